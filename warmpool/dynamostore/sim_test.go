package dynamostore_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/bench/ddbsim"
	"github.com/quarryhq/quarry/bench/ddbsim/ddbsimtest"
	"github.com/quarryhq/quarry/warmpool"
	"github.com/quarryhq/quarry/warmpool/dynamostore"
	"github.com/quarryhq/quarry/warmpool/storetest"
)

// TestStore_Conformance_Simulator runs the lease-store suite against the
// DynamoDB simulator, in-process: it needs nothing but Go, so it runs
// under plain go test. Each replica has its own SDK client; the race is
// the emulator's: 10,000 claims by 256 claimers over three replicas. The
// indexes are current at once (IndexLag -1, as on the emulator): the suite
// claims right after it makes tasks ready, which an index that lags (AWS's,
// and the simulator's default) does not show yet.
func TestStore_Conformance_Simulator(t *testing.T) {
	url, _ := ddbsimtest.Start(t, ddbsim.Config{IndexLag: -1})
	client := ddbsim.Client(url, 3)
	cfgs := map[warmpool.Store]dynamostore.Config{}
	storetest.Run(t, func(t *testing.T) warmpool.Store {
		cfg := freshTables(t, client, dynamostore.Config{})
		s, err := dynamostore.New(client, cfg)
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		cfgs[s] = cfg
		return s
	}, storetest.Options{
		RaceTasks: 200, RaceClaims: 10000, RaceClaimers: 256, Replicas: 3,
		NewReplica: func(t *testing.T, s warmpool.Store) warmpool.Store {
			r, err := dynamostore.New(ddbsim.Client(url, 3), cfgs[s])
			require.NoError(t, err)
			t.Cleanup(func() { _ = r.Close() })
			return r
		},
	})
}
