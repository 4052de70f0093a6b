package warmpool

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/quarryhq/quarry/internal/badinput"
	"github.com/quarryhq/quarry/providers"
)

// On-demand pools: a pool made for an image a request named, of a class the
// operator configured (docs/ARCHITECTURE.md, "Images on demand"). This file
// holds how a request finds or makes its pool (ImagePool), how pools are
// loaded and unloaded on a replica, the class loop (warm policy, idle end,
// retention) and the batched acquire counts (TouchPool).

const (
	lockClassPrefix = "class/" // + class name: the class loop and its pools' passes
	// touchConcurrency bounds the TouchPool calls of one flush.
	touchConcurrency = 8
	// loadAttempts bounds the races one load of a pool record may lose.
	loadAttempts = 3
	// ReasonPoolIdle is the reason recorded with a ready task retired
	// because its on-demand pool was idle for its class's idle_seconds.
	ReasonPoolIdle = "its on-demand pool is idle (no acquire for the class's idle_seconds): the pool ends"
)

// ImageRequest asks for the on-demand pool of an image (ImagePool).
type ImageRequest struct {
	// Image is the reference as the request wrote it.
	Image string
	// Class names the pool class; "" takes the first class (in the pools
	// file's order) whose images patterns match the image.
	Class string
	// CPU, Memory and Disk: 0 takes the class's; each is bounded by the
	// class's maximum.
	CPU    float64
	Memory MiB
	Disk   DiskMiB
	// Owner is the caller (the API key's owner id): QUARRY_IMAGE_ALLOW's
	// rules may name it.
	Owner string
}

// ImageNotAllowedError is an image that no rule lets the caller ask for:
// its class's images patterns, or QUARRY_IMAGE_ALLOW. Refused names what
// refused it.
type ImageNotAllowedError struct {
	Image   string
	Refused string
}

func (e *ImageNotAllowedError) Error() string {
	return fmt.Sprintf("image %q is not allowed: %s", e.Image, e.Refused)
}

// classState is a configured class with what the manager derives from it.
type classState struct {
	cfg      ClassConfig
	provider providers.Provider
	patterns []ImagePattern
	lock     string
	// cursor is where the class loop is in the class's pool records; only
	// the class loop uses it.
	cursor string
}

// odState is what an on-demand pool adds to a pool. mu guards the fields
// below it.
type odState struct {
	class *classState
	quit  chan struct{} // closed when the pool is unloaded: its loop ends
	once  sync.Once
	loop  atomic.Bool // its loop was started

	// ending is held while an idle pool ends (endIdle: the decision, the
	// record's end, the unload) and by useIfActive: a request that finds
	// the pool active has it used before the end can decide, or finds it
	// unloaded after.
	ending sync.Mutex

	mu        sync.Mutex
	rec       PoolRecord // as last read or written
	warm      int        // ready tasks it keeps now (warm policy and prefetch floor)
	lastLocal time.Time  // its last acquire (or load) on this replica, real time
	usedAt    time.Time  // its last acquire or image request on this replica, manager clock
	samples   []acquireSample
}

// acquireSample is a pool record's acquire count at a time (manager clock).
type acquireSample struct {
	at time.Time
	n  int64
}

// imageRule is one rule of QUARRY_IMAGE_ALLOW: a pattern, for every key or
// for one owner.
type imageRule struct {
	owner   string // "" for every key
	pattern ImagePattern
}

// parseImageRules parses QUARRY_IMAGE_ALLOW's rules: PATTERN or
// OWNER=PATTERN, OWNER being an API key's owner id (32 hex characters).
func parseImageRules(rules []string) ([]imageRule, error) {
	var out []imageRule
	for i, r := range rules {
		r = strings.TrimSpace(r)
		if r == "" {
			continue
		}
		var rule imageRule
		if owner, pat, ok := strings.Cut(r, "="); ok {
			if len(owner) != 32 || strings.Trim(owner, "0123456789abcdef") != "" {
				return nil, fmt.Errorf("QUARRY_IMAGE_ALLOW: rule %d %q: %q is not an owner id (32 hex characters, as GET /v1/whoami answers)", i+1, r, owner)
			}
			rule.owner, r = owner, pat
		}
		p, err := ParseImagePattern(r)
		if err != nil {
			return nil, fmt.Errorf("QUARRY_IMAGE_ALLOW: rule %d: %w", i+1, err)
		}
		rule.pattern = p
		out = append(out, rule)
	}
	return out, nil
}

// newClasses builds the classes' states; every class's provider must be
// configured.
func newClasses(classes []ClassConfig, provs map[string]providers.Provider) (map[string]*classState, []string, error) {
	out := make(map[string]*classState, len(classes))
	var names []string
	for i, c := range classes {
		if c.Provider == "" {
			return nil, nil, badinput.New(fmt.Sprintf("classes[%d].provider", i), "class %q names no provider (cmd/ sets the default provider before New)", c.Name)
		}
		prov, ok := provs[c.Provider]
		if !ok {
			return nil, nil, badinput.New(fmt.Sprintf("classes[%d].provider", i), "class %q uses provider %q, which is not configured (configured: %v)",
				c.Name, c.Provider, slices.Sorted(maps.Keys(provs)))
		}
		cs := &classState{cfg: c, provider: prov, lock: lockClassPrefix + c.Name}
		for _, s := range c.Images {
			p, err := ParseImagePattern(s)
			if err != nil {
				return nil, nil, badinput.New(fmt.Sprintf("classes[%d].images", i), "%s", err.Error())
			}
			cs.patterns = append(cs.patterns, p)
		}
		out[c.Name] = cs
		names = append(names, c.Name)
	}
	return out, names, nil
}

// Classes returns the configured classes with the tasks each counts now,
// in configuration order: one counter read per class.
func (m *Manager) Classes(ctx context.Context) ([]ClassStatus, error) {
	ctx = ContextWithCaller(ctx, CallerPools)
	out := make([]ClassStatus, 0, len(m.classNames))
	for _, name := range m.classNames {
		n, err := m.store.CountClass(ctx, name)
		if err != nil {
			return nil, fmt.Errorf("class status %s: %w", name, err)
		}
		out = append(out, ClassStatus{ClassConfig: m.classes[name].cfg, Tasks: n})
	}
	return out, nil
}

// ClassStatus is a class's configuration and how many tasks its on-demand
// pools have together.
type ClassStatus struct {
	ClassConfig
	Tasks int `json:"tasks"`
}

// resolve checks an image request and returns its class and the
// configuration of its on-demand pool.
func (m *Manager) resolve(req ImageRequest) (*classState, PoolConfig, error) {
	ref, err := ParseImageRef(req.Image)
	if err != nil {
		return nil, PoolConfig{}, err
	}
	if len(m.classes) == 0 {
		return nil, PoolConfig{}, badinput.New("image", "this gateway serves no image on demand: the operator configures pool classes in the pools file (docs/API.md, \"Images on demand\"); name a pool instead")
	}
	var cs *classState
	if req.Class != "" {
		if cs = m.classes[req.Class]; cs == nil {
			return nil, PoolConfig{}, badinput.New("class", "unknown class %q (configured classes: %s)", req.Class, strings.Join(m.classNames, ", "))
		}
		if !matchAny(cs.patterns, ref) {
			return nil, PoolConfig{}, &ImageNotAllowedError{Image: ref.String(),
				Refused: fmt.Sprintf("class %q serves only images matching %s", cs.cfg.Name, strings.Join(cs.cfg.Images, ", "))}
		}
	} else {
		for _, name := range m.classNames {
			if c := m.classes[name]; matchAny(c.patterns, ref) {
				cs = c
				break
			}
		}
		if cs == nil {
			var rules []string
			for _, name := range m.classNames {
				rules = append(rules, fmt.Sprintf("%s: %s", name, strings.Join(m.classes[name].cfg.Images, ", ")))
			}
			return nil, PoolConfig{}, &ImageNotAllowedError{Image: ref.String(),
				Refused: "no class serves it (the classes' images patterns: " + strings.Join(rules, "; ") + ")"}
		}
	}
	if _, ok := cs.provider.(providers.ImagePreparer); !ok {
		return nil, PoolConfig{}, badinput.New("image", "class %q runs on the %s provider, which runs no images (the docker and ecs providers do); name a pool instead", cs.cfg.Name, cs.cfg.Provider)
	}
	if len(m.imageRules) > 0 {
		allowed := false
		for _, r := range m.imageRules {
			if (r.owner == "" || r.owner == req.Owner) && r.pattern.Match(ref) {
				allowed = true
				break
			}
		}
		if !allowed {
			return nil, PoolConfig{}, &ImageNotAllowedError{Image: ref.String(), Refused: "no rule of QUARRY_IMAGE_ALLOW lets this API key ask for it"}
		}
	}
	c := cs.cfg
	cpu, memory, disk := req.CPU, req.Memory, req.Disk
	if cpu == 0 {
		cpu = c.CPU
	}
	if memory == 0 {
		memory = c.Memory
	}
	if disk == 0 {
		disk = c.Disk
	}
	switch {
	case !(cpu >= minCPU && cpu <= c.MaxCPU):
		return nil, PoolConfig{}, badinput.New("cpu", "is %g; class %q allows %g to %g vCPUs", cpu, c.Name, minCPU, c.MaxCPU)
	case memory < minMemory || memory > c.MaxMemory:
		return nil, PoolConfig{}, badinput.New("memory", "is %d MiB; class %q allows %d to %d MiB", memory, c.Name, minMemory, c.MaxMemory)
	case disk < 0 || disk > c.MaxDisk && disk > 0:
		if c.MaxDisk == 0 {
			return nil, PoolConfig{}, badinput.New("disk", "class %q sets no disk size (its provider's default applies); leave disk out", c.Name)
		}
		return nil, PoolConfig{}, badinput.New("disk", "is %d MiB; class %q allows %d to %d MiB", disk, c.Name, minDisk, c.MaxDisk)
	}
	name := OnDemandPoolName(c.Name, ref, cpu, memory, disk)
	return cs, c.pool(name, ref.String(), cpu, memory, disk), nil
}

func matchAny(patterns []ImagePattern, ref ImageRef) bool {
	for _, p := range patterns {
		if p.Match(ref) {
			return true
		}
	}
	return false
}

// ImagePool returns the name of the on-demand pool of req's image and
// resources, making it when no replica has (the image is prepared first:
// pulled, or its task definition registered) or making it active again when
// it ended. The caller then acquires from it as from any pool.
//
// Errors: *badinput.Error for a malformed image, an unknown class,
// resources out of the class's bounds or a class whose provider runs no
// images; *ImageNotAllowedError; the provider's *providers.ImageError when
// the image cannot be prepared (missing, refused, registry down); store
// errors. Concurrent calls for one pool share one load; ctx bounds this
// caller's wait, not the shared preparation (Config.ImagePrepareTimeout).
func (m *Manager) ImagePool(ctx context.Context, req ImageRequest) (string, error) {
	cs, cfg, err := m.resolve(req)
	if err != nil {
		return "", err
	}
	if p := m.odPool(cfg.Name); p != nil && p.od.useIfActive(m.clock.Now()) {
		return cfg.Name, nil
	}
	if _, err := m.loadPool(ctx, cs, cfg, true); err != nil {
		return "", err
	}
	return cfg.Name, nil
}

// loadPool loads (and, when make is set and it is absent or ended, makes)
// on-demand pool cfg on this replica, sharing one load between concurrent
// callers. It returns the pool.
func (m *Manager) loadPool(ctx context.Context, cs *classState, cfg PoolConfig, make bool) (*pool, error) {
	key := cfg.Name
	if make {
		key += "\x00make"
	}
	ch := m.loads.DoChan(key, func() (any, error) {
		lctx, cancel := context.WithTimeout(ContextWithCaller(context.WithoutCancel(ctx), CallerAcquire), m.cfg.ImagePrepareTimeout)
		defer cancel()
		return m.load(lctx, cs, cfg, make)
	})
	select {
	case r := <-ch:
		if r.Err != nil {
			return nil, r.Err
		}
		return r.Val.(*pool), nil
	case <-ctx.Done():
		return nil, fmt.Errorf("load pool %s: %w", cfg.Name, ctx.Err())
	}
}

// load is loadPool's shared work: the record is read, made or activated,
// then the pool is added to this replica's. One replica prepares an image
// at a time (a lock in the store, "prepare/<pool>"): another that needs the
// pool meanwhile waits for its record instead of pulling or registering
// the image too, and takes the preparation over if the lock is let go
// without a record (the preparation failed; it then gets the failure
// itself).
func (m *Manager) load(ctx context.Context, cs *classState, cfg PoolConfig, make bool) (*pool, error) {
	wait := prepareWait
	for races := 0; races < loadAttempts; {
		rec, err := m.store.GetPool(ctx, cfg.Name)
		switch {
		case errors.Is(err, ErrNotFound) && !make:
			return nil, fmt.Errorf("on-demand pool %s: %w", cfg.Name, ErrNotFound)
		case err != nil && !errors.Is(err, ErrNotFound):
			return nil, fmt.Errorf("read on-demand pool %s: %w", cfg.Name, err)
		case err == nil && rec.State == PoolEnded && !make:
			return nil, fmt.Errorf("on-demand pool %s ended: %w", cfg.Name, ErrNotFound)
		case err == nil && rec.State == PoolActive:
			return m.addPool(cs, cfg, rec)
		}
		// Absent or ended: this replica prepares the image, unless another does.
		made, held, err := m.prepareAndRecord(ctx, cs, cfg, rec, errors.Is(err, ErrNotFound))
		switch {
		case err != nil:
			return nil, err
		case held && made.Name != "":
			return m.addPool(cs, cfg, made)
		case held:
			races++ // another replica recorded it meanwhile: read it
			continue
		}
		t := time.NewTimer(wait) // another replica prepares it: look again
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("wait for another replica's preparation of %s: %w", cfg.Image, ctx.Err())
		case <-t.C:
		}
		wait = min(2*wait, prepareWaitMax)
	}
	return nil, fmt.Errorf("load on-demand pool %s: lost %d races in a row: %w", cfg.Name, loadAttempts, ErrConflict)
}

// Waits of a replica whose pool another replica prepares (load): from
// prepareWait, doubling up to prepareWaitMax between looks. prepareLockTTL
// is the preparation lock's TTL, renewed every third of it while the
// preparation runs, so that a replica that dies mid-pull holds it up that
// long at most.
const (
	prepareWait    = 100 * time.Millisecond
	prepareWaitMax = 2 * time.Second
	prepareLockTTL = 30 * time.Second
)

// prepareAndRecord prepares the image of pool cfg and creates its record
// (absent) or makes the ended rec active again, under the pool's
// preparation lock. held is false when another replica holds the lock (it
// prepares: nothing was done); made is zero when the record changed
// meanwhile (the caller reads it again).
//
// The preparation outlives ctx: when this replica's wait ends first
// (Config.ImagePrepareTimeout), it goes on in the background, up to
// preparationMax, still holding the lock, and records the pool when done.
// Letting go of the lock at the wait's end would have another replica
// start the same preparation again while the provider still runs the
// first: in the fleet simulation, registrations queued behind AWS's
// RegisterTaskDefinition rate for longer than the wait were registered
// twice (2,674 task definitions for 2,000 images).
func (m *Manager) prepareAndRecord(ctx context.Context, cs *classState, cfg PoolConfig, rec PoolRecord, absent bool) (made PoolRecord, held bool, err error) {
	type result struct {
		made PoolRecord
		held bool
	}
	caller := CallerOf(ctx)
	// One preparation per pool on this replica too: a load that gave up
	// waiting and a later one share the preparation still running.
	ch := m.preps.DoChan(cfg.Name, func() (any, error) {
		lock := "prepare/" + cfg.Name
		var r result
		var err error
		done := make(chan struct{})
		if !m.goBackground(caller, func(bg context.Context) {
			defer close(done)
			pctx, cancel := context.WithTimeout(bg, max(preparationMax, m.cfg.ImagePrepareTimeout))
			defer cancel()
			ok, lerr := m.store.TryLock(pctx, lock, m.cfg.ReplicaID, prepareLockTTL, m.clock.Now())
			if lerr != nil || !ok {
				err = lerr
				return
			}
			r.held = true
			r.made, err = m.underPrepareLock(pctx, lock, cfg, func() (PoolRecord, error) {
				return m.prepareRecord(pctx, cs, cfg, rec, absent)
			})
		}) {
			return result{held: true}, fmt.Errorf("prepare image %s: %w", cfg.Image, ErrClosed)
		}
		<-done
		return r, err
	})
	select {
	case res := <-ch:
		r, _ := res.Val.(result)
		return r.made, r.held, res.Err
	case <-ctx.Done():
		return PoolRecord{}, true, fmt.Errorf("wait for the preparation of image %s (it goes on; QUARRY_IMAGE_PREPARE_TIMEOUT bounds the wait): %w", cfg.Image, ctx.Err())
	}
}

// preparationMax bounds a preparation that no acquire waits for any more
// (prepareAndRecord); providers bound theirs too (ECS: an hour of
// registration backlog).
const preparationMax = time.Hour

// underPrepareLock runs fn while holding the preparation lock, renewing it
// every third of its TTL, and lets go of it after.
func (m *Manager) underPrepareLock(ctx context.Context, lock string, cfg PoolConfig, fn func() (PoolRecord, error)) (PoolRecord, error) {
	renewed := make(chan struct{})
	stop := make(chan struct{})
	go func() { // the lock outlives a long pull, and no more than the pull
		defer close(renewed)
		t := time.NewTicker(prepareLockTTL / 3)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				sctx, cancel := context.WithTimeout(ctx, m.cfg.StoreTimeout)
				_, _ = m.store.TryLock(sctx, lock, m.cfg.ReplicaID, prepareLockTTL, m.clock.Now())
				cancel()
			}
		}
	}()
	defer func() {
		close(stop)
		<-renewed
		m.unlockPrepare(ctx, lock, cfg)
	}()
	return fn()
}

// unlockPrepare lets go of an image's preparation lock.
func (m *Manager) unlockPrepare(ctx context.Context, lock string, cfg PoolConfig) {
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.StoreTimeout)
	defer cancel()
	if err := m.store.Unlock(uctx, lock, m.cfg.ReplicaID); err != nil {
		m.log.Warn("let go of an image's preparation lock: it expires instead", "pool", cfg.Name, "err", err)
	}
}

// prepareRecord is prepareAndRecord's work under the lock: the image is
// prepared, then the record made or made active again (zero when it
// changed meanwhile).
func (m *Manager) prepareRecord(ctx context.Context, cs *classState, cfg PoolConfig, rec PoolRecord, absent bool) (PoolRecord, error) {
	info, err := m.prepare(ctx, cs, cfg)
	if err != nil {
		return PoolRecord{}, err
	}
	sctx, cancel := context.WithTimeout(ctx, m.cfg.StoreTimeout)
	defer cancel()
	now := m.clock.Now()
	if absent {
		made, err := m.store.CreatePool(sctx, PoolRecord{
			Name: cfg.Name, Class: cs.cfg.Name, Image: cfg.Image, CPU: cfg.CPU, MemoryMiB: int(cfg.Memory), DiskMiB: int(cfg.Disk),
			Digest: info.Digest, Ref: info.Ref, CreatedAt: now, LastUsed: now,
		})
		if errors.Is(err, ErrConflict) {
			return PoolRecord{}, nil
		}
		if err != nil {
			return PoolRecord{}, fmt.Errorf("record on-demand pool %s: %w", cfg.Name, err)
		}
		m.log.Info("on-demand pool made", "pool", cfg.Name, "class", cs.cfg.Name, "image", cfg.Image, "digest", info.Digest)
		return made, nil
	}
	rec.State, rec.EndedAt, rec.LastUsed = PoolActive, time.Time{}, now
	if info.Digest != "" {
		rec.Digest = info.Digest
	}
	if info.Ref != "" {
		rec.Ref = info.Ref
	}
	made, err := m.store.UpdatePool(sctx, rec)
	if errors.Is(err, ErrConflict) {
		return PoolRecord{}, nil
	}
	if err != nil {
		return PoolRecord{}, fmt.Errorf("make on-demand pool %s active again: %w", cfg.Name, err)
	}
	m.log.Info("on-demand pool active again", "pool", cfg.Name, "class", cs.cfg.Name, "image", cfg.Image)
	return made, nil
}

// prepare makes the image of on-demand pool cfg launchable
// (providers.ImagePreparer).
func (m *Manager) prepare(ctx context.Context, cs *classState, cfg PoolConfig) (providers.ImageInfo, error) {
	ip, ok := cs.provider.(providers.ImagePreparer)
	if !ok {
		return providers.ImageInfo{}, nil
	}
	start := time.Now()
	info, err := ip.PrepareImage(ctx, poolSpec(cfg, cs.cfg.Name))
	outcome := "ready"
	if err != nil {
		outcome = "failed"
	}
	m.metrics.prepareSeconds.WithLabelValues(cs.cfg.Name, outcome).Observe(time.Since(start).Seconds())
	if err != nil {
		return info, fmt.Errorf("prepare image %s: %w", cfg.Image, err)
	}
	return info, nil
}

// prepareAndLaunch launches names with spec (p.spec, or p.specOf a task
// started on a layer) in p's provider, preparing an on-demand
// pool's image first (cheap when it is ready): an image removed since (a
// cache's budget) is pulled again, and a task's startup deadline, which
// starts when Launch returns, never includes the pull.
func (m *Manager) prepareAndLaunch(ctx context.Context, p *pool, spec providers.Spec, names []string) ([]providers.Task, error) {
	if p.od != nil {
		if _, err := m.prepare(ctx, p.od.class, p.cfg); err != nil {
			return nil, err
		}
	}
	return p.provider.Launch(ctx, spec, names)
}

// addPool adds on-demand pool cfg (its record rec) to this replica's, or
// refreshes the record of one it has, and starts its loop when the loops
// run. At most Config.MaxOnDemandPools are loaded at once.
func (m *Manager) addPool(cs *classState, cfg PoolConfig, rec PoolRecord) (*pool, error) {
	m.odMu.Lock()
	p := m.od[cfg.Name]
	if p == nil {
		if len(m.od) >= m.cfg.MaxOnDemandPools {
			m.odMu.Unlock()
			return nil, fmt.Errorf("this gateway holds %d on-demand pools (QUARRY_MAX_ONDEMAND_POOLS): %w", len(m.od), ErrNoCapacity)
		}
		p = newPool(cfg, cs.provider, m.log, m.cfg)
		p.spec = poolSpec(cfg, cs.cfg.Name)
		p.metric, p.lock, p.interval = lockClassPrefix+cs.cfg.Name, cs.lock, m.cfg.SweepInterval
		p.log = m.log.With("pool", cfg.Name, "class", cs.cfg.Name)
		p.od = &odState{class: cs, quit: make(chan struct{}), lastLocal: time.Now()}
		m.od[cfg.Name] = p
		m.metrics.odPools.WithLabelValues(cs.cfg.Name).Inc()
	}
	m.odMu.Unlock()
	p.od.setRecord(rec)
	m.startPoolLoop(p)
	return p, nil
}

// startPoolLoop starts an on-demand pool's loop once, if the manager's
// loops run.
func (m *Manager) startPoolLoop(p *pool) {
	if !m.loopsRun() || !p.od.loop.CompareAndSwap(false, true) {
		return
	}
	if !m.goBackground(CallerReconcile, func(ctx context.Context) { m.reconcileLoop(ctx, p) }) {
		p.od.loop.Store(false)
	}
}

// unload drops on-demand pool p from this replica (its loop ends); its
// record and tasks are the store's.
func (m *Manager) unload(p *pool) {
	m.odMu.Lock()
	if m.od[p.cfg.Name] == p {
		delete(m.od, p.cfg.Name)
		m.metrics.odPools.WithLabelValues(p.od.class.cfg.Name).Dec()
	}
	m.odMu.Unlock()
	p.od.once.Do(func() { close(p.od.quit) })
}

// unloadIdle unloads on-demand pool p from a replica that does not run its
// class's passes when no acquire used it here for the class's idle_seconds:
// such a replica loads it again when a request needs it. It reports
// whether it did.
func (m *Manager) unloadIdle(p *pool) bool {
	if m.holds(p.lock) || p.queue.len() > 0 || p.localTasks() > 0 {
		return false
	}
	p.od.mu.Lock()
	idle := time.Since(p.od.lastLocal) >= time.Duration(p.od.class.cfg.IdleSeconds)*time.Second
	p.od.mu.Unlock()
	if idle {
		m.unload(p)
	}
	return idle
}

// odPool returns the loaded on-demand pool name, or nil.
func (m *Manager) odPool(name string) *pool {
	m.odMu.RLock()
	defer m.odMu.RUnlock()
	return m.od[name]
}

// pool returns the configured or loaded on-demand pool name, or nil.
func (m *Manager) pool(name string) *pool {
	if p := m.pools[name]; p != nil {
		return p
	}
	return m.odPool(name)
}

// lookupPool is pool, loading an on-demand pool whose record is active (a
// lease of a pool this replica did not load, an acquire naming its pool).
// nil when there is no such pool.
func (m *Manager) lookupPool(ctx context.Context, name string) *pool {
	if p := m.pool(name); p != nil || !strings.HasPrefix(name, OnDemandPrefix) {
		return p
	}
	rec, err := m.store.GetPool(ctx, name)
	if err != nil {
		return nil
	}
	cs := m.classes[rec.Class]
	if cs == nil {
		return nil
	}
	p, err := m.loadPool(ctx, cs, poolOfRecord(cs, rec), false)
	if err != nil {
		return nil
	}
	return p
}

// poolOfRecord is the configuration of an on-demand pool's record under its
// class's configuration now.
func poolOfRecord(cs *classState, rec PoolRecord) PoolConfig {
	return cs.cfg.pool(rec.Name, rec.Image, rec.CPU, MiB(rec.MemoryMiB), DiskMiB(rec.DiskMiB))
}

// allPools returns the configured pools and the loaded on-demand ones.
func (m *Manager) allPools() []*pool {
	out := make([]*pool, 0, len(m.pools))
	for _, name := range m.names {
		out = append(out, m.pools[name])
	}
	m.odMu.RLock()
	defer m.odMu.RUnlock()
	for _, p := range m.od {
		out = append(out, p)
	}
	return out
}

func (o *odState) setRecord(rec PoolRecord) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if rec.Version >= o.rec.Version {
		o.rec = rec
	}
}

func (o *odState) record() PoolRecord {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.rec
}

// active reports whether the pool's record was active when last seen.
func (o *odState) active() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.rec.State == PoolActive
}

func (o *odState) usedLocally(now time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.lastLocal, o.usedAt = time.Now(), now
}

// useIfActive marks the pool used at now (manager clock) if its record is
// active, and reports whether it was; it waits for an end under way
// (endIdle), which then either saw this use or unloaded the pool first.
func (o *odState) useIfActive(now time.Time) bool {
	o.ending.Lock()
	defer o.ending.Unlock()
	if !o.active() {
		return false
	}
	o.usedLocally(now)
	return true
}

// usedWithin reports whether the pool was used on this replica less than d
// before now (manager clock).
func (o *odState) usedWithin(now time.Time, d time.Duration) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return !o.usedAt.IsZero() && now.Sub(o.usedAt) < d
}

// setWarm sets how many ready tasks the pool keeps and reports whether
// that grew.
func (o *odState) setWarm(n int) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	grew := n > o.warm
	o.warm = n
	return grew
}

// minWarm is how many ready tasks the pool keeps: min_warm for a
// configured pool; its warm policy's (and a prefetch's floor) for an
// on-demand one.
func (p *pool) minWarm() int {
	if p.od == nil {
		return p.cfg.MinWarm
	}
	p.od.mu.Lock()
	defer p.od.mu.Unlock()
	return p.od.warm
}

// warmHere reports whether this replica refills p for its warm target
// without holding its lock: an on-demand pool whose target a prefetch here
// raised.
func (p *pool) warmHere() bool { return p.od != nil && p.minWarm() > 0 }

// reserve reserves recs for p: within its class's total for an on-demand
// pool, whose record must be active. A reservation refused because the
// pool ended meanwhile (its class loop ended it on another replica) makes
// the pool active again and is tried once more.
func (m *Manager) reserve(ctx context.Context, p *pool, recs []TaskRecord) error {
	if p.od == nil {
		return m.store.ReserveTasks(ctx, p.cfg.Name, p.cfg.MaxTotal, recs)
	}
	c := p.od.class.cfg
	err := m.store.ReserveClassTasks(ctx, c.Name, c.MaxTotal, p.cfg.Name, p.cfg.MaxTotal, recs)
	if !errors.Is(err, ErrNoCapacity) {
		return err
	}
	rec, gerr := m.store.GetPool(ctx, p.cfg.Name)
	if gerr == nil && rec.State == PoolActive {
		return err // a limit: the pool's or the class's
	}
	if _, lerr := m.load(ctx, p.od.class, p.cfg, true); lerr != nil {
		return errors.Join(err, lerr)
	}
	return m.store.ReserveClassTasks(ctx, c.Name, c.MaxTotal, p.cfg.Name, p.cfg.MaxTotal, recs)
}

// noteAcquire counts an acquire of on-demand pool p for its record: the
// counts are written every Config.PoolTouchInterval (TouchPool), or at
// once when the loops do not run (no flusher).
func (m *Manager) noteAcquire(ctx context.Context, p *pool) {
	if p.od == nil {
		return
	}
	now := m.clock.Now()
	p.od.usedLocally(now)
	if !m.loopsRun() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.StoreTimeout)
		defer cancel()
		if err := m.store.TouchPool(sctx, p.cfg.Name, now, 1); err != nil {
			p.log.Warn("count an acquire of the on-demand pool", "err", err)
		}
		return
	}
	m.touchMu.Lock()
	t := m.touches[p.cfg.Name]
	t.n++
	t.at = now
	m.touches[p.cfg.Name] = t
	m.touchMu.Unlock()
}

// touch is the acquires of one pool not yet counted in its record.
type touch struct {
	n  int
	at time.Time
}

// touchLoop writes the counted acquires every PoolTouchInterval, and once more
// when the manager closes.
func (m *Manager) touchLoop(ctx context.Context) {
	t := time.NewTicker(m.cfg.PoolTouchInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.StoreTimeout)
			m.flushTouches(fctx)
			cancel()
			return
		case <-t.C:
			m.flushTouches(ctx)
		}
	}
}

// flushTouches writes the counted acquires (TouchPool per pool, at most
// touchConcurrency at once); those that fail are counted again next time.
func (m *Manager) flushTouches(ctx context.Context) {
	m.touchMu.Lock()
	batch := m.touches
	m.touches = make(map[string]touch, len(batch))
	m.touchMu.Unlock()
	var g errgroup.Group
	g.SetLimit(touchConcurrency)
	for name, t := range batch {
		g.Go(func() error {
			sctx, cancel := context.WithTimeout(ctx, m.cfg.StoreTimeout)
			err := m.store.TouchPool(sctx, name, t.at, t.n)
			cancel()
			switch {
			case errors.Is(err, ErrNotFound): // the record went: nothing to count
			case err != nil:
				m.touchMu.Lock()
				again := m.touches[name]
				again.n += t.n
				if t.at.After(again.at) {
					again.at = t.at
				}
				m.touches[name] = again
				m.touchMu.Unlock()
				if ctx.Err() == nil {
					m.log.Warn("count the acquires of an on-demand pool: retrying", "pool", name, "err", err)
				}
			}
			return nil
		})
	}
	_ = g.Wait()
}

// classLoop runs the class's pass every ReconcileInterval on the replica
// that holds the class's lock, which also gates the passes of the class's
// pools.
func (m *Manager) classLoop(ctx context.Context, cs *classState) {
	m.every(ctx, m.cfg.ReconcileInterval, m.locked(cs.lock, m.cfg.ReconcileInterval, func(ctx context.Context) { m.classPass(ctx, cs) }))
}

// classPassConcurrency bounds the pool passes one class pass runs at once.
const classPassConcurrency = 8

// classPass reads one page (Config.PoolPage) of the class's pool records,
// from where the last pass stopped, tends each, and runs the reconciler's
// pass of each active one (a counter read, and a page of its walk when it
// has tasks): the class's background work is one page of pools per
// ReconcileInterval, whatever the number of pools, and a pool's turn comes
// every pools/PoolPage passes (its walks at most every SweepInterval).
func (m *Manager) classPass(ctx context.Context, cs *classState) {
	ctx, renew, done := m.renewing(ctx, cs.lock, m.cfg.ReconcileInterval)
	defer done()
	sctx, cancel := context.WithTimeout(ctx, m.cfg.StoreTimeout)
	page, err := m.store.ListPoolsPage(sctx, cs.cfg.Name, cs.cursor, m.cfg.PoolPage)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			m.log.Warn("class pass: read pool records", "class", cs.cfg.Name, "err", err)
		}
		return
	}
	cs.cursor = page.Next
	var g errgroup.Group
	g.SetLimit(classPassConcurrency)
	for _, rec := range page.Pools {
		if !renew() {
			break
		}
		if p := m.tend(ctx, cs, rec); p != nil {
			g.Go(func() error { m.reconcile(ctx, p); return nil })
		}
	}
	_ = g.Wait()
	if cs.cursor == "" {
		sctx, cancel := context.WithTimeout(ctx, m.cfg.StoreTimeout)
		n, err := m.store.CountClass(sctx, cs.cfg.Name)
		cancel()
		if err == nil {
			m.metrics.classTasks.WithLabelValues(cs.cfg.Name).Set(float64(n))
		}
	}
}

// tend applies the class's rules to one of its pool records: an active
// pool is loaded here (the holder runs its passes) and gets its warm target
// (the warm policy, or a prefetch's floor); one idle past idle_seconds
// retires its ready tasks, then ends when it has none; an ended one is
// unloaded, and deleted with what its provider made once retention_seconds
// have passed. It returns the pool whose reconciler pass is due (an active
// one not ending), or nil.
func (m *Manager) tend(ctx context.Context, cs *classState, rec PoolRecord) *pool {
	now := m.clock.Now()
	p := m.odPool(rec.Name)
	if rec.State == PoolEnded {
		if p != nil {
			m.unload(p)
		}
		if now.Sub(rec.EndedAt) >= time.Duration(cs.cfg.RetentionSeconds)*time.Second {
			m.forgetPool(ctx, cs, rec)
		}
		return nil
	}
	if p == nil {
		var err error
		if p, err = m.addPool(cs, poolOfRecord(cs, rec), rec); err != nil {
			m.log.Warn("class pass: load an on-demand pool", "class", cs.cfg.Name, "pool", rec.Name, "err", err)
			return nil
		}
	}
	p.od.setRecord(rec)
	c := cs.cfg
	window := time.Duration(c.WarmWindowSeconds) * time.Second
	idle := now.Sub(rec.LastUsed) >= time.Duration(c.IdleSeconds)*time.Second && !now.Before(rec.WarmUntil)
	target := 0
	if !idle {
		target = c.warmTarget(p.od.rate(now, rec.Acquires, window), now.Sub(rec.LastUsed) < window)
		if now.Before(rec.WarmUntil) {
			target = max(target, min(rec.WarmFloor, p.cfg.MaxTotal))
		}
	}
	if p.od.setWarm(target) {
		p.poke()
	}
	if idle {
		m.endIdle(ctx, p, rec)
		return nil
	}
	return p
}

// rate records a sample of the pool's acquire count and returns its
// acquires per second over the window (0 until two samples span some time).
func (o *odState) rate(now time.Time, n int64, window time.Duration) float64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.samples = append(o.samples, acquireSample{at: now, n: n})
	// Keep the newest sample at or before the window's start, and those
	// after it: the rate spans the window.
	cut := 0
	for i, s := range o.samples {
		if now.Sub(s.at) >= window {
			cut = i
		}
	}
	o.samples = o.samples[cut:]
	first := o.samples[0]
	span := now.Sub(first.at).Seconds()
	if span <= 0 || n < first.n {
		return 0
	}
	return float64(n-first.n) / span
}

// endIdle ends an idle on-demand pool: while it has tasks, its ready ones
// are retired (a page per pass; a leased or launching task means it is in
// use after all, and nothing is done); with none, EndPool ends its record
// and the pool is unloaded.
func (m *Manager) endIdle(ctx context.Context, p *pool, rec PoolRecord) {
	// A request on this replica that found the pool active since the
	// record was read (its use not yet in rec.LastUsed) keeps it: the next
	// pass decides again. useIfActive waits while the pool ends.
	p.od.ending.Lock()
	defer p.od.ending.Unlock()
	if p.od.usedWithin(m.clock.Now(), time.Duration(p.od.class.cfg.IdleSeconds)*time.Second) {
		return
	}
	sctx, cancel := context.WithTimeout(ctx, m.cfg.StoreTimeout)
	c, err := m.countTasks(sctx, p)
	cancel()
	switch {
	case err != nil:
		if ctx.Err() == nil {
			p.log.Warn("end an idle on-demand pool: count its tasks", "err", err)
		}
		return
	case c.Leased > 0 || c.Launching > 0 || p.queue.len() > 0:
		return
	case c.Total() == 0:
		sctx, cancel := context.WithTimeout(ctx, m.cfg.StoreTimeout)
		ended, err := m.store.EndPool(sctx, rec, m.clock.Now())
		cancel()
		if err != nil {
			if !errors.Is(err, ErrConflict) && ctx.Err() == nil {
				p.log.Warn("end an idle on-demand pool", "err", err)
			}
			return
		}
		p.od.setRecord(ended)
		m.unload(p)
		m.metrics.odEnded.WithLabelValues(p.od.class.cfg.Name, "idle").Inc()
		p.log.Info("on-demand pool ended: no acquire for the class's idle_seconds", "idle_seconds", p.od.class.cfg.IdleSeconds)
		return
	case c.Ready == 0:
		return // stopping tasks: the pool's walk finishes them
	}
	sctx, cancel = context.WithTimeout(ctx, m.cfg.StoreTimeout)
	page, err := m.store.ListTasksPage(sctx, p.cfg.Name, "", pageMax)
	cancel()
	if err != nil {
		return
	}
	var stop []TaskRecord
	for _, t := range page.Tasks {
		if t.State != TaskReady {
			continue
		}
		if r, ok := m.transition(ctx, p, t, TaskStopping, ReasonPoolIdle); ok {
			stop = append(stop, r)
		}
	}
	if len(stop) > 0 {
		p.log.Info("retiring the ready tasks of an idle on-demand pool", "tasks", len(stop))
		m.stopAll(ctx, stop)
	}
}

// forgetPool deletes an ended pool's record once its retention passed,
// after its provider released what it made for the image
// (providers.ImageCache.ForgetImage); a failure is retried by a later pass.
func (m *Manager) forgetPool(ctx context.Context, cs *classState, rec PoolRecord) {
	if ic, ok := cs.provider.(providers.ImageCache); ok {
		pctx, cancel := context.WithTimeout(ctx, m.cfg.ProviderTimeout)
		err := ic.ForgetImage(pctx, poolSpec(poolOfRecord(cs, rec), cs.cfg.Name), rec.Ref)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				m.log.Warn("forget the image of an ended on-demand pool: retrying later", "pool", rec.Name, "image", rec.Image, "err", err)
			}
			return
		}
	}
	sctx, cancel := context.WithTimeout(ctx, m.cfg.StoreTimeout)
	err := m.store.DeletePool(sctx, rec)
	cancel()
	if err != nil {
		if !errors.Is(err, ErrConflict) && ctx.Err() == nil {
			m.log.Warn("delete the record of an ended on-demand pool", "pool", rec.Name, "err", err)
		}
		return
	}
	m.metrics.odEnded.WithLabelValues(cs.cfg.Name, "deleted").Inc()
	m.log.Info("on-demand pool record deleted: ended for the class's retention_seconds", "pool", rec.Name, "image", rec.Image)
}

// Pool returns the configuration of a configured pool or an on-demand one
// (loading it: its record must be active); ErrNotFound otherwise.
func (m *Manager) Pool(ctx context.Context, name string) (PoolConfig, error) {
	p := m.lookupPool(ContextWithCaller(ctx, CallerPools), name)
	if p == nil {
		return PoolConfig{}, fmt.Errorf("pool %q: %w", name, ErrNotFound)
	}
	return p.cfg, nil
}
