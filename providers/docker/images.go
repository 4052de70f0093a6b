package docker

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/quarryhq/quarry/providers"
)

var (
	_ providers.ImagePreparer = (*Provider)(nil)
	_ providers.ImageCache    = (*Provider)(nil)
)

const (
	// ledgerFlushInterval is how often uses of ledger images are written.
	ledgerFlushInterval = 5 * time.Second
	// maxFailures bounds the failed preparations Images reports.
	maxFailures = 64
)

// imageCache is the provider's images on demand: pulls in flight (one per
// image), recent failures, launches in flight by image, and the ledger of
// the images pulled for on-demand pools with the budget it is held to.
type imageCache struct {
	api          dockerAPI
	dockerConfig string
	pullTimeout  time.Duration
	budget       Bytes
	ledger       *ledger
	logger       *slog.Logger
	metrics      *metrics
	slots        chan struct{} // a pull holds one while it runs

	ctx    context.Context // ends at close: pulls stop
	cancel context.CancelFunc
	wg     sync.WaitGroup // pulls and the ledger's flusher

	// evictPass runs one budget pass at a time; evictMu is held by a
	// removal (write) and by a launch marking its image needed (read).
	evictPass sync.Mutex
	evictMu   sync.RWMutex

	mu       sync.Mutex
	closed   bool                           // no pull starts any more; guarded by mu
	flights  map[string]*flight             // by normalized ref; guarded by mu
	launches map[string]int                 // launches in flight by normalized ref; guarded by mu
	failures map[string]providers.ImageInfo // recent failures by normalized ref (≤ maxFailures); guarded by mu
	failedAt map[string]time.Time           // when each failed; guarded by mu
}

// newImageCache loads the ledger and starts its flusher.
func newImageCache(cfg Config, api dockerAPI, logger *slog.Logger) (*imageCache, error) {
	l, err := loadLedger(cfg.LedgerFile)
	if err != nil {
		return nil, fmt.Errorf("docker provider config: LedgerFile: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &imageCache{
		api: api, dockerConfig: cfg.DockerConfig, pullTimeout: cfg.PullTimeout, budget: cfg.ImageBudget,
		ledger: l, logger: logger, slots: make(chan struct{}, cfg.PullConcurrency),
		ctx: ctx, cancel: cancel,
		flights: map[string]*flight{}, launches: map[string]int{},
		failures: map[string]providers.ImageInfo{}, failedAt: map[string]time.Time{},
	}
	c.metrics = newMetrics(c)
	c.wg.Add(1)
	go c.flushLoop()
	return c, nil
}

// flushLoop writes the ledger's uses every ledgerFlushInterval until close.
func (c *imageCache) flushLoop() {
	defer c.wg.Done()
	t := time.NewTicker(ledgerFlushInterval)
	defer t.Stop()
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-t.C:
			if err := c.ledger.flush(); err != nil {
				c.logger.Warn("image ledger not written; tried again later", "err", err)
			}
		}
	}
}

// close stops the pulls (their callers get an error), waits for them and
// writes the ledger.
func (c *imageCache) close() error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.cancel()
	c.wg.Wait()
	return c.ledger.flush()
}

// PrepareImage makes spec's image launchable on the engine: one
// ImageInspect when the engine has it; otherwise a pull through the engine
// (with the credentials of Config.DockerConfig), shared by every caller of
// the same image (by its normalized reference), at most
// Config.PullConcurrency at once, each bounded by Config.PullTimeout from
// when it has a slot. ctx bounds this caller's wait only: the pull goes on
// for the others. A pull for an on-demand pool (spec.Class set) is
// recorded in the ledger and may make the budget remove other images; an
// image prepared for a configured pool is pinned: never removed. Errors of
// the image or its registry are *providers.ImageError; the answer's InUse
// is not computed (Images says).
func (p *Provider) PrepareImage(ctx context.Context, spec providers.Spec) (providers.ImageInfo, error) {
	return p.img.prepare(ctx, spec)
}

func (c *imageCache) prepare(ctx context.Context, spec providers.Spec) (providers.ImageInfo, error) {
	ref, err := parseRef(spec.Image)
	if err != nil {
		return failedInfo(spec.Image, err), err
	}
	if spec.Class == "" {
		c.pin(ref)
	}
	img, found, err := c.inspect(ctx, ref)
	if err != nil {
		return failedInfo(spec.Image, err), fmt.Errorf("prepare image %s: %w", spec.Image, err)
	}
	if found {
		return c.infoOf(spec.Image, ref, img), nil
	}
	f := c.join(spec, ref)
	select {
	case <-f.done:
		if f.err != nil {
			return f.info, f.err
		}
		info := f.info
		info.Image = spec.Image
		return info, nil
	case <-ctx.Done():
		return c.flightInfo(f), fmt.Errorf("prepare image %s: %w", spec.Image, ctx.Err())
	}
}

// join returns the flight of ref, starting one when none runs.
func (c *imageCache) join(spec providers.Spec, ref imageRef) *flight {
	c.mu.Lock()
	defer c.mu.Unlock()
	f, ok := c.flights[ref.name]
	if !ok {
		f = &flight{image: spec.Image, ref: ref, started: time.Now(), done: make(chan struct{})}
		if c.closed {
			f.info, f.err = failedInfo(spec.Image, errClosed), errClosed
			close(f.done)
			return f
		}
		c.flights[ref.name] = f
		c.wg.Add(1)
		go c.run(f)
	}
	if spec.Class != "" {
		f.onDemand = true
	}
	return f
}

// pin records that a configured pool uses ref (logged when it cannot be
// written: the pin holds in memory).
func (c *imageCache) pin(ref imageRef) {
	if err := c.ledger.pin(ref.name); err != nil {
		c.logger.Warn("image ledger not written: a configured pool's image is pinned in memory only", "ref", ref.name, "err", err)
	}
}

// use marks ref needed by a launch until release is called, so that the
// budget does not remove it meanwhile.
func (c *imageCache) use(ref imageRef) (release func()) {
	c.evictMu.RLock()
	c.mu.Lock()
	c.launches[ref.name]++
	c.mu.Unlock()
	c.evictMu.RUnlock()
	return func() {
		c.mu.Lock()
		if c.launches[ref.name]--; c.launches[ref.name] <= 0 {
			delete(c.launches, ref.name)
		}
		c.mu.Unlock()
	}
}

// busy reports whether a pull or a launch in flight needs ref.
func (c *imageCache) busy(ref string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, pulling := c.flights[ref]
	return pulling || c.launches[ref] > 0
}

// addFailure keeps a failed preparation for Images, dropping the oldest
// beyond maxFailures. Call with mu held.
func (c *imageCache) addFailure(ref string, info providers.ImageInfo) {
	c.failures[ref], c.failedAt[ref] = info, time.Now()
	for len(c.failures) > maxFailures {
		oldest := ""
		for r, at := range c.failedAt {
			if oldest == "" || at.Before(c.failedAt[oldest]) {
				oldest = r
			}
		}
		delete(c.failures, oldest)
		delete(c.failedAt, oldest)
	}
}

// flightInfo is f's state while it runs.
func (c *imageCache) flightInfo(f *flight) providers.ImageInfo {
	return providers.ImageInfo{Image: f.image, State: providers.ImagePulling, BytesDone: f.bytesDone.Load(), BytesTotal: f.bytesTotal.Load()}
}

// failedInfo is the ImageInfo of a preparation that failed with err.
func failedInfo(image string, err error) providers.ImageInfo {
	return providers.ImageInfo{Image: image, State: providers.ImageFailed, Reason: err.Error()}
}

// engineImage is what the engine says of an image it has.
type engineImage struct {
	id     string
	digest string // the registry's manifest digest of the image's repository, else id
	size   int64
}

// inspect asks the engine for ref's image; found is false when it has none.
func (c *imageCache) inspect(ctx context.Context, ref imageRef) (engineImage, bool, error) {
	ins, err := c.api.ImageInspect(ctx, ref.name)
	if isNotFound(err) {
		return engineImage{}, false, nil
	}
	if err != nil {
		return engineImage{}, false, fmt.Errorf("inspect image %s: %w", ref.name, err)
	}
	img := engineImage{id: ins.ID, digest: ins.ID, size: ins.Size}
	repo, _, _ := strings.Cut(ref.name, "@")
	if i := strings.LastIndex(repo, ":"); i > strings.LastIndex(repo, "/") {
		repo = repo[:i]
	}
	for _, rd := range ins.RepoDigests {
		name, digest, ok := strings.Cut(rd, "@")
		if ok && (name == repo || img.digest == img.id) {
			img.digest = digest
		}
	}
	return img, true, nil
}

// infoOf is the ImageInfo of an image the engine has.
func (c *imageCache) infoOf(image string, ref imageRef, img engineImage) providers.ImageInfo {
	info := providers.ImageInfo{Image: image, Digest: img.digest, State: providers.ImageReady, SizeBytes: img.size, Pinned: c.ledger.isPinned(ref.name)}
	if e, ok := c.ledger.get(ref.name); ok {
		info.LastUsed = e.LastUsed
	}
	return info
}

// Images reports the images of the ledger (pulled for on-demand pools)
// and those of configured pools, as the engine has them (size, digest, in
// use: one inspection and one filtered container list each), then the
// pulls in flight with their progress and the recent failures (at most
// 64), sorted by image. A ledger image the engine no longer has (removed
// from outside) is dropped from the ledger.
func (p *Provider) Images(ctx context.Context) ([]providers.ImageInfo, error) {
	return p.img.images(ctx)
}

func (c *imageCache) images(ctx context.Context) ([]providers.ImageInfo, error) {
	entries, pinned := c.ledger.snapshot()
	byRef := map[string]string{} // ref → image as asked
	for _, r := range pinned {
		byRef[r] = r
	}
	for _, e := range entries {
		byRef[e.Ref] = e.Image
	}
	c.mu.Lock()
	var out []providers.ImageInfo
	seen := map[string]bool{}
	for r, f := range c.flights {
		select {
		case <-f.done:
			continue // answered: reported as the engine has it
		default:
		}
		out = append(out, c.flightInfo(f))
		seen[r] = true
	}
	for r, info := range c.failures {
		if !seen[r] {
			out = append(out, info)
			seen[r] = true
		}
	}
	c.mu.Unlock()
	for _, r := range slices.Sorted(maps.Keys(byRef)) {
		if seen[r] {
			continue
		}
		ref := imageRef{name: r}
		img, found, err := c.inspect(ctx, ref)
		if err != nil {
			return nil, fmt.Errorf("list images: %w", err)
		}
		if !found {
			if _, ok := c.ledger.get(r); ok {
				c.logger.Info("image of the ledger removed from outside; forgotten", "ref", r)
				if err := c.ledger.remove(r); err != nil {
					return nil, fmt.Errorf("list images: %w", err)
				}
			}
			continue
		}
		info := c.infoOf(byRef[r], ref, img)
		if info.InUse, err = c.inUse(ctx, img.id, r); err != nil {
			return nil, fmt.Errorf("list images: %w", err)
		}
		out = append(out, info)
	}
	slices.SortStableFunc(out, func(a, b providers.ImageInfo) int { return cmp.Compare(a.Image, b.Image) })
	return out, nil
}

// ForgetImage removes spec's image from the engine and the ledger when this
// provider pulled it for an on-demand pool and nothing keeps it: no
// container uses it, no pull or launch in flight needs it, no configured
// pool uses it (such an image is left, with a log line, and nil
// returned). An image it did not pull is never touched. Idempotent. ref
// is unused: the provider made nothing for an image but the image.
func (p *Provider) ForgetImage(ctx context.Context, spec providers.Spec, _ string) error {
	ref, err := parseRef(spec.Image)
	if err != nil {
		return nil // no such image was ever pulled
	}
	e, ok := p.img.ledger.get(ref.name)
	if !ok {
		return nil
	}
	kept, err := p.img.evict(ctx, e)
	if err != nil {
		return fmt.Errorf("forget image %s: %w", spec.Image, err)
	}
	if kept != "" {
		p.logger.Info("image not forgotten: still needed", "image", spec.Image, "why", kept)
		return nil
	}
	p.logger.Info("image forgotten and removed", "image", spec.Image, "ref", ref.name, "size", e.Size)
	return nil
}
