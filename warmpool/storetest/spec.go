package storetest

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/warmpool"
)

// Tests of TaskRecord.Spec and ClaimRequest.Spec: a pool hands out only
// tasks launched for its current configuration.

// readySpec creates n ready tasks in pool launched for spec.
func readySpec(t *testing.T, s warmpool.Store, pool, spec string, n int) []warmpool.TaskRecord {
	t.Helper()
	recs := make([]warmpool.TaskRecord, n)
	for i := range recs {
		recs[i] = newTask(pool)
		recs[i].Spec = spec
	}
	require.NoError(t, s.ReserveTasks(t.Context(), pool, 1000, recs))
	for i := range recs {
		recs[i].State, recs[i].Version = warmpool.TaskLaunching, 1
		recs[i] = setState(t, s, recs[i], warmpool.TaskReady)
	}
	return recs
}

func testClaimSpec(t *testing.T, s warmpool.Store) {
	old := readySpec(t, s, "p", "v1:old", 3)
	cur := readySpec(t, s, "p", "v1:new", 1)[0]
	legacy := readySpec(t, s, "p", "", 1)[0] // written before records kept a spec

	var stale []warmpool.TaskRecord
	// A store meets the stale tasks in an order of its own: a claim may
	// meet only stale ones (ErrNoCapacity) before the one of its spec.
	res, err := s.Claim(t.Context(), warmpool.ClaimRequest{Pool: "p", Spec: "v1:new", Lease: newLease("o"), Now: base})
	for i := 0; err != nil && len(res.Stale) > 0 && i < 8; i++ {
		stale = append(stale, res.Stale...)
		res, err = s.Claim(t.Context(), warmpool.ClaimRequest{Pool: "p", Spec: "v1:new", Lease: newLease("o"), Now: base})
	}
	require.NoError(t, err)
	assert.Equal(t, cur.ID, res.Lease.TaskID, "only the task of the spec asked for is claimed")
	stale = append(stale, res.Stale...)
	// What the claim did not meet, a claim that finds nothing else meets.
	for range 8 {
		res, err = s.Claim(t.Context(), warmpool.ClaimRequest{Pool: "p", Spec: "v1:new", Lease: newLease("o"), Now: base})
		require.ErrorIs(t, err, warmpool.ErrNoCapacity, "no ready task of the spec is left")
		stale = append(stale, res.Stale...)
		if len(res.Stale) == 0 {
			break
		}
	}
	ids := map[string]bool{}
	for _, r := range stale {
		assert.Equal(t, warmpool.TaskStopping, r.State, "a stale task is reported as stored: stopping")
		assert.Equal(t, warmpool.ReasonStaleSpec, r.Reason)
		ids[r.ID] = true
	}
	want := map[string]bool{old[0].ID: true, old[1].ID: true, old[2].ID: true, legacy.ID: true}
	assert.Equal(t, want, ids, "every ready task of another spec (or none) is retired once, and reported")
	assertCounts(t, s, "p", warmpool.TaskCounts{Leased: 1, Stopping: 4}, "after the claims")
	for id := range want {
		rec, ok := findTask(t, s, id)
		require.True(t, ok)
		assert.Equal(t, warmpool.TaskStopping, rec.State)
	}
}

func testClaimSpecOnlyStale(t *testing.T, s warmpool.Store) {
	old := readySpec(t, s, "p", "v1:old", 2)
	_ = readySpec(t, s, "q", "v1:old", 1) // another pool's tasks are never touched
	var stale []warmpool.TaskRecord
	for range 4 {
		res, err := s.Claim(t.Context(), warmpool.ClaimRequest{Pool: "p", Spec: "v1:new", Lease: newLease("o"), Now: base})
		require.ErrorIs(t, err, warmpool.ErrNoCapacity)
		stale = append(stale, res.Stale...)
		if len(res.Stale) == 0 {
			break
		}
	}
	assert.ElementsMatch(t, []string{old[0].ID, old[1].ID}, taskIDs(stale))
	assertCounts(t, s, "p", warmpool.TaskCounts{Stopping: 2}, "the stale tasks are stopping")
	assertCounts(t, s, "q", warmpool.TaskCounts{Ready: 1}, "the other pool is untouched")
	_, err := s.GetLease(t.Context(), "sbx-none")
	require.ErrorIs(t, err, warmpool.ErrNotFound)
	leases, err := s.ListLeases(t.Context(), warmpool.LeaseFilter{Owner: "o"})
	require.NoError(t, err)
	assert.Empty(t, leases, "a claim that found no task of its spec made no lease")

	res := claim(t, s, "q", newLease("o")) // no spec: any ready task
	assert.NotEmpty(t, res.Lease.TaskID, "a claim without a spec takes any ready task")
	assert.Empty(t, res.Stale)
}

func testClaimSpecByID(t *testing.T, s warmpool.Store) {
	old := readySpec(t, s, "p", "v1:old", 1)[0]
	_, err := s.Claim(t.Context(), warmpool.ClaimRequest{Pool: "p", TaskID: old.ID, Spec: "v1:new", Lease: newLease("o"), Now: base})
	require.ErrorIs(t, err, warmpool.ErrConflict, "a task of another spec is not claimed by id")
	res, err := s.Claim(t.Context(), warmpool.ClaimRequest{Pool: "p", TaskID: old.ID, Spec: "v1:old", Lease: newLease("o"), Now: base})
	require.NoError(t, err, "a task of the spec asked for is")
	assert.Equal(t, old.ID, res.Lease.TaskID)
}

func testSpecKept(t *testing.T, s warmpool.Store) {
	rec := readySpec(t, s, "p", "v1:abc", 1)[0]
	got, err := s.GetTask(t.Context(), rec.ID)
	require.NoError(t, err)
	assert.Equal(t, "v1:abc", got.Spec, "the spec is stored with the record")
	got.Spec = "" // a caller that does not carry it
	_, err = s.UpdateTask(t.Context(), got, got.State)
	require.NoError(t, err)
	got, err = s.GetTask(t.Context(), rec.ID)
	require.NoError(t, err)
	assert.Equal(t, "v1:abc", got.Spec, "an update never changes the spec")
}

func taskIDs(recs []warmpool.TaskRecord) []string {
	out := make([]string, len(recs))
	for i, r := range recs {
		out[i] = r.ID
	}
	return out
}
