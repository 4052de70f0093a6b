package warmpool_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/internal/testenv"
	"github.com/quarryhq/quarry/warmpool"
	"github.com/quarryhq/quarry/warmpool/dynamostore"
)

// A refill past the DynamoDB store's MaxReserve (92 records in one
// transaction) fills the pool, on the emulator: the manager reserves in
// chunks within the store's limit even when QUARRY_LAUNCH_CHUNK and the
// budget would take all 100 at once (issue 13, launching 1: a pool of
// min_warm 150 had 0 ready after 90 s).
func TestManager_Refill_PastMaxReserveOnDynamoDB(t *testing.T) {
	testenv.AWS(t)
	ctx := t.Context()
	awsCfg, err := config.LoadDefaultConfig(ctx, dynamostore.Config{MaxAttempts: 3}.SDKOptions()...)
	require.NoError(t, err, "load the AWS SDK config")
	client := dynamodb.NewFromConfig(awsCfg)
	id := time.Now().UnixNano() & 0xffffffffff
	dcfg := dynamostore.Config{TasksTable: fmt.Sprintf("quarry-test-wp-%x-tasks", id), LeasesTable: fmt.Sprintf("quarry-test-wp-%x-leases", id)}
	require.NoError(t, dynamostore.CreateTables(ctx, client, dcfg))
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		require.NoError(t, dynamostore.DeleteTables(cctx, client, dcfg))
	})
	ds, err := dynamostore.New(client, dcfg)
	require.NoError(t, err)
	require.Less(t, ds.MaxReserve(), 100)

	const n = 100
	cfg := fastConfig()
	cfg.ReconcileInterval, cfg.LaunchChunk, cfg.LaunchBudget = 100*time.Millisecond, n, n
	e := newEnvSetup(t, cfg, func(e *env) {
		e.wrap = func(warmpool.Store) warmpool.Store { return ds }
	}, testPool(n, n))
	require.Eventually(t, func() bool { return e.status().Ready == n }, 3*time.Minute, 100*time.Millisecond,
		"the pool never had %d ready tasks", n)
}
