package warmpool_test

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/internal/badinput"
	"github.com/quarryhq/quarry/providers"
	"github.com/quarryhq/quarry/warmpool"
	"github.com/quarryhq/quarry/warmpool/boltstore"
)

// waitFor is how long a test polls for a condition: generous, because the
// CI machine is busy. Conditions are met in milliseconds when it is not.
const (
	waitFor = 30 * time.Second
	tick    = 5 * time.Millisecond
)

// env is a manager on a real bbolt store with a fake provider and agents.
type env struct {
	t      testing.TB
	m      *warmpool.Manager
	store  *boltstore.Store
	path   string
	prov   *fakeProvider
	agents *fakeAgents
	clock  *fakeClock
	reg    *prometheus.Registry
	cfg    warmpool.Config
	pools  []warmpool.PoolConfig
	// classes are the pool classes of on-demand pools.
	classes []warmpool.ClassConfig
	// wrap, when set, wraps the store the manager uses (not e.store).
	wrap func(warmpool.Store) warmpool.Store
	// provider, when set, is the provider "fake" the manager uses (e.prov
	// with more capabilities).
	provider providers.Provider
	// logger, when set, is the manager's logger.
	logger *slog.Logger
}

func testPool(minWarm, maxTotal int) warmpool.PoolConfig {
	return warmpool.PoolConfig{Name: "default", Provider: "fake", Image: "host", MinWarm: minWarm, MaxTotal: maxTotal}.WithDefaults()
}

// fastConfig reconciles, reaps and sweeps every few milliseconds.
func fastConfig() warmpool.Config {
	return warmpool.Config{
		ReconcileInterval: 10 * time.Millisecond, ReapInterval: 10 * time.Millisecond,
		OrphanInterval: 10 * time.Millisecond, OrphanGrace: time.Minute,
		HealthCheckInterval: time.Hour, AcquireTimeout: waitFor, LaunchBackoff: 10 * time.Millisecond,
		LaunchBackoffMax: 50 * time.Millisecond, SweepInterval: 10 * time.Millisecond,
	}
}

func newEnv(t testing.TB, cfg warmpool.Config, pools ...warmpool.PoolConfig) *env {
	t.Helper()
	return newEnvSetup(t, cfg, nil, pools...)
}

// newEnvSetup is newEnv with a setup of the fakes before the manager starts.
func newEnvSetup(t testing.TB, cfg warmpool.Config, setup func(e *env), pools ...warmpool.PoolConfig) *env {
	t.Helper()
	clock := newFakeClock()
	prov := newFakeProvider(clock)
	e := &env{
		t: t, path: filepath.Join(t.TempDir(), "leases.db"), prov: prov, agents: newFakeAgents(prov),
		clock: clock, cfg: cfg, pools: pools,
	}
	if setup != nil {
		setup(e)
	}
	e.start()
	t.Cleanup(e.stop)
	return e
}

func (e *env) start() {
	t := e.t
	t.Helper()
	s, err := boltstore.Open(e.path, boltstore.Options{})
	require.NoError(t, err)
	e.store = s
	e.reg = prometheus.NewRegistry()
	var store warmpool.Store = s
	if e.wrap != nil {
		store = e.wrap(s)
	}
	var prov providers.Provider = e.prov
	if e.provider != nil {
		prov = e.provider
	}
	m, err := warmpool.New(e.cfg, warmpool.Deps{
		Store: store, Providers: map[string]providers.Provider{"fake": prov}, Pools: e.pools, Classes: e.classes,
		Agents: e.agents, Clock: e.clock, Metrics: e.reg, Logger: e.logger,
	})
	require.NoError(t, err)
	require.NoError(t, m.Start(t.Context()))
	e.m = m
}

func (e *env) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	assert.NoError(e.t, e.m.Close(ctx))
	assert.NoError(e.t, e.store.Close())
}

// restart simulates a gateway restart: a new Manager on the reopened store.
func (e *env) restart() {
	e.stop()
	e.start()
}

func (e *env) acquire(owner string) warmpool.Lease {
	e.t.Helper()
	l, replayed, err := e.m.Acquire(e.t.Context(), warmpool.AcquireRequest{Pool: "default", Owner: owner, Env: map[string]string{"TASK": "1"}})
	require.NoError(e.t, err)
	require.False(e.t, replayed)
	return l
}

func (e *env) status() warmpool.PoolStatus {
	e.t.Helper()
	st, err := e.m.Pools(e.t.Context())
	require.NoError(e.t, err)
	require.Len(e.t, st, 1)
	return st[0]
}

func (e *env) waitReady(n int) {
	e.t.Helper()
	require.Eventually(e.t, func() bool { return e.status().Ready == n }, waitFor, tick, "pool never had %d ready tasks", n)
}

// storedLease reads a lease from the store, as it is (Get presents expiry).
func (e *env) storedLease(id string) warmpool.Lease {
	e.t.Helper()
	l, err := e.store.GetLease(e.t.Context(), id)
	require.NoError(e.t, err)
	return l
}

func (e *env) taskRecord(id string) (warmpool.TaskRecord, bool) {
	e.t.Helper()
	recs, err := e.store.ListTasks(e.t.Context(), "")
	require.NoError(e.t, err)
	for _, r := range recs {
		if r.ID == id {
			return r, true
		}
	}
	return warmpool.TaskRecord{}, false
}

// providerTask returns the provider task of a lease's task.
func (e *env) providerTask(taskID string) providers.Task {
	e.t.Helper()
	pt, ok := e.prov.byName(taskID)
	require.True(e.t, ok, "provider task of %s", taskID)
	return pt
}

func (e *env) counter(name string, labels map[string]string) float64 {
	e.t.Helper()
	return metricValue(e.t, e.reg, name, labels)
}

// metricValue returns the value of the first series of metric name in reg
// whose labels include labels (a histogram's sample count), or 0.
func metricValue(t testing.TB, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	metrics:
		for _, m := range f.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue metrics
				}
			}
			switch {
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				return float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return 0
}

func TestManager_Acquire_WarmClaimsReadyTask(t *testing.T) {
	e := newEnv(t, fastConfig(), testPool(2, 4))
	e.waitReady(2)
	before, err := e.store.ListTasks(t.Context(), "default")
	require.NoError(t, err)
	readyIDs := map[string]bool{}
	for _, r := range before {
		readyIDs[r.ID] = r.State == warmpool.TaskReady
	}

	l, replayed, err := e.m.Acquire(t.Context(), warmpool.AcquireRequest{
		Pool: "default", Owner: "alice", LeaseSeconds: 120, Env: map[string]string{"TASK": "42"}, Labels: map[string]string{"run": "x"},
	})
	require.NoError(t, err)
	assert.False(t, replayed)
	assert.Regexp(t, `^sbx-[a-z2-7]{26}$`, l.ID)
	assert.Equal(t, warmpool.LeaseActive, l.State)
	assert.Equal(t, "alice", l.Owner)
	assert.Equal(t, int64(1), l.Generation)
	assert.Equal(t, 2*time.Minute, l.Duration)
	assert.True(t, e.clock.Now().Add(2*time.Minute).Equal(l.ExpiresAt))
	assert.Equal(t, map[string]string{"run": "x"}, l.Labels)
	assert.True(t, readyIDs[l.TaskID], "a task that was ready was claimed")

	inits := e.agents.initsOf(l.AgentURL)
	require.Len(t, inits, 1)
	assert.Equal(t, agentapi.InitRequest{LeaseID: l.ID, Generation: 1, Env: map[string]string{"TASK": "42"}}, inits[0])
	assert.Equal(t, 1.0, e.counter("quarry_acquires_total", map[string]string{"pool": "default", "outcome": "warm"}))
	assert.Equal(t, 1.0, e.counter("quarry_acquire_duration_seconds", map[string]string{"outcome": "warm"}))

	got, err := e.m.Get(t.Context(), l.ID, "alice")
	require.NoError(t, err)
	assert.Equal(t, l.TaskID, got.TaskID)
	_, err = e.m.Get(t.Context(), l.ID, "mallory")
	require.ErrorIs(t, err, warmpool.ErrNotFound, "another owner's lease is not found")
}

func TestManager_Acquire_EmptyPoolColdStarts(t *testing.T) {
	e := newEnv(t, fastConfig(), testPool(0, 4))
	l := e.acquire("alice")
	assert.Equal(t, warmpool.LeaseActive, l.State)
	pt := e.providerTask(l.TaskID)
	assert.Equal(t, providers.TaskRunning, pt.State)
	assert.Equal(t, "true", pt.Labels[providers.LabelManaged])
	assert.Equal(t, "quarry", pt.Labels[providers.LabelGateway], "tasks carry the gateway id")
	assert.Equal(t, 1.0, e.counter("quarry_acquires_total", map[string]string{"outcome": "cold"}))
	assert.Equal(t, 1.0, e.counter("quarry_task_launches_total", map[string]string{"pool": "default"}))
	rec, ok := e.taskRecord(l.TaskID)
	require.True(t, ok)
	assert.Equal(t, warmpool.TaskLeased, rec.State)
	assert.Equal(t, pt.ID, rec.ProviderID)
	require.Len(t, e.agents.initsOf(l.AgentURL), 1)
}

func TestManager_Acquire_MaxTotalNeverExceededUnderConcurrentAcquires(t *testing.T) {
	tests := []struct {
		name    string
		minWarm int
	}{
		{name: "cold starts only", minWarm: 0},
		{name: "cold starts racing the reconciler", minWarm: 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, fastConfig(), testPool(tc.minWarm, 3))
			e.prov.setStartDelay(20 * time.Millisecond)
			leases := acquireConcurrently(t, 12, func(int) *warmpool.Manager { return e.m })
			tasks := leasedTasks(t, leases)
			assert.Len(t, tasks, 3, "every slot was leased")
			_, maxRunning, _, _ := e.prov.counts()
			assert.LessOrEqual(t, maxRunning, 3, "never more than max_total tasks")
			st := e.status()
			assert.Equal(t, 3, st.Leased)
			assert.LessOrEqual(t, st.Ready+st.Launching+st.Leased+st.Stopping, 3)
		})
	}
}

func TestManager_Acquire_AllLeasedNoCapacity(t *testing.T) {
	e := newEnv(t, fastConfig(), testPool(1, 1))
	_ = e.acquire("alice")
	_, _, err := e.m.Acquire(t.Context(), warmpool.AcquireRequest{Pool: "default", Owner: "bob"})
	require.ErrorIs(t, err, warmpool.ErrNoCapacity)
	assert.Equal(t, 1.0, e.counter("quarry_acquires_total", map[string]string{"outcome": "error"}))
}

func TestManager_Reconciler_RefillsMinWarm(t *testing.T) {
	e := newEnv(t, fastConfig(), testPool(2, 5))
	e.waitReady(2)
	l := e.acquire("alice")
	require.Eventually(t, func() bool {
		st := e.status()
		return st.Ready == 2 && st.Leased == 1 && st.Launching == 0
	}, waitFor, tick)
	running, _, launched, _ := e.prov.counts()
	assert.Equal(t, 3, running)
	assert.Equal(t, 3, launched)
	_, err := e.m.Release(t.Context(), l.ID, "alice")
	require.NoError(t, err)
	require.Eventually(t, func() bool { st := e.status(); return st.Ready == 2 && st.Leased == 0 }, waitFor, tick)
	require.Eventually(t, func() bool {
		return e.counter("quarry_pool_tasks", map[string]string{"state": "ready"}) == 2
	}, waitFor, tick, "the reconciler publishes the pool's counts")
}

func TestManager_Release_StopsAndDeletesTask(t *testing.T) {
	e := newEnv(t, fastConfig(), testPool(0, 2))
	l := e.acquire("alice")

	_, err := e.m.Release(t.Context(), l.ID, "mallory")
	require.ErrorIs(t, err, warmpool.ErrNotFound, "only the owner releases")

	got, err := e.m.Release(t.Context(), l.ID, "alice")
	require.NoError(t, err)
	assert.Equal(t, warmpool.LeaseReleased, got.State)
	assert.Equal(t, providers.TaskStopped, e.providerTask(l.TaskID).State)
	_, ok := e.taskRecord(l.TaskID)
	assert.False(t, ok, "the task record is deleted")
	fenced := false
	for _, in := range e.agents.initsOf(l.AgentURL) {
		fenced = fenced || in.Generation == l.Generation+1
	}
	assert.True(t, fenced, "the agent is fenced before it stops")

	again, err := e.m.Release(t.Context(), l.ID, "alice")
	require.ErrorIs(t, err, warmpool.ErrLeaseEnded)
	assert.Equal(t, warmpool.LeaseReleased, again.State)
	_, err = e.m.Heartbeat(t.Context(), l.ID, "alice")
	require.ErrorIs(t, err, warmpool.ErrLeaseEnded)

	l2 := e.acquire("alice")
	assert.NotEqual(t, l.TaskID, l2.TaskID, "a task is never reused across leases")
}

func TestManager_Heartbeat_ExtendsExpiry(t *testing.T) {
	e := newEnv(t, fastConfig(), testPool(0, 2))
	l, _, err := e.m.Acquire(t.Context(), warmpool.AcquireRequest{Pool: "default", Owner: "alice", LeaseSeconds: 60})
	require.NoError(t, err)

	e.clock.Advance(40 * time.Second)
	got, err := e.m.Heartbeat(t.Context(), l.ID, "alice")
	require.NoError(t, err)
	assert.True(t, e.clock.Now().Add(time.Minute).Equal(got.ExpiresAt), "expiry moves to now + the lease's duration")

	_, err = e.m.Heartbeat(t.Context(), l.ID, "mallory")
	require.ErrorIs(t, err, warmpool.ErrNotFound)
	_, err = e.m.Heartbeat(t.Context(), "sbx-unknown", "alice")
	require.ErrorIs(t, err, warmpool.ErrNotFound)

	e.clock.Advance(50 * time.Second)
	got, err = e.m.Get(t.Context(), l.ID, "alice")
	require.NoError(t, err)
	assert.Equal(t, warmpool.LeaseActive, got.State, "the heartbeat kept it alive past its first expiry")

	e.clock.Advance(11 * time.Second)
	got, err = e.m.Heartbeat(t.Context(), l.ID, "alice")
	require.ErrorIs(t, err, warmpool.ErrLeaseEnded)
	assert.Equal(t, warmpool.LeaseExpired, got.State)
}

func TestManager_SetExpiry_MovesExpiryEitherWay(t *testing.T) {
	e := newEnv(t, fastConfig(), testPool(0, 2))
	l, _, err := e.m.Acquire(t.Context(), warmpool.AcquireRequest{Pool: "default", Owner: "alice", LeaseSeconds: 60})
	require.NoError(t, err)

	e.clock.Advance(10 * time.Second)
	later := e.clock.Now().Add(5 * time.Minute)
	got, err := e.m.SetExpiry(t.Context(), l.ID, "alice", later)
	require.NoError(t, err)
	assert.True(t, later.Equal(got.ExpiresAt), "later")
	assert.Equal(t, time.Minute, got.Duration, "the lease's duration is kept")
	read, err := e.m.Get(t.Context(), l.ID, "alice")
	require.NoError(t, err)
	assert.True(t, later.Equal(read.ExpiresAt), "what Get reads next")

	sooner := e.clock.Now().Add(time.Second)
	got, err = e.m.SetExpiry(t.Context(), l.ID, "alice", sooner)
	require.NoError(t, err)
	assert.True(t, sooner.Equal(got.ExpiresAt), "sooner")

	_, err = e.m.SetExpiry(t.Context(), l.ID, "mallory", later)
	require.ErrorIs(t, err, warmpool.ErrNotFound)
	var bad *badinput.Error
	_, err = e.m.SetExpiry(t.Context(), l.ID, "alice", e.clock.Now())
	require.ErrorAs(t, err, &bad, "not after now")
	_, err = e.m.SetExpiry(t.Context(), l.ID, "alice", e.clock.Now().Add(time.Duration(testPool(0, 2).MaxLeaseSeconds+1)*time.Second))
	require.ErrorAs(t, err, &bad, "past the pool's max_lease_seconds")

	e.clock.Advance(2 * time.Second)
	got, err = e.m.SetExpiry(t.Context(), l.ID, "alice", later)
	require.ErrorIs(t, err, warmpool.ErrLeaseEnded, "it expired")
	assert.Equal(t, warmpool.LeaseExpired, got.State)
}

func TestManager_Reaper_EndsExpiredLeasesAndStopsTasks(t *testing.T) {
	e := newEnv(t, fastConfig(), testPool(0, 2))
	l, _, err := e.m.Acquire(t.Context(), warmpool.AcquireRequest{Pool: "default", Owner: "alice", LeaseSeconds: 60})
	require.NoError(t, err)
	keep, _, err := e.m.Acquire(t.Context(), warmpool.AcquireRequest{Pool: "default", Owner: "alice", LeaseSeconds: 600})
	require.NoError(t, err)

	e.clock.Advance(61 * time.Second)
	require.Eventually(t, func() bool { return e.storedLease(l.ID).State == warmpool.LeaseExpired }, waitFor, tick)
	require.Eventually(t, func() bool { _, ok := e.taskRecord(l.TaskID); return !ok }, waitFor, tick, "the task record is deleted")
	assert.Equal(t, providers.TaskStopped, e.providerTask(l.TaskID).State)
	assert.Equal(t, warmpool.LeaseActive, e.storedLease(keep.ID).State, "an unexpired lease is kept")
	assert.Equal(t, 1.0, e.counter("quarry_leases_reaped_total", nil))

	e.clock.Advance(25 * time.Hour) // past the retention
	require.Eventually(t, func() bool {
		_, err := e.store.GetLease(t.Context(), l.ID)
		return errors.Is(err, warmpool.ErrNotFound)
	}, waitFor, tick, "ended leases are purged after the retention")
}

func TestManager_Reconciler_DetectsLostTask(t *testing.T) {
	e := newEnv(t, fastConfig(), testPool(1, 3))
	l := e.acquire("alice")
	e.prov.kill(e.providerTask(l.TaskID).ID, "OOMKilled")

	require.Eventually(t, func() bool { return e.storedLease(l.ID).State == warmpool.LeaseLost }, waitFor, tick)
	got, err := e.m.Get(t.Context(), l.ID, "alice")
	require.NoError(t, err)
	assert.Equal(t, warmpool.LeaseLost, got.State)
	assert.Contains(t, got.Reason, "OOMKilled")
	require.Eventually(t, func() bool { _, ok := e.taskRecord(l.TaskID); return !ok }, waitFor, tick)

	e.waitReady(1)
	st := e.status()
	ready, err := e.store.ListTasks(t.Context(), "default")
	require.NoError(t, err)
	require.Len(t, ready, st.Ready+st.Launching+st.Leased+st.Stopping)
	e.prov.kill(ready[0].ProviderID, "node lost")
	require.Eventually(t, func() bool { _, ok := e.taskRecord(ready[0].ID); return !ok }, waitFor, tick, "a dead ready task is removed")
	e.waitReady(1)
}

func TestManager_CheckTask_EndsLeaseOfDeadTask(t *testing.T) {
	cfg := fastConfig()
	cfg.ReconcileInterval = time.Hour // only CheckTask notices
	e := newEnv(t, cfg, testPool(0, 2))
	l := e.acquire("alice")

	got, err := e.m.CheckTask(t.Context(), l)
	require.NoError(t, err)
	assert.Equal(t, warmpool.LeaseActive, got.State, "a running task keeps its lease")

	e.prov.kill(e.providerTask(l.TaskID).ID, "exit status 137")
	got, err = e.m.CheckTask(t.Context(), l)
	require.NoError(t, err)
	assert.Equal(t, warmpool.LeaseLost, got.State)
	assert.Contains(t, got.Reason, "exit status 137")
	require.Eventually(t, func() bool { _, ok := e.taskRecord(l.TaskID); return !ok }, waitFor, tick, "the dead task's record is deleted")
}

func TestManager_OrphanSweep_StopsUntrackedTasksAfterGrace(t *testing.T) {
	e := newEnv(t, fastConfig(), testPool(0, 2))
	now := e.clock.Now()
	ours := providers.Task{ID: "proc-orphan", Name: "tsk-gone", Pool: "default", CreatedAt: now, Labels: map[string]string{
		providers.LabelManaged: "true", providers.LabelGateway: "quarry", providers.LabelTask: "tsk-gone",
	}}
	theirs := providers.Task{ID: "proc-theirs", Name: "tsk-theirs", Pool: "default", CreatedAt: now, Labels: map[string]string{
		providers.LabelManaged: "true", providers.LabelGateway: "other-fleet", providers.LabelTask: "tsk-theirs",
	}}
	exited := providers.Task{ID: "proc-exited", Name: "tsk-exited", Pool: "default", CreatedAt: now, State: providers.TaskStopped,
		Labels: map[string]string{providers.LabelManaged: "true", providers.LabelGateway: "quarry", providers.LabelTask: "tsk-exited"}}
	e.prov.add(ours)
	e.prov.add(theirs)
	e.prov.add(exited)      // an exited container no record accounts for: its remains must go too
	l := e.acquire("alice") // a tracked task, which must survive

	_, _, _, calls := e.prov.counts()
	require.Eventually(t, func() bool { _, _, _, c := e.prov.counts(); return c >= calls+3 }, waitFor, tick, "sweeps ran")
	pt, _ := e.prov.task("proc-orphan")
	assert.Equal(t, providers.TaskRunning, pt.State, "within the grace period the orphan is left alone")

	e.clock.Advance(2 * time.Minute)
	require.Eventually(t, func() bool { pt, _ := e.prov.task("proc-orphan"); return pt.State == providers.TaskStopped }, waitFor, tick)
	_, _, _, calls = e.prov.counts()
	require.Eventually(t, func() bool { _, _, _, c := e.prov.counts(); return c >= calls+3 }, waitFor, tick, "more sweeps ran")
	pt, _ = e.prov.task("proc-theirs")
	assert.Equal(t, providers.TaskRunning, pt.State, "another gateway's task is never stopped")
	assert.Equal(t, providers.TaskRunning, e.providerTask(l.TaskID).State, "a tracked task is never stopped")
	assert.Contains(t, e.prov.stopCalls(), "proc-exited", "a stopped orphan is removed")
	assert.Equal(t, 2.0, e.counter("quarry_orphan_tasks_stopped_total", nil))
}

// An orphan the provider still lists once it stopped it (ECS keeps a stopped
// task for about an hour) is stopped once, not again at every sweep.
func TestManager_OrphanSweep_StopsAnOrphanOnce(t *testing.T) {
	e := newEnvSetup(t, fastConfig(), func(e *env) { e.prov.KeepStopped = true }, testPool(0, 2))
	e.prov.add(providers.Task{ID: "ecs-orphan", Name: "tsk-gone", Pool: "default", CreatedAt: e.clock.Now(), Labels: map[string]string{
		providers.LabelManaged: "true", providers.LabelGateway: "quarry", providers.LabelTask: "tsk-gone",
	}})
	e.clock.Advance(2 * time.Minute)
	require.Eventually(t, func() bool { return slices.Contains(e.prov.stopCalls(), "ecs-orphan") }, waitFor, tick)
	_, _, _, calls := e.prov.counts()
	require.Eventually(t, func() bool { _, _, _, c := e.prov.counts(); return c >= calls+5 }, waitFor, tick, "more sweeps ran")
	n := 0
	for _, id := range e.prov.stopCalls() {
		if id == "ecs-orphan" {
			n++
		}
	}
	assert.Equal(t, 1, n, "stopped once")
	assert.Equal(t, 1.0, e.counter("quarry_orphan_tasks_stopped_total", nil))
}

func TestManager_Reconciler_LaunchDeadlineCleanup(t *testing.T) {
	e := newEnvSetup(t, fastConfig(), func(e *env) {
		e.agents.setHealthFunc(func(string) error { return errRefused }) // agents never come up
	}, testPool(1, 2))
	var first warmpool.TaskRecord
	require.Eventually(t, func() bool {
		recs, err := e.store.ListTasks(t.Context(), "default")
		require.NoError(t, err)
		for _, r := range recs {
			if r.State == warmpool.TaskLaunching && r.ProviderID != "" {
				first = r
				return true
			}
		}
		return false
	}, waitFor, tick)

	e.clock.Advance(61 * time.Second) // past the 60 s startup timeout
	require.Eventually(t, func() bool { _, ok := e.taskRecord(first.ID); return !ok }, waitFor, tick, "the stuck launch is given up")
	pt, _ := e.prov.task(first.ProviderID)
	assert.Equal(t, providers.TaskStopped, pt.State)
	assert.GreaterOrEqual(t, e.counter("quarry_task_launch_failures_total", nil), 1.0)

	e.agents.setHealthFunc(nil)
	e.waitReady(1) // and the pool recovers
}

func TestManager_Reconciler_ReplacesUnhealthyReadyTask(t *testing.T) {
	cfg := fastConfig()
	cfg.HealthCheckInterval = time.Millisecond
	e := newEnv(t, cfg, testPool(1, 2))
	e.waitReady(1)
	recs, err := e.store.ListTasks(t.Context(), "default")
	require.NoError(t, err)
	require.Len(t, recs, 1)
	sick := recs[0]
	e.agents.setHealthFunc(func(url string) error {
		if url == sick.AgentURL {
			return errRefused
		}
		return nil
	})
	require.Eventually(t, func() bool { _, ok := e.taskRecord(sick.ID); return !ok }, waitFor, tick)
	pt, _ := e.prov.task(sick.ProviderID)
	assert.Equal(t, providers.TaskStopped, pt.State)
	e.waitReady(1)
}

func TestManager_Acquire_IdempotencyKeyReplays(t *testing.T) {
	e := newEnv(t, fastConfig(), testPool(1, 8))
	e.waitReady(1)
	req := warmpool.AcquireRequest{Pool: "default", Owner: "alice", IdempotencyKey: "create-1"}
	first, replayed, err := e.m.Acquire(t.Context(), req)
	require.NoError(t, err)
	assert.False(t, replayed)
	again, replayed, err := e.m.Acquire(t.Context(), req)
	require.NoError(t, err)
	assert.True(t, replayed)
	assert.Equal(t, first.ID, again.ID)
	assert.Equal(t, first.TaskID, again.TaskID)

	req.Owner = "bob"
	bobs, replayed, err := e.m.Acquire(t.Context(), req)
	require.NoError(t, err)
	assert.False(t, replayed, "keys are per owner")
	assert.NotEqual(t, first.ID, bobs.ID)

	// A key reused with another request leases nothing and says so.
	for _, change := range []func(*warmpool.AcquireRequest){
		func(r *warmpool.AcquireRequest) { r.Labels = map[string]string{"run": "other"} },
		func(r *warmpool.AcquireRequest) { r.Env = map[string]string{"A": "1"} },
		func(r *warmpool.AcquireRequest) { r.LeaseSeconds = 60 },
	} {
		other := warmpool.AcquireRequest{Pool: "default", Owner: "alice", IdempotencyKey: "create-1"}
		change(&other)
		_, _, err := e.m.Acquire(t.Context(), other)
		require.ErrorIs(t, err, warmpool.ErrIdempotencyMismatch)
		assert.Contains(t, err.Error(), first.ID, "the error names the key's sandbox")
	}
}

func TestManager_Acquire_RacingIdempotentColdStartsMakeOneLease(t *testing.T) {
	e := newEnv(t, fastConfig(), testPool(0, 8))
	e.prov.setStartDelay(20 * time.Millisecond)
	const n = 6
	var wg sync.WaitGroup
	ids := make([]string, n)
	replays := make([]bool, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, replayed, err := e.m.Acquire(context.Background(), warmpool.AcquireRequest{Pool: "default", Owner: "alice", IdempotencyKey: "k"})
			if assert.NoError(t, err) {
				ids[i], replays[i] = l.ID, replayed
			}
		}()
	}
	wg.Wait()
	fresh := 0
	for i := range ids {
		assert.Equal(t, ids[0], ids[i], "one lease for one key")
		if !replays[i] {
			fresh++
		}
	}
	assert.Equal(t, 1, fresh)
	st := e.status()
	assert.Equal(t, 1, st.Leased)
	_, _, launched, _ := e.prov.counts()
	assert.Equal(t, launched-1, st.Ready, "the losers' tasks went back to the pool as ready")
	list, err := e.m.List(t.Context(), warmpool.LeaseFilter{Owner: "alice"})
	require.NoError(t, err)
	assert.Len(t, list, 1)
}

func TestManager_Acquire_InitFailureTriesAnotherTask(t *testing.T) {
	e := newEnv(t, fastConfig(), testPool(2, 4))
	e.waitReady(2)
	var mu sync.Mutex
	var broken string
	e.agents.setInitFunc(func(url string, _ agentapi.InitRequest) error {
		mu.Lock()
		defer mu.Unlock()
		if broken == "" {
			broken = url
		}
		if url == broken {
			return errors.New("agent crashed")
		}
		return nil
	})
	l, replayed, err := e.m.Acquire(t.Context(), warmpool.AcquireRequest{Pool: "default", Owner: "alice", IdempotencyKey: "k"})
	require.NoError(t, err)
	assert.False(t, replayed)
	assert.NotEqual(t, broken, l.AgentURL)

	list, err := e.m.List(t.Context(), warmpool.LeaseFilter{Owner: "alice"})
	require.NoError(t, err)
	require.Len(t, list, 2)
	lost := list[0]
	if lost.ID == l.ID {
		lost = list[1]
	}
	assert.Equal(t, warmpool.LeaseLost, lost.State)
	assert.Contains(t, lost.Reason, "agent crashed")
	assert.Equal(t, providers.TaskStopped, e.providerTask(lost.TaskID).State, "the broken task is stopped")

	again, replayed, err := e.m.Acquire(t.Context(), warmpool.AcquireRequest{Pool: "default", Owner: "alice", IdempotencyKey: "k"})
	require.NoError(t, err)
	assert.True(t, replayed)
	assert.Equal(t, l.ID, again.ID, "the key names the lease that worked")
}

func TestManager_Acquire_LaunchErrorSurfaces(t *testing.T) {
	e := newEnv(t, fastConfig(), testPool(0, 2))
	e.prov.setOnLaunch(func(_ context.Context, spec providers.Spec, _ []string) error {
		return &providers.LaunchError{Pool: spec.Pool, Image: spec.Image, Reason: "image has no shell", Err: providers.ErrInvalidSpec}
	})
	_, _, err := e.m.Acquire(t.Context(), warmpool.AcquireRequest{Pool: "default", Owner: "alice"})
	require.ErrorIs(t, err, providers.ErrInvalidSpec)
	var le *providers.LaunchError
	require.ErrorAs(t, err, &le)
	assert.Equal(t, "image has no shell", le.Reason)
	require.Eventually(t, func() bool { st := e.status(); return st.Launching+st.Stopping == 0 }, waitFor, tick, "the failed slot is freed")
}

func TestManager_Acquire_RejectsBadInput(t *testing.T) {
	e := newEnv(t, fastConfig(), testPool(0, 2))
	long := make([]byte, 300)
	for i := range long {
		long[i] = 'k'
	}
	tests := []struct {
		name  string
		req   warmpool.AcquireRequest
		field string
	}{
		{name: "no pool", req: warmpool.AcquireRequest{Owner: "o"}, field: "pool"},
		{name: "unknown pool", req: warmpool.AcquireRequest{Pool: "gpu", Owner: "o"}, field: "pool"},
		{name: "no owner", req: warmpool.AcquireRequest{Pool: "default"}, field: "owner"},
		{name: "lease above the maximum", req: warmpool.AcquireRequest{Pool: "default", Owner: "o", LeaseSeconds: 86401}, field: "lease_seconds"},
		{name: "negative lease", req: warmpool.AcquireRequest{Pool: "default", Owner: "o", LeaseSeconds: -1}, field: "lease_seconds"},
		{name: "bad env key", req: warmpool.AcquireRequest{Pool: "default", Owner: "o", Env: map[string]string{"1BAD": "x"}}, field: "env"},
		{name: "bad label key", req: warmpool.AcquireRequest{Pool: "default", Owner: "o", Labels: map[string]string{"a b": "x"}}, field: "labels"},
		{name: "long idempotency key", req: warmpool.AcquireRequest{Pool: "default", Owner: "o", IdempotencyKey: string(long)}, field: "idempotency_key"},
		{name: "control character in idempotency key", req: warmpool.AcquireRequest{Pool: "default", Owner: "o", IdempotencyKey: "a\nb"}, field: "idempotency_key"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := e.m.Acquire(t.Context(), tc.req)
			var ve *badinput.Error
			require.ErrorAs(t, err, &ve)
			assert.Equal(t, tc.field, ve.Field)
			assert.NotEmpty(t, ve.Message)
		})
	}
	_, _, launched, _ := e.prov.counts()
	assert.Zero(t, launched, "bad input launches nothing")
}

func TestManager_Restart_KeepsLeases(t *testing.T) {
	e := newEnv(t, fastConfig(), testPool(1, 4))
	l := e.acquire("alice")
	released := e.acquire("alice")
	_, err := e.m.Release(t.Context(), released.ID, "alice")
	require.NoError(t, err)

	e.restart()

	got, err := e.m.Get(t.Context(), l.ID, "alice")
	require.NoError(t, err)
	assert.Equal(t, warmpool.LeaseActive, got.State)
	assert.Equal(t, l.AgentURL, got.AgentURL)
	assert.Equal(t, l.AgentToken, got.AgentToken)
	assert.Equal(t, l.Generation, got.Generation)
	assert.Equal(t, providers.TaskRunning, e.providerTask(l.TaskID).State, "Close never stops tasks")
	gone, err := e.m.Get(t.Context(), released.ID, "alice")
	require.NoError(t, err)
	assert.Equal(t, warmpool.LeaseReleased, gone.State, "ended leases stay readable")

	e.clock.Advance(10 * time.Second)
	hb, err := e.m.Heartbeat(t.Context(), l.ID, "alice")
	require.NoError(t, err)
	assert.True(t, hb.ExpiresAt.After(l.ExpiresAt))
	_, err = e.m.Release(t.Context(), l.ID, "alice")
	require.NoError(t, err)
	assert.Equal(t, providers.TaskStopped, e.providerTask(l.TaskID).State)
}

func TestManager_List_FiltersAndBounds(t *testing.T) {
	cfg := fastConfig()
	cfg.MaxListLeases = 2
	e := newEnv(t, cfg, testPool(0, 4))
	a1, _, err := e.m.Acquire(t.Context(), warmpool.AcquireRequest{Pool: "default", Owner: "alice", Labels: map[string]string{"run": "x"}})
	require.NoError(t, err)
	e.clock.Advance(time.Second)
	_ = e.acquire("bob")
	e.clock.Advance(time.Second)
	a2 := e.acquire("alice")
	e.clock.Advance(time.Second)
	a3 := e.acquire("alice")

	tests := []struct {
		name string
		f    warmpool.LeaseFilter
		want []string
	}{
		{name: "owner, bounded by MaxListLeases", f: warmpool.LeaseFilter{Owner: "alice"}, want: []string{a3.ID, a2.ID}},
		{name: "label", f: warmpool.LeaseFilter{Owner: "alice", Labels: map[string]string{"run": "x"}}, want: []string{a1.ID}},
		{name: "limit", f: warmpool.LeaseFilter{Owner: "alice", Limit: 1}, want: []string{a3.ID}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := e.m.List(t.Context(), tc.f)
			require.NoError(t, err)
			var ids []string
			for _, l := range got {
				ids = append(ids, l.ID)
			}
			assert.Equal(t, tc.want, ids)
		})
	}
}

func TestNew_RejectsBadDeps(t *testing.T) {
	s, err := boltstore.Open(filepath.Join(t.TempDir(), "leases.db"), boltstore.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	prov := newFakeProvider(newFakeClock())
	good := warmpool.Deps{Store: s, Providers: map[string]providers.Provider{"fake": prov}, Pools: []warmpool.PoolConfig{testPool(1, 2)}, Agents: newFakeAgents(prov)}
	tests := []struct {
		name   string
		cfg    warmpool.Config
		mutate func(d *warmpool.Deps)
		want   string
	}{
		{name: "no store", mutate: func(d *warmpool.Deps) { d.Store = nil }, want: "Store"},
		{name: "no agents", mutate: func(d *warmpool.Deps) { d.Agents = nil }, want: "Agents"},
		{name: "no pools", mutate: func(d *warmpool.Deps) { d.Pools = nil }, want: "at least one pool"},
		{name: "pool without provider", mutate: func(d *warmpool.Deps) { d.Pools[0].Provider = "" }, want: "names no provider"},
		{name: "unknown provider", mutate: func(d *warmpool.Deps) { d.Pools[0].Provider = "ecs" }, want: `provider "ecs"`},
		{name: "bad interval", cfg: warmpool.Config{ReconcileInterval: -time.Second}, mutate: func(*warmpool.Deps) {}, want: "QUARRY_RECONCILE_INTERVAL"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := good
			d.Pools = []warmpool.PoolConfig{testPool(1, 2)}
			tc.mutate(&d)
			_, err := warmpool.New(tc.cfg, d)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
	m, err := warmpool.New(warmpool.Config{}, good)
	require.NoError(t, err)
	require.NoError(t, m.Close(t.Context()), "closing a manager that never started")
}

func TestManager_Start_TwiceFails(t *testing.T) {
	e := newEnv(t, fastConfig(), testPool(0, 1))
	require.Error(t, e.m.Start(t.Context()))
}

func TestManager_TwoReplicasOnOneStore_NeverExceedMaxTotal(t *testing.T) {
	cfg := fastConfig()
	e := newEnv(t, cfg, testPool(2, 4))
	e.prov.setStartDelay(10 * time.Millisecond)
	second, err := warmpool.New(cfg, warmpool.Deps{
		Store: e.store, Providers: map[string]providers.Provider{"fake": e.prov}, Pools: e.pools,
		Agents: e.agents, Clock: e.clock, Metrics: prometheus.NewRegistry(),
	})
	require.NoError(t, err)
	require.NoError(t, second.Start(t.Context()))
	t.Cleanup(func() { assert.NoError(t, second.Close(context.Background())) })
	replicas := []*warmpool.Manager{e.m, second}

	leases := acquireConcurrently(t, 16, func(i int) *warmpool.Manager { return replicas[i%2] })
	tasks := leasedTasks(t, leases)
	assert.Len(t, tasks, 4, "every slot was leased")
	_, maxRunning, _, _ := e.prov.counts()
	assert.LessOrEqual(t, maxRunning, 4, "never more than max_total tasks across both replicas")

	// Either replica serves a lease the other one made.
	got, err := second.Get(t.Context(), leases[0].ID, "o")
	require.NoError(t, err)
	assert.Equal(t, warmpool.LeaseActive, got.State)
}

// acquireConcurrently runs n acquires at once, the i-th on manager(i), and
// returns the leases granted; every failure must be ErrNoCapacity.
func acquireConcurrently(t *testing.T, n int, manager func(i int) *warmpool.Manager) []warmpool.Lease {
	t.Helper()
	var wg sync.WaitGroup
	errs := make([]error, n)
	leases := make([]warmpool.Lease, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			leases[i], _, errs[i] = manager(i).Acquire(context.Background(), warmpool.AcquireRequest{Pool: "default", Owner: "o"})
		}()
	}
	wg.Wait()
	var granted []warmpool.Lease
	for i, err := range errs {
		if err != nil {
			assert.ErrorIs(t, err, warmpool.ErrNoCapacity)
			continue
		}
		granted = append(granted, leases[i])
	}
	return granted
}

// leasedTasks returns the set of tasks of leases, failing on a task granted twice.
func leasedTasks(t *testing.T, leases []warmpool.Lease) map[string]bool {
	t.Helper()
	tasks := map[string]bool{}
	for _, l := range leases {
		assert.False(t, tasks[l.TaskID], "task %s granted twice", l.TaskID)
		tasks[l.TaskID] = true
	}
	return tasks
}

func TestManager_Launch_ModelOptionsNeverReachTheProvider(t *testing.T) {
	pool := testPool(0, 2)
	pool.Options = map[string]string{"model.timeout_seconds": "3", "model.name": "policy", "network": "host"}
	e := newEnv(t, fastConfig(), pool)
	seen := make(chan map[string]string, 4)
	e.prov.setOnLaunch(func(_ context.Context, spec providers.Spec, _ []string) error {
		seen <- spec.Options
		return nil
	})
	_, _, err := e.m.Acquire(t.Context(), warmpool.AcquireRequest{Pool: "default", Owner: "alice"})
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"network": "host"}, <-seen)
}

func TestManager_Launch_SpecCarriesTheDisk(t *testing.T) {
	pool := testPool(0, 2)
	pool.Memory, pool.Disk = 64, 2048
	e := newEnv(t, fastConfig(), pool)
	seen := make(chan providers.Spec, 4)
	e.prov.setOnLaunch(func(_ context.Context, spec providers.Spec, _ []string) error {
		seen <- spec
		return nil
	})
	_, _, err := e.m.Acquire(t.Context(), warmpool.AcquireRequest{Pool: "default", Owner: "alice"})
	require.NoError(t, err)
	spec := <-seen
	assert.Equal(t, 64, spec.MemoryMB)
	assert.Equal(t, 2048, spec.DiskMB, "the pool's disk reaches the provider, separate from memory")
}

// pausingProvider is the fake provider with providers.Pauser: it records
// the paused task ids, and fails a pause with failPause.
type pausingProvider struct {
	*fakeProvider
	pmu       sync.Mutex
	paused    map[string]bool
	failPause error
}

func (p *pausingProvider) Pause(_ context.Context, id string) error {
	p.pmu.Lock()
	defer p.pmu.Unlock()
	if p.failPause != nil {
		return p.failPause
	}
	p.paused[id] = true
	return nil
}

func (p *pausingProvider) Resume(_ context.Context, id string) error {
	p.pmu.Lock()
	defer p.pmu.Unlock()
	delete(p.paused, id)
	return nil
}

// Pause marks the lease and freezes its task; a second pause, or a resume
// of a running lease, is a PauseStateError; a failed freeze leaves the
// lease running; a provider that cannot pause is bad input.
func TestManager_PauseResume(t *testing.T) {
	var pp *pausingProvider
	e := newEnvSetup(t, fastConfig(), func(e *env) {
		pp = &pausingProvider{fakeProvider: e.prov, paused: map[string]bool{}}
		e.provider = pp
	}, testPool(0, 2))
	l, _, err := e.m.Acquire(t.Context(), warmpool.AcquireRequest{Pool: "default", Owner: "alice", LeaseSeconds: 60})
	require.NoError(t, err)

	got, err := e.m.Pause(t.Context(), l.ID, "alice")
	require.NoError(t, err)
	assert.False(t, got.PausedAt.IsZero())
	assert.True(t, pp.paused[l.ProviderTaskID], "the provider froze the lease's task")
	read, err := e.m.Get(t.Context(), l.ID, "alice")
	require.NoError(t, err)
	assert.False(t, read.PausedAt.IsZero(), "Get reads it paused")
	var state *warmpool.PauseStateError
	_, err = e.m.Pause(t.Context(), l.ID, "alice")
	require.ErrorAs(t, err, &state)
	assert.True(t, state.Paused)
	_, err = e.m.Pause(t.Context(), l.ID, "mallory")
	require.ErrorIs(t, err, warmpool.ErrNotFound)

	got, err = e.m.Resume(t.Context(), l.ID, "alice")
	require.NoError(t, err)
	assert.True(t, got.PausedAt.IsZero())
	assert.False(t, pp.paused[l.ProviderTaskID], "thawed")
	_, err = e.m.Resume(t.Context(), l.ID, "alice")
	require.ErrorAs(t, err, &state)
	assert.False(t, state.Paused)

	pp.pmu.Lock()
	pp.failPause = errors.New("engine says no")
	pp.pmu.Unlock()
	_, err = e.m.Pause(t.Context(), l.ID, "alice")
	require.ErrorContains(t, err, "engine says no")
	read, err = e.m.Get(t.Context(), l.ID, "alice")
	require.NoError(t, err)
	assert.True(t, read.PausedAt.IsZero(), "a failed freeze leaves the lease running")
}

func TestManager_Pause_ProviderThatCannot(t *testing.T) {
	e := newEnv(t, fastConfig(), testPool(0, 2))
	l, _, err := e.m.Acquire(t.Context(), warmpool.AcquireRequest{Pool: "default", Owner: "alice", LeaseSeconds: 60})
	require.NoError(t, err)
	var bad *badinput.Error
	_, err = e.m.Pause(t.Context(), l.ID, "alice")
	require.ErrorAs(t, err, &bad)
	assert.Contains(t, err.Error(), "cannot pause")
	read, err := e.m.Get(t.Context(), l.ID, "alice")
	require.NoError(t, err)
	assert.True(t, read.PausedAt.IsZero(), "nothing marked")
}

// A lease paused by another replica (written to the store, not through
// this manager, whose copy of the lease says running) is resumed: the
// store, not the replica's copy, says whether it is paused.
func TestManager_Resume_PausedByAnotherReplica(t *testing.T) {
	var pp *pausingProvider
	e := newEnvSetup(t, fastConfig(), func(e *env) {
		pp = &pausingProvider{fakeProvider: e.prov, paused: map[string]bool{}}
		e.provider = pp
	}, testPool(0, 2))
	l, _, err := e.m.Acquire(t.Context(), warmpool.AcquireRequest{Pool: "default", Owner: "alice", LeaseSeconds: 60})
	require.NoError(t, err)
	_, err = e.m.Get(t.Context(), l.ID, "alice") // this replica's copy: running
	require.NoError(t, err)
	_, err = e.store.PauseLease(t.Context(), l.ID, "alice", true, e.clock.Now())
	require.NoError(t, err)
	require.NoError(t, pp.Pause(t.Context(), l.ProviderTaskID))

	got, err := e.m.Resume(t.Context(), l.ID, "alice")
	require.NoError(t, err)
	assert.True(t, got.PausedAt.IsZero())
	assert.False(t, pp.paused[l.ProviderTaskID], "thawed")
}
