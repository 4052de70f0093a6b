package warmpool_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/internal/syncbuf"
	"github.com/quarryhq/quarry/internal/testenv"
	"github.com/quarryhq/quarry/warmpool"
	"github.com/quarryhq/quarry/warmpool/dynamostore"
)

// A refill past the DynamoDB store's MaxReserve (83 records in one
// transaction) fills the pool, on the emulator: the manager reserves in
// chunks within the store's limit even when QUARRY_LAUNCH_CHUNK and the
// budget would take all 100 at once (issue 13, launching 1: a pool of
// min_warm 150 had 0 ready after 90 s).
func TestManager_Refill_PastMaxReserveOnDynamoDB(t *testing.T) {
	ds := newDynamoStore(t, "wp")
	require.Less(t, ds.MaxReserve(), 100)

	const n = 100
	cfg := fastConfig()
	cfg.ReconcileInterval, cfg.LaunchChunk, cfg.LaunchBudget = 100*time.Millisecond, n, n
	var logs syncbuf.Buffer // the manager's log, shown when the pool does not fill
	e := newEnvSetup(t, cfg, func(e *env) {
		e.logger = slog.New(slog.NewTextHandler(&logs, nil))
		e.wrap = func(warmpool.Store) warmpool.Store { return ds }
	}, testPool(n, n))
	require.Eventually(t, func() bool { return e.status().Ready == n }, 3*time.Minute, 100*time.Millisecond,
		"the pool never had %d ready tasks; the manager's log:\n%s", n, &logs)
}

// An on-demand pool on DynamoDB (the emulator): made once, its task counted
// in its class, ended when idle.
func TestOnDemand_OnDynamoDB(t *testing.T) {
	ctx := t.Context()
	ds := newDynamoStore(t, "od")

	cfg := fastConfig()
	cfg.ReconcileInterval, cfg.PoolTouchInterval = 100*time.Millisecond, 50*time.Millisecond
	e := newEnvSetup(t, cfg, func(e *env) {
		e.provider = newImageProvider(e.prov)
		e.classes = []warmpool.ClassConfig{testClass(8)}
		e.wrap = func(warmpool.Store) warmpool.Store { return ds }
	}, testPool(0, 2))
	name := e.imagePool("registry.test/ddb:1")
	l := e.acquireFrom(name, "alice")
	rec, err := ds.GetPool(ctx, name)
	require.NoError(t, err)
	assert.Equal(t, warmpool.PoolActive, rec.State)
	n, err := ds.CountClass(ctx, "default")
	require.NoError(t, err)
	assert.Equal(t, 1, n, "the task counts in its class")
	require.Eventually(t, func() bool {
		rec, err := ds.GetPool(ctx, name)
		return err == nil && rec.Acquires == 1
	}, time.Minute, 50*time.Millisecond, "the acquire is counted in the record")
	_, err = e.m.Release(ctx, l.ID, "alice")
	require.NoError(t, err)
	e.clock.Advance(601 * time.Second)
	require.Eventually(t, func() bool {
		rec, err := ds.GetPool(ctx, name)
		return err == nil && rec.State == warmpool.PoolEnded
	}, 2*time.Minute, 100*time.Millisecond, "idle past idle_seconds: the pool ends")
	n, err = ds.CountClass(ctx, "default")
	require.NoError(t, err)
	assert.Zero(t, n, "its task was deleted and uncounted")
}

// newDynamoStore makes the test need the AWS emulator (or AWS) and returns
// a DynamoDB store on tables of its own (named by tag), deleted at the end.
func newDynamoStore(t *testing.T, tag string) *dynamostore.Store {
	t.Helper()
	testenv.AWS(t)
	ctx := t.Context()
	awsCfg, err := config.LoadDefaultConfig(ctx, dynamostore.Config{MaxAttempts: 3}.SDKOptions()...)
	require.NoError(t, err, "load the AWS SDK config")
	client := dynamodb.NewFromConfig(awsCfg)
	id := time.Now().UnixNano() & 0xffffffffff
	dcfg := dynamostore.Config{TasksTable: fmt.Sprintf("quarry-test-%s-%x-tasks", tag, id), LeasesTable: fmt.Sprintf("quarry-test-%s-%x-leases", tag, id)}
	require.NoError(t, dynamostore.CreateTables(ctx, client, dcfg))
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		require.NoError(t, dynamostore.DeleteTables(cctx, client, dcfg))
	})
	ds, err := dynamostore.New(client, dcfg)
	require.NoError(t, err)
	return ds
}
