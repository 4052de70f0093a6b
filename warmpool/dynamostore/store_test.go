package dynamostore_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/internal/testenv"
	"github.com/quarryhq/quarry/warmpool"
	"github.com/quarryhq/quarry/warmpool/dynamostore"
	"github.com/quarryhq/quarry/warmpool/storetest"
)

// TestStore_Conformance runs the lease-store suite on fresh tables per
// subtest, with the race: 10,000 claims by 256 claimers over three
// replicas, each with its own SDK client.
func TestStore_Conformance(t *testing.T) {
	testenv.AWS(t)
	client := newClient(t)
	cfgs := map[warmpool.Store]dynamostore.Config{}
	start := time.Now()
	storetest.Run(t, func(t *testing.T) warmpool.Store {
		// 256 claimers queue at a single-threaded emulator: a call may
		// wait for seconds there, so the call timeout is generous.
		cfg := freshTables(t, client, dynamostore.Config{CallTimeout: 2 * time.Minute})
		s, err := dynamostore.New(client, cfg)
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		cfgs[s] = cfg
		return s
	}, storetest.Options{
		RaceTasks: 200, RaceClaims: 10000, RaceClaimers: 256, Replicas: 3,
		NewReplica: func(t *testing.T, s warmpool.Store) warmpool.Store {
			r, err := dynamostore.New(newClient(t), cfgs[s])
			require.NoError(t, err)
			t.Cleanup(func() { _ = r.Close() })
			return r
		},
	})
	t.Logf("conformance suite took %s", time.Since(start).Round(time.Millisecond))
}
