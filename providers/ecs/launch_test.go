package ecs

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/providers"
)

// Cold starts arrive one name per Launch call. One watcher per provider
// polls all their starting tasks together, and while the RunTask rate
// holds them back their names share RunTask calls: neither the
// DescribeTasks nor the RunTask calls grow with the number of Launch
// calls.
func TestProvider_Launch_ConcurrentColdStartsShareOnePollerAndTheirRunTasks(t *testing.T) {
	f := newFake()
	f.runAfter = 4 // each task runs on its 4th description
	cfg := testConfig()
	cfg.PollInterval = 20 * time.Millisecond
	cfg.RunTaskRate, cfg.RunTaskBurst = 20, 1 // one RunTask call every 50 ms
	p := newTestProvider(t, cfg, f)
	ctx := testCtx(t)
	_, err := p.Launch(ctx, testSpec(), []string{"warm-up"}) // registers the task definition
	require.NoError(t, err)
	describesBefore := f.describeCount()
	runsBefore, _, _, _, _, _, _ := f.stats()

	const n = 40
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tasks, err := p.Launch(ctx, testSpec(), []string{fmt.Sprintf("cold-%d", i)})
			if err == nil && len(tasks) != 1 {
				err = fmt.Errorf("%d tasks", len(tasks))
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "launch %d", i)
	}
	describes := f.describeCount() - describesBefore
	runs, _, _, _, _, _, _ := f.stats()
	runs -= runsBefore
	t.Logf("%d cold starts: %d DescribeTasks calls, %d RunTask calls", n, describes, runs)
	assert.Less(t, describes, n, "one watcher describes every starting task in the same calls (a watcher per launch makes at least %d)", 4*n)
	assert.LessOrEqual(t, runs, n/4, "names of concurrent launches share RunTask calls (10 a call)")
}

// Two pools launch at once: the launch queue takes the pools in turn, so a
// small pool's launch is not queued behind a large pool's refill.
func TestProvider_Launch_PoolsTakeTurnsForTheRunTaskRate(t *testing.T) {
	f := newFake()
	cfg := testConfig()
	cfg.RunTaskRate, cfg.RunTaskBurst = 20, 1 // one RunTask call every 50 ms
	p := newTestProvider(t, cfg, f)
	ctx := testCtx(t)
	big, small := testSpec(), testSpec()
	big.Pool, small.Pool = "big", "small"
	_, err := p.Launch(ctx, small, []string{"s-warm-up"}) // registers the task definition
	require.NoError(t, err)
	_, err = p.Launch(ctx, big, []string{"b-warm-up"})
	require.NoError(t, err)

	var wg sync.WaitGroup
	wg.Add(1)
	var bigErr error
	go func() {
		defer wg.Done()
		_, bigErr = p.Launch(ctx, big, names("b", 100)) // 10 RunTask calls
	}()
	require.Eventually(t, func() bool { return slices.Contains(f.runPoolOrder()[2:], "big") }, waitLong, time.Millisecond,
		"the big pool's refill starts")
	_, err = p.Launch(ctx, small, names("s", 10))
	require.NoError(t, err)
	wg.Wait()
	require.NoError(t, bigErr)

	order := f.runPoolOrder()[2:]
	at := slices.Index(order, "small")
	t.Logf("RunTask calls by pool: %v", order)
	require.GreaterOrEqual(t, at, 0)
	assert.LessOrEqual(t, at, 3, "the small pool's batch waits for at most the big pool's batches already under way, not for its whole refill")
	assert.Equal(t, 11, len(order))
}

// The launch queue is bounded: names past Config.MaxQueued are refused
// with ErrThrottled, naming the limit; the others launch.
func TestProvider_Launch_QueueBoundRefusesTheRest(t *testing.T) {
	f := newFake()
	cfg := testConfig()
	cfg.MaxQueued = 2
	p := newTestProvider(t, cfg, f)

	tasks, err := p.Launch(testCtx(t), testSpec(), names("q", 5))
	require.Error(t, err)
	assert.ErrorIs(t, err, providers.ErrThrottled)
	assert.Contains(t, err.Error(), "QUARRY_ECS_MAX_QUEUED")
	assert.Contains(t, err.Error(), `launch task "q-2"`)
	assert.Contains(t, err.Error(), "launch 3 of 5 tasks")
	require.Len(t, tasks, 2)
	assert.Equal(t, []string{"q-0", "q-1"}, []string{tasks[0].Name, tasks[1].Name})
	_, tasksRun, _, _, _, _, _ := f.stats()
	assert.Equal(t, 2, tasksRun)
	assert.Equal(t, 3.0, counterValue(t, p.metrics.refused.WithLabelValues("max_queued")), "the refusals show in a metric")
}

// A Launch whose ctx ends while its names wait in the queue (here for a
// start slot) returns at once, and its names are never started.
func TestProvider_Launch_CancelledWhileQueuedStartsNothing(t *testing.T) {
	f := newFake()
	f.neverRun["slot-holder"] = true
	cfg := testConfig()
	cfg.MaxStarting = 1
	p := newTestProvider(t, cfg, f)
	go func() { _, _ = p.Launch(testCtx(t), testSpec(), []string{"slot-holder"}) }() // ends at Close
	require.Eventually(t, func() bool { _, ok := f.task("slot-holder"); return ok }, waitLong, time.Millisecond)

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	tasks, err := p.Launch(ctx, testSpec(), []string{"queued"})
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Empty(t, tasks)
	assert.Less(t, time.Since(start), 5*time.Second)
	_, ok := f.task("queued")
	assert.False(t, ok, "a name that never left the queue is not started")
}

// Close fails the names still queued and ends the waits of starting
// tasks, which come back pending (they are real).
func TestProvider_Close_EndsQueuedAndStartingLaunches(t *testing.T) {
	f := newFake()
	f.neverRun["starting"] = true
	cfg := testConfig()
	cfg.MaxStarting = 1
	p, err := New(cfg, f, Deps{})
	require.NoError(t, err)
	type result struct {
		tasks []providers.Task
		err   error
	}
	launch := func(name string) chan result {
		ch := make(chan result, 1)
		go func() { ts, err := p.Launch(testCtx(t), testSpec(), []string{name}); ch <- result{ts, err} }()
		return ch
	}
	starting := launch("starting")
	require.Eventually(t, func() bool { _, ok := f.task("starting"); return ok }, waitLong, time.Millisecond)
	_, pushed := p.queue.counts()
	waitingForSlot := launch("waiting-for-slot") // the dispatcher takes it and waits for the slot
	require.Eventually(t, func() bool { q, n := p.queue.counts(); return q == 0 && n == pushed+1 }, waitLong, time.Millisecond)
	queued := launch("queued")
	require.Eventually(t, func() bool { q, n := p.queue.counts(); return q == 1 && n == pushed+2 }, waitLong, time.Millisecond)

	cctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	require.NoError(t, p.Close(cctx))
	r := <-starting
	require.Error(t, r.err)
	assert.Contains(t, r.err.Error(), "provider closed")
	require.Len(t, r.tasks, 1)
	assert.Equal(t, providers.TaskPending, r.tasks[0].State)
	for _, ch := range []chan result{waitingForSlot, queued} {
		r = <-ch
		require.Error(t, r.err)
		assert.Contains(t, r.err.Error(), "provider closed")
		assert.Empty(t, r.tasks)
	}
	for _, name := range []string{"waiting-for-slot", "queued"} {
		_, ok := f.task(name)
		assert.False(t, ok, "%s never started", name)
	}
	_, err = p.Launch(testCtx(t), testSpec(), []string{"after"})
	assert.ErrorContains(t, err, "provider closed")
}

// The start slots are sized for Fargate's launch rate: a burst plus 90 s
// of launches, so starting tasks never hold launches below the rate.
func TestConfig_MaxStartingDefaultsToTheLaunchRateTimesTheSlowestStart(t *testing.T) {
	assert.Equal(t, 100+20*90, Config{}.WithDefaults().MaxStarting)
	assert.Equal(t, 200+50*90, Config{LaunchRate: 50, LaunchBurst: 200}.WithDefaults().MaxStarting)
	assert.Equal(t, 7, Config{MaxStarting: 7}.WithDefaults().MaxStarting)
}

// Names of two Launch calls that share a batch waiting for start slots:
// the one whose ctx ends returns at once, the other keeps waiting.
func TestProvider_Launch_CancelledInASharedBatchReturnsAtOnce(t *testing.T) {
	f := newFake()
	f.neverRun["h0"], f.neverRun["h1"] = true, true
	cfg := testConfig()
	cfg.MaxStarting = 2
	p := newTestProvider(t, cfg, f)
	go func() { _, _ = p.Launch(testCtx(t), testSpec(), []string{"h0", "h1"}) }() // holds both slots until Close
	require.Eventually(t, func() bool { _, ok := f.task("h1"); return ok }, waitLong, time.Millisecond)

	type result struct{ err error }
	launch := func(ctx context.Context, name string) chan result {
		ch := make(chan result, 1)
		go func() { _, err := p.Launch(ctx, testSpec(), []string{name}); ch <- result{err} }()
		return ch
	}
	_, pushed := p.queue.counts()
	cctx, cancelC := context.WithCancel(context.Background())
	c := launch(cctx, "c") // the dispatcher takes it and waits for a slot
	require.Eventually(t, func() bool { q, n := p.queue.counts(); return q == 0 && n == pushed+1 }, waitLong, time.Millisecond)
	actx, cancelA := context.WithCancel(context.Background())
	bctx, cancelB := context.WithCancel(context.Background())
	defer cancelB()
	a, b := launch(actx, "a"), launch(bctx, "b")
	require.Eventually(t, func() bool { q, n := p.queue.counts(); return q == 2 && n == pushed+3 }, waitLong, time.Millisecond)
	cancelC() // the dispatcher gives c up and takes a and b as one batch
	require.ErrorIs(t, (<-c).err, context.Canceled)
	require.Eventually(t, func() bool { return p.queue.len() == 0 }, waitLong, time.Millisecond)

	cancelA()
	select {
	case r := <-a:
		require.ErrorIs(t, r.err, context.Canceled)
	case <-time.After(5 * time.Second):
		t.Fatal("a launch whose ctx ended waits for another launch of its batch")
	}
	select {
	case r := <-b:
		t.Fatalf("b returned: %v", r.err)
	case <-time.After(50 * time.Millisecond):
	}
	cancelB()
	require.ErrorIs(t, (<-b).err, context.Canceled)
	for _, name := range []string{"a", "b", "c"} {
		_, ok := f.task(name)
		assert.False(t, ok, "%s never started", name)
	}
}

// rateFunc is a RateLimiter of a function.
type rateFunc func(ctx context.Context, n int) error

func (f rateFunc) Wait(ctx context.Context, n int) error { return f(ctx, n) }

// A RunTask rate that fails (a shared limiter whose store does not answer)
// admits no launch, and the launch fails as throttled (retryable), saying
// why; nothing is started.
func TestProvider_Launch_AFailingRateLimiterIsThrottled(t *testing.T) {
	f := newFake()
	p, err := New(testConfig(), f, Deps{Rate: rateFunc(func(context.Context, int) error {
		return errors.New("shared run task rate: update rate#ecs-run-task: service unavailable")
	})})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, p.Close(context.Background())) })
	tasks, err := p.Launch(testCtx(t), testSpec(), names("r", 2))
	require.Error(t, err)
	assert.Empty(t, tasks)
	assert.ErrorIs(t, err, providers.ErrThrottled)
	assert.Contains(t, err.Error(), "wait for the run task rate: provider throttled the request: shared run task rate")
	runCalls, _, _, _, _, _, _ := f.stats()
	assert.Zero(t, runCalls)
}
