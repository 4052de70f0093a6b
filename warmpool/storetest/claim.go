package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/warmpool"
)

func testClaimReadyOnly(t *testing.T, s warmpool.Store) {
	_, err := s.Claim(t.Context(), warmpool.ClaimRequest{Pool: "p", Lease: newLease("o"), Now: base})
	require.ErrorIs(t, err, warmpool.ErrNoCapacity, "empty pool")

	recs := reserve(t, s, "p", 3) // launching
	_ = setState(t, s, recs[1], warmpool.TaskStopping)
	_ = ready(t, s, "other", 1)
	_, err = s.Claim(t.Context(), warmpool.ClaimRequest{Pool: "p", Lease: newLease("o"), Now: base})
	require.ErrorIs(t, err, warmpool.ErrNoCapacity, "launching and stopping tasks, and ready tasks of other pools, are not claimable")

	r := setState(t, s, recs[2], warmpool.TaskReady)
	res := claim(t, s, "p", newLease("o"))
	assert.Equal(t, r.ID, res.Lease.TaskID)
	_, err = s.Claim(t.Context(), warmpool.ClaimRequest{Pool: "p", Lease: newLease("o"), Now: base})
	require.ErrorIs(t, err, warmpool.ErrNoCapacity, "a leased task is not claimable")
}

func testClaimFills(t *testing.T, s warmpool.Store) {
	rec := reserve(t, s, "p", 1)[0]
	rec.Generation = 5 // e.g. fenced before
	rec = setState(t, s, rec, warmpool.TaskReady)
	l := newLease("owner-1")
	l.IdempotencyKey = "k1"
	l.RequestDigest = "d1"
	now := base.Add(time.Second)
	res, err := s.Claim(t.Context(), warmpool.ClaimRequest{Pool: "p", Lease: l, Now: now})
	require.NoError(t, err)
	assert.False(t, res.Replayed)

	got := res.Lease
	assert.Equal(t, l.ID, got.ID)
	assert.Equal(t, "p", got.Pool)
	assert.Equal(t, rec.ID, got.TaskID)
	assert.Equal(t, "owner-1", got.Owner)
	assert.Equal(t, warmpool.LeaseActive, got.State)
	assert.Equal(t, int64(6), got.Generation, "generation increments on claim")
	assert.Equal(t, rec.AgentURL, got.AgentURL)
	assert.Equal(t, rec.AgentToken, got.AgentToken)
	assert.Equal(t, rec.ProviderID, got.ProviderTaskID, "the lease names the provider's task")
	assert.Equal(t, rec.Provider, got.Provider, "the lease names the provider that made its task")
	assert.Equal(t, l.Labels, got.Labels)
	assert.Equal(t, l.Env, got.Env)
	assert.Equal(t, "k1", got.IdempotencyKey)
	assert.Equal(t, "d1", got.RequestDigest)
	assert.Equal(t, time.Minute, got.Duration)
	assertTime(t, l.ExpiresAt, got.ExpiresAt, "expires_at")
	assertTime(t, now, got.CreatedAt, "created_at defaults to now")
	assert.Positive(t, got.Version)

	assert.Equal(t, warmpool.TaskLeased, res.Task.State)
	assert.Equal(t, l.ID, res.Task.LeaseID)
	assert.Equal(t, int64(6), res.Task.Generation)

	stored, err := s.GetLease(t.Context(), l.ID)
	require.NoError(t, err)
	assert.Equal(t, got.TaskID, stored.TaskID)
	assert.Equal(t, "d1", stored.RequestDigest, "the request digest is kept")
	assert.Equal(t, got.Generation, stored.Generation)
	assert.Equal(t, got.Version, stored.Version)
	assert.Equal(t, rec.ProviderID, stored.ProviderTaskID)
	assert.Equal(t, rec.Provider, stored.Provider)
	task, ok := findTask(t, s, rec.ID)
	require.True(t, ok)
	assert.Equal(t, warmpool.TaskLeased, task.State)
	assert.Equal(t, l.ID, task.LeaseID)
	assert.Equal(t, int64(6), task.Generation)
	assert.Greater(t, task.Version, rec.Version)
}

func testClaimByTaskID(t *testing.T, s warmpool.Store) {
	recs := reserve(t, s, "p", 3)
	launching := recs[0]
	readyRec := setState(t, s, recs[1], warmpool.TaskReady)
	_ = setState(t, s, recs[2], warmpool.TaskStopping)
	other := reserve(t, s, "q", 1)[0]

	res, err := s.Claim(t.Context(), warmpool.ClaimRequest{Pool: "p", TaskID: launching.ID, Lease: newLease("o"), Now: base})
	require.NoError(t, err, "a launching task is claimable by id (cold start)")
	assert.Equal(t, launching.ID, res.Lease.TaskID)
	assert.Equal(t, int64(1), res.Lease.Generation)

	tests := []struct {
		name   string
		pool   string
		taskID string
		want   error
	}{
		{name: "leased task", pool: "p", taskID: launching.ID, want: warmpool.ErrConflict},
		{name: "stopping task", pool: "p", taskID: recs[2].ID, want: warmpool.ErrConflict},
		{name: "task of another pool", pool: "p", taskID: other.ID, want: warmpool.ErrNotFound},
		{name: "unknown task", pool: "p", taskID: "tsk-unknown", want: warmpool.ErrNotFound},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := s.Claim(t.Context(), warmpool.ClaimRequest{Pool: tc.pool, TaskID: tc.taskID, Lease: newLease("o"), Now: base})
			require.ErrorIs(t, err, tc.want)
		})
	}

	res, err = s.Claim(t.Context(), warmpool.ClaimRequest{Pool: "p", TaskID: readyRec.ID, Lease: newLease("o"), Now: base})
	require.NoError(t, err, "a ready task is claimable by id")
	assert.Equal(t, readyRec.ID, res.Lease.TaskID)
	_, err = s.Claim(t.Context(), warmpool.ClaimRequest{Pool: "p", Lease: newLease("o"), Now: base})
	require.ErrorIs(t, err, warmpool.ErrNoCapacity, "the task claimed by id left the ready set")
}

func testClaimDistinct(t *testing.T, s warmpool.Store) {
	recs := ready(t, s, "p", 5)
	seen := map[string]bool{}
	for range recs {
		res := claim(t, s, "p", newLease("o"))
		assert.False(t, seen[res.Lease.TaskID], "task %s granted twice", res.Lease.TaskID)
		seen[res.Lease.TaskID] = true
	}
	_, err := s.Claim(t.Context(), warmpool.ClaimRequest{Pool: "p", Lease: newLease("o"), Now: base})
	require.ErrorIs(t, err, warmpool.ErrNoCapacity)
	assert.Len(t, seen, 5)
}

func testClaimDuplicateLease(t *testing.T, s warmpool.Store) {
	_ = ready(t, s, "p", 2)
	l := newLease("o")
	_ = claim(t, s, "p", l)
	_, err := s.Claim(t.Context(), warmpool.ClaimRequest{Pool: "p", Lease: l, Now: base})
	require.ErrorIs(t, err, warmpool.ErrConflict)
	assert.Equal(t, 1, tasksByState(t, s, "p")[warmpool.TaskReady], "the refused claim took no task")
}

func testClaimIdempotency(t *testing.T, s warmpool.Store) {
	_ = ready(t, s, "p", 3)
	first := newLease("alice")
	first.IdempotencyKey = "create-1"
	res1 := claim(t, s, "p", first)

	retry := newLease("alice")
	retry.IdempotencyKey = "create-1"
	res2 := claim(t, s, "p", retry)
	assert.True(t, res2.Replayed)
	assert.Equal(t, res1.Lease.ID, res2.Lease.ID)
	assert.Equal(t, res1.Lease.TaskID, res2.Lease.TaskID)
	assert.Equal(t, res1.Lease.Generation, res2.Lease.Generation)
	assert.Equal(t, 2, tasksByState(t, s, "p")[warmpool.TaskReady], "a replay claims nothing")
	_, err := s.GetLease(t.Context(), retry.ID)
	require.ErrorIs(t, err, warmpool.ErrNotFound, "a replay creates no lease")

	bob := newLease("bob")
	bob.IdempotencyKey = "create-1"
	res3 := claim(t, s, "p", bob)
	assert.False(t, res3.Replayed, "keys are per owner")
	assert.NotEqual(t, res1.Lease.TaskID, res3.Lease.TaskID)

	_, err = s.EndLease(t.Context(), res1.Lease.ID, warmpool.LeaseEnd{State: warmpool.LeaseReleased, Now: base})
	require.NoError(t, err)
	again := newLease("alice")
	again.IdempotencyKey = "create-1"
	res4 := claim(t, s, "p", again)
	assert.True(t, res4.Replayed, "an ended lease is still replayed")
	assert.Equal(t, res1.Lease.ID, res4.Lease.ID)
	assert.Equal(t, warmpool.LeaseReleased, res4.Lease.State)
}

func testClaimForgetKey(t *testing.T, s warmpool.Store) {
	_ = ready(t, s, "p", 2)
	first := newLease("alice")
	first.IdempotencyKey = "k"
	res1 := claim(t, s, "p", first)
	ended, err := s.EndLease(t.Context(), res1.Lease.ID, warmpool.LeaseEnd{
		State: warmpool.LeaseLost, Reason: "init failed", Now: base, ForgetIdempotencyKey: true,
	})
	require.NoError(t, err)
	assert.Equal(t, warmpool.LeaseLost, ended.State)

	retry := newLease("alice")
	retry.IdempotencyKey = "k"
	res2 := claim(t, s, "p", retry)
	assert.False(t, res2.Replayed, "a forgotten key claims again")
	assert.Equal(t, retry.ID, res2.Lease.ID)
	assert.NotEqual(t, res1.Lease.TaskID, res2.Lease.TaskID)

	again := newLease("alice")
	again.IdempotencyKey = "k"
	res3 := claim(t, s, "p", again)
	assert.True(t, res3.Replayed, "the key now names the new lease")
	assert.Equal(t, retry.ID, res3.Lease.ID)
}

func testRaceClaims(t *testing.T, s warmpool.Store, opts Options) {
	_ = ready(t, s, "race", opts.RaceTasks)
	stores := replicas(t, s, opts)

	var (
		mu       sync.Mutex
		granted  = map[string]string{} // task id → lease id
		failures []error
		noCap    atomic.Int64
		next     atomic.Int64
		wg       sync.WaitGroup
	)
	for g := 0; g < opts.RaceClaimers; g++ {
		wg.Add(1)
		go func(st warmpool.Store) {
			defer wg.Done()
			for next.Add(1) <= int64(opts.RaceClaims) {
				res, err := st.Claim(context.Background(), warmpool.ClaimRequest{Pool: "race", Lease: newLease("racer"), Now: base})
				switch {
				case errors.Is(err, warmpool.ErrNoCapacity):
					noCap.Add(1)
					continue
				case err != nil:
					mu.Lock()
					failures = append(failures, err)
					mu.Unlock()
					continue
				}
				mu.Lock()
				if prev, dup := granted[res.Lease.TaskID]; dup {
					failures = append(failures, fmt.Errorf("task %s granted to %s and %s", res.Lease.TaskID, prev, res.Lease.ID))
				}
				granted[res.Lease.TaskID] = res.Lease.ID
				mu.Unlock()
			}
		}(stores[g%len(stores)])
	}
	wg.Wait()

	require.Empty(t, failures)
	want := min(opts.RaceTasks, opts.RaceClaims)
	assert.Len(t, granted, want, "successes == min(tasks, claims)")
	assert.Equal(t, int64(opts.RaceClaims-want), noCap.Load(), "every other claim found no capacity")

	recs := mustList(t, s, "race")
	leased := 0
	for _, r := range recs {
		if r.State != warmpool.TaskLeased {
			continue
		}
		leased++
		assert.Equal(t, granted[r.ID], r.LeaseID, "task %s names the lease it was granted to", r.ID)
		assert.Equal(t, int64(1), r.Generation)
	}
	assert.Equal(t, want, leased)
	active, err := s.ListLeases(t.Context(), warmpool.LeaseFilter{Pool: "race", State: warmpool.LeaseActive})
	require.NoError(t, err)
	assert.Len(t, active, want)
}

func testRaceIdempotency(t *testing.T, s warmpool.Store, opts Options) {
	n := min(opts.RaceClaimers, 32)
	_ = ready(t, s, "race", n)
	stores := replicas(t, s, opts)
	ids := make([]string, n)
	replayed := make([]bool, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int, st warmpool.Store) {
			defer wg.Done()
			l := newLease("alice")
			l.IdempotencyKey = "same-key"
			res, err := st.Claim(context.Background(), warmpool.ClaimRequest{Pool: "race", Lease: l, Now: base})
			if assert.NoError(t, err) {
				ids[i], replayed[i] = res.Lease.ID, res.Replayed
			}
		}(i, stores[i%len(stores)])
	}
	wg.Wait()
	fresh := 0
	for i := range ids {
		assert.Equal(t, ids[0], ids[i], "every request got the same lease")
		if !replayed[i] {
			fresh++
		}
	}
	assert.Equal(t, 1, fresh, "exactly one request claimed")
	assert.Equal(t, n-1, tasksByState(t, s, "race")[warmpool.TaskReady])
}
