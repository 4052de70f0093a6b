package boltstore_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"

	"github.com/quarryhq/quarry/warmpool"
	"github.com/quarryhq/quarry/warmpool/boltstore"
	"github.com/quarryhq/quarry/warmpool/storetest"
)

func openStore(t testing.TB, path string) *boltstore.Store {
	t.Helper()
	s, err := boltstore.Open(path, boltstore.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func TestStore_Conformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) warmpool.Store {
		return openStore(t, filepath.Join(t.TempDir(), "leases.db"))
	}, storetest.Options{})
}

func TestStore_Reopen_DataSurvives(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "leases.db")
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	s := openStore(t, path)
	recs := []warmpool.TaskRecord{
		{ID: "tsk-a", Provider: "process", CreatedAt: now},
		{ID: "tsk-b", Provider: "process", CreatedAt: now.Add(time.Second)},
	}
	require.NoError(t, s.ReserveTasks(t.Context(), "default", 4, recs))
	for _, r := range recs {
		r.Pool, r.State, r.Version = "default", warmpool.TaskReady, 1
		r.AgentURL, r.AgentToken = "http://127.0.0.1:1", "tok-"+r.ID
		_, err := s.UpdateTask(t.Context(), r, warmpool.TaskLaunching)
		require.NoError(t, err)
	}
	res, err := s.Claim(t.Context(), warmpool.ClaimRequest{Pool: "default", Now: now, Lease: warmpool.Lease{
		ID: "sbx-1", Owner: "o", IdempotencyKey: "k", Duration: time.Minute, ExpiresAt: now.Add(time.Minute),
	}})
	require.NoError(t, err)
	assert.Equal(t, "tsk-a", res.Lease.TaskID, "the oldest ready task is claimed first")
	require.NoError(t, s.Close())

	s2 := openStore(t, path)
	got, err := s2.GetLease(t.Context(), "sbx-1")
	require.NoError(t, err)
	assert.Equal(t, warmpool.LeaseActive, got.State)
	assert.Equal(t, "tok-tsk-a", got.AgentToken)
	replay, err := s2.Claim(t.Context(), warmpool.ClaimRequest{Pool: "default", Now: now, Lease: warmpool.Lease{
		ID: "sbx-2", Owner: "o", IdempotencyKey: "k", ExpiresAt: now.Add(time.Minute),
	}})
	require.NoError(t, err)
	assert.True(t, replay.Replayed, "the idempotency index survived")
	assert.Equal(t, "sbx-1", replay.Lease.ID)
	next, err := s2.Claim(t.Context(), warmpool.ClaimRequest{Pool: "default", Now: now, Lease: warmpool.Lease{
		ID: "sbx-3", Owner: "o", ExpiresAt: now.Add(time.Minute),
	}})
	require.NoError(t, err)
	assert.Equal(t, "tsk-b", next.Lease.TaskID, "the ready index survived")
	expiring, err := s2.ListLeases(t.Context(), warmpool.LeaseFilter{ExpiresBefore: now.Add(time.Hour)})
	require.NoError(t, err)
	assert.Len(t, expiring, 2, "the expiry index survived")
}

// A file written before the task counters has none: Open counts its tasks
// once, and the counts then follow every write.
func TestOpen_CountsAFileMadeBeforeTheCounters(t *testing.T) {
	path := filepath.Join(t.TempDir(), "leases.db")
	s := openStore(t, path)
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	recs := []warmpool.TaskRecord{{ID: "tsk-a", CreatedAt: now}, {ID: "tsk-b", CreatedAt: now}, {ID: "tsk-c", CreatedAt: now}}
	require.NoError(t, s.ReserveTasks(t.Context(), "default", 10, recs))
	r := recs[0]
	r.Pool, r.State, r.Version = "default", warmpool.TaskReady, 1
	_, err := s.UpdateTask(t.Context(), r, warmpool.TaskLaunching)
	require.NoError(t, err)
	require.NoError(t, s.Close())

	db, err := bolt.Open(path, 0o600, nil) // make it a file of the earlier build
	require.NoError(t, err)
	require.NoError(t, db.Update(func(tx *bolt.Tx) error {
		if err := tx.DeleteBucket([]byte("task_counts")); err != nil {
			return err
		}
		return tx.Bucket([]byte("meta")).Delete([]byte("counted"))
	}))
	require.NoError(t, db.Close())

	s = openStore(t, path)
	c, err := s.CountTasks(t.Context(), "default")
	require.NoError(t, err)
	assert.Equal(t, warmpool.TaskCounts{Launching: 2, Ready: 1}, c)
	require.ErrorIs(t, s.ReserveTasks(t.Context(), "default", 3, []warmpool.TaskRecord{{ID: "tsk-d"}}), warmpool.ErrNoCapacity,
		"max_total counts the tasks made before the counters")
}

func TestOpen_LockedFileTimesOut(t *testing.T) {
	path := filepath.Join(t.TempDir(), "leases.db")
	_ = openStore(t, path)
	_, err := boltstore.Open(path, boltstore.Options{Timeout: 50 * time.Millisecond})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "another process holds it")
}

// BenchmarkStore_Claim measures one warm claim (the store's share of a warm
// acquire) on a durable store: p50/p99 in milliseconds.
func BenchmarkStore_Claim(b *testing.B) {
	s := openStore(b, filepath.Join(b.TempDir(), "leases.db"))
	now := time.Now().UTC()
	const pool = "bench"
	// Make b.N ready tasks (and some leases of another pool, so the store is not empty).
	var recs []warmpool.TaskRecord
	for i := 0; i < b.N; i++ {
		recs = append(recs, warmpool.TaskRecord{ID: warmpool.NewTaskID(), Provider: "fake", CreatedAt: now})
	}
	for start := 0; start < len(recs); start += 100 {
		require.NoError(b, s.ReserveTasks(b.Context(), pool, b.N, recs[start:min(start+100, len(recs))]))
	}
	for _, r := range recs {
		r.Pool, r.State, r.Version = pool, warmpool.TaskReady, 1
		r.AgentURL, r.AgentToken = "http://127.0.0.1:1", "token"
		_, err := s.UpdateTask(b.Context(), r, warmpool.TaskLaunching)
		require.NoError(b, err)
	}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		_, err := s.Claim(b.Context(), warmpool.ClaimRequest{Pool: pool, Now: now, Lease: warmpool.Lease{
			ID: warmpool.NewLeaseID(), Owner: "owner", Duration: time.Minute, ExpiresAt: now.Add(time.Minute),
			IdempotencyKey: warmpool.NewLeaseID(), Labels: map[string]string{"run": "bench"},
		}})
		lat = append(lat, time.Since(start))
		if err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	storetest.ReportLatency(b, lat)
}
