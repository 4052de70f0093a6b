package storetest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/warmpool"
)

// Options sets the scale of the race tests. Zero fields take the defaults
// noted on each field.
type Options struct {
	// RaceTasks is how many ready tasks the claim race starts with (100).
	RaceTasks int
	// RaceClaims is how many claims the race attempts in total (200).
	RaceClaims int
	// RaceClaimers is how many goroutines claim at once (32).
	RaceClaimers int
	// Replicas is how many store handles the claimers are spread over (1),
	// as several gateway replicas share one store.
	Replicas int
	// NewReplica opens another handle onto the same data as s (a second
	// client of the same table), closed by the test's cleanup. Nil means
	// every replica shares s (the embedded store is single-node).
	NewReplica func(t *testing.T, s warmpool.Store) warmpool.Store
}

func (o Options) withDefaults() Options {
	if o.RaceTasks <= 0 {
		o.RaceTasks = 100
	}
	if o.RaceClaims <= 0 {
		o.RaceClaims = 200
	}
	if o.RaceClaimers <= 0 {
		o.RaceClaimers = 32
	}
	if o.Replicas <= 0 {
		o.Replicas = 1
	}
	return o
}

// base is the suite's clock: stores must only use the times they are given.
var base = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

// Run runs the conformance suite. newStore returns a new, empty store for
// one subtest and registers its own cleanup (which must tolerate a store
// the suite has already closed).
func Run(t *testing.T, newStore func(t *testing.T) warmpool.Store, opts Options) {
	opts = opts.withDefaults()
	tests := []struct {
		name string
		fn   func(t *testing.T, s warmpool.Store)
	}{
		{"ReserveTasks_WithinMaxCreatesLaunching", testReserveWithinMax},
		{"ReserveTasks_OverMaxCreatesNone", testReserveOverMax},
		{"ReserveTasks_DuplicateIDCreatesNone", testReserveDuplicate},
		{"ReserveTasks_PoolsCountSeparately", testReservePools},
		{"UpdateTask_IncrementsVersion", testUpdateTask},
		{"UpdateTask_StaleVersionConflicts", testUpdateTaskConflict},
		{"UpdateTask_UnknownNotFound", testUpdateTaskUnknown},
		{"UpdateTask_OtherPreviousStateConflicts", testUpdateTaskFrom},
		{"DeleteTask_FreesSlotAndIsIdempotent", testDeleteTask},
		{"DeleteTask_AnyStateWhateverTheCallerSaw", testDeleteTaskAnyState},
		{"GetTask_ReadsOneRecord", testGetTask},
		{"CountTasks_FollowEveryWrite", testCounts},
		{"ReserveTasks_AtMostMaxReserve", testReserveLimit},
		{"ListTasks_ByPoolAndAll", testListTasks},
		{"ListTasksPage_WalksEveryRecordOnce", testListTasksPage},
		{"Claim_OnlyReadyTasks", testClaimReadyOnly},
		{"Claim_FillsLeaseAndTask", testClaimFills},
		{"Claim_ByTaskID", testClaimByTaskID},
		{"Claim_SpecPassesOverAndRetiresOtherSpecs", testClaimSpec},
		{"Claim_SpecOnlyStaleRetiresThemAndFindsNone", testClaimSpecOnlyStale},
		{"Claim_SpecByTaskIDRefusesAnotherSpec", testClaimSpecByID},
		{"TaskRecord_SpecSetAtReserveNeverChanges", testSpecKept},
		{"Claim_NeverGrantsATaskTwice", testClaimDistinct},
		{"Claim_DuplicateLeaseIDConflicts", testClaimDuplicateLease},
		{"Claim_IdempotencyKeyReplaysPerOwner", testClaimIdempotency},
		{"Claim_ForgottenIdempotencyKeyClaimsAgain", testClaimForgetKey},
		{"Lease_EnvOnlyFromClaim", testLeaseEnv},
		{"LeaseByKey_NamesTheKeysLease", testLeaseByKey},
		{"RenewLease_BeforeExpiryExtends", testRenew},
		{"RenewLease_ZeroExpiryRenewsByTheDuration", testRenewByDuration},
		{"RenewLease_RefusesExpiredEndedOtherOwnerUnknown", testRenewRefusals},
		{"EndLease_MovesTaskToStopping", testEndLease},
		{"EndLease_TwiceReturnsLeaseEnded", testEndLeaseTwice},
		{"EndLease_OnlyIfExpiredLetsHeartbeatWin", testEndLeaseOnlyIfExpired},
		{"EndLease_OtherOwnerAndUnknown", testEndLeaseRefusals},
		{"EndLease_WithTheCallersCopy", testEndLeaseWithCopy},
		{"ListLeases_Filters", testListLeases},
		{"PurgeLeases_DeletesEndedBefore", testPurge},
		{"TryLock_ExpiringLockMovesBetweenHolders", testLock},
		{"BadArguments_RefusedWithTheContractsChecks", testBadArguments},
		{"CanceledContext_ClaimsNothing", testCanceled},
		{"Close_LaterCallsReturnErrClosed", testClose},
	}
	tests = append(tests, poolTests(opts)...)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, newStore(t)) })
	}
	t.Run("Race_ClaimsNeverGrantATaskTwice", func(t *testing.T) { testRaceClaims(t, newStore(t), opts) })
	t.Run("Race_ReserveNeverExceedsMaxTotal", func(t *testing.T) { testRaceReserve(t, newStore(t), opts) })
	t.Run("Race_SameIdempotencyKeyOneLease", func(t *testing.T) { testRaceIdempotency(t, newStore(t), opts) })
	t.Run("Race_OneLockHolder", func(t *testing.T) { testRaceLock(t, newStore(t), opts) })
	t.Run("Race_CountsStayRight", func(t *testing.T) { testRaceCounts(t, newStore(t), opts) })
}

// --- helpers ---

func newTask(pool string) warmpool.TaskRecord {
	id := warmpool.NewTaskID()
	return warmpool.TaskRecord{
		ID: id, Pool: pool, Provider: "fake", CreatedAt: base, UpdatedAt: base,
		LaunchDeadline: base.Add(time.Minute),
	}
}

func newLease(owner string) warmpool.Lease {
	return warmpool.Lease{
		ID: warmpool.NewLeaseID(), Owner: owner, Duration: time.Minute,
		ExpiresAt: base.Add(time.Minute), Labels: map[string]string{"run": "a"}, Env: map[string]string{"A": "1"},
	}
}

// reserve reserves n launching tasks in pool (no max_total to speak of).
func reserve(t *testing.T, s warmpool.Store, pool string, n int) []warmpool.TaskRecord {
	t.Helper()
	var recs []warmpool.TaskRecord
	for i := 0; i < n; i++ {
		recs = append(recs, newTask(pool))
	}
	for start := 0; start < n; start += 25 {
		require.NoError(t, s.ReserveTasks(t.Context(), pool, math.MaxInt32, recs[start:min(start+25, n)]))
	}
	for i := range recs {
		recs[i].State = warmpool.TaskLaunching
		recs[i].Version = 1
	}
	return recs
}

// setState moves rec to state (with an agent address for ready tasks).
func setState(t *testing.T, s warmpool.Store, rec warmpool.TaskRecord, state warmpool.TaskState) warmpool.TaskRecord {
	t.Helper()
	from := rec.State
	rec.State = state
	if rec.AgentURL == "" {
		rec.ProviderID = "p-" + rec.ID
		rec.AgentURL = "http://127.0.0.1:1/" + rec.ID
		rec.AgentToken = "token-" + rec.ID
	}
	out, err := s.UpdateTask(t.Context(), rec, from)
	require.NoError(t, err)
	return out
}

// ready creates n ready tasks in pool.
func ready(t *testing.T, s warmpool.Store, pool string, n int) []warmpool.TaskRecord {
	t.Helper()
	recs := reserve(t, s, pool, n)
	for i := range recs {
		recs[i] = setState(t, s, recs[i], warmpool.TaskReady)
	}
	return recs
}

func claim(t *testing.T, s warmpool.Store, pool string, l warmpool.Lease) warmpool.ClaimResult {
	t.Helper()
	res, err := s.Claim(t.Context(), warmpool.ClaimRequest{Pool: pool, Lease: l, Now: base})
	require.NoError(t, err)
	return res
}

// tasksByState counts the pool's tasks per state.
func tasksByState(t *testing.T, s warmpool.Store, pool string) map[warmpool.TaskState]int {
	t.Helper()
	recs, err := s.ListTasks(t.Context(), pool)
	require.NoError(t, err)
	out := map[warmpool.TaskState]int{}
	for _, r := range recs {
		out[r.State]++
	}
	return out
}

func findTask(t *testing.T, s warmpool.Store, id string) (warmpool.TaskRecord, bool) {
	t.Helper()
	recs, err := s.ListTasks(t.Context(), "")
	require.NoError(t, err)
	for _, r := range recs {
		if r.ID == id {
			return r, true
		}
	}
	return warmpool.TaskRecord{}, false
}

func assertTime(t *testing.T, want, got time.Time, field string) {
	t.Helper()
	assert.Truef(t, want.Equal(got), "%s: want %s, got %s", field, want, got)
}

func leaseIDs(ls []warmpool.Lease) []string {
	ids := make([]string, len(ls))
	for i, l := range ls {
		ids[i] = l.ID
	}
	return ids
}

// --- tasks ---

func testReserveWithinMax(t *testing.T, s warmpool.Store) {
	recs := []warmpool.TaskRecord{newTask("p"), newTask("p")}
	require.NoError(t, s.ReserveTasks(t.Context(), "p", 2, recs))
	got, err := s.ListTasks(t.Context(), "p")
	require.NoError(t, err)
	require.Len(t, got, 2)
	for _, r := range got {
		assert.Equal(t, warmpool.TaskLaunching, r.State)
		assert.Equal(t, "p", r.Pool)
		assert.Positive(t, r.Version)
	}
	assert.ElementsMatch(t, []string{recs[0].ID, recs[1].ID}, []string{got[0].ID, got[1].ID})
}

func testReserveOverMax(t *testing.T, s warmpool.Store) {
	require.NoError(t, s.ReserveTasks(t.Context(), "p", 3, []warmpool.TaskRecord{newTask("p")}))
	err := s.ReserveTasks(t.Context(), "p", 3, []warmpool.TaskRecord{newTask("p"), newTask("p"), newTask("p")})
	require.ErrorIs(t, err, warmpool.ErrNoCapacity)
	assert.Equal(t, 1, tasksByState(t, s, "p")[warmpool.TaskLaunching], "all or none: nothing of the refused batch is created")
	require.NoError(t, s.ReserveTasks(t.Context(), "p", 3, []warmpool.TaskRecord{newTask("p"), newTask("p")}), "exactly max_total fits")
	require.ErrorIs(t, s.ReserveTasks(t.Context(), "p", 3, []warmpool.TaskRecord{newTask("p")}), warmpool.ErrNoCapacity)
}

func testReserveDuplicate(t *testing.T, s warmpool.Store) {
	first := newTask("p")
	require.NoError(t, s.ReserveTasks(t.Context(), "p", 10, []warmpool.TaskRecord{first}))
	err := s.ReserveTasks(t.Context(), "p", 10, []warmpool.TaskRecord{newTask("p"), first})
	require.ErrorIs(t, err, warmpool.ErrConflict)
	assert.Len(t, mustList(t, s, "p"), 1, "all or none: the new record of the refused batch is not created")
}

func mustList(t *testing.T, s warmpool.Store, pool string) []warmpool.TaskRecord {
	t.Helper()
	recs, err := s.ListTasks(t.Context(), pool)
	require.NoError(t, err)
	return recs
}

func testReservePools(t *testing.T, s warmpool.Store) {
	require.NoError(t, s.ReserveTasks(t.Context(), "a", 1, []warmpool.TaskRecord{newTask("a")}))
	require.NoError(t, s.ReserveTasks(t.Context(), "b", 1, []warmpool.TaskRecord{newTask("b")}), "pool b has its own max_total")
	require.ErrorIs(t, s.ReserveTasks(t.Context(), "a", 1, []warmpool.TaskRecord{newTask("a")}), warmpool.ErrNoCapacity)
}

func testUpdateTask(t *testing.T, s warmpool.Store) {
	rec := reserve(t, s, "p", 1)[0]
	rec.ProviderID = "prov-1"
	rec.AgentURL = "http://127.0.0.1:9"
	rec.AgentToken = "secret"
	out, err := s.UpdateTask(t.Context(), rec, warmpool.TaskLaunching)
	require.NoError(t, err)
	assert.Equal(t, rec.Version+1, out.Version)
	assert.Equal(t, "prov-1", out.ProviderID)
	stored := mustList(t, s, "p")
	require.Len(t, stored, 1)
	assert.Equal(t, out.Version, stored[0].Version)
	assert.Equal(t, "secret", stored[0].AgentToken)
}

func testUpdateTaskConflict(t *testing.T, s warmpool.Store) {
	rec := reserve(t, s, "p", 1)[0]
	_ = setState(t, s, rec, warmpool.TaskReady)
	rec.State = warmpool.TaskStopping // rec still carries the old version
	_, err := s.UpdateTask(t.Context(), rec, warmpool.TaskLaunching)
	require.ErrorIs(t, err, warmpool.ErrConflict)
	assert.Equal(t, 1, tasksByState(t, s, "p")[warmpool.TaskReady], "the losing write changed nothing")
}

func testUpdateTaskUnknown(t *testing.T, s warmpool.Store) {
	rec := newTask("p")
	rec.State = warmpool.TaskReady
	rec.Version = 1
	_, err := s.UpdateTask(t.Context(), rec, warmpool.TaskLaunching)
	require.ErrorIs(t, err, warmpool.ErrNotFound)
}

func testUpdateTaskFrom(t *testing.T, s warmpool.Store) {
	rec := reserve(t, s, "p", 1)[0] // launching, version 1
	rec.State = warmpool.TaskStopping
	_, err := s.UpdateTask(t.Context(), rec, warmpool.TaskReady) // the version matches, the state does not
	require.ErrorIs(t, err, warmpool.ErrConflict)
	assert.Equal(t, warmpool.TaskCounts{Launching: 1}, counts(t, s, "p"), "the refused write moved no count")
	stored, err := s.GetTask(t.Context(), rec.ID)
	require.NoError(t, err)
	assert.Equal(t, warmpool.TaskLaunching, stored.State)
	assert.Equal(t, int64(1), stored.Version)
}

func testDeleteTask(t *testing.T, s warmpool.Store) {
	rec := newTask("p")
	require.NoError(t, s.ReserveTasks(t.Context(), "p", 1, []warmpool.TaskRecord{rec}))
	require.NoError(t, s.DeleteTask(t.Context(), rec))
	require.NoError(t, s.DeleteTask(t.Context(), rec), "deleting again is a no-op")
	require.NoError(t, s.DeleteTask(t.Context(), warmpool.TaskRecord{ID: "tsk-unknown", Pool: "p"}))
	assert.Empty(t, mustList(t, s, "p"))
	require.NoError(t, s.ReserveTasks(t.Context(), "p", 1, []warmpool.TaskRecord{newTask("p")}), "the slot is free again")

	readyRec := ready(t, s, "q", 1)[0]
	require.NoError(t, s.DeleteTask(t.Context(), readyRec))
	_, err := s.Claim(t.Context(), warmpool.ClaimRequest{Pool: "q", Lease: newLease("o"), Now: base})
	require.ErrorIs(t, err, warmpool.ErrNoCapacity, "a deleted ready task is not claimable")
}

// counts reads the pool's counts.
func counts(t *testing.T, s warmpool.Store, pool string) warmpool.TaskCounts {
	t.Helper()
	c, err := s.CountTasks(t.Context(), pool)
	require.NoError(t, err)
	return c
}

// assertCounts checks that the pool's counts are what its records say.
func assertCounts(t *testing.T, s warmpool.Store, pool string, want warmpool.TaskCounts, step string) {
	t.Helper()
	assert.Equal(t, want, counts(t, s, pool), "%s: counts", step)
	assert.Equal(t, warmpool.CountStates(mustList(t, s, pool)), counts(t, s, pool), "%s: counts agree with the records", step)
}

func testDeleteTaskAnyState(t *testing.T, s warmpool.Store) {
	recs := reserve(t, s, "p", 3)
	readyRec := setState(t, s, recs[1], warmpool.TaskReady)
	stopping := setState(t, s, recs[2], warmpool.TaskStopping)
	seen := readyRec
	seen.State = warmpool.TaskStopping // the caller's view is stale
	require.NoError(t, s.DeleteTask(t.Context(), seen))
	require.NoError(t, s.DeleteTask(t.Context(), recs[0]))
	require.NoError(t, s.DeleteTask(t.Context(), stopping))
	assert.Empty(t, mustList(t, s, "p"))
	assertCounts(t, s, "p", warmpool.TaskCounts{}, "all deleted")
}

func testGetTask(t *testing.T, s warmpool.Store) {
	rec := setState(t, s, reserve(t, s, "p", 1)[0], warmpool.TaskReady)
	got, err := s.GetTask(t.Context(), rec.ID)
	require.NoError(t, err)
	assert.Equal(t, rec.ID, got.ID)
	assert.Equal(t, "p", got.Pool)
	assert.Equal(t, warmpool.TaskReady, got.State)
	assert.Equal(t, rec.Version, got.Version)
	assert.Equal(t, rec.AgentURL, got.AgentURL)
	_, err = s.GetTask(t.Context(), "tsk-unknown")
	require.ErrorIs(t, err, warmpool.ErrNotFound)
}

// testCounts follows one task through its life (and a second pool beside
// it): every write moves the counts, a refused write moves none.
func testCounts(t *testing.T, s warmpool.Store) {
	assertCounts(t, s, "p", warmpool.TaskCounts{}, "empty")
	recs := []warmpool.TaskRecord{newTask("p"), newTask("p"), newTask("p")} // max_total 3 throughout
	require.NoError(t, s.ReserveTasks(t.Context(), "p", 3, recs))
	for i := range recs {
		recs[i].State, recs[i].Version = warmpool.TaskLaunching, 1
	}
	_ = reserve(t, s, "q", 2)
	assertCounts(t, s, "p", warmpool.TaskCounts{Launching: 3}, "reserved")
	assertCounts(t, s, "q", warmpool.TaskCounts{Launching: 2}, "another pool")
	require.ErrorIs(t, s.ReserveTasks(t.Context(), "p", 3, []warmpool.TaskRecord{newTask("p")}), warmpool.ErrNoCapacity)
	assertCounts(t, s, "p", warmpool.TaskCounts{Launching: 3}, "refused reservation")

	a := setState(t, s, recs[0], warmpool.TaskReady)
	b := setState(t, s, recs[1], warmpool.TaskReady)
	assertCounts(t, s, "p", warmpool.TaskCounts{Launching: 1, Ready: 2}, "ready")
	again := recs[0] // stale: version 1, launching
	again.State = warmpool.TaskStopping
	_, err := s.UpdateTask(t.Context(), again, warmpool.TaskLaunching)
	require.ErrorIs(t, err, warmpool.ErrConflict)
	assertCounts(t, s, "p", warmpool.TaskCounts{Launching: 1, Ready: 2}, "refused update")

	res := claim(t, s, "p", newLease("o"))
	assertCounts(t, s, "p", warmpool.TaskCounts{Launching: 1, Ready: 1, Leased: 1}, "claimed")
	byID, err := s.Claim(t.Context(), warmpool.ClaimRequest{Pool: "p", TaskID: recs[2].ID, Lease: newLease("o"), Now: base})
	require.NoError(t, err)
	assertCounts(t, s, "p", warmpool.TaskCounts{Ready: 1, Leased: 2}, "claimed a launching task by id")
	_, err = s.Claim(t.Context(), warmpool.ClaimRequest{Pool: "p", Lease: res.Lease, Now: base})
	require.ErrorIs(t, err, warmpool.ErrConflict)
	assertCounts(t, s, "p", warmpool.TaskCounts{Ready: 1, Leased: 2}, "refused claim")

	_, err = s.EndLease(t.Context(), res.Lease.ID, warmpool.LeaseEnd{State: warmpool.LeaseReleased, Now: base})
	require.NoError(t, err)
	assertCounts(t, s, "p", warmpool.TaskCounts{Ready: 1, Leased: 1, Stopping: 1}, "ended")
	_, err = s.EndLease(t.Context(), res.Lease.ID, warmpool.LeaseEnd{State: warmpool.LeaseReleased, Now: base})
	require.ErrorIs(t, err, warmpool.ErrLeaseEnded)
	assertCounts(t, s, "p", warmpool.TaskCounts{Ready: 1, Leased: 1, Stopping: 1}, "ended twice")

	stopped, err := s.GetTask(t.Context(), res.Lease.TaskID)
	require.NoError(t, err)
	require.NoError(t, s.DeleteTask(t.Context(), stopped))
	require.NoError(t, s.DeleteTask(t.Context(), stopped))
	assertCounts(t, s, "p", warmpool.TaskCounts{Ready: 1, Leased: 1}, "deleted")
	other := a
	if other.ID == res.Lease.TaskID {
		other = b
	}
	require.NoError(t, s.DeleteTask(t.Context(), other))
	_, err = s.EndLease(t.Context(), byID.Lease.ID, warmpool.LeaseEnd{State: warmpool.LeaseLost, Now: base})
	require.NoError(t, err)
	assertCounts(t, s, "p", warmpool.TaskCounts{Stopping: 1}, "one left")
	assertCounts(t, s, "q", warmpool.TaskCounts{Launching: 2}, "the other pool was left alone")
	require.NoError(t, s.ReserveTasks(t.Context(), "p", 3, []warmpool.TaskRecord{newTask("p"), newTask("p")}), "the freed slots count")
}

// testReserveLimit: a store with a ReserveLimiter takes that many records
// in one call and refuses one more, writing nothing.
func testReserveLimit(t *testing.T, s warmpool.Store) {
	l, ok := s.(warmpool.ReserveLimiter)
	if !ok {
		recs := make([]warmpool.TaskRecord, 500)
		for i := range recs {
			recs[i] = newTask("p")
		}
		require.NoError(t, s.ReserveTasks(t.Context(), "p", math.MaxInt32, recs), "a store without a limit takes a large batch")
		assertCounts(t, s, "p", warmpool.TaskCounts{Launching: 500}, "large batch")
		return
	}
	n := l.MaxReserve()
	require.Positive(t, n)
	recs := make([]warmpool.TaskRecord, n+1)
	for i := range recs {
		recs[i] = newTask("p")
	}
	require.Error(t, s.ReserveTasks(t.Context(), "p", math.MaxInt32, recs), "one record more than MaxReserve")
	assertCounts(t, s, "p", warmpool.TaskCounts{}, "nothing of the refused batch")
	require.NoError(t, s.ReserveTasks(t.Context(), "p", math.MaxInt32, recs[:n]), "MaxReserve records in one call")
	assertCounts(t, s, "p", warmpool.TaskCounts{Launching: n}, "the whole batch")
}

func testListTasks(t *testing.T, s warmpool.Store) {
	a := reserve(t, s, "a", 2)
	b := reserve(t, s, "b", 1)
	assert.Len(t, mustList(t, s, "a"), 2)
	assert.Len(t, mustList(t, s, "b"), 1)
	assert.Len(t, mustList(t, s, ""), 3)
	assert.Empty(t, mustList(t, s, "c"))
	_, ok := findTask(t, s, a[1].ID)
	assert.True(t, ok)
	got, ok := findTask(t, s, b[0].ID)
	require.True(t, ok)
	assert.Equal(t, "b", got.Pool)
}

func testListTasksPage(t *testing.T, s warmpool.Store) {
	a := reserve(t, s, "a", 23)
	_ = reserve(t, s, "b", 4)
	walk := func(pool string, limit int) map[string]int {
		t.Helper()
		seen := map[string]int{}
		cursor := ""
		for pages := 0; ; pages++ {
			require.Less(t, pages, 100, "the walk ends")
			page, err := s.ListTasksPage(t.Context(), pool, cursor, limit)
			require.NoError(t, err)
			require.LessOrEqual(t, len(page.Tasks), limit)
			for _, r := range page.Tasks {
				seen[r.ID]++
				if pool != "" {
					assert.Equal(t, pool, r.Pool)
				}
			}
			if page.Next == "" {
				return seen
			}
			cursor = page.Next
		}
	}
	for _, limit := range []int{1, 7, 23, 100} {
		seen := walk("a", limit)
		assert.Len(t, seen, 23, "limit %d: every record of the pool", limit)
		for _, r := range a {
			assert.Equal(t, 1, seen[r.ID], "limit %d: %s seen once", limit, r.ID)
		}
	}
	assert.Len(t, walk("", 5), 27, "every pool")
	assert.Empty(t, walk("c", 5), "an empty pool")
}

// --- claims ---

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

// --- leases ---

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

// --- races ---

// replicas returns opts.Replicas handles onto s's data.
func replicas(t *testing.T, s warmpool.Store, opts Options) []warmpool.Store {
	out := []warmpool.Store{s}
	for len(out) < opts.Replicas {
		if opts.NewReplica == nil {
			out = append(out, s)
			continue
		}
		out = append(out, opts.NewReplica(t, s))
	}
	return out
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

func testRaceReserve(t *testing.T, s warmpool.Store, opts Options) {
	const maxTotal = 10
	stores := replicas(t, s, opts)
	attempts := max(4*maxTotal, opts.RaceClaimers)
	var ok, full atomic.Int64
	var wg sync.WaitGroup
	for i := 0; i < attempts; i++ {
		wg.Add(1)
		go func(st warmpool.Store) {
			defer wg.Done()
			err := st.ReserveTasks(context.Background(), "race", maxTotal, []warmpool.TaskRecord{newTask("race")})
			switch {
			case err == nil:
				ok.Add(1)
			case errors.Is(err, warmpool.ErrNoCapacity):
				full.Add(1)
			default:
				assert.NoError(t, err)
			}
		}(stores[i%len(stores)])
	}
	wg.Wait()
	assert.Equal(t, int64(maxTotal), ok.Load())
	assert.Equal(t, int64(attempts-maxTotal), full.Load())
	assert.Len(t, mustList(t, s, "race"), maxTotal, "max_total is never exceeded")
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

func testLock(t *testing.T, s warmpool.Store) {
	ctx := t.Context()
	now := time.Now().UTC().Truncate(time.Millisecond)
	const ttl = 10 * time.Second
	name := "pool/" + uniq("lock")

	ok, err := s.TryLock(ctx, name, "a", ttl, now)
	require.NoError(t, err)
	assert.True(t, ok, "a free lock is taken")
	ok, err = s.TryLock(ctx, name, "b", ttl, now.Add(time.Second))
	require.NoError(t, err)
	assert.False(t, ok, "another holder's unexpired lock stands")
	ok, err = s.TryLock(ctx, name, "a", ttl, now.Add(5*time.Second))
	require.NoError(t, err)
	assert.True(t, ok, "the holder renews")
	ok, err = s.TryLock(ctx, name, "b", ttl, now.Add(12*time.Second))
	require.NoError(t, err)
	assert.False(t, ok, "the renewal moved the expiry")
	ok, err = s.TryLock(ctx, name, "b", ttl, now.Add(16*time.Second))
	require.NoError(t, err)
	assert.True(t, ok, "an expired lock passes to another holder")

	require.NoError(t, s.Unlock(ctx, name, "a"), "unlock by a non-holder is a no-op")
	ok, err = s.TryLock(ctx, name, "a", ttl, now.Add(17*time.Second))
	require.NoError(t, err)
	assert.False(t, ok, "b still holds it")
	require.NoError(t, s.Unlock(ctx, name, "b"))
	require.NoError(t, s.Unlock(ctx, name, "b"), "unlock is idempotent")
	ok, err = s.TryLock(ctx, name, "a", ttl, now.Add(17*time.Second))
	require.NoError(t, err)
	assert.True(t, ok, "a released lock is free")
}

func testRaceLock(t *testing.T, s warmpool.Store, opts Options) {
	ctx := t.Context()
	now := time.Now().UTC()
	name := "pool/" + uniq("race-lock")
	stores := replicas(t, s, opts)
	var held atomic.Int32
	var wg sync.WaitGroup
	for i := range opts.RaceClaimers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ok, err := stores[i%len(stores)].TryLock(ctx, name, fmt.Sprintf("holder-%d", i), time.Minute, now)
			assert.NoError(t, err)
			if ok {
				held.Add(1)
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, int32(1), held.Load(), "exactly one holder wins a free lock")
}

// testRaceCounts runs whole task lives at once on every replica (reserve,
// ready, claim, end, delete, with stale updates racing them) and checks
// that the counts end as the records say.
func testRaceCounts(t *testing.T, s warmpool.Store, opts Options) {
	const pool = "race-counts"
	stores := replicas(t, s, opts)
	workers := min(opts.RaceClaimers, 16)
	const lives = 6
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func(st warmpool.Store) {
			defer wg.Done()
			ctx := context.Background()
			for i := range lives {
				rec := newTask(pool)
				if err := st.ReserveTasks(ctx, pool, math.MaxInt32, []warmpool.TaskRecord{rec}); !assert.NoError(t, err) {
					return
				}
				rec.State, rec.Version = warmpool.TaskLaunching, 1
				stale := rec
				rec.State, rec.AgentURL = warmpool.TaskReady, "http://127.0.0.1:1/"+rec.ID
				ready, err := st.UpdateTask(ctx, rec, warmpool.TaskLaunching)
				if !assert.NoError(t, err) {
					return
				}
				stale.State = warmpool.TaskStopping // loses: the version moved on
				_, err = st.UpdateTask(ctx, stale, warmpool.TaskLaunching)
				assert.ErrorIs(t, err, warmpool.ErrConflict)
				switch i % 3 {
				case 0: // stays ready
				case 1: // claimed by id, ended, deleted
					res, err := st.Claim(ctx, warmpool.ClaimRequest{Pool: pool, TaskID: ready.ID, Lease: newLease("o"), Now: base})
					if errors.Is(err, warmpool.ErrConflict) {
						continue // another worker's claim of any task took it
					}
					if !assert.NoError(t, err) {
						return
					}
					_, err = st.EndLease(ctx, res.Lease.ID, warmpool.LeaseEnd{State: warmpool.LeaseReleased, Now: base})
					assert.NoError(t, err)
					assert.NoError(t, st.DeleteTask(ctx, res.Task))
				case 2: // any ready task claimed, then left leased
					_, err := st.Claim(ctx, warmpool.ClaimRequest{Pool: pool, Lease: newLease("o"), Now: base})
					if !errors.Is(err, warmpool.ErrNoCapacity) {
						assert.NoError(t, err)
					}
				}
			}
		}(stores[w%len(stores)])
	}
	wg.Wait()
	got := counts(t, s, pool)
	want := warmpool.CountStates(mustList(t, s, pool))
	assert.Equal(t, want, got, "the counts agree with the records")
	assert.Positive(t, want.Total())
	for _, st := range stores {
		c, err := st.CountTasks(t.Context(), pool)
		require.NoError(t, err)
		assert.Equal(t, want, c, "every replica reads the same counts")
	}
}

// uniq returns a name no earlier run used, for stores whose data outlives a
// test (a shared DynamoDB table).
func uniq(prefix string) string {
	return fmt.Sprintf("%s-%d", prefix, time.Now().UnixNano())
}
