package warmpool_test

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

	"github.com/quarryhq/quarry/providers"
	"github.com/quarryhq/quarry/warmpool"
)

// countingStore wraps the real store of a test and records, by caller,
// the calls that show how much work a pass does; its function fields
// script failures and slow pages.
type countingStore struct {
	warmpool.Store

	mu         sync.Mutex
	ReserveErr func() error  // non-nil error: ReserveTasks fails with it
	PageCap    int           // > 0: pages of at most this many records
	PageDelay  time.Duration // reconciler pages take this long
	reserves   []int         // records per ReserveTasks call
	pages      map[string][]int
	lists      map[string]int
	tryLocks   map[string]int
	inWalk     bool
	renewals   int // TryLock calls of the reconciler while its walk is under way
}

func newCountingStore(s warmpool.Store) *countingStore {
	return &countingStore{Store: s, pages: map[string][]int{}, lists: map[string]int{}, tryLocks: map[string]int{}}
}

func (s *countingStore) ReserveTasks(ctx context.Context, pool string, maxTotal int, recs []warmpool.TaskRecord) error {
	s.mu.Lock()
	s.reserves = append(s.reserves, len(recs))
	fn := s.ReserveErr
	s.mu.Unlock()
	if fn != nil {
		if err := fn(); err != nil {
			return err
		}
	}
	return s.Store.ReserveTasks(ctx, pool, maxTotal, recs)
}

func (s *countingStore) ListTasksPage(ctx context.Context, pool, cursor string, limit int) (warmpool.TaskPage, error) {
	caller := warmpool.CallerOf(ctx)
	s.mu.Lock()
	s.pages[caller] = append(s.pages[caller], limit)
	if caller == warmpool.CallerReconcile && cursor == "" {
		s.inWalk = true
	}
	cap, delay := s.PageCap, s.PageDelay
	s.mu.Unlock()
	if cap > 0 {
		limit = min(limit, cap)
	}
	if caller == warmpool.CallerReconcile && delay > 0 {
		time.Sleep(delay)
	}
	page, err := s.Store.ListTasksPage(ctx, pool, cursor, limit)
	if caller == warmpool.CallerReconcile && err == nil && page.Next == "" {
		s.mu.Lock()
		s.inWalk = false
		s.mu.Unlock()
	}
	return page, err
}

func (s *countingStore) ListTasks(ctx context.Context, pool string) ([]warmpool.TaskRecord, error) {
	s.mu.Lock()
	s.lists[warmpool.CallerOf(ctx)]++
	s.mu.Unlock()
	return s.Store.ListTasks(ctx, pool)
}

func (s *countingStore) TryLock(ctx context.Context, name, holder string, ttl time.Duration, now time.Time) (bool, error) {
	caller := warmpool.CallerOf(ctx)
	s.mu.Lock()
	s.tryLocks[caller]++
	if caller == warmpool.CallerReconcile && s.inWalk {
		s.renewals++
	}
	s.mu.Unlock()
	return s.Store.TryLock(ctx, name, holder, ttl, now)
}

func (s *countingStore) setReserveErr(fn func() error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ReserveErr = fn
}

func (s *countingStore) snapshot() (reserves []int, pages map[string][]int, lists map[string]int, renewals int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	pages = map[string][]int{}
	for k, v := range s.pages {
		pages[k] = append([]int(nil), v...)
	}
	lists = map[string]int{}
	for k, v := range s.lists {
		lists[k] = v
	}
	return append([]int(nil), s.reserves...), pages, lists, s.renewals
}

// newCountingEnv is newEnv with its manager on a countingStore.
func newCountingEnv(t *testing.T, cfg warmpool.Config, pool warmpool.PoolConfig) (*env, *countingStore) {
	var s *countingStore
	e := newEnvSetup(t, cfg, func(e *env) {
		e.wrap = func(st warmpool.Store) warmpool.Store { s = newCountingStore(st); return s }
	}, pool)
	return e, s
}

// limitedStore is a countingStore that takes at most max records per
// ReserveTasks (a warmpool.ReserveLimiter, as the DynamoDB store is).
type limitedStore struct {
	*countingStore
	max int
}

func (s *limitedStore) MaxReserve() int { return s.max }

func (s *limitedStore) ReserveTasks(ctx context.Context, pool string, maxTotal int, recs []warmpool.TaskRecord) error {
	if len(recs) > s.max {
		return errors.New("more records than MaxReserve")
	}
	return s.countingStore.ReserveTasks(ctx, pool, maxTotal, recs)
}

// A refill reserves in chunks within the store's limit, and launches at
// most QUARRY_LAUNCH_CONCURRENCY chunks at once.
func TestManager_Refill_ChunksWithinTheStoresLimit(t *testing.T) {
	cfg := fastConfig()
	cfg.LaunchBudget, cfg.LaunchConcurrency = 8, 2
	var s *limitedStore
	var inFlight, most atomic.Int32
	e := newEnvSetup(t, cfg, func(e *env) {
		e.wrap = func(st warmpool.Store) warmpool.Store {
			s = &limitedStore{countingStore: newCountingStore(st), max: 5}
			return s
		}
		e.prov.setOnLaunch(func(context.Context, providers.Spec, []string) error {
			n := inFlight.Add(1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			time.Sleep(20 * time.Millisecond)
			inFlight.Add(-1)
			return nil
		})
	}, testPool(23, 30))
	e.waitReady(23)
	reserves, _, _, _ := s.snapshot()
	require.NotEmpty(t, reserves)
	for _, n := range reserves {
		assert.LessOrEqual(t, n, 5, "never more records in one call than the store's MaxReserve")
	}
	assert.GreaterOrEqual(t, len(reserves), 5, "23 tasks take at least 5 reservations of 5")
	assert.LessOrEqual(t, most.Load(), int32(2), "at most QUARRY_LAUNCH_CONCURRENCY launch calls at once")
	assert.Zero(t, e.counter("quarry_task_launch_failures_total", nil))
}

// A task's startup deadline starts when the provider launched it: time
// spent queued behind the provider's rate limit (here 90 s, beyond the
// pool's 60 s startup timeout) does not count against it.
func TestManager_Launch_DeadlineStartsAtTheLaunch(t *testing.T) {
	var checks atomic.Int32
	e := newEnvSetup(t, fastConfig(), func(e *env) {
		e.prov.setOnLaunch(func(context.Context, providers.Spec, []string) error {
			e.clock.Advance(90 * time.Second) // queued behind the provider's rate limit
			return nil
		})
		e.agents.setHealthFunc(func(string) error {
			if checks.Add(1) <= 3 { // the agent takes a moment to answer
				return errRefused
			}
			return nil
		})
	}, testPool(1, 2))
	e.waitReady(1)
	assert.Zero(t, e.counter("quarry_task_launch_failures_total", nil), "the task was not given up")
	_, _, launched, _ := e.prov.counts()
	assert.Equal(t, 1, launched)
	recs, err := e.store.ListTasks(t.Context(), "default")
	require.NoError(t, err)
	require.Len(t, recs, 1)
	pt := e.providerTask(recs[0].ID)
	assert.True(t, pt.CreatedAt.Add(60*time.Second).Equal(recs[0].LaunchDeadline),
		"the deadline is the launch plus the startup timeout: %s, launched %s", recs[0].LaunchDeadline, pt.CreatedAt)
}

// A refill that cannot proceed shows in a metric (and a log line), backs
// off, and proceeds once the store answers again.
func TestManager_Refill_BlockedShowsInAMetric(t *testing.T) {
	var fails atomic.Int32
	e := newEnvSetup(t, fastConfig(), func(e *env) {
		e.wrap = func(st warmpool.Store) warmpool.Store {
			s := newCountingStore(st)
			// Before the manager starts: its first refill comes at once
			// (set after New, it sometimes raced it and reserved both
			// tasks: the metric stayed 0, 1 run in 20).
			s.setReserveErr(func() error {
				if fails.Add(1) <= 3 {
					return warmpool.ErrUnavailable
				}
				return nil
			})
			return s
		}
	}, testPool(2, 4))
	e.waitReady(2)
	assert.GreaterOrEqual(t, e.counter("quarry_refill_blocked_total", map[string]string{"pool": "default", "reason": "store"}), 1.0)
}

// blockLaunches makes the fake provider's launches wait until the
// returned function is called (or their ctx ends).
func blockLaunches(e *env) (release func()) {
	ch := make(chan struct{})
	var once sync.Once
	e.prov.setOnLaunch(func(ctx context.Context, _ providers.Spec, _ []string) error {
		select {
		case <-ch:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	release = func() { once.Do(func() { close(ch) }) }
	e.t.Cleanup(release)
	return release
}

// acquireAsync runs an acquire in a goroutine; its result arrives on the
// returned channel.
type acquired struct {
	l   warmpool.Lease
	err error
	at  time.Time
}

func acquireAsync(ctx context.Context, e *env, owner string) <-chan acquired {
	ch := make(chan acquired, 1)
	go func() {
		l, _, err := e.m.Acquire(ctx, warmpool.AcquireRequest{Pool: "default", Owner: owner})
		ch <- acquired{l: l, err: err, at: time.Now()}
	}()
	return ch
}

func (e *env) waitQueued(n int) {
	e.t.Helper()
	require.Eventually(e.t, func() bool {
		return e.counter("quarry_acquire_queue_length", map[string]string{"pool": "default"}) == float64(n)
	}, waitFor, tick, "%d acquires never waited", n)
}

// Acquires that find no ready task wait in a bounded queue: beyond
// QUARRY_ACQUIRE_QUEUE one fails at once, and the waiting ones get their
// tasks once the launches go through.
func TestManager_AcquireQueue_Bounded(t *testing.T) {
	cfg := fastConfig()
	cfg.AcquireQueue = 2
	e := newEnv(t, cfg, testPool(0, 5))
	release := blockLaunches(e)
	a, b := acquireAsync(t.Context(), e, "a"), acquireAsync(t.Context(), e, "b")
	e.waitQueued(2)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	start := time.Now()
	_, _, err := e.m.Acquire(ctx, warmpool.AcquireRequest{Pool: "default", Owner: "c"})
	require.ErrorIs(t, err, warmpool.ErrNoCapacity)
	assert.Less(t, time.Since(start), time.Second, "refused at once, not after a wait")
	assert.Equal(t, 1.0, e.counter("quarry_acquire_queue_full_total", map[string]string{"pool": "default"}))
	release()
	for _, ch := range []<-chan acquired{a, b} {
		got := <-ch
		require.NoError(t, got.err)
		assert.Equal(t, warmpool.LeaseActive, got.l.State)
	}
	assert.Equal(t, 2.0, e.counter("quarry_acquires_total", map[string]string{"outcome": "cold"}))
}

// Each waiting acquire keeps its own deadline: one that gives up while
// launches are throttled gets no_capacity (retryable), and the others wait
// on.
func TestManager_AcquireQueue_OwnDeadlines(t *testing.T) {
	e := newEnv(t, fastConfig(), testPool(0, 4))
	release := blockLaunches(e)
	patient := acquireAsync(t.Context(), e, "patient")
	e.waitQueued(1)
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	_, _, err := e.m.Acquire(ctx, warmpool.AcquireRequest{Pool: "default", Owner: "hasty"})
	require.ErrorIs(t, err, warmpool.ErrNoCapacity, "its own deadline passed while launches were held")
	select {
	case got := <-patient:
		t.Fatalf("the patient acquire returned early: %+v", got)
	default:
	}
	release()
	got := <-patient
	require.NoError(t, got.err)
	assert.Equal(t, "patient", got.l.Owner)
}

// Waiting acquires are served first come, first served, each by any task
// that becomes ready: here the task launched for the second acquire
// becomes ready first, and goes to the first.
func TestManager_AcquireQueue_FIFOAndAnyReadyTask(t *testing.T) {
	healthy := map[string]bool{}
	var mu sync.Mutex
	e := newEnvSetup(t, fastConfig(), func(e *env) {
		e.agents.setHealthFunc(func(url string) error {
			mu.Lock()
			defer mu.Unlock()
			if !healthy[url] {
				return errRefused
			}
			return nil
		})
	}, testPool(0, 4))
	allow := func(providerID string) {
		pt, ok := e.prov.task(providerID)
		require.True(t, ok, providerID)
		mu.Lock()
		healthy[pt.AgentURL] = true
		mu.Unlock()
	}
	first := acquireAsync(t.Context(), e, "first")
	require.Eventually(t, func() bool { _, _, n, _ := e.prov.counts(); return n == 1 }, waitFor, tick)
	second := acquireAsync(t.Context(), e, "second")
	require.Eventually(t, func() bool { _, _, n, _ := e.prov.counts(); return n == 2 }, waitFor, tick)
	allow("proc-2") // the second acquire's launch
	a := <-first
	require.NoError(t, a.err)
	assert.Equal(t, "first", a.l.Owner)
	pt, ok := e.prov.task("proc-2")
	require.True(t, ok)
	assert.Equal(t, pt.Name, a.l.TaskID, "the first waiter took the first task that became ready")
	allow("proc-1")
	b := <-second
	require.NoError(t, b.err)
	pt, _ = e.prov.task("proc-1")
	assert.Equal(t, pt.Name, b.l.TaskID)
}

// A waiting acquire takes a task that becomes ready anywhere (here
// another replica's, written straight to the store), not only one
// launched for it.
func TestManager_AcquireQueue_TakesATaskMadeReadyElsewhere(t *testing.T) {
	e := newEnv(t, fastConfig(), testPool(0, 3))
	blockLaunches(e) // this replica's launches never return
	got := acquireAsync(t.Context(), e, "alice")
	e.waitQueued(1)

	rec := warmpool.TaskRecord{ID: warmpool.NewTaskID(), Pool: "default", Provider: "fake", Spec: testPool(0, 3).SpecDigest(), CreatedAt: e.clock.Now()}
	require.NoError(t, e.store.ReserveTasks(t.Context(), "default", 3, []warmpool.TaskRecord{rec}))
	e.prov.add(providers.Task{ID: "proc-elsewhere", Name: rec.ID, Pool: "default", AgentURL: "fake://" + rec.ID, AgentToken: "tok-" + rec.ID,
		Labels: map[string]string{providers.LabelManaged: "true", providers.LabelTask: rec.ID}})
	rec.State, rec.Version = warmpool.TaskReady, 1
	rec.ProviderID, rec.AgentURL, rec.AgentToken = "proc-elsewhere", "fake://"+rec.ID, "tok-"+rec.ID
	_, err := e.store.UpdateTask(t.Context(), rec, warmpool.TaskLaunching)
	require.NoError(t, err)

	select {
	case a := <-got:
		require.NoError(t, a.err)
		assert.Equal(t, rec.ID, a.l.TaskID)
	case <-time.After(waitFor):
		t.Fatal("the waiting acquire never took the ready task")
	}
}

// waitWatch waits until the manager watches w's events.
func waitWatch(t *testing.T, w *watchingProvider) {
	t.Helper()
	select {
	case <-w.watches:
	case <-time.After(waitFor):
		t.Fatal("the manager never watched the provider's events")
	}
}

// With a provider that delivers task events, a stopped task is noticed
// from its event: no walk describes the pool's tasks.
func TestManager_Events_StoppedTasksWithoutDescribe(t *testing.T) {
	cfg := fastConfig()
	var w *watchingProvider
	e := newEnvSetup(t, cfg, func(e *env) {
		w = newWatchingProvider(e.prov)
		e.provider = w
	}, testPool(1, 3))
	waitWatch(t, w)
	e.waitReady(1)
	l := e.acquire("alice")
	e.waitReady(1)
	before := e.prov.describeCalls()
	send := func(ev providers.TaskEvent) {
		select {
		case w.events <- ev:
		case <-time.After(waitFor):
			t.Fatal("the manager does not take events")
		}
	}

	pt := e.providerTask(l.TaskID)
	e.prov.kill(pt.ID, "OOMKilled")
	send(providers.TaskEvent{ID: pt.ID, Name: l.TaskID, Pool: "default", State: providers.TaskStopped, Reason: "OOMKilled", At: e.clock.Now()})
	require.Eventually(t, func() bool { return e.storedLease(l.ID).State == warmpool.LeaseLost }, waitFor, tick)
	assert.Contains(t, e.storedLease(l.ID).Reason, "OOMKilled")
	require.Eventually(t, func() bool { _, ok := e.taskRecord(l.TaskID); return !ok }, waitFor, tick, "the dead task's record is deleted")

	recs, err := e.store.ListTasks(t.Context(), "default")
	require.NoError(t, err)
	var ready warmpool.TaskRecord
	for _, r := range recs {
		if r.State == warmpool.TaskReady {
			ready = r
		}
	}
	require.NotEmpty(t, ready.ID)
	e.prov.kill(ready.ProviderID, "node lost")
	send(providers.TaskEvent{ID: ready.ProviderID, Name: ready.ID, Pool: "default", State: providers.TaskStopped, Reason: "node lost"})
	require.Eventually(t, func() bool { _, ok := e.taskRecord(ready.ID); return !ok }, waitFor, tick, "a dead ready task is removed")
	e.waitReady(1)
	send(providers.TaskEvent{ID: "proc-unknown", Name: "tsk-unknown", Pool: "default", State: providers.TaskStopped})

	assert.Equal(t, before, e.prov.describeCalls(), "the events told; nothing was described")
	assert.Equal(t, 2.0, e.counter("quarry_task_events_total", map[string]string{"outcome": "handled"}))
	require.Eventually(t, func() bool {
		return e.counter("quarry_task_events_total", map[string]string{"outcome": "ignored"}) == 1
	}, waitFor, tick, "an event of no known task is ignored")
}

// When a provider's events end for good, the walks describe its tasks
// again, and a task that dies without an event is still noticed.
func TestManager_Events_WatchEndsFallsBackToDescribe(t *testing.T) {
	var w *watchingProvider
	e := newEnvSetup(t, fastConfig(), func(e *env) {
		w = newWatchingProvider(e.prov)
		e.provider = w
	}, testPool(0, 3))
	waitWatch(t, w)
	l := e.acquire("alice")
	walked := e.counter("quarry_walked_tasks_total", map[string]string{"pool": "default"})
	require.Eventually(t, func() bool {
		return e.counter("quarry_walked_tasks_total", map[string]string{"pool": "default"}) >= walked+5
	}, waitFor, tick, "walks ran")
	assert.Zero(t, e.prov.describeCalls(), "while events come, walks describe nothing")

	w.fail <- errors.New("the event queue was deleted")
	e.prov.kill(e.providerTask(l.TaskID).ID, "exit status 137")
	require.Eventually(t, func() bool { return e.storedLease(l.ID).State == warmpool.LeaseLost }, waitFor, tick)
	assert.Positive(t, e.prov.describeCalls(), "the walks described again")
}

// A reconciler pass reads at most QUARRY_SWEEP_BUDGET task records, a page
// at a time, and nothing the manager does lists every task.
func TestManager_Reconciler_PassIsBounded(t *testing.T) {
	cfg := fastConfig()
	cfg.SweepBudget = 4
	e, s := newCountingEnv(t, cfg, testPool(10, 12))
	e.waitReady(10)
	walked := e.counter("quarry_walked_tasks_total", map[string]string{"pool": "default"})
	require.Eventually(t, func() bool {
		return e.counter("quarry_walked_tasks_total", map[string]string{"pool": "default"}) >= walked+30
	}, waitFor, tick, "whole walks ran")
	l := e.acquire("alice")
	_, err := e.m.Release(t.Context(), l.ID, "alice")
	require.NoError(t, err)
	_, err = e.m.Pools(t.Context())
	require.NoError(t, err)

	_, pages, lists, _ := s.snapshot()
	require.NotEmpty(t, pages[warmpool.CallerReconcile])
	for _, limit := range pages[warmpool.CallerReconcile] {
		assert.LessOrEqual(t, limit, 4, "a page within the pass's budget")
	}
	assert.Empty(t, lists, "no manager call lists every task: %v", lists)
}

// A pass that outlasts a third of its lock's TTL renews the lock on the
// way, so that it never runs on after its lock expired.
func TestManager_Reconciler_RenewsItsLockDuringALongPass(t *testing.T) {
	cfg := fastConfig()
	cfg.ReconcileInterval, cfg.LockTTL, cfg.SweepBudget = 50*time.Millisecond, 150*time.Millisecond, 12
	e, s := newCountingEnv(t, cfg, testPool(12, 12))
	e.waitReady(12)
	s.mu.Lock()
	s.PageCap, s.PageDelay = 3, 60*time.Millisecond // a walk of 4 pages: 240 ms, past the 150 ms TTL
	s.mu.Unlock()
	require.Eventually(t, func() bool { _, _, _, n := s.snapshot(); return n >= 2 }, waitFor, tick,
		"the lock was renewed while a walk was under way")
	assert.True(t, lockHeld(t, e.reg, "pool/default"))
}

// The orphan sweep walks the records QUARRY_ORPHAN_BUDGET a pass, lists no
// task store-wide in one go, and stops an orphan once its cycle is done.
func TestManager_OrphanSweep_Incremental(t *testing.T) {
	cfg := fastConfig()
	cfg.OrphanBudget = 2
	e, s := newCountingEnv(t, cfg, testPool(6, 8))
	e.waitReady(6)
	e.prov.add(providers.Task{ID: "proc-orphan", Name: "tsk-gone", Pool: "default", CreatedAt: e.clock.Now(), Labels: map[string]string{
		providers.LabelManaged: "true", providers.LabelGateway: "quarry", providers.LabelTask: "tsk-gone",
	}})
	e.clock.Advance(2 * time.Minute)
	require.Eventually(t, func() bool { pt, _ := e.prov.task("proc-orphan"); return pt.State == providers.TaskStopped }, waitFor, tick)

	_, pages, lists, _ := s.snapshot()
	require.NotEmpty(t, pages[warmpool.CallerOrphans])
	for _, limit := range pages[warmpool.CallerOrphans] {
		assert.LessOrEqual(t, limit, 2, "a page within the sweep's budget")
	}
	assert.Zero(t, lists[warmpool.CallerOrphans], "the sweep never lists every task at once")
	for _, id := range e.prov.stopCalls() {
		assert.Equal(t, "proc-orphan", id, "only the orphan was stopped")
	}
	assert.Equal(t, 1.0, e.counter("quarry_orphan_tasks_stopped_total", nil))
	assert.GreaterOrEqual(t, e.counter("quarry_orphan_walked_tasks_total", nil), 6.0)
}

// gatedCounts is a store whose CountTasks calls wait while the gate is
// shut, counting how many are in flight at once.
type gatedCounts struct {
	warmpool.Store
	mu             sync.Mutex
	shut           chan struct{} // nil: open
	inFlight, most int
}

func (s *gatedCounts) CountTasks(ctx context.Context, pool string) (warmpool.TaskCounts, error) {
	s.mu.Lock()
	s.inFlight++
	s.most = max(s.most, s.inFlight)
	gate := s.shut
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.inFlight--
		s.mu.Unlock()
	}()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return warmpool.TaskCounts{}, ctx.Err()
		}
	}
	return s.Store.CountTasks(ctx, pool)
}

func (s *gatedCounts) state() (inFlight, most int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.inFlight, s.most
}

// Acquires of many pools, all reading their pools' counts at once while
// the store is slow, keep at most QUARRY_COUNT_READS reads in flight; the
// others wait for a slot, and every acquire succeeds once the store
// answers. (The fleet simulation's 2,000 prefetched images timed the store
// out with a read in flight for every waiting pool.)
func TestManager_CountReads_BoundedWhateverThePools(t *testing.T) {
	const pools, slots = 12, 3
	cfg := fastConfig()
	cfg.CountReads = slots
	var cfgs []warmpool.PoolConfig
	for i := range pools {
		p := testPool(0, 1)
		p.Name = fmt.Sprintf("p%d", i)
		cfgs = append(cfgs, p)
	}
	var s *gatedCounts
	e := newEnvSetup(t, cfg, func(e *env) {
		e.wrap = func(st warmpool.Store) warmpool.Store { s = &gatedCounts{Store: st}; return s }
	}, cfgs...)
	gate := make(chan struct{})
	s.mu.Lock()
	s.shut, s.most = gate, 0
	s.mu.Unlock()

	errs := make(chan error, pools)
	for i := range pools {
		go func() {
			_, _, err := e.m.Acquire(t.Context(), warmpool.AcquireRequest{Pool: fmt.Sprintf("p%d", i), Owner: "alice"})
			errs <- err
		}()
	}
	// Every acquire (and maybe a refill) reads counts: slots of them in
	// the store, the others waiting for a slot.
	require.Eventually(t, func() bool {
		in, _ := s.state()
		return in == slots && e.counter("quarry_count_reads_waiting", nil) >= pools-slots
	}, waitFor, time.Millisecond, "reads in flight and waiting")
	_, most := s.state()
	assert.Equal(t, slots, most, "count reads in flight at once")
	close(gate)
	for range pools {
		require.NoError(t, <-errs)
	}
	_, most = s.state()
	assert.LessOrEqual(t, most, slots)
	// The pools' refills read counts too, on their own goroutines: the
	// acquires can return while one still waits for a slot, which it gets
	// now that the store answers.
	require.Eventually(t, func() bool { return e.counter("quarry_count_reads_waiting", nil) == 0 },
		waitFor, tick, "no count read is left waiting")
}
