package warmpool_test

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/providers"
	"github.com/quarryhq/quarry/warmpool"
	"github.com/quarryhq/quarry/warmpool/boltstore"
)

// scriptedStore wraps the real store of a test. Its function field scripts
// TryLock failures (a replica cut off from the store can no longer renew
// its locks); it counts lease reads and records the caller of each call.
type scriptedStore struct {
	warmpool.Store

	mu         sync.Mutex
	TryLockErr func(ctx context.Context) error // non-nil error: TryLock fails with it
	getLeases  int
	callers    map[string]map[string]bool // method → callers seen
}

func newScriptedStore(s warmpool.Store) *scriptedStore {
	return &scriptedStore{Store: s, callers: map[string]map[string]bool{}}
}

func (s *scriptedStore) saw(ctx context.Context, method string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.callers[method] == nil {
		s.callers[method] = map[string]bool{}
	}
	s.callers[method][warmpool.CallerOf(ctx)] = true
}

func (s *scriptedStore) TryLock(ctx context.Context, name, holder string, ttl time.Duration, now time.Time) (bool, error) {
	s.saw(ctx, "TryLock")
	s.mu.Lock()
	fn := s.TryLockErr
	s.mu.Unlock()
	if fn != nil {
		if err := fn(ctx); err != nil {
			return false, err
		}
	}
	return s.Store.TryLock(ctx, name, holder, ttl, now)
}

func (s *scriptedStore) GetLease(ctx context.Context, id string) (warmpool.Lease, error) {
	s.saw(ctx, "GetLease")
	s.mu.Lock()
	s.getLeases++
	s.mu.Unlock()
	return s.Store.GetLease(ctx, id)
}

func (s *scriptedStore) RenewLease(ctx context.Context, id, owner string, expiresAt, now time.Time) (warmpool.Lease, error) {
	s.saw(ctx, "RenewLease")
	return s.Store.RenewLease(ctx, id, owner, expiresAt, now)
}

func (s *scriptedStore) Claim(ctx context.Context, req warmpool.ClaimRequest) (warmpool.ClaimResult, error) {
	s.saw(ctx, "Claim")
	return s.Store.Claim(ctx, req)
}

func (s *scriptedStore) setTryLockErr(fn func(ctx context.Context) error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.TryLockErr = fn
}

func (s *scriptedStore) leaseReads() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.getLeases
}

func (s *scriptedStore) callersOf(method string) map[string]bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]bool{}
	for c := range s.callers[method] {
		out[c] = true
	}
	return out
}

// replica is a second gateway replica: another Manager on e's store,
// provider, agents and clock, with its own id and metrics.
type replica struct {
	m   *warmpool.Manager
	reg *prometheus.Registry
}

func (e *env) replica(id string, cfg warmpool.Config) *replica {
	e.t.Helper()
	cfg.ReplicaID = id
	r := &replica{reg: prometheus.NewRegistry()}
	m, err := warmpool.New(cfg, warmpool.Deps{
		Store: e.store, Providers: map[string]providers.Provider{"fake": e.prov}, Pools: e.pools,
		Agents: e.agents, Clock: e.clock, Metrics: r.reg,
	})
	require.NoError(e.t, err)
	require.NoError(e.t, m.Start(e.t.Context()))
	e.t.Cleanup(func() { assert.NoError(e.t, m.Close(context.Background())) })
	r.m = m
	return r
}

// Lock metrics of one replica.
func lockHeld(t testing.TB, reg *prometheus.Registry, lock string) bool {
	return metricValue(t, reg, "quarry_lock_held", map[string]string{"lock": lock}) == 1
}

func lockedPasses(t testing.TB, reg *prometheus.Registry, lock string) float64 {
	return metricValue(t, reg, "quarry_locked_passes_total", map[string]string{"lock": lock})
}

func lockBusy(t testing.TB, reg *prometheus.Registry, lock string) float64 {
	return metricValue(t, reg, "quarry_lock_attempts_total", map[string]string{"lock": lock, "outcome": "busy"})
}

// Two replicas on one store: only the holder of a pool's lock reconciles
// the pool (and only the holder of the reaper's and the sweep's locks runs
// them); when the holder stops renewing, the other takes over once the lock
// has expired, never before, and keeps the pool at min_warm.
func TestManager_Locks_OneReplicaReconcilesAPoolAtATime(t *testing.T) {
	cfg := fastConfig()
	cfg.ReplicaID = "r1"
	var first *scriptedStore
	e := newEnvSetup(t, cfg, func(e *env) {
		e.wrap = func(s warmpool.Store) warmpool.Store { first = newScriptedStore(s); return first }
	}, testPool(1, 4))
	const pool = "pool/default"
	jobs := []string{pool, "reaper", "orphans"}
	require.Eventually(t, func() bool {
		return lockHeld(t, e.reg, pool) && lockHeld(t, e.reg, "reaper") && lockHeld(t, e.reg, "orphans")
	}, waitFor, tick, "the first replica takes every lock")
	e.waitReady(1)

	second := e.replica("r2", cfg)
	passes := lockedPasses(t, e.reg, pool)
	require.Eventually(t, func() bool {
		return lockBusy(t, second.reg, pool) >= 10 && lockedPasses(t, e.reg, pool) >= passes+10
	}, waitFor, tick, "both replicas ran their loops")
	for _, lock := range jobs {
		assert.Zero(t, lockedPasses(t, second.reg, lock), "the second replica never ran %s", lock)
		assert.False(t, lockHeld(t, second.reg, lock), lock)
	}

	// The holder is cut off from the store: it can no longer renew.
	first.setTryLockErr(func(context.Context) error { return errors.New("store unreachable from r1") })
	require.Eventually(t, func() bool { return !lockHeld(t, e.reg, pool) }, waitFor, tick, "r1 knows it lost the lock")
	busy := lockBusy(t, second.reg, pool)
	require.Eventually(t, func() bool { return lockBusy(t, second.reg, pool) >= busy+10 }, waitFor, tick)
	assert.Zero(t, lockedPasses(t, second.reg, pool), "no takeover before the lock expires")

	e.clock.Advance(15*time.Second + time.Millisecond) // past LockTTL (default 15 s)
	for _, lock := range jobs {
		require.Eventually(t, func() bool { return lockHeld(t, second.reg, lock) && lockedPasses(t, second.reg, lock) > 0 },
			waitFor, tick, "r2 took %s over", lock)
	}
	_, _, err := second.m.Acquire(t.Context(), warmpool.AcquireRequest{Pool: "default", Owner: "o"})
	require.NoError(t, err)
	require.Eventually(t, func() bool { st := e.status(); return st.Ready == 1 && st.Leased == 1 }, waitFor, tick,
		"the new holder keeps the pool at min_warm")
	_, maxRunning, _, _ := e.prov.counts()
	assert.LessOrEqual(t, maxRunning, 4)
}

// A replica that shuts down releases its locks: another one takes the work
// over at once, without waiting for the locks to expire.
func TestManager_Close_HandsLocksOverAtOnce(t *testing.T) {
	cfg := fastConfig()
	e := newEnv(t, cfg, testPool(1, 4))
	const pool = "pool/default"
	require.Eventually(t, func() bool { return lockHeld(t, e.reg, pool) }, waitFor, tick)
	second := e.replica("r2", cfg)
	require.Eventually(t, func() bool { return lockBusy(t, second.reg, pool) >= 3 }, waitFor, tick)

	require.NoError(t, e.m.Close(t.Context()))
	assert.False(t, lockHeld(t, e.reg, pool))
	for _, lock := range []string{pool, "reaper", "orphans"} {
		require.Eventually(t, func() bool { return lockHeld(t, second.reg, lock) }, waitFor, tick, "r2 took %s over", lock)
	}
}

// The lease cache saves lease reads but never lets an ended lease be
// used: this replica drops what it ends or renews, entries never outlive
// ExpiresAt, and a lease that another replica ended has had its agent
// fenced with a higher generation, so a stale entry is refused there.
func TestManager_LeaseCache_NeverServesAnEndedLease(t *testing.T) {
	tests := []struct {
		name string
		run  func(t *testing.T, e *env, other *replica, l warmpool.Lease)
	}{
		{name: "released by this replica", run: func(t *testing.T, e *env, _ *replica, l warmpool.Lease) {
			_, err := e.m.Release(t.Context(), l.ID, "alice")
			require.NoError(t, err)
			got, err := e.m.Get(t.Context(), l.ID, "alice")
			require.NoError(t, err)
			assert.Equal(t, warmpool.LeaseReleased, got.State)
		}},
		{name: "expired", run: func(t *testing.T, e *env, _ *replica, l warmpool.Lease) {
			e.clock.Advance(l.ExpiresAt.Sub(e.clock.Now()))
			got, err := e.m.Get(t.Context(), l.ID, "alice")
			require.NoError(t, err)
			assert.Equal(t, warmpool.LeaseExpired, got.State)
			_, err = e.m.Heartbeat(t.Context(), l.ID, "alice")
			require.ErrorIs(t, err, warmpool.ErrLeaseEnded)
		}},
		{name: "released by another replica", run: func(t *testing.T, e *env, other *replica, l warmpool.Lease) {
			_, err := other.m.Release(t.Context(), l.ID, "alice")
			require.NoError(t, err)
			fenced := false
			for _, in := range e.agents.initsOf(l.AgentURL) {
				fenced = fenced || in.Generation > l.Generation
			}
			assert.True(t, fenced, "the agent refuses the cached lease's generation")
			_, err = e.m.Heartbeat(t.Context(), l.ID, "alice")
			require.ErrorIs(t, err, warmpool.ErrLeaseEnded, "a heartbeat is a store write, never a cache answer")
			got, err := e.m.Get(t.Context(), l.ID, "alice")
			require.NoError(t, err)
			assert.Equal(t, warmpool.LeaseReleased, got.State, "the failed heartbeat dropped the entry")
		}},
		{name: "lost on another replica", run: func(t *testing.T, e *env, other *replica, l warmpool.Lease) {
			e.prov.kill(e.providerTask(l.TaskID).ID, "OOMKilled")
			got, err := other.m.CheckTask(t.Context(), l)
			require.NoError(t, err)
			require.Equal(t, warmpool.LeaseLost, got.State)
			got, err = e.m.CheckTask(t.Context(), l) // what the gateway calls when the agent is unreachable
			require.NoError(t, err)
			assert.Equal(t, warmpool.LeaseLost, got.State)
			got, err = e.m.Get(t.Context(), l.ID, "alice")
			require.NoError(t, err)
			assert.Equal(t, warmpool.LeaseLost, got.State)
		}},
		{name: "renewed by another replica past the cached expiry", run: func(t *testing.T, e *env, other *replica, l warmpool.Lease) {
			e.clock.Advance(30 * time.Second)
			renewed, err := other.m.Heartbeat(t.Context(), l.ID, "alice")
			require.NoError(t, err)
			e.clock.Advance(l.ExpiresAt.Sub(e.clock.Now()) + time.Second)
			got, err := e.m.Get(t.Context(), l.ID, "alice")
			require.NoError(t, err)
			assert.Equal(t, warmpool.LeaseActive, got.State, "an entry past its ExpiresAt is read again, not shown expired")
			assert.True(t, renewed.ExpiresAt.Equal(got.ExpiresAt))
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := fastConfig()
			cfg.ReconcileInterval = time.Hour // nothing but the test ends leases
			cfg.ReapInterval = time.Hour
			cfg.LeaseCacheTTL = time.Minute // the maximum: only invalidation and ExpiresAt bound the entries
			var s *scriptedStore
			e := newEnvSetup(t, cfg, func(e *env) {
				e.wrap = func(st warmpool.Store) warmpool.Store { s = newScriptedStore(st); return s }
			}, testPool(0, 4))
			other := e.replica("other", cfg)
			l, _, err := e.m.Acquire(t.Context(), warmpool.AcquireRequest{Pool: "default", Owner: "alice", LeaseSeconds: 60})
			require.NoError(t, err)
			reads := s.leaseReads()
			for range 3 {
				got, err := e.m.Get(t.Context(), l.ID, "alice")
				require.NoError(t, err)
				require.Equal(t, warmpool.LeaseActive, got.State)
			}
			_, err = e.m.Get(t.Context(), l.ID, "mallory")
			require.ErrorIs(t, err, warmpool.ErrNotFound, "a cached lease is still only its owner's")
			require.Equal(t, reads, s.leaseReads(), "lookups of a fresh lease are served from the cache")
			tc.run(t, e, other, l)
		})
	}
}

// The cache TTL bounds how long another replica's release can go unseen by
// a lease lookup here; a negative TTL turns the cache off.
func TestManager_LeaseCache_TTLBoundsStaleness(t *testing.T) {
	tests := []struct {
		name string
		ttl  time.Duration
	}{
		{name: "short ttl", ttl: 20 * time.Millisecond},
		{name: "disabled", ttl: -1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := fastConfig()
			cfg.LeaseCacheTTL = tc.ttl
			e := newEnv(t, cfg, testPool(0, 2))
			other := e.replica("other", cfg)
			l := e.acquire("alice")
			_, err := e.m.Get(t.Context(), l.ID, "alice")
			require.NoError(t, err)
			_, err = other.m.Release(t.Context(), l.ID, "alice")
			require.NoError(t, err)
			require.Eventually(t, func() bool {
				got, err := e.m.Get(t.Context(), l.ID, "alice")
				return err == nil && got.State == warmpool.LeaseReleased
			}, waitFor, tick)
		})
	}
}

// Store calls carry the manager operation they serve (CallerOf), so that
// a store's call counts tell an acquire's calls from background work's.
func TestManager_StoreCallsCarryTheirCaller(t *testing.T) {
	var s *scriptedStore
	cfg := fastConfig()
	cfg.LeaseCacheTTL = -1
	e := newEnvSetup(t, cfg, func(e *env) {
		e.wrap = func(st warmpool.Store) warmpool.Store { s = newScriptedStore(st); return s }
	}, testPool(1, 2))
	e.waitReady(1)
	l := e.acquire("alice")
	_, err := e.m.Get(t.Context(), l.ID, "alice")
	require.NoError(t, err)
	require.NoError(t, e.m.Ready(t.Context()))
	_, err = e.m.Heartbeat(t.Context(), l.ID, "alice")
	require.NoError(t, err)

	assert.Equal(t, map[string]bool{warmpool.CallerAcquire: true}, s.callersOf("Claim"))
	assert.Equal(t, map[string]bool{warmpool.CallerGet: true, warmpool.CallerReady: true}, s.callersOf("GetLease"),
		"a heartbeat reads nothing: it is one write")
	assert.Equal(t, map[string]bool{warmpool.CallerHeartbeat: true}, s.callersOf("RenewLease"))
	require.Eventually(t, func() bool {
		c := s.callersOf("TryLock")
		return c[warmpool.CallerReconcile] && c[warmpool.CallerReaper] && c[warmpool.CallerOrphans]
	}, waitFor, tick)
}

// Ready answers whether the store answers.
func TestManager_Ready_ReflectsTheStore(t *testing.T) {
	s, err := boltstore.Open(filepath.Join(t.TempDir(), "leases.db"), boltstore.Options{})
	require.NoError(t, err)
	prov := newFakeProvider(newFakeClock())
	m, err := warmpool.New(fastConfig(), warmpool.Deps{
		Store: s, Providers: map[string]providers.Provider{"fake": prov}, Pools: []warmpool.PoolConfig{testPool(0, 1)},
		Agents: newFakeAgents(prov),
	})
	require.NoError(t, err)
	require.NoError(t, m.Ready(t.Context()))
	require.NoError(t, s.Close())
	require.ErrorIs(t, m.Ready(t.Context()), warmpool.ErrClosed)
}

// getterStore is a scriptedStore that counts by caller the task reads and
// listings.
type getterStore struct {
	*scriptedStore
	mu    sync.Mutex
	reads map[string]int // "GetTask/<caller>" or "ListTasks/<caller>"
}

func (s *getterStore) count(ctx context.Context, method string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reads[method+"/"+warmpool.CallerOf(ctx)]++
}

func (s *getterStore) GetTask(ctx context.Context, id string) (warmpool.TaskRecord, error) {
	s.count(ctx, "GetTask")
	recs, err := s.Store.ListTasks(ctx, "")
	if err != nil {
		return warmpool.TaskRecord{}, err
	}
	for _, r := range recs {
		if r.ID == id {
			return r, nil
		}
	}
	return warmpool.TaskRecord{}, warmpool.ErrNotFound
}

func (s *getterStore) ListTasks(ctx context.Context, pool string) ([]warmpool.TaskRecord, error) {
	s.count(ctx, "ListTasks")
	return s.Store.ListTasks(ctx, pool)
}

func (s *getterStore) calls(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reads[key]
}

// A release reads no task: the lease names the provider's task, so the
// task is stopped and its record deleted without a read (and never with a
// listing of the pool); a task check reads the one record.
func TestManager_Release_ReadsNoTask(t *testing.T) {
	var s *getterStore
	e := newEnvSetup(t, fastConfig(), func(e *env) {
		e.wrap = func(st warmpool.Store) warmpool.Store {
			s = &getterStore{scriptedStore: newScriptedStore(st), reads: map[string]int{}}
			return s
		}
	}, testPool(0, 2))
	l := e.acquire("alice")
	_, err := e.m.Release(t.Context(), l.ID, "alice")
	require.NoError(t, err)
	assert.Equal(t, providers.TaskStopped, e.providerTask(l.TaskID).State, "the task was found and stopped")
	_, ok := e.taskRecord(l.TaskID)
	assert.False(t, ok, "and its record deleted")
	assert.Zero(t, s.calls("GetTask/"+warmpool.CallerRelease))
	assert.Zero(t, s.calls("ListTasks/"+warmpool.CallerRelease))

	l = e.acquire("alice")
	e.prov.kill(e.providerTask(l.TaskID).ID, "OOMKilled")
	got, err := e.m.CheckTask(t.Context(), l)
	require.NoError(t, err)
	assert.Equal(t, warmpool.LeaseLost, got.State)
	assert.Positive(t, s.calls("GetTask/"+warmpool.CallerCheckTask))
	assert.Zero(t, s.calls("ListTasks/"+warmpool.CallerCheckTask))
}

func TestConfig_Validate_ReplicaSettingsNameTheVariable(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(c *warmpool.Config)
		want   string
	}{
		{name: "defaults", mutate: func(*warmpool.Config) {}},
		{name: "cache off", mutate: func(c *warmpool.Config) { c.LeaseCacheTTL = -1 }},
		{name: "replica id with a space", mutate: func(c *warmpool.Config) { c.ReplicaID = "gw 1" }, want: "QUARRY_REPLICA_ID"},
		{name: "negative lock ttl", mutate: func(c *warmpool.Config) { c.LockTTL = -time.Second }, want: "QUARRY_LOCK_TTL"},
		{name: "cache ttl above the maximum", mutate: func(c *warmpool.Config) { c.LeaseCacheTTL = time.Hour }, want: "QUARRY_LEASE_CACHE_TTL"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var c warmpool.Config
			tc.mutate(&c)
			err := c.WithDefaults().Validate()
			if tc.want == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

func TestDefaultReplicaID_IsValidAndDistinct(t *testing.T) {
	a, b := warmpool.DefaultReplicaID(), warmpool.DefaultReplicaID()
	assert.NotEqual(t, a, b, "two managers in one process get distinct ids")
	c := warmpool.Config{ReplicaID: a}.WithDefaults()
	assert.NoError(t, c.Validate())
	assert.Equal(t, a, c.ReplicaID)
	assert.NotEqual(t, a, warmpool.Config{}.WithDefaults().ReplicaID)
}

// Cached answers from the lease cache as Get does, and only from it: an
// acquired lease is there for its owner, never for another owner, and a
// lease this replica ended is not (Get reads it from the store).
func TestManager_Cached(t *testing.T) {
	e := newEnv(t, fastConfig(), testPool(1, 2))
	l := e.acquire("alice")
	got, ok := e.m.Cached(l.ID, "alice")
	require.True(t, ok, "an acquired lease is cached")
	want, err := e.m.Get(t.Context(), l.ID, "alice")
	require.NoError(t, err)
	assert.Equal(t, want, got, "as Get answers it")
	_, ok = e.m.Cached(l.ID, "bob")
	assert.False(t, ok, "another owner's")
	_, ok = e.m.Cached("lse-unknown", "alice")
	assert.False(t, ok)
	_, err = e.m.Release(t.Context(), l.ID, "alice")
	require.NoError(t, err)
	if got, ok := e.m.Cached(l.ID, "alice"); ok {
		assert.Equal(t, warmpool.LeaseReleased, got.State, "never an ended lease as active")
	}
}
