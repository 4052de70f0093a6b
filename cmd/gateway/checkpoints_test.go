package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/checkpoints"
	"github.com/quarryhq/quarry/checkpoints/s3store"
	"github.com/quarryhq/quarry/internal/testenv"
)

func TestCheckpointStore_EmbeddedUnderTheDataDir(t *testing.T) {
	cfg := Config{DataDir: t.TempDir()}
	st, err := openCheckpointStore(context.Background(), cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, st.Close()) })
	_, err = os.Stat(filepath.Join(cfg.DataDir, "checkpoints", "meta.db"))
	assert.NoError(t, err)
}

// QUARRY_CHECKPOINT_DIR moves the embedded store, so that replicas sharing
// a data dir can each hold one.
func TestCheckpointStore_EmbeddedInItsOwnDir(t *testing.T) {
	cfg := Config{DataDir: t.TempDir()}
	cfg.CheckpointConfig.Dir = filepath.Join(t.TempDir(), "ckp")
	st, err := openCheckpointStore(context.Background(), cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, st.Close()) })
	_, err = os.Stat(filepath.Join(cfg.CheckpointConfig.Dir, "meta.db"))
	assert.NoError(t, err)
	_, err = os.Stat(filepath.Join(cfg.DataDir, "checkpoints"))
	assert.ErrorIs(t, err, os.ErrNotExist, "nothing under the data dir")
}

// The embedded store's budget: QUARRY_CHECKPOINT_BUDGET_* as set, and
// unset, half the file system the store is on.
func TestCheckpointStore_EmbeddedBudget(t *testing.T) {
	var logs strings.Builder
	log := slog.New(slog.NewTextHandler(&logs, nil))
	cfg := Config{DataDir: t.TempDir()}
	st, err := openCheckpointStore(context.Background(), cfg, log)
	require.NoError(t, err)
	require.NoError(t, st.Close())
	fs, err := fileSystemSize(cfg.DataDir)
	require.NoError(t, err)
	require.Positive(t, fs)
	assert.Contains(t, logs.String(), fmt.Sprintf("budget_per_key=0 budget_total=%d", fs/2), "the default total is half the disk")

	cfg.CheckpointConfig.BudgetPerKey = 10
	st, err = openCheckpointStore(context.Background(), cfg, log)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, st.Close()) })
	now := time.Now()
	_, err = st.Put(context.Background(), checkpoints.Checkpoint{ID: checkpoints.NewID(), Owner: "o", Format: "tar+gzip",
		Paths: []string{"/w"}, CreatedAt: now, ExpiresAt: now.Add(time.Hour)}, strings.NewReader("eleven byte"), 1<<20)
	assert.ErrorIs(t, err, checkpoints.ErrOverBudget, "QUARRY_CHECKPOINT_BUDGET_PER_KEY reaches the store")
}

func TestCheckpointConfig_Validate(t *testing.T) {
	assert.NoError(t, CheckpointConfig{}.Validate(), "the zero value takes the defaults")
	assert.ErrorContains(t, CheckpointConfig{PurgeBudget: -1}.Validate(), "QUARRY_CHECKPOINT_PURGE_BUDGET")
	assert.ErrorContains(t, CheckpointConfig{PurgeInterval: -time.Second}.Validate(), "QUARRY_CHECKPOINT_PURGE_INTERVAL")
	assert.ErrorContains(t, CheckpointConfig{Config: checkpoints.Config{Store: "tape"}}.Validate(), "QUARRY_CHECKPOINT_STORE")
	assert.ErrorContains(t, CheckpointConfig{Config: checkpoints.Config{BudgetTotal: -2}}.Validate(), "QUARRY_CHECKPOINT_BUDGET_TOTAL")
}

// The purge loop deletes expired checkpoints, at most its budget per pass,
// until none is left; it stops on Close.
func TestPurger_DeletesExpiredWithABudget(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	st, err := openCheckpointStore(context.Background(), Config{DataDir: t.TempDir()}, log)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, st.Close()) })
	now := time.Now()
	put := func(expires time.Time) {
		_, err := st.Put(context.Background(), checkpoints.Checkpoint{ID: checkpoints.NewID(), Owner: "o", Format: "tar+gzip",
			Paths: []string{"/w"}, CreatedAt: now.Add(-2 * time.Hour), ExpiresAt: expires}, strings.NewReader("archive"), 1<<20)
		require.NoError(t, err)
	}
	for range 5 {
		put(now.Add(-time.Hour))
	}
	put(now.Add(time.Hour)) // not expired

	reg := prometheus.NewRegistry()
	p, err := newPurger(st, CheckpointConfig{PurgeInterval: 20 * time.Millisecond, PurgeBudget: 2}, log, reg)
	require.NoError(t, err)
	p.Start(context.Background())
	deadline := time.Now().Add(10 * time.Second)
	for counterValue(t, p.purged) < 5 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	p.Close(ctx)
	assert.Equal(t, 5.0, counterValue(t, p.purged), "every expired one, over passes of 2")
	left, err := st.List(context.Background(), checkpoints.Filter{Owner: "o"})
	require.NoError(t, err)
	assert.Len(t, left, 1, "the unexpired one stays")
}

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	require.NoError(t, c.Write(&m))
	return m.GetCounter().GetValue()
}

// With QUARRY_CHECKPOINT_STORE=s3 the gateway's store is s3store on the
// SDK's configuration (path style for an endpoint): a checkpoint goes in
// and comes back (the AWS emulator).
func TestCheckpointStore_S3OnTheEmulator(t *testing.T) {
	testenv.AWS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	awsCfg, err := loadAWS(ctx, DynamoConfig{})
	require.NoError(t, err)
	run := fmt.Sprintf("%x", time.Now().UnixNano()&0xffffffffff)
	bucket, table := "quarry-test-gw-checkpoints-"+run, "quarry-test-gw-checkpoints-"+run
	s3c := s3.NewFromConfig(awsCfg, func(o *s3.Options) { o.UsePathStyle = true })
	_, err = s3c.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(bucket)})
	require.NoError(t, err)
	t.Cleanup(func() { // after the checkpoint's Delete below emptied it
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, err := s3c.DeleteBucket(ctx, &s3.DeleteBucketInput{Bucket: aws.String(bucket)})
		assert.NoError(t, err, "the bucket is empty: the checkpoint's object was deleted")
	})
	ddb := dynamodb.NewFromConfig(awsCfg)
	require.NoError(t, s3store.CreateTables(ctx, ddb, table))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		assert.NoError(t, s3store.DeleteTables(ctx, ddb, table))
	})
	t.Setenv("QUARRY_CHECKPOINT_BUCKET", bucket)
	t.Setenv("QUARRY_CHECKPOINT_TABLE", table)

	cfg := Config{DataDir: t.TempDir()}
	cfg.CheckpointConfig.Store = checkpoints.StoreS3
	st, err := openCheckpointStore(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, st.Close()) })
	now := time.Now()
	ck, err := st.Put(ctx, checkpoints.Checkpoint{ID: checkpoints.NewID(), Owner: "o", Format: "tar+gzip", Paths: []string{"/w"},
		CreatedAt: now, ExpiresAt: now.Add(time.Hour)}, strings.NewReader("archive bytes"), 1<<20)
	require.NoError(t, err)
	rc, _, err := st.Open(ctx, ck.ID, "o")
	require.NoError(t, err)
	b, err := io.ReadAll(rc)
	require.NoError(t, err)
	require.NoError(t, rc.Close())
	assert.Equal(t, "archive bytes", string(b))
	require.NoError(t, st.Delete(ctx, ck.ID, "o"))
	_, err = os.Stat(filepath.Join(cfg.DataDir, "checkpoints"))
	assert.ErrorIs(t, err, os.ErrNotExist, "nothing embedded")

	t.Setenv("QUARRY_CHECKPOINT_BUCKET", "")
	_, err = openCheckpointStore(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	assert.ErrorContains(t, err, "QUARRY_CHECKPOINT_BUCKET")
}
