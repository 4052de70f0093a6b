package warmpool_test

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/quarryhq/quarry/warmpool"
)

var checkNow = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

func TestTaskState_Valid(t *testing.T) {
	for _, s := range []warmpool.TaskState{warmpool.TaskLaunching, warmpool.TaskReady, warmpool.TaskLeased, warmpool.TaskStopping} {
		assert.True(t, s.Valid(), s)
	}
	for _, s := range []warmpool.TaskState{"", "Ready", "stopped", "deleted"} {
		assert.False(t, s.Valid(), s)
	}
}

func TestCheckReserve(t *testing.T) {
	rec := func(id, pool string) warmpool.TaskRecord { return warmpool.TaskRecord{ID: id, Pool: pool} }
	tests := []struct {
		name     string
		pool     string
		recs     []warmpool.TaskRecord
		want     string // "" for nil
		conflict bool
	}{
		{name: "records of the pool", pool: "p", recs: []warmpool.TaskRecord{rec("a", "p"), rec("b", "")}},
		{name: "no records", pool: "p"},
		{name: "empty pool", pool: "", recs: []warmpool.TaskRecord{rec("a", "p")}, want: "reserve tasks: pool is empty"},
		{name: "empty pool, no records", pool: "", want: "reserve tasks: pool is empty"},
		{name: "empty id", pool: "p", recs: []warmpool.TaskRecord{rec("a", "p"), rec("", "p")}, want: "reserve tasks: a record has an empty id"},
		{name: "other pool", pool: "p", recs: []warmpool.TaskRecord{rec("a", "q")}, want: `reserve tasks: record a is for pool "q", not "p"`},
		{name: "id twice", pool: "p", recs: []warmpool.TaskRecord{rec("a", "p"), rec("b", "p"), rec("a", "")},
			want: "reserve tasks: id a given twice: " + warmpool.ErrConflict.Error(), conflict: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := warmpool.CheckReserve(tc.pool, tc.recs)
			assertCheck(t, err, tc.want)
			assert.Equal(t, tc.conflict, errors.Is(err, warmpool.ErrConflict), "wraps ErrConflict")
		})
	}
}

func TestCheckUpdate(t *testing.T) {
	tests := []struct {
		name string
		rec  warmpool.TaskRecord
		from warmpool.TaskState
		want string
	}{
		{name: "every state", rec: warmpool.TaskRecord{ID: "t", State: warmpool.TaskStopping}, from: warmpool.TaskLeased},
		{name: "empty id", rec: warmpool.TaskRecord{State: warmpool.TaskReady}, from: warmpool.TaskLaunching, want: "update task: id is empty"},
		{name: "unknown state", rec: warmpool.TaskRecord{ID: "t", State: "gone"}, from: warmpool.TaskReady, want: `update task t: unknown state "gone"`},
		{name: "no state", rec: warmpool.TaskRecord{ID: "t"}, from: warmpool.TaskReady, want: `update task t: unknown state ""`},
		{name: "unknown previous state", rec: warmpool.TaskRecord{ID: "t", State: warmpool.TaskReady}, from: "gone", want: `update task t: unknown previous state "gone"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assertCheck(t, warmpool.CheckUpdate(tc.rec, tc.from), tc.want)
		})
	}
}

func TestCheckDelete(t *testing.T) {
	assertCheck(t, warmpool.CheckDelete(warmpool.TaskRecord{ID: "t", Pool: "p"}), "")
	assertCheck(t, warmpool.CheckDelete(warmpool.TaskRecord{ID: "t"}), `delete task "t": id and pool are required`)
	assertCheck(t, warmpool.CheckDelete(warmpool.TaskRecord{Pool: "p"}), `delete task "": id and pool are required`)
}

func TestCheckPage(t *testing.T) {
	assertCheck(t, warmpool.CheckPage(1), "")
	assertCheck(t, warmpool.CheckPage(0), "list tasks page: limit 0; at least 1")
}

func TestCheckClaim(t *testing.T) {
	ok := warmpool.ClaimRequest{Pool: "p", Now: checkNow, Lease: warmpool.Lease{ID: "sbx-1", Owner: "o"}}
	with := func(f func(*warmpool.ClaimRequest)) warmpool.ClaimRequest { r := ok; f(&r); return r }
	tests := []struct {
		name string
		req  warmpool.ClaimRequest
		want string
	}{
		{name: "complete", req: ok},
		{name: "by task id", req: with(func(r *warmpool.ClaimRequest) { r.TaskID = "t" })},
		{name: "no pool", req: with(func(r *warmpool.ClaimRequest) { r.Pool = "" }), want: "claim: pool is empty"},
		{name: "no lease id", req: with(func(r *warmpool.ClaimRequest) { r.Lease.ID = "" }), want: "claim: lease id is empty"},
		{name: "no owner", req: with(func(r *warmpool.ClaimRequest) { r.Lease.Owner = "" }), want: "claim: lease owner is empty"},
		{name: "no now", req: with(func(r *warmpool.ClaimRequest) { r.Now = time.Time{} }), want: "claim: now is zero"},
		{name: "first problem named", req: warmpool.ClaimRequest{}, want: "claim: pool is empty"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assertCheck(t, warmpool.CheckClaim(tc.req), tc.want)
		})
	}
}

func TestClaimedLease(t *testing.T) {
	task := warmpool.TaskRecord{
		ID: "t", Pool: "p", Provider: "ecs", ProviderID: "arn:t", Spec: "s1", Class: "c", State: warmpool.TaskReady,
		AgentURL: "http://10.0.0.1:49983", AgentToken: "tok", Generation: 3, Reason: "warm",
		CreatedAt: checkNow.Add(-time.Hour), UpdatedAt: checkNow.Add(-time.Minute), Version: 7,
	}
	lease := warmpool.Lease{
		ID: "sbx-1", Owner: "o", Image: "img", Labels: map[string]string{"run": "a"}, Env: map[string]string{"A": "1"},
		IdempotencyKey: "k", RequestDigest: "d", Duration: time.Minute, ExpiresAt: checkNow.Add(time.Minute),
		// What the store fills, set wrong by the caller: overwritten.
		Pool: "q", TaskID: "x", State: warmpool.LeaseExpired, Reason: "old", Generation: 9, AgentURL: "u", AgentToken: "v",
		ProviderTaskID: "w", Provider: "docker", EndedAt: checkNow, Version: 5,
	}
	req := warmpool.ClaimRequest{Pool: "p", Lease: lease, Now: checkNow}

	l, got := warmpool.ClaimedLease(req, task)

	assert.Equal(t, warmpool.TaskRecord{
		ID: "t", Pool: "p", Provider: "ecs", ProviderID: "arn:t", Spec: "s1", Class: "c", State: warmpool.TaskLeased,
		AgentURL: "http://10.0.0.1:49983", AgentToken: "tok", LeaseID: "sbx-1", Generation: 4,
		CreatedAt: checkNow.Add(-time.Hour), UpdatedAt: checkNow, Version: 8,
	}, got)
	assert.Equal(t, warmpool.Lease{
		ID: "sbx-1", Pool: "p", TaskID: "t", Owner: "o", State: warmpool.LeaseActive, Generation: 4,
		AgentURL: "http://10.0.0.1:49983", AgentToken: "tok", ProviderTaskID: "arn:t", Provider: "ecs",
		Image: "img", Labels: map[string]string{"run": "a"}, Env: map[string]string{"A": "1"},
		IdempotencyKey: "k", RequestDigest: "d", Duration: time.Minute,
		CreatedAt: checkNow, ExpiresAt: checkNow.Add(time.Minute), Version: 1,
	}, l)

	req.Lease.CreatedAt = checkNow.Add(-time.Second)
	l, _ = warmpool.ClaimedLease(req, task)
	assert.Equal(t, checkNow.Add(-time.Second), l.CreatedAt, "a CreatedAt given is kept")
}

func TestCheckRenew(t *testing.T) {
	assert.NoError(t, warmpool.CheckRenew(checkNow))
	assert.EqualError(t, warmpool.CheckRenew(time.Time{}), "renew lease: now is zero")
}

func TestCheckEnd(t *testing.T) {
	tests := []struct {
		name string
		end  warmpool.LeaseEnd
		want string
	}{
		{name: "released", end: warmpool.LeaseEnd{State: warmpool.LeaseReleased, Now: checkNow}},
		{name: "expired", end: warmpool.LeaseEnd{State: warmpool.LeaseExpired, Now: checkNow}},
		{name: "lost", end: warmpool.LeaseEnd{State: warmpool.LeaseLost, Now: checkNow}},
		{name: "active", end: warmpool.LeaseEnd{State: warmpool.LeaseActive, Now: checkNow},
			want: `end lease sbx-1: state "active" is not released, expired or lost`},
		{name: "no state", end: warmpool.LeaseEnd{Now: checkNow}, want: `end lease sbx-1: state "" is not released, expired or lost`},
		{name: "no now", end: warmpool.LeaseEnd{State: warmpool.LeaseReleased}, want: "end lease: now is zero"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assertCheck(t, warmpool.CheckEnd("sbx-1", tc.end), tc.want)
		})
	}
}

func TestCheckLock(t *testing.T) {
	tests := []struct {
		name         string
		lock, holder string
		ttl          time.Duration
		want         string
	}{
		{name: "complete", lock: "pool/p", holder: "r1", ttl: time.Second},
		{name: "no name", holder: "r1", ttl: time.Second, want: `try lock "": name, holder and a positive ttl are required`},
		{name: "no holder", lock: "reaper", ttl: time.Second, want: `try lock "reaper": name, holder and a positive ttl are required`},
		{name: "zero ttl", lock: "reaper", holder: "r1", want: `try lock "reaper": name, holder and a positive ttl are required`},
		{name: "negative ttl", lock: "reaper", holder: "r1", ttl: -time.Second, want: `try lock "reaper": name, holder and a positive ttl are required`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assertCheck(t, warmpool.CheckLock(tc.lock, tc.holder, tc.ttl), tc.want)
		})
	}
}

func TestLeaseFilter_Matches(t *testing.T) {
	l := warmpool.Lease{ID: "sbx-1", Pool: "p", Owner: "o", State: warmpool.LeaseActive,
		Labels: map[string]string{"run": "a", "k": "v"}, ExpiresAt: checkNow}
	tests := []struct {
		name string
		f    warmpool.LeaseFilter
		want bool
	}{
		{name: "zero filter", f: warmpool.LeaseFilter{}, want: true},
		{name: "every field", f: warmpool.LeaseFilter{Pool: "p", Owner: "o", State: warmpool.LeaseActive,
			Labels: map[string]string{"run": "a"}, ExpiresBefore: checkNow.Add(time.Nanosecond), Limit: 1}, want: true},
		{name: "other pool", f: warmpool.LeaseFilter{Pool: "q"}},
		{name: "other owner", f: warmpool.LeaseFilter{Owner: "x"}},
		{name: "other state", f: warmpool.LeaseFilter{State: warmpool.LeaseReleased}},
		{name: "label value differs", f: warmpool.LeaseFilter{Labels: map[string]string{"run": "b"}}},
		{name: "label missing", f: warmpool.LeaseFilter{Labels: map[string]string{"other": ""}}},
		{name: "expires at the bound", f: warmpool.LeaseFilter{ExpiresBefore: checkNow}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, tc.f.Matches(l))
		})
	}
	ended := l
	ended.State = warmpool.LeaseExpired
	assert.False(t, warmpool.LeaseFilter{ExpiresBefore: checkNow.Add(time.Hour)}.Matches(ended), "ExpiresBefore selects active leases only")
}

// assertCheck asserts that err is nil when want is "", else that its
// message is want.
func assertCheck(t *testing.T, err error, want string) {
	t.Helper()
	if want == "" {
		assert.NoError(t, err)
		return
	}
	assert.EqualError(t, err, want)
}
