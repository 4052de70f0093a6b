package storetest

import (
	"fmt"
	"math"
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
		{"PauseLease_MarksAndClears", testPause},
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

func mustList(t *testing.T, s warmpool.Store, pool string) []warmpool.TaskRecord {
	t.Helper()
	recs, err := s.ListTasks(t.Context(), pool)
	require.NoError(t, err)
	return recs
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

// uniq returns a name no earlier run used, for stores whose data outlives a
// test (a shared DynamoDB table).
func uniq(prefix string) string {
	return fmt.Sprintf("%s-%d", prefix, time.Now().UnixNano())
}
