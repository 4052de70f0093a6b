package storetest

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/warmpool"
)

func testRenew(t *testing.T, s warmpool.Store) {
	_ = ready(t, s, "p", 1)
	res := claim(t, s, "p", newLease("o"))
	newExpiry := base.Add(5 * time.Minute)
	got, err := s.RenewLease(t.Context(), res.Lease.ID, "o", newExpiry, base.Add(30*time.Second))
	require.NoError(t, err)
	assertTime(t, newExpiry, got.ExpiresAt, "expires_at")
	assert.Equal(t, warmpool.LeaseActive, got.State)
	assert.Greater(t, got.Version, res.Lease.Version)
	stored, err := s.GetLease(t.Context(), res.Lease.ID)
	require.NoError(t, err)
	assertTime(t, newExpiry, stored.ExpiresAt, "stored expires_at")
}

func testRenewByDuration(t *testing.T, s warmpool.Store) {
	_ = ready(t, s, "p", 2)
	l := newLease("o") // a minute
	res := claim(t, s, "p", l)
	now := base.Add(40 * time.Second)
	got, err := s.RenewLease(t.Context(), res.Lease.ID, "o", time.Time{}, now)
	require.NoError(t, err)
	assertTime(t, now.Add(time.Minute), got.ExpiresAt, "expires_at is now + the duration")
	assert.Greater(t, got.Version, res.Lease.Version)
	stored, err := s.GetLease(t.Context(), res.Lease.ID)
	require.NoError(t, err)
	assertTime(t, now.Add(time.Minute), stored.ExpiresAt, "stored expires_at")
	expiring, err := s.ListLeases(t.Context(), warmpool.LeaseFilter{ExpiresBefore: now.Add(time.Minute)})
	require.NoError(t, err)
	assert.Empty(t, expiring, "the expiry index moved too")
	expiring, err = s.ListLeases(t.Context(), warmpool.LeaseFilter{ExpiresBefore: now.Add(time.Minute + time.Second)})
	require.NoError(t, err)
	assert.Equal(t, []string{res.Lease.ID}, leaseIDs(expiring))

	_, err = s.RenewLease(t.Context(), res.Lease.ID, "mallory", time.Time{}, now)
	require.ErrorIs(t, err, warmpool.ErrLeaseNotHeld)
	_, err = s.RenewLease(t.Context(), res.Lease.ID, "o", time.Time{}, now.Add(2*time.Minute))
	require.ErrorIs(t, err, warmpool.ErrLeaseEnded, "expired")

	none := newLease("o")
	none.Duration = 0
	res = claim(t, s, "p", none)
	_, err = s.RenewLease(t.Context(), res.Lease.ID, "o", time.Time{}, base)
	require.Error(t, err, "a lease without a duration needs an expiry")
	stored, err = s.GetLease(t.Context(), res.Lease.ID)
	require.NoError(t, err)
	assert.Equal(t, res.Lease.Version, stored.Version, "nothing was written")
}

// testPause: PauseLease marks and clears PausedAt on an active lease,
// which heartbeats keep and an end keeps; a second pause (or resume) is
// ErrConflict, another owner's is ErrLeaseNotHeld, an expired lease's
// ErrLeaseEnded.
func testPause(t *testing.T, s warmpool.Store) {
	_ = ready(t, s, "p", 1)
	res := claim(t, s, "p", newLease("o")) // a minute
	at := base.Add(10 * time.Second)
	_, err := s.PauseLease(t.Context(), res.Lease.ID, "mallory", true, at)
	require.ErrorIs(t, err, warmpool.ErrLeaseNotHeld)
	got, err := s.PauseLease(t.Context(), res.Lease.ID, "o", true, at)
	require.NoError(t, err)
	assertTime(t, at, got.PausedAt, "paused_at")
	assert.Greater(t, got.Version, res.Lease.Version)
	_, err = s.PauseLease(t.Context(), res.Lease.ID, "o", true, at.Add(time.Second))
	require.ErrorIs(t, err, warmpool.ErrConflict, "paused already")

	renewed, err := s.RenewLease(t.Context(), res.Lease.ID, "o", time.Time{}, at.Add(2*time.Second))
	require.NoError(t, err)
	assertTime(t, at, renewed.PausedAt, "a heartbeat keeps paused_at")
	stored, err := s.GetLease(t.Context(), res.Lease.ID)
	require.NoError(t, err)
	assertTime(t, at, stored.PausedAt, "stored paused_at")

	got, err = s.PauseLease(t.Context(), res.Lease.ID, "o", false, at.Add(3*time.Second))
	require.NoError(t, err)
	assert.True(t, got.PausedAt.IsZero(), "resumed: %v", got.PausedAt)
	_, err = s.PauseLease(t.Context(), res.Lease.ID, "o", false, at.Add(4*time.Second))
	require.ErrorIs(t, err, warmpool.ErrConflict, "not paused")
	stored, err = s.GetLease(t.Context(), res.Lease.ID)
	require.NoError(t, err)
	assert.True(t, stored.PausedAt.IsZero(), "stored: resumed")

	_, err = s.PauseLease(t.Context(), res.Lease.ID, "o", true, base.Add(10*time.Minute))
	require.ErrorIs(t, err, warmpool.ErrLeaseEnded, "expired")
	_, err = s.PauseLease(t.Context(), "no-such-lease", "o", true, at)
	require.ErrorIs(t, err, warmpool.ErrNotFound)
}

// testLeaseEnv: the env reaches the claim's result (the agent's init), and
// no read returns it: it is kept apart from the lease's record.
func testLeaseEnv(t *testing.T, s warmpool.Store) {
	_ = ready(t, s, "p", 1)
	l := newLease("o")
	l.Env = map[string]string{"BIG": strings.Repeat("x", 4096), "A": "1"}
	l.IdempotencyKey = "k"
	res := claim(t, s, "p", l)
	assert.Equal(t, l.Env, res.Lease.Env, "the claim returns the env")
	got, err := s.GetLease(t.Context(), l.ID)
	require.NoError(t, err)
	assert.Nil(t, got.Env)
	renewed, err := s.RenewLease(t.Context(), l.ID, "o", time.Time{}, base)
	require.NoError(t, err)
	assert.Nil(t, renewed.Env)
	listed, err := s.ListLeases(t.Context(), warmpool.LeaseFilter{Owner: "o"})
	require.NoError(t, err)
	require.Len(t, listed, 1)
	assert.Nil(t, listed[0].Env)
	again := newLease("o")
	again.IdempotencyKey = "k"
	replay := claim(t, s, "p", again)
	require.True(t, replay.Replayed)
	assert.Nil(t, replay.Lease.Env, "a replay reads the lease")
	ended, err := s.EndLease(t.Context(), l.ID, warmpool.LeaseEnd{State: warmpool.LeaseReleased, Now: base})
	require.NoError(t, err)
	assert.Nil(t, ended.Env)
	n, err := s.PurgeLeases(t.Context(), base.Add(time.Second))
	require.NoError(t, err)
	assert.Equal(t, 1, n, "a lease with an env is purged with it")
}

func testLeaseByKey(t *testing.T, s warmpool.Store) {
	_ = ready(t, s, "p", 3)
	l := newLease("alice")
	l.IdempotencyKey = "rock:one"
	first := claim(t, s, "p", l).Lease
	got, err := s.LeaseByKey(t.Context(), "alice", "rock:one")
	require.NoError(t, err)
	assert.Equal(t, first.ID, got.ID)
	assert.Equal(t, first.TaskID, got.TaskID)
	assert.Equal(t, warmpool.LeaseActive, got.State)
	_, err = s.LeaseByKey(t.Context(), "bob", "rock:one")
	require.ErrorIs(t, err, warmpool.ErrNotFound, "keys are per owner")
	_, err = s.LeaseByKey(t.Context(), "alice", "rock:two")
	require.ErrorIs(t, err, warmpool.ErrNotFound)

	_, err = s.EndLease(t.Context(), first.ID, warmpool.LeaseEnd{State: warmpool.LeaseReleased, Now: base})
	require.NoError(t, err)
	got, err = s.LeaseByKey(t.Context(), "alice", "rock:one")
	require.NoError(t, err)
	assert.Equal(t, warmpool.LeaseReleased, got.State, "an ended lease is still the key's")

	k := newLease("alice")
	k.IdempotencyKey = "rock:forgotten"
	lost := claim(t, s, "p", k).Lease
	_, err = s.EndLease(t.Context(), lost.ID, warmpool.LeaseEnd{State: warmpool.LeaseLost, Now: base, ForgetIdempotencyKey: true})
	require.NoError(t, err)
	_, err = s.LeaseByKey(t.Context(), "alice", "rock:forgotten")
	require.ErrorIs(t, err, warmpool.ErrNotFound, "a forgotten key names no lease")
	retry := newLease("alice")
	retry.IdempotencyKey = "rock:forgotten"
	second := claim(t, s, "p", retry).Lease
	got, err = s.LeaseByKey(t.Context(), "alice", "rock:forgotten")
	require.NoError(t, err)
	assert.Equal(t, second.ID, got.ID, "the key names the lease that took it again")
}

func testRenewRefusals(t *testing.T, s warmpool.Store) {
	_ = ready(t, s, "p", 2)
	active := claim(t, s, "p", newLease("o")).Lease
	ended := claim(t, s, "p", newLease("o")).Lease
	_, err := s.EndLease(t.Context(), ended.ID, warmpool.LeaseEnd{State: warmpool.LeaseReleased, Now: base})
	require.NoError(t, err)

	tests := []struct {
		name  string
		id    string
		owner string
		now   time.Time
		want  error
	}{
		{name: "at expiry", id: active.ID, owner: "o", now: active.ExpiresAt, want: warmpool.ErrLeaseEnded},
		{name: "after expiry", id: active.ID, owner: "o", now: active.ExpiresAt.Add(time.Second), want: warmpool.ErrLeaseEnded},
		{name: "ended", id: ended.ID, owner: "o", now: base, want: warmpool.ErrLeaseEnded},
		{name: "other owner", id: active.ID, owner: "mallory", now: base, want: warmpool.ErrLeaseNotHeld},
		{name: "unknown", id: "sbx-unknown", owner: "o", now: base, want: warmpool.ErrNotFound},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := s.RenewLease(t.Context(), tc.id, tc.owner, tc.now.Add(time.Hour), tc.now)
			require.ErrorIs(t, err, tc.want)
		})
	}
	stored, err := s.GetLease(t.Context(), active.ID)
	require.NoError(t, err)
	assertTime(t, active.ExpiresAt, stored.ExpiresAt, "refused renewals changed nothing")
}

func testEndLease(t *testing.T, s warmpool.Store) {
	_ = ready(t, s, "p", 1)
	res := claim(t, s, "p", newLease("o"))
	now := base.Add(10 * time.Second)
	got, err := s.EndLease(t.Context(), res.Lease.ID, warmpool.LeaseEnd{State: warmpool.LeaseLost, Reason: "task exited", Now: now, Owner: "o"})
	require.NoError(t, err)
	assert.Equal(t, warmpool.LeaseLost, got.State)
	assert.Equal(t, "task exited", got.Reason)
	assertTime(t, now, got.EndedAt, "ended_at")
	assert.Greater(t, got.Version, res.Lease.Version)

	task, ok := findTask(t, s, res.Lease.TaskID)
	require.True(t, ok)
	assert.Equal(t, warmpool.TaskStopping, task.State, "the task stops with its lease, atomically")
	_, err = s.Claim(t.Context(), warmpool.ClaimRequest{Pool: "p", Lease: newLease("o"), Now: base})
	require.ErrorIs(t, err, warmpool.ErrNoCapacity, "a task is never reused across leases")
	_, err = s.Claim(t.Context(), warmpool.ClaimRequest{Pool: "p", TaskID: task.ID, Lease: newLease("o"), Now: base})
	require.ErrorIs(t, err, warmpool.ErrConflict, "not even by id")
}

func testEndLeaseTwice(t *testing.T, s warmpool.Store) {
	_ = ready(t, s, "p", 1)
	res := claim(t, s, "p", newLease("o"))
	_, err := s.EndLease(t.Context(), res.Lease.ID, warmpool.LeaseEnd{State: warmpool.LeaseReleased, Reason: "done", Now: base})
	require.NoError(t, err)
	got, err := s.EndLease(t.Context(), res.Lease.ID, warmpool.LeaseEnd{State: warmpool.LeaseExpired, Now: base.Add(time.Hour)})
	require.ErrorIs(t, err, warmpool.ErrLeaseEnded)
	assert.Equal(t, res.Lease.ID, got.ID, "the ended lease comes back with the error")
	assert.Equal(t, warmpool.LeaseReleased, got.State, "the first end stands")
	assert.Equal(t, "done", got.Reason)
}

func testEndLeaseOnlyIfExpired(t *testing.T, s warmpool.Store) {
	_ = ready(t, s, "p", 1)
	res := claim(t, s, "p", newLease("o")) // expires at base+1m
	renewed := base.Add(2 * time.Minute)
	_, err := s.RenewLease(t.Context(), res.Lease.ID, "o", renewed, base.Add(50*time.Second))
	require.NoError(t, err)

	_, err = s.EndLease(t.Context(), res.Lease.ID, warmpool.LeaseEnd{State: warmpool.LeaseExpired, Now: base.Add(70 * time.Second), OnlyIfExpired: true})
	require.ErrorIs(t, err, warmpool.ErrConflict, "the heartbeat won")
	stored, err := s.GetLease(t.Context(), res.Lease.ID)
	require.NoError(t, err)
	assert.Equal(t, warmpool.LeaseActive, stored.State)

	got, err := s.EndLease(t.Context(), res.Lease.ID, warmpool.LeaseEnd{State: warmpool.LeaseExpired, Now: renewed, OnlyIfExpired: true})
	require.NoError(t, err, "expired at exactly ExpiresAt")
	assert.Equal(t, warmpool.LeaseExpired, got.State)
}

// testEndLeaseWithCopy: the caller's copy (LeaseEnd.Read) may be stale; the
// end is still written exactly, from the lease as stored.
func testEndLeaseWithCopy(t *testing.T, s warmpool.Store) {
	_ = ready(t, s, "p", 3)
	fresh := claim(t, s, "p", newLease("o")).Lease
	got, err := s.EndLease(t.Context(), fresh.ID, warmpool.LeaseEnd{State: warmpool.LeaseReleased, Now: base, Owner: "o", Read: &fresh})
	require.NoError(t, err)
	assert.Equal(t, warmpool.LeaseReleased, got.State)
	assert.Equal(t, fresh.Version+1, got.Version)
	assert.Equal(t, fresh.TaskID, got.TaskID)
	stored, err := s.GetLease(t.Context(), fresh.ID)
	require.NoError(t, err)
	assert.Equal(t, got.Version, stored.Version)
	assert.Equal(t, warmpool.LeaseReleased, stored.State)
	task, err := s.GetTask(t.Context(), fresh.TaskID)
	require.NoError(t, err)
	assert.Equal(t, warmpool.TaskStopping, task.State, "the task stops with its lease")

	stale := claim(t, s, "p", newLease("o")).Lease
	renewed, err := s.RenewLease(t.Context(), stale.ID, "o", base.Add(time.Hour), base)
	require.NoError(t, err)
	got, err = s.EndLease(t.Context(), stale.ID, warmpool.LeaseEnd{State: warmpool.LeaseReleased, Now: base, Read: &stale})
	require.NoError(t, err, "a stale copy costs a read")
	assert.Equal(t, renewed.Version+1, got.Version)
	assertTime(t, renewed.ExpiresAt, got.ExpiresAt, "the end is written on the lease as stored")
	_, err = s.EndLease(t.Context(), stale.ID, warmpool.LeaseEnd{State: warmpool.LeaseExpired, Now: base, Read: &stale})
	require.ErrorIs(t, err, warmpool.ErrLeaseEnded, "a copy of a lease that ended since")

	other := claim(t, s, "p", newLease("o")).Lease
	_, err = s.EndLease(t.Context(), other.ID, warmpool.LeaseEnd{State: warmpool.LeaseReleased, Now: base, Owner: "mallory", Read: &other})
	require.ErrorIs(t, err, warmpool.ErrLeaseNotHeld)
	_, err = s.EndLease(t.Context(), other.ID, warmpool.LeaseEnd{State: warmpool.LeaseExpired, Now: base, OnlyIfExpired: true, Read: &other})
	require.ErrorIs(t, err, warmpool.ErrConflict, "not expired")
	assertCounts(t, s, "p", warmpool.TaskCounts{Leased: 1, Stopping: 2}, "ends with copies")
}

func testEndLeaseRefusals(t *testing.T, s warmpool.Store) {
	_ = ready(t, s, "p", 1)
	res := claim(t, s, "p", newLease("o"))
	_, err := s.EndLease(t.Context(), res.Lease.ID, warmpool.LeaseEnd{State: warmpool.LeaseReleased, Now: base, Owner: "mallory"})
	require.ErrorIs(t, err, warmpool.ErrLeaseNotHeld)
	_, err = s.EndLease(t.Context(), "sbx-unknown", warmpool.LeaseEnd{State: warmpool.LeaseReleased, Now: base})
	require.ErrorIs(t, err, warmpool.ErrNotFound)
	_, err = s.EndLease(t.Context(), res.Lease.ID, warmpool.LeaseEnd{State: warmpool.LeaseActive, Now: base})
	require.Error(t, err, "active is not an end state")
	stored, err := s.GetLease(t.Context(), res.Lease.ID)
	require.NoError(t, err)
	assert.Equal(t, warmpool.LeaseActive, stored.State)
}

func testListLeases(t *testing.T, s warmpool.Store) {
	_ = ready(t, s, "a", 3)
	_ = ready(t, s, "b", 2)
	mk := func(pool, owner string, i int, labels map[string]string) warmpool.Lease {
		l := newLease(owner)
		l.Labels = labels
		l.CreatedAt = base.Add(time.Duration(i) * time.Second)
		l.ExpiresAt = base.Add(time.Duration(10+i) * time.Minute)
		return claim(t, s, pool, l).Lease
	}
	l0 := mk("a", "alice", 0, map[string]string{"run": "x"})
	l1 := mk("a", "bob", 1, map[string]string{"run": "y"})
	l2 := mk("b", "alice", 2, map[string]string{"run": "x", "team": "t"})
	l3 := mk("a", "alice", 3, nil)
	l4 := mk("b", "bob", 4, map[string]string{"run": "x"})
	_, err := s.EndLease(t.Context(), l3.ID, warmpool.LeaseEnd{State: warmpool.LeaseReleased, Now: base})
	require.NoError(t, err)

	tests := []struct {
		name string
		f    warmpool.LeaseFilter
		want []warmpool.Lease
	}{
		{name: "all newest first", f: warmpool.LeaseFilter{}, want: []warmpool.Lease{l4, l3, l2, l1, l0}},
		{name: "pool", f: warmpool.LeaseFilter{Pool: "b"}, want: []warmpool.Lease{l4, l2}},
		{name: "owner", f: warmpool.LeaseFilter{Owner: "alice"}, want: []warmpool.Lease{l3, l2, l0}},
		{name: "state", f: warmpool.LeaseFilter{State: warmpool.LeaseReleased}, want: []warmpool.Lease{l3}},
		{name: "owner and state", f: warmpool.LeaseFilter{Owner: "alice", State: warmpool.LeaseActive}, want: []warmpool.Lease{l2, l0}},
		{name: "label", f: warmpool.LeaseFilter{Labels: map[string]string{"run": "x"}}, want: []warmpool.Lease{l4, l2, l0}},
		{name: "two labels", f: warmpool.LeaseFilter{Labels: map[string]string{"run": "x", "team": "t"}}, want: []warmpool.Lease{l2}},
		{name: "label and owner", f: warmpool.LeaseFilter{Owner: "bob", Labels: map[string]string{"run": "x"}}, want: []warmpool.Lease{l4}},
		{name: "expires before: active only", f: warmpool.LeaseFilter{ExpiresBefore: base.Add(13*time.Minute + time.Second)}, want: []warmpool.Lease{l2, l1, l0}},
		{name: "expires before is strict", f: warmpool.LeaseFilter{ExpiresBefore: base.Add(11 * time.Minute)}, want: []warmpool.Lease{l0}},
		{name: "expires before and owner", f: warmpool.LeaseFilter{Owner: "bob", ExpiresBefore: base.Add(time.Hour)}, want: []warmpool.Lease{l4, l1}},
		{name: "limit", f: warmpool.LeaseFilter{Limit: 2}, want: []warmpool.Lease{l4, l3}},
		{name: "limit with owner", f: warmpool.LeaseFilter{Owner: "alice", Limit: 1}, want: []warmpool.Lease{l3}},
		{name: "limit with expires before", f: warmpool.LeaseFilter{ExpiresBefore: base.Add(time.Hour), Limit: 2}, want: []warmpool.Lease{l4, l2}},
		{name: "no match", f: warmpool.LeaseFilter{Owner: "nobody"}, want: nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := s.ListLeases(t.Context(), tc.f)
			require.NoError(t, err)
			assert.Equal(t, leaseIDs(tc.want), leaseIDs(got))
		})
	}
}

func testPurge(t *testing.T, s warmpool.Store) {
	_ = ready(t, s, "p", 4)
	var ls []warmpool.Lease
	for i := 0; i < 4; i++ {
		l := newLease("o")
		l.IdempotencyKey = fmt.Sprintf("key-%d", i)
		ls = append(ls, claim(t, s, "p", l).Lease)
	}
	for i, l := range ls[:3] {
		_, err := s.EndLease(t.Context(), l.ID, warmpool.LeaseEnd{State: warmpool.LeaseReleased, Now: base.Add(time.Duration(i+1) * time.Minute)})
		require.NoError(t, err)
	}
	n, err := s.PurgeLeases(t.Context(), base.Add(2*time.Minute+time.Second))
	require.NoError(t, err)
	assert.Equal(t, 2, n)
	for _, l := range ls[:2] {
		_, err := s.GetLease(t.Context(), l.ID)
		require.ErrorIs(t, err, warmpool.ErrNotFound, "purged")
	}
	for _, l := range ls[2:] {
		_, err := s.GetLease(t.Context(), l.ID)
		require.NoError(t, err, "ended later, or active: kept")
	}
	all, err := s.ListLeases(t.Context(), warmpool.LeaseFilter{})
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{ls[3].ID, ls[2].ID}, leaseIDs(all))
	n, err = s.PurgeLeases(t.Context(), base.Add(2*time.Minute+time.Second))
	require.NoError(t, err)
	assert.Zero(t, n, "purging again deletes nothing")

	_ = ready(t, s, "p", 1)
	l := newLease("o")
	l.IdempotencyKey = "key-0"
	res := claim(t, s, "p", l)
	assert.False(t, res.Replayed, "a purged lease's key is free")
}
