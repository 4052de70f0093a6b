package warmpool_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"

	"github.com/quarryhq/quarry/internal/badinput"
	"github.com/quarryhq/quarry/providers"
	"github.com/quarryhq/quarry/warmpool"
	"github.com/quarryhq/quarry/warmpool/boltstore"
)

// imageProvider is a fakeProvider that prepares images
// (providers.ImagePreparer) and keeps them (providers.ImageCache):
// Prepare, when set, decides a preparation; prepares counts them by image.
type imageProvider struct {
	*fakeProvider

	imu      sync.Mutex
	Prepare  func(ctx context.Context, spec providers.Spec) (providers.ImageInfo, error)
	prepares map[string]int
	forgets  []string // refs ForgetImage was called with
}

var (
	_ providers.ImagePreparer = (*imageProvider)(nil)
	_ providers.ImageCache    = (*imageProvider)(nil)
)

func newImageProvider(prov *fakeProvider) *imageProvider {
	return &imageProvider{fakeProvider: prov, prepares: map[string]int{}}
}

func (p *imageProvider) PrepareImage(ctx context.Context, spec providers.Spec) (providers.ImageInfo, error) {
	p.imu.Lock()
	p.prepares[spec.Image]++
	fn := p.Prepare
	p.imu.Unlock()
	if fn != nil {
		return fn(ctx, spec)
	}
	return providers.ImageInfo{Image: spec.Image, State: providers.ImageReady, Digest: "sha256:d-" + spec.Image, Ref: "ref-" + spec.Image}, nil
}

func (p *imageProvider) Images(context.Context) ([]providers.ImageInfo, error) {
	p.imu.Lock()
	defer p.imu.Unlock()
	var out []providers.ImageInfo
	for image := range p.prepares {
		out = append(out, providers.ImageInfo{Image: image, State: providers.ImageReady, SizeBytes: 42})
	}
	return out, nil
}

func (p *imageProvider) ForgetImage(_ context.Context, _ providers.Spec, ref string) error {
	p.imu.Lock()
	defer p.imu.Unlock()
	p.forgets = append(p.forgets, ref)
	return nil
}

func (p *imageProvider) setPrepare(fn func(ctx context.Context, spec providers.Spec) (providers.ImageInfo, error)) {
	p.imu.Lock()
	defer p.imu.Unlock()
	p.Prepare = fn
}

func (p *imageProvider) prepareCount(image string) int {
	p.imu.Lock()
	defer p.imu.Unlock()
	return p.prepares[image]
}

func (p *imageProvider) forgotten() []string {
	p.imu.Lock()
	defer p.imu.Unlock()
	return append([]string(nil), p.forgets...)
}

func testClass(maxTotal int) warmpool.ClassConfig {
	zero := 0
	return warmpool.ClassConfig{
		Name: "default", Provider: "fake", MaxTotal: maxTotal, MaxCPU: 4, MaxMemory: 4096, WarmMax: &zero,
		Images: []string{"registry.test/**", "python:*"},
	}.WithDefaults()
}

// newImageEnv is a manager with one configured pool ("default", none warm)
// and the classes given, on an imageProvider.
func newImageEnv(t *testing.T, cfg warmpool.Config, classes ...warmpool.ClassConfig) (*env, *imageProvider) {
	t.Helper()
	var ip *imageProvider
	e := newEnvSetup(t, cfg, func(e *env) {
		ip = newImageProvider(e.prov)
		e.provider = ip
		e.classes = classes
	}, testPool(0, 4))
	return e, ip
}

func (e *env) imagePool(image string) string {
	e.t.Helper()
	name, err := e.m.ImagePool(e.t.Context(), warmpool.ImageRequest{Image: image, Owner: "alice"})
	require.NoError(e.t, err)
	return name
}

func (e *env) acquireFrom(pool, owner string) warmpool.Lease {
	e.t.Helper()
	l, _, err := e.m.Acquire(e.t.Context(), warmpool.AcquireRequest{Pool: pool, Owner: owner})
	require.NoError(e.t, err)
	return l
}

func (e *env) poolRecord(name string) warmpool.PoolRecord {
	e.t.Helper()
	rec, err := e.store.GetPool(e.t.Context(), name)
	require.NoError(e.t, err)
	return rec
}

func TestImagePool_OnePoolPerImagePreparedOnce(t *testing.T) {
	e, ip := newImageEnv(t, fastConfig(), testClass(8))
	gate := make(chan struct{})
	ip.setPrepare(func(ctx context.Context, spec providers.Spec) (providers.ImageInfo, error) {
		<-gate // every caller is waiting when the preparation ends
		return providers.ImageInfo{Image: spec.Image, State: providers.ImageReady, Digest: "sha256:abc"}, nil
	})
	const callers = 12
	names := make([]string, callers)
	var wg sync.WaitGroup
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n, err := e.m.ImagePool(context.Background(), warmpool.ImageRequest{Image: "registry.test/swe/task-1:v1", Owner: "alice"})
			assert.NoError(t, err)
			names[i] = n
		}()
	}
	require.Eventually(t, func() bool { return ip.prepareCount("registry.test/swe/task-1:v1") == 1 }, waitFor, tick)
	close(gate)
	wg.Wait()
	for _, n := range names {
		assert.Equal(t, names[0], n, "one pool for one image")
	}
	assert.Equal(t, 1, ip.prepareCount("registry.test/swe/task-1:v1"), "one preparation for every caller")
	ref, err := warmpool.ParseImageRef("registry.test/swe/task-1:v1")
	require.NoError(t, err)
	assert.Equal(t, warmpool.OnDemandPoolName("default", ref, 1, 1024, 0), names[0], "named from the class, image and resources")

	rec := e.poolRecord(names[0])
	assert.Equal(t, warmpool.PoolActive, rec.State)
	assert.Equal(t, "default", rec.Class)
	assert.Equal(t, "registry.test/swe/task-1:v1", rec.Image)
	assert.Equal(t, "sha256:abc", rec.Digest)

	l := e.acquireFrom(names[0], "alice")
	assert.Equal(t, names[0], l.Pool)
	task, ok := e.taskRecord(l.TaskID)
	require.True(t, ok)
	assert.Equal(t, "default", task.Class, "the task counts in its class")
	pt := e.providerTask(l.TaskID)
	assert.Equal(t, names[0], pt.Pool)

	other := e.imagePool("python:3.11")
	assert.NotEqual(t, names[0], other, "another image, another pool")
	bigger, err := e.m.ImagePool(t.Context(), warmpool.ImageRequest{Image: "registry.test/swe/task-1:v1", CPU: 2, Owner: "alice"})
	require.NoError(t, err)
	assert.NotEqual(t, names[0], bigger, "other resources, another pool")
}

func TestImagePool_Refusals(t *testing.T) {
	cfg := fastConfig()
	cfg.ImageAllow = []string{"registry.test/**", "0123456789abcdef0123456789abcdef=python:3.12"}
	process := warmpool.ClassConfig{Name: "host", Provider: "process", MaxTotal: 4, Images: []string{"local/**"}}.WithDefaults()
	var ip *imageProvider
	e := newEnvSetup(t, cfg, func(e *env) {
		ip = newImageProvider(e.prov)
		e.provider = ip
		e.classes = []warmpool.ClassConfig{testClass(8)}
	}, testPool(0, 4))
	// Again with a class on a provider without images (the process one's
	// place: a fake that does not prepare images).
	require.NoError(t, e.m.Close(t.Context()))
	require.NoError(t, e.store.Close())
	e.classes = append(e.classes, process)
	e.start2(map[string]providers.Provider{"fake": ip, "process": e.prov})

	for _, tc := range []struct {
		name   string
		req    warmpool.ImageRequest
		bad    string // a *badinput.Error naming this field
		denied string // an *ImageNotAllowedError saying this
	}{
		{name: "malformed", req: warmpool.ImageRequest{Image: "UPPER/Case"}, bad: "image"},
		{name: "empty", req: warmpool.ImageRequest{Image: ""}, bad: "image"},
		{name: "no class serves it", req: warmpool.ImageRequest{Image: "quay.io/x/y:1"}, denied: "no class serves it"},
		{name: "the named class does not serve it", req: warmpool.ImageRequest{Image: "python:3.11", Class: "host"}, denied: `class "host" serves only images matching local/**`},
		{name: "unknown class", req: warmpool.ImageRequest{Image: "python:3.11", Class: "gpu"}, bad: "class"},
		{name: "a provider without images", req: warmpool.ImageRequest{Image: "local/a:1", Class: "host"}, bad: "image"},
		{name: "cpu over the class's", req: warmpool.ImageRequest{Image: "registry.test/a:1", CPU: 8}, bad: "cpu"},
		{name: "memory over the class's", req: warmpool.ImageRequest{Image: "registry.test/a:1", Memory: 8192}, bad: "memory"},
		{name: "disk where the class sets none", req: warmpool.ImageRequest{Image: "registry.test/a:1", Disk: 100}, bad: "disk"},
		{name: "QUARRY_IMAGE_ALLOW has no rule for this key", req: warmpool.ImageRequest{Image: "python:3.11", Owner: "ffffffffffffffffffffffffffffffff"}, denied: "QUARRY_IMAGE_ALLOW"},
		{name: "another key's rule", req: warmpool.ImageRequest{Image: "python:3.12", Owner: "ffffffffffffffffffffffffffffffff"}, denied: "QUARRY_IMAGE_ALLOW"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.m.ImagePool(t.Context(), tc.req)
			require.Error(t, err)
			if tc.bad != "" {
				var be *badinput.Error
				require.ErrorAs(t, err, &be)
				assert.Equal(t, tc.bad, be.Field)
			} else {
				var de *warmpool.ImageNotAllowedError
				require.ErrorAs(t, err, &de)
				assert.Contains(t, de.Error(), tc.denied)
			}
		})
	}
	_, err := e.m.ImagePool(t.Context(), warmpool.ImageRequest{Image: "python:3.12", Owner: "0123456789abcdef0123456789abcdef"})
	require.NoError(t, err, "the key's own rule")
	page, err := e.store.ListPoolsPage(t.Context(), "", "", 100)
	require.NoError(t, err)
	assert.Len(t, page.Pools, 1, "no refused request made a pool")
}

// start2 starts the env's manager again with these providers.
func (e *env) start2(provs map[string]providers.Provider) {
	e.t.Helper()
	var err error
	e.store, err = boltstore.Open(e.path, boltstore.Options{})
	require.NoError(e.t, err)
	e.m, err = warmpool.New(e.cfg, warmpool.Deps{Store: e.store, Providers: provs, Pools: e.pools, Classes: e.classes,
		Agents: e.agents, Clock: e.clock})
	require.NoError(e.t, err)
	require.NoError(e.t, e.m.Start(e.t.Context()))
}

func TestImagePool_APreparationThatFailsLeavesNothing(t *testing.T) {
	e, ip := newImageEnv(t, fastConfig(), testClass(8))
	for _, kind := range []providers.ImageErrorKind{providers.ImageNotFound, providers.ImageDenied, providers.ImageUnreachable} {
		t.Run(string(kind), func(t *testing.T) {
			ip.setPrepare(func(_ context.Context, spec providers.Spec) (providers.ImageInfo, error) {
				return providers.ImageInfo{}, &providers.ImageError{Image: spec.Image, Kind: kind, Registry: "registry.test", Answer: "no"}
			})
			_, err := e.m.ImagePool(t.Context(), warmpool.ImageRequest{Image: "registry.test/missing:" + string(kind)})
			var ie *providers.ImageError
			require.ErrorAs(t, err, &ie)
			assert.Equal(t, kind, ie.Kind)
		})
	}
	page, err := e.store.ListPoolsPage(t.Context(), "", "", 100)
	require.NoError(t, err)
	assert.Empty(t, page.Pools, "no pool record")
	tasks, err := e.store.ListTasks(t.Context(), "")
	require.NoError(t, err)
	assert.Empty(t, tasks, "no task")
	_, _, launched, _ := e.prov.counts()
	assert.Zero(t, launched, "nothing launched")
}

func TestOnDemand_ClassTotalBoundsEveryPool(t *testing.T) {
	e, _ := newImageEnv(t, fastConfig(), testClass(2))
	a, b, c := e.imagePool("registry.test/a:1"), e.imagePool("registry.test/b:1"), e.imagePool("registry.test/c:1")
	la := e.acquireFrom(a, "alice")
	e.acquireFrom(b, "alice")
	got := make(chan warmpool.Lease, 1)
	go func() {
		l, _, err := e.m.Acquire(context.Background(), warmpool.AcquireRequest{Pool: c, Owner: "alice"})
		assert.NoError(t, err)
		got <- l
	}()
	require.Eventually(t, func() bool {
		return e.counter("quarry_refill_blocked_total", map[string]string{"pool": "class/default", "reason": "max_total"}) > 0
	}, waitFor, tick, "the third image waits at the class's max_total")
	n, err := e.store.CountClass(t.Context(), "default")
	require.NoError(t, err)
	assert.Equal(t, 2, n)
	_, err = e.m.Release(t.Context(), la.ID, "alice")
	require.NoError(t, err)
	select {
	case l := <-got:
		assert.Equal(t, c, l.Pool, "a freed slot of the class serves another image")
	case <-time.After(waitFor):
		t.Fatal("the waiting acquire never got a sandbox")
	}
}

func TestOnDemand_WarmPolicyIdleEndAndReturn(t *testing.T) {
	cfg := fastConfig()
	cfg.PoolTouchInterval = 10 * time.Millisecond
	class := testClass(8)
	two := 2
	class.WarmMax, class.IdleSeconds, class.RetentionSeconds = &two, 600, 3600
	e, ip := newImageEnv(t, cfg, class)
	name := e.imagePool("registry.test/warm:1")
	l := e.acquireFrom(name, "alice")
	require.Eventually(t, func() bool { return e.poolRecord(name).Acquires == 1 }, waitFor, tick, "the acquire is counted in the record")
	require.Eventually(t, func() bool { return e.counts(name).Ready >= 1 }, waitFor, tick, "a pool used recently keeps one warm")

	_, err := e.m.Release(t.Context(), l.ID, "alice")
	require.NoError(t, err)
	e.clock.Advance(601 * time.Second)
	require.Eventually(t, func() bool { return e.poolRecord(name).State == warmpool.PoolEnded }, waitFor, tick, "idle past idle_seconds: the pool ends")
	assert.Zero(t, e.counts(name).Total(), "with no task left")

	again := e.imagePool("registry.test/warm:1")
	assert.Equal(t, name, again)
	assert.Equal(t, warmpool.PoolActive, e.poolRecord(name).State, "an acquire makes it active again")
	e.acquireFrom(name, "bob")

	// Ended again, then past its retention: the record and the image go.
	require.NoError(t, releaseAll(e))
	e.clock.Advance(601 * time.Second)
	require.Eventually(t, func() bool { return e.poolRecord(name).State == warmpool.PoolEnded }, waitFor, tick)
	e.clock.Advance(3601 * time.Second)
	require.Eventually(t, func() bool {
		_, err := e.store.GetPool(t.Context(), name)
		return errors.Is(err, warmpool.ErrNotFound)
	}, waitFor, tick, "deleted after retention_seconds")
	assert.Contains(t, ip.forgotten(), "ref-registry.test/warm:1", "the provider released what it made")
}

func (e *env) counts(pool string) warmpool.TaskCounts {
	e.t.Helper()
	c, err := e.store.CountTasks(e.t.Context(), pool)
	require.NoError(e.t, err)
	return c
}

// releaseAll releases every active lease.
func releaseAll(e *env) error {
	ls, err := e.m.List(e.t.Context(), warmpool.LeaseFilter{State: warmpool.LeaseActive})
	if err != nil {
		return err
	}
	for _, l := range ls {
		if _, err := e.m.Release(e.t.Context(), l.ID, l.Owner); err != nil {
			return err
		}
	}
	return nil
}

func TestPrefetch_PreparesAndWarms(t *testing.T) {
	e, ip := newImageEnv(t, fastConfig(), testClass(8))
	res, err := e.m.Prefetch(t.Context(), warmpool.PrefetchRequest{
		Images: []string{"registry.test/p:1", "registry.test/q:1", "quay.io/nope:1", "registry.test/p:1"}, Warm: 2, Owner: "alice",
	})
	require.NoError(t, err)
	require.Len(t, res, 4)
	assert.Equal(t, warmpool.PrefetchQueued, res[0].State)
	assert.Equal(t, warmpool.PrefetchQueued, res[1].State)
	assert.Equal(t, warmpool.PrefetchRefused, res[2].State)
	var de *warmpool.ImageNotAllowedError
	assert.ErrorAs(t, res[2].Err, &de)
	assert.Equal(t, res[0].Pool, res[3].Pool, "an image named twice is one pool")
	for _, r := range res[:2] {
		require.Eventually(t, func() bool { return e.counts(r.Pool).Ready == 2 }, waitFor, tick, "%s keeps 2 warm", r.Image)
		rec := e.poolRecord(r.Pool)
		assert.Equal(t, 2, rec.WarmFloor)
	}
	assert.GreaterOrEqual(t, ip.prepareCount("registry.test/p:1"), 1, "prepared before the pool was made (and before each launch)")

	page, err := e.m.Images(t.Context(), "", 100)
	require.NoError(t, err)
	require.Len(t, page.Images, 2)
	for _, im := range page.Images {
		assert.Equal(t, providers.ImageReady, im.State)
		assert.Equal(t, warmpool.PoolActive, im.PoolState)
		assert.Equal(t, int64(42), im.SizeBytes, "the provider's size")
		assert.Equal(t, 2, im.Warm)
	}
	of, err := e.m.ImagesOf(t.Context(), []string{res[0].Pool, "i-nonexistentnonexistent00"}, []string{"docker.io/library/nothing:1"})
	require.NoError(t, err)
	require.Len(t, of.Images, 1, "the named pool's image; no record, no provider entry: nothing else")
	assert.Equal(t, res[0].Pool, of.Images[0].Pool)
	_, err = e.m.Prefetch(t.Context(), warmpool.PrefetchRequest{})
	var be *badinput.Error
	require.ErrorAs(t, err, &be, "no image")
	_, err = e.m.Prefetch(t.Context(), warmpool.PrefetchRequest{Images: []string{"registry.test/p:1"}, Warm: -1})
	require.ErrorAs(t, err, &be, "a negative warm")
}

func TestOnDemand_AnotherReplicaServesThePool(t *testing.T) {
	e, ip := newImageEnv(t, fastConfig(), testClass(8))
	name := e.imagePool("registry.test/shared:1")
	other, err := warmpool.New(e.cfg, warmpool.Deps{
		Store: e.store, Providers: map[string]providers.Provider{"fake": ip}, Pools: e.pools, Classes: e.classes,
		Agents: e.agents, Clock: e.clock,
	})
	require.NoError(t, err)
	require.NoError(t, other.Start(t.Context()))
	t.Cleanup(func() { assert.NoError(t, other.Close(context.Background())) })
	l, _, err := other.Acquire(t.Context(), warmpool.AcquireRequest{Pool: name, Owner: "alice"})
	require.NoError(t, err, "a replica that never saw the image acquires by the pool's name")
	assert.Equal(t, name, l.Pool)
	got, err := other.Get(t.Context(), l.ID, "alice")
	require.NoError(t, err)
	assert.Equal(t, name, got.Pool)
	_, _, err = other.Acquire(t.Context(), warmpool.AcquireRequest{Pool: "i-aaaaaaaaaaaaaaaaaaaaaaaa", Owner: "alice"})
	var be *badinput.Error
	require.ErrorAs(t, err, &be, "an on-demand name with no record is an unknown pool")
}

// callCounter counts a store's lock attempts by lock name and its task
// counter reads.
type callCounter struct {
	warmpool.Store
	mu     sync.Mutex
	locks  map[string]int
	counts int
}

func (s *callCounter) TryLock(ctx context.Context, name, holder string, ttl time.Duration, now time.Time) (bool, error) {
	s.mu.Lock()
	s.locks[name]++
	s.mu.Unlock()
	return s.Store.TryLock(ctx, name, holder, ttl, now)
}

// CountTasks counts the reads of on-demand pools' counters only: the
// configured pool's reconciler reads its own as often as its interval,
// which under CPU pressure outpaces the class's slowed passes (make
// flake-hunt: 4,147 reads against a bound of 4,141, 1 run of 20).
func (s *callCounter) CountTasks(ctx context.Context, pool string) (warmpool.TaskCounts, error) {
	if strings.HasPrefix(pool, warmpool.OnDemandPrefix) {
		s.mu.Lock()
		s.counts++
		s.mu.Unlock()
	}
	return s.Store.CountTasks(ctx, pool)
}

func (s *callCounter) snapshot() (map[string]int, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]int{}
	for k, v := range s.locks {
		out[k] = v
	}
	return out, s.counts
}

// Thousands of on-demand pools cost their class one lock and one page of
// pool passes per pass: no lock of their own, no walk while they have no
// task, and no pass of their own beside the class's.
func TestOnDemand_ThousandsOfPoolsShareTheirClassLock(t *testing.T) {
	const pools = 2000
	cfg := fastConfig()
	cfg.SweepInterval = time.Hour // each pool's periodic pass: once, at its load
	cfg.PoolPage = 100
	var counter *callCounter
	e := newEnvSetup(t, cfg, func(e *env) {
		ip := newImageProvider(e.prov)
		e.provider = ip
		e.classes = []warmpool.ClassConfig{testClass(10000)}
		e.wrap = func(s warmpool.Store) warmpool.Store {
			counter = &callCounter{Store: s, locks: map[string]int{}}
			return counter
		}
	}, testPool(0, 4))
	now := e.clock.Now()
	var g errgroup.Group
	g.SetLimit(32) // the embedded store commits concurrent writes together
	for i := range pools {
		g.Go(func() error {
			ref, err := warmpool.ParseImageRef(fmt.Sprintf("registry.test/task-%d:v1", i))
			if err != nil {
				return err
			}
			_, err = e.store.CreatePool(context.Background(), warmpool.PoolRecord{Name: warmpool.OnDemandPoolName("default", ref, 1, 1024, 0),
				Class: "default", Image: ref.String(), CPU: 1, MemoryMiB: 1024, CreatedAt: now, LastUsed: now})
			return err
		})
	}
	require.NoError(t, g.Wait())
	require.Eventually(t, func() bool {
		return e.counter("quarry_ondemand_pools_loaded", map[string]string{"class": "default"}) == pools
	}, waitFor, tick, "the class loop loads every active pool, a page per pass")
	locks0, reads0 := counter.snapshot()
	require.Eventually(t, func() bool { l, _ := counter.snapshot(); return l["class/default"] >= locks0["class/default"]+40 }, waitFor, tick,
		"two more walks of the class's records")
	locks1, reads1 := counter.snapshot()
	passes := locks1["class/default"] - locks0["class/default"]
	for name := range locks1 {
		assert.NotContains(t, name, "pool/i-", "an on-demand pool takes no lock of its own")
	}
	// A class pass is one page of pools: a counter read per pool of the
	// page (none has a task: no walk), and the class's count once a cycle.
	assert.LessOrEqual(t, reads1-reads0, (passes+1)*(cfg.PoolPage+1), "the work of %d class passes", passes)
}

func TestImages_PagesClassByClass(t *testing.T) {
	a, b := testClass(8), testClass(8)
	a.Name, a.Images = "a", []string{"registry.test/a/**"}
	b.Name, b.Images = "b", []string{"registry.test/b/**"}
	e, _ := newImageEnv(t, fastConfig(), a, b)
	want := map[string]bool{}
	for _, image := range []string{"registry.test/a/1", "registry.test/a/2", "registry.test/a/3", "registry.test/b/1", "registry.test/b/2"} {
		want[e.imagePool(image)] = true
	}
	seen := map[string]int{}
	cursor := ""
	for pages := 0; ; pages++ {
		require.Less(t, pages, 10)
		page, err := e.m.Images(t.Context(), cursor, 2)
		require.NoError(t, err)
		assert.LessOrEqual(t, len(page.Images), 2, "at most limit pools")
		for _, im := range page.Images {
			seen[im.Pool]++
		}
		if cursor = page.Next; cursor == "" {
			break
		}
	}
	assert.Len(t, seen, len(want))
	for pool := range want {
		assert.Equal(t, 1, seen[pool], pool)
	}
	_, err := e.m.Images(t.Context(), "7/x", 2)
	var be *badinput.Error
	require.ErrorAs(t, err, &be, "a cursor of no class")
}

// claimCounter counts an acquire's claims and counter reads.
type claimCounter struct {
	warmpool.Store
	claims, counts atomic.Int64
}

func (s *claimCounter) Claim(ctx context.Context, req warmpool.ClaimRequest) (warmpool.ClaimResult, error) {
	if warmpool.CallerOf(ctx) == warmpool.CallerAcquire {
		s.claims.Add(1)
	}
	return s.Store.Claim(ctx, req)
}

func (s *claimCounter) CountTasks(ctx context.Context, pool string) (warmpool.TaskCounts, error) {
	if warmpool.CallerOf(ctx) == warmpool.CallerAcquire {
		s.counts.Add(1)
	}
	return s.Store.CountTasks(ctx, pool)
}

// An acquire that waits while nothing is ready looks with a counter read,
// not a claim: thousands of pools with waiting acquires (an on-demand
// class under load) would otherwise cost a claim's queries each, four
// times a second.
func TestAcquire_WaitingHeadLooksWithCountsNotClaims(t *testing.T) {
	var counter *claimCounter
	release := make(chan struct{})
	e := newEnvSetup(t, fastConfig(), func(e *env) {
		e.wrap = func(s warmpool.Store) warmpool.Store { counter = &claimCounter{Store: s}; return counter }
		e.prov.setOnLaunch(func(ctx context.Context, _ providers.Spec, _ []string) error {
			select { // launches hang: nothing becomes ready
			case <-release:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
	}, testPool(0, 2))
	var once sync.Once
	open := func() { once.Do(func() { close(release) }) }
	defer open()
	done := make(chan error, 1)
	go func() {
		_, _, err := e.m.Acquire(context.Background(), warmpool.AcquireRequest{Pool: "default", Owner: "alice"})
		done <- err
	}()
	require.Eventually(t, func() bool { return counter.counts.Load() >= 4 }, waitFor, tick, "the head looks again and again")
	assert.Equal(t, int64(1), counter.claims.Load(), "one claim, at the start: every look since found nothing ready")
	open()
	select {
	case err := <-done:
		require.NoError(t, err, "the launch ends and the acquire gets its task")
	case <-time.After(waitFor):
		t.Fatal("the acquire never got its task")
	}
}

// Two replicas asked for a new image at once: one prepares it (one pull,
// one task definition), the other waits for its record.
func TestImagePool_ReplicasPrepareAnImageOnce(t *testing.T) {
	e, ip := newImageEnv(t, fastConfig(), testClass(8))
	other, gate := secondReplicaGated(t, e, ip)
	names := make(chan string, 2)
	for _, m := range []*warmpool.Manager{e.m, other} {
		go func() {
			n, err := m.ImagePool(context.Background(), warmpool.ImageRequest{Image: "registry.test/both:1", Owner: "alice"})
			assert.NoError(t, err)
			names <- n
		}()
	}
	require.Eventually(t, func() bool { return ip.prepareCount("registry.test/both:1") == 1 }, waitFor, tick)
	close(gate)
	a, b := <-names, <-names
	assert.Equal(t, a, b)
	assert.Equal(t, 1, ip.prepareCount("registry.test/both:1"), "one replica prepared the image; the other waited for its record")
}

// A prefetched pool waits for its batch: it does not end for idleness
// until the class's prefetch hold has passed.
func TestPrefetch_HoldsThePoolForItsBatch(t *testing.T) {
	class := testClass(8)
	class.IdleSeconds, class.PrefetchHoldSeconds = 600, 1800
	e, _ := newImageEnv(t, fastConfig(), class)
	res, err := e.m.Prefetch(t.Context(), warmpool.PrefetchRequest{Images: []string{"registry.test/later:1"}, Owner: "alice"})
	require.NoError(t, err)
	name := res[0].Pool
	require.Eventually(t, func() bool {
		rec, err := e.store.GetPool(t.Context(), name)
		return err == nil && rec.State == warmpool.PoolActive && !rec.WarmUntil.IsZero()
	}, waitFor, tick, "the prefetch made the pool and recorded its hold")
	passes := func() float64 {
		return e.counter("quarry_locked_passes_total", map[string]string{"lock": "class/default"})
	}
	e.clock.Advance(601 * time.Second)
	before := passes()
	require.Eventually(t, func() bool { return passes() >= before+3 }, waitFor, tick, "the class passes ran")
	assert.Equal(t, warmpool.PoolActive, e.poolRecord(name).State, "idle past idle_seconds, but within the prefetch's hold")
	e.clock.Advance(1200 * time.Second)
	require.Eventually(t, func() bool { return e.poolRecord(name).State == warmpool.PoolEnded }, waitFor, tick, "after the hold it ends")
}

// A preparation that outlasts its acquires' wait goes on under its lock:
// another replica (or a later acquire here) waits for it instead of
// preparing the image a second time (on ECS: a second registration in
// AWS's RegisterTaskDefinition rate).
func TestImagePool_APreparationOutlastingItsWaitIsNotStartedAgain(t *testing.T) {
	cfg := fastConfig()
	cfg.ImagePrepareTimeout = 300 * time.Millisecond
	e, ip := newImageEnv(t, cfg, testClass(8))
	other, gate := secondReplicaGated(t, e, ip)
	req := warmpool.ImageRequest{Image: "registry.test/slow:1", Owner: "alice"}
	_, err := e.m.ImagePool(t.Context(), req)
	require.ErrorIs(t, err, context.DeadlineExceeded, "the wait ended before the preparation")
	require.Equal(t, 1, ip.prepareCount(req.Image))

	for _, m := range []*warmpool.Manager{e.m, other} {
		_, err = m.ImagePool(t.Context(), req)
		require.ErrorIs(t, err, context.DeadlineExceeded, "still preparing")
	}
	assert.Equal(t, 1, ip.prepareCount(req.Image), "neither a later acquire nor the other replica prepared the image again")

	close(gate)
	var name string
	require.Eventually(t, func() bool {
		name, err = other.ImagePool(t.Context(), req)
		return err == nil
	}, waitFor, tick, "the preparation recorded the pool when it was done")
	assert.Equal(t, warmpool.PoolActive, e.poolRecord(name).State)
	assert.Equal(t, 1, ip.prepareCount(req.Image))
}

// secondReplicaGated starts a second replica on e's store and provider,
// and makes the provider's preparations wait until gate is closed.
func secondReplicaGated(t *testing.T, e *env, ip *imageProvider) (*warmpool.Manager, chan struct{}) {
	t.Helper()
	other, err := warmpool.New(e.cfg, warmpool.Deps{
		Store: e.store, Providers: map[string]providers.Provider{"fake": ip}, Pools: e.pools, Classes: e.classes,
		Agents: e.agents, Clock: e.clock, Logger: slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	require.NoError(t, other.Start(t.Context()))
	t.Cleanup(func() { assert.NoError(t, other.Close(context.Background())) })
	gate := make(chan struct{})
	ip.setPrepare(func(ctx context.Context, spec providers.Spec) (providers.ImageInfo, error) {
		select {
		case <-gate:
		case <-ctx.Done():
			return providers.ImageInfo{}, ctx.Err()
		}
		return providers.ImageInfo{Image: spec.Image, State: providers.ImageReady}, nil
	})
	return other, gate
}

// slowCounts is a store whose count reads take a while, as DynamoDB's do,
// so that an on-demand pool's class pass and its wake-up refills overlap.
// The sleep is the store's modelled latency, not a wait for a condition:
// with the fix the passes take turns whatever it is, so no timing makes
// the test fail; it only makes the overlap likely without the fix (every
// run did).
type slowCounts struct{ warmpool.Store }

func (s slowCounts) CountTasks(ctx context.Context, pool string) (warmpool.TaskCounts, error) {
	time.Sleep(20 * time.Millisecond)
	return s.Store.CountTasks(ctx, pool)
}

// One acquire of a new image launches one task: the class pass's refill
// and the pool's wake-up refill, on two goroutines, take turns, so the
// second counts what the first reserved (both launched one, two tasks for
// one sandbox, on DynamoDB every time).
func TestOnDemand_OneAcquireLaunchesOneTask(t *testing.T) {
	cfg := fastConfig()
	cfg.ReconcileInterval, cfg.PoolTouchInterval = 20*time.Millisecond, 50*time.Millisecond
	e := newEnvSetup(t, cfg, func(e *env) {
		e.provider = newImageProvider(e.prov)
		e.classes = []warmpool.ClassConfig{testClass(8)}
		e.wrap = func(s warmpool.Store) warmpool.Store { return slowCounts{s} }
	}, testPool(0, 2))
	for i := range 3 {
		name := e.imagePool(fmt.Sprintf("registry.test/one:%d", i))
		e.acquireFrom(name, "alice")
		passes := e.counter("quarry_locked_passes_total", map[string]string{"lock": "class/default"})
		require.Eventually(t, func() bool {
			return e.counter("quarry_locked_passes_total", map[string]string{"lock": "class/default"}) >= passes+3
		}, waitFor, tick, "class passes ran after the acquire")
		_, _, launched, _ := e.prov.counts()
		require.Equal(t, i+1, launched, "image %d: one task per acquire", i)
	}
}

// gatedEndStore holds EndPool until gate is closed, telling entered when
// it is called.
type gatedEndStore struct {
	warmpool.Store
	entered chan struct{}
	gate    chan struct{}
}

func (s *gatedEndStore) EndPool(ctx context.Context, rec warmpool.PoolRecord, now time.Time) (warmpool.PoolRecord, error) {
	select {
	case s.entered <- struct{}{}:
	default:
	}
	<-s.gate
	return s.Store.EndPool(ctx, rec, now)
}

// TestOnDemand_ImageRequestDuringTheEndOfItsPool: an image request that
// comes while the pool of its image is ending (the record ended, the pool
// not yet unloaded) gets the pool made active again, not a name whose pool
// has just ended (seen under load: the request found the replica's copy
// still active and was answered from it, 1 run in 7).
func TestOnDemand_ImageRequestDuringTheEndOfItsPool(t *testing.T) {
	cfg := fastConfig()
	cfg.PoolTouchInterval = 10 * time.Millisecond
	class := testClass(8)
	class.IdleSeconds, class.RetentionSeconds = 600, 3600
	gs := &gatedEndStore{entered: make(chan struct{}, 1), gate: make(chan struct{})}
	var e *env
	e = newEnvSetup(t, cfg, func(en *env) {
		en.provider = newImageProvider(en.prov)
		en.classes = []warmpool.ClassConfig{class}
		en.wrap = func(st warmpool.Store) warmpool.Store { gs.Store = st; return gs }
	}, testPool(0, 4))
	name := e.imagePool("registry.test/ending:1")
	l := e.acquireFrom(name, "alice")
	require.Eventually(t, func() bool { return e.poolRecord(name).Acquires == 1 }, waitFor, tick)
	_, err := e.m.Release(t.Context(), l.ID, "alice")
	require.NoError(t, err)
	e.clock.Advance(601 * time.Second)
	select {
	case <-gs.entered: // the pool is ending: its record is about to end
	case <-time.After(waitFor):
		t.Fatal("the idle pool never began to end")
	}

	got := make(chan error, 1)
	go func() {
		_, err := e.m.ImagePool(context.Background(), warmpool.ImageRequest{Image: "registry.test/ending:1", Owner: "bob"})
		got <- err
	}()
	// Without the fix the request is answered now, from the replica's copy
	// of a record that is about to end; with it, it waits for the end. Give
	// it the chance to answer early, then let the end go on.
	select {
	case err := <-got:
		got <- err
	case <-time.After(200 * time.Millisecond):
	}
	close(gs.gate)
	select {
	case err := <-got:
		require.NoError(t, err)
	case <-time.After(waitFor):
		t.Fatal("the image request never ended")
	}
	assert.Equal(t, warmpool.PoolActive, e.poolRecord(name).State, "the request made the pool active again")
	e.acquireFrom(name, "bob")
}
