package warmpool_test

import (
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/internal/syncbuf"
	"github.com/quarryhq/quarry/providers"
	"github.com/quarryhq/quarry/warmpool"
	"github.com/quarryhq/quarry/warmpool/boltstore"
)

func TestPoolConfig_SpecDigest(t *testing.T) {
	base := warmpool.PoolConfig{Name: "default", Provider: "process", Image: "host", MinWarm: 2, MaxTotal: 16}.WithDefaults()
	tests := []struct {
		name   string
		change func(p *warmpool.PoolConfig)
		same   bool
	}{
		{"provider", func(p *warmpool.PoolConfig) { p.Provider = "docker" }, false},
		{"image", func(p *warmpool.PoolConfig) { p.Image = "quarry-test/busybox:latest" }, false},
		{"cpu", func(p *warmpool.PoolConfig) { p.CPU = 2 }, false},
		{"memory", func(p *warmpool.PoolConfig) { p.Memory = 512 }, false},
		{"disk", func(p *warmpool.PoolConfig) { p.Disk = 100 }, false},
		{"env", func(p *warmpool.PoolConfig) { p.Env = map[string]string{"A": "1"} }, false},
		{"provider option", func(p *warmpool.PoolConfig) { p.Options = map[string]string{"user": "1000"} }, false},
		{"name", func(p *warmpool.PoolConfig) { p.Name = "other" }, true},
		{"warm counts", func(p *warmpool.PoolConfig) { p.MinWarm, p.MaxTotal = 0, 100 }, true},
		{"lease bounds", func(p *warmpool.PoolConfig) { p.DefaultLeaseSeconds, p.MaxLeaseSeconds = 60, 120 }, true},
		{"labels", func(p *warmpool.PoolConfig) { p.Labels = map[string]string{"team": "rl"} }, true},
		{"a gateway service's option", func(p *warmpool.PoolConfig) { p.Options = map[string]string{"model.timeout_seconds": "5"} }, true},
		{"an empty env", func(p *warmpool.PoolConfig) { p.Env = map[string]string{} }, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := base
			tc.change(&p)
			if tc.same {
				assert.Equal(t, base.SpecDigest(), p.SpecDigest(), "a task does not depend on it")
			} else {
				assert.NotEqual(t, base.SpecDigest(), p.SpecDigest(), "a task depends on it")
			}
		})
	}
}

// staleEnv is a store whose pool "default" was first served by provider
// "old" (one lease held, the rest ready) and is now configured for
// provider "fake" (another image): the sequence of a gateway restarted in
// the same data dir with another provider.
type staleEnv struct {
	t      *testing.T
	store  *boltstore.Store
	clock  *fakeClock
	old    *fakeProvider
	cur    *fakeProvider
	agents *fakeAgents
	held   warmpool.Lease // made by the old configuration
	pool   warmpool.PoolConfig
}

func newStaleEnv(t *testing.T) *staleEnv {
	clock := newFakeClock()
	old, cur := newFakeProvider(clock), newFakeProvider(clock)
	agents := newFakeAgents(cur)
	agents.more = []*fakeProvider{old}
	s, err := boltstore.Open(filepath.Join(t.TempDir(), "leases.db"), boltstore.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	e := &staleEnv{t: t, store: s, clock: clock, old: old, cur: cur, agents: agents}

	before := warmpool.PoolConfig{Name: "default", Provider: "old", Image: "host", MinWarm: 3, MaxTotal: 8}.WithDefaults()
	m, err := warmpool.New(fastConfig(), warmpool.Deps{Store: s, Providers: map[string]providers.Provider{"old": old},
		Pools: []warmpool.PoolConfig{before}, Agents: agents, Clock: clock})
	require.NoError(t, err)
	require.NoError(t, m.Start(t.Context()))
	e.held, _, err = m.Acquire(t.Context(), warmpool.AcquireRequest{Pool: "default", Owner: "alice"})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		c, err := s.CountTasks(t.Context(), "default")
		return err == nil && c.Ready == 3 && c.Launching == 0
	}, waitFor, tick, "the old configuration never had 3 ready tasks")
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	require.NoError(t, m.Close(ctx))
	running, _, _, _ := old.counts()
	require.Equal(t, 4, running, "the old provider runs the held task and 3 ready ones")

	e.pool = warmpool.PoolConfig{Name: "default", Provider: "fake", Image: "quarry-test/busybox:latest", MinWarm: 1, MaxTotal: 8}.WithDefaults()
	return e
}

// manager is a manager of the new configuration; extra builds the
// providers no pool uses (nil: none can be built).
func (e *staleEnv) manager(logs *syncbuf.Buffer, extra func(string) (providers.Provider, error)) (*warmpool.Manager, *prometheus.Registry) {
	reg := prometheus.NewRegistry()
	log := slog.New(slog.DiscardHandler)
	if logs != nil {
		log = slog.New(slog.NewTextHandler(logs, nil))
	}
	m, err := warmpool.New(fastConfig(), warmpool.Deps{Store: e.store, Providers: map[string]providers.Provider{"fake": e.cur},
		Pools: []warmpool.PoolConfig{e.pool}, Agents: e.agents, Clock: e.clock, Metrics: reg, Logger: log, ExtraProvider: extra})
	require.NoError(e.t, err)
	e.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		defer cancel()
		assert.NoError(e.t, m.Close(ctx))
	})
	return m, reg
}

func (e *staleEnv) oldProvider(name string) (providers.Provider, error) {
	if name != "old" {
		return nil, providers.ErrInvalidSpec
	}
	return e.old, nil
}

// assertNew checks that l is on a task the new configuration launched.
func (e *staleEnv) assertNew(l warmpool.Lease) {
	e.t.Helper()
	_, ok := e.cur.byName(l.TaskID)
	assert.True(e.t, ok, "lease %s is on task %s, which the new provider did not launch", l.ID, l.TaskID)
	_, old := e.old.byName(l.TaskID)
	assert.False(e.t, old, "lease %s is on a task of the old provider", l.ID)
	assert.Equal(e.t, "fake", l.Provider)
}

// The claim alone keeps stale tasks out: a manager whose loops do not run
// (no reconciler walk to retire them first) still never hands one out, and
// the ones it met are stopped by the provider that made them.
func TestManager_StaleSpec_ClaimsNeverHandOutATaskOfTheOldConfiguration(t *testing.T) {
	e := newStaleEnv(t)
	m, reg := e.manager(nil, e.oldProvider) // not started: Acquire claims, or cold-starts its own
	for i := range 3 {
		l, _, err := m.Acquire(t.Context(), warmpool.AcquireRequest{Pool: "default", Owner: "bob"})
		require.NoError(t, err, "acquire %d", i)
		e.assertNew(l)
	}
	require.Eventually(t, func() bool { running, _, _, _ := e.old.counts(); return running == 1 }, waitFor, tick,
		"the old provider still runs the stale ready tasks")
	assert.Equal(t, 3.0, metricValue(t, reg, "quarry_stale_tasks_total", map[string]string{"pool": "default", "action": "retired"}))
	c, err := e.store.CountTasks(t.Context(), "default")
	require.NoError(t, err)
	assert.Equal(t, warmpool.TaskCounts{Leased: 4}, c, "the held lease and the three new ones; the stale records are gone")
}

// A gateway that starts on the new configuration retires the stale ready
// tasks (its walk), serves only new ones, and keeps the lease held on an
// old task working until it ends: then the old provider stops it.
func TestManager_StaleSpec_OldLeaseKeepsWorkingThenItsProviderStopsIt(t *testing.T) {
	e := newStaleEnv(t)
	logs := &syncbuf.Buffer{}
	m, _ := e.manager(logs, e.oldProvider)
	require.NoError(t, m.Start(t.Context()))
	require.Eventually(t, func() bool { running, _, _, _ := e.old.counts(); return running == 1 }, waitFor, tick,
		"the walk never stopped the stale ready tasks")
	l, _, err := m.Acquire(t.Context(), warmpool.AcquireRequest{Pool: "default", Owner: "bob"})
	require.NoError(t, err)
	e.assertNew(l)

	_, err = m.Heartbeat(t.Context(), e.held.ID, e.held.Owner)
	require.NoError(t, err, "a lease held on an old task keeps working")
	require.Eventually(t, func() bool {
		return strings.Contains(logs.String(), "a lease holds a task launched for another configuration")
	}, waitFor, tick)
	assert.Equal(t, 1, strings.Count(logs.String(), "a lease holds a task launched for another configuration"), "said once")

	_, err = m.Release(t.Context(), e.held.ID, e.held.Owner)
	require.NoError(t, err)
	require.Eventually(t, func() bool { running, _, _, _ := e.old.counts(); return running == 0 }, waitFor, tick,
		"the released old task was not stopped by the provider that made it")
	pt, ok := e.old.byName(e.held.TaskID)
	require.True(t, ok)
	assert.Contains(t, e.old.stopCalls(), pt.ID)
	assert.NotContains(t, e.cur.stopCalls(), pt.ID, "the new provider was never asked to stop an old task")
}

// When the provider that made a stale task cannot be built, the task is
// reported once and its record kept (nothing is lost track of), and the
// pool serves new tasks meanwhile.
func TestManager_StaleSpec_UnconfiguredProviderIsReportedOnce(t *testing.T) {
	e := newStaleEnv(t)
	logs := &syncbuf.Buffer{}
	m, reg := e.manager(logs, nil)
	require.NoError(t, m.Start(t.Context()))
	l, _, err := m.Acquire(t.Context(), warmpool.AcquireRequest{Pool: "default", Owner: "bob"})
	require.NoError(t, err)
	e.assertNew(l)
	require.Eventually(t, func() bool {
		return metricValue(t, reg, "quarry_stale_tasks_total", map[string]string{"pool": "default", "action": "unstoppable"}) == 3
	}, waitFor, tick, "the three stale ready tasks were not reported")
	waitPasses(t, reg, 3) // more passes: no report repeats
	assert.Equal(t, 3, strings.Count(logs.String(), "cannot stop a task: its provider is not configured"), "once per task")
	running, _, _, _ := e.old.counts()
	assert.Equal(t, 4, running, "nothing could stop them")
	c, err := e.store.CountTasks(t.Context(), "default")
	require.NoError(t, err)
	assert.Equal(t, 3, c.Stopping, "their records are kept")
}

// waitPasses waits until the pool's reconciler has run n more passes.
func waitPasses(t *testing.T, reg *prometheus.Registry, n int) {
	t.Helper()
	labels := map[string]string{"pool": "default"}
	start := metricValue(t, reg, "quarry_reconcile_pass_duration_seconds", labels)
	require.Eventually(t, func() bool {
		return metricValue(t, reg, "quarry_reconcile_pass_duration_seconds", labels) >= start+float64(n)
	}, waitFor, tick)
}
