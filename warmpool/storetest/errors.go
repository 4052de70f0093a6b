package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/warmpool"
)

// testBadArguments checks that the store refuses what the contract's checks
// (warmpool.CheckReserve, CheckUpdate, CheckClaim, CheckRenew, CheckEnd,
// CheckLock) refuse, with their errors, and writes nothing.
func testBadArguments(t *testing.T, s warmpool.Store) {
	ctx := t.Context()
	_ = ready(t, s, "p", 1)
	held := claim(t, s, "p", newLease("o")).Lease
	spare := ready(t, s, "p", 1)[0]
	want := func(err, check error) {
		t.Helper()
		require.Error(t, check, "the check refuses")
		assert.EqualError(t, err, check.Error())
	}

	dup := newTask("p")
	for _, recs := range [][]warmpool.TaskRecord{{newTask("p"), {}}, {newTask("q")}, {dup, dup}} {
		want(s.ReserveTasks(ctx, "p", 100, recs), warmpool.CheckReserve("p", recs))
	}
	want(s.ReserveTasks(ctx, "", 100, []warmpool.TaskRecord{newTask("")}), warmpool.CheckReserve("", nil))

	bad := spare
	bad.State = "gone"
	_, err := s.UpdateTask(ctx, bad, warmpool.TaskReady)
	want(err, warmpool.CheckUpdate(bad, warmpool.TaskReady))
	_, err = s.UpdateTask(ctx, spare, "gone")
	want(err, warmpool.CheckUpdate(spare, "gone"))
	noPool := spare
	noPool.Pool = ""
	want(s.DeleteTask(ctx, noPool), warmpool.CheckDelete(noPool))
	_, err = s.ListTasksPage(ctx, "p", "", 0)
	want(err, warmpool.CheckPage(0))

	for _, req := range []warmpool.ClaimRequest{
		{Lease: newLease("o"), Now: base},
		{Pool: "p", Lease: warmpool.Lease{Owner: "o"}, Now: base},
		{Pool: "p", Lease: warmpool.Lease{ID: warmpool.NewLeaseID()}, Now: base},
		{Pool: "p", Lease: newLease("o")},
	} {
		_, err := s.Claim(ctx, req)
		want(err, warmpool.CheckClaim(req))
	}

	_, err = s.RenewLease(ctx, held.ID, "o", base.Add(time.Hour), time.Time{})
	want(err, warmpool.CheckRenew(time.Time{}))
	for _, end := range []warmpool.LeaseEnd{{State: warmpool.LeaseActive, Now: base}, {State: warmpool.LeaseReleased}} {
		_, err := s.EndLease(ctx, held.ID, end)
		want(err, warmpool.CheckEnd(held.ID, end))
	}
	_, err = s.TryLock(ctx, "reaper", "", time.Minute, base)
	want(err, warmpool.CheckLock("reaper", "", time.Minute))

	assert.Equal(t, map[warmpool.TaskState]int{warmpool.TaskLeased: 1, warmpool.TaskReady: 1}, tasksByState(t, s, "p"), "nothing was reserved, claimed or ended")
	got, err := s.GetLease(ctx, held.ID)
	require.NoError(t, err)
	assert.Equal(t, warmpool.LeaseActive, got.State, "the lease was not ended")
	assert.Equal(t, held.Version, got.Version, "the lease was neither renewed nor ended")
	assert.True(t, held.ExpiresAt.Equal(got.ExpiresAt), "the lease was not renewed")
	stored, err := s.ListTasks(ctx, "p")
	require.NoError(t, err)
	for _, r := range stored {
		if r.ID == spare.ID {
			assert.Equal(t, spare.Version, r.Version, "the refused update wrote nothing")
		}
	}
	ok, err := s.TryLock(ctx, "reaper", "r1", time.Minute, base)
	require.NoError(t, err)
	assert.True(t, ok, "the refused lock took nothing")
}

func testCanceled(t *testing.T, s warmpool.Store) {
	_ = ready(t, s, "p", 1)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err := s.Claim(ctx, warmpool.ClaimRequest{Pool: "p", Lease: newLease("o"), Now: base})
	require.Error(t, err)
	assert.Equal(t, 1, tasksByState(t, s, "p")[warmpool.TaskReady], "nothing was claimed")
}

func testClose(t *testing.T, s warmpool.Store) {
	_ = ready(t, s, "p", 1)
	require.NoError(t, s.Close())
	_, err := s.GetLease(t.Context(), "sbx-x")
	require.ErrorIs(t, err, warmpool.ErrClosed)
	_, err = s.Claim(t.Context(), warmpool.ClaimRequest{Pool: "p", Lease: newLease("o"), Now: base})
	require.ErrorIs(t, err, warmpool.ErrClosed)
	_, err = s.ListTasks(t.Context(), "")
	require.ErrorIs(t, err, warmpool.ErrClosed)
}
