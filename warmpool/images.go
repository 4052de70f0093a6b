package warmpool

import (
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/quarryhq/quarry/internal/badinput"
	"github.com/quarryhq/quarry/providers"
)

// Bounds of a prefetch.
const (
	maxPrefetchImages = 1000
	// PrefetchQueued and PrefetchReady are the states of an accepted image
	// in a prefetch's answer; PrefetchRefused one that was not accepted.
	PrefetchQueued  = "queued"
	PrefetchReady   = "ready"
	PrefetchRefused = "refused"
)

// PrefetchRequest announces images that acquires will ask for soon, so
// that their preparation (a pull, a task definition) starts now.
type PrefetchRequest struct {
	Images []string
	// Class, CPU, Memory and Disk are those of the acquires to come, as in
	// ImageRequest.
	Class  string
	CPU    float64
	Memory MiB
	Disk   DiskMiB
	// Warm ready tasks are kept in each image's pool for its class's
	// prefetch_hold_seconds (0: none beyond the warm policy); the pool does
	// not end for idleness before then either.
	Warm  int
	Owner string
}

// PrefetchResult is one image of a prefetch: its pool and whether it was
// accepted.
type PrefetchResult struct {
	Image string // as asked
	Ref   string // normalized ("" when refused)
	Pool  string // its on-demand pool ("" when refused)
	State string // PrefetchQueued, PrefetchReady or PrefetchRefused
	// Err says why it was refused (State PrefetchRefused): the error an
	// acquire of it would get.
	Err error
}

// prefetchJob is one image's preparation waiting for a prefetch worker.
type prefetchJob struct {
	cs   *classState
	cfg  PoolConfig
	warm int
}

// Prefetch checks each image as ImagePool does and starts the preparation
// of those it accepts in the background (Config.PrefetchQueue bounds the
// images waiting; a full queue refuses the rest with ErrNoCapacity), and
// answers at once. An image refused is reported in its result; the call
// fails only for a malformed request (no image, too many, a bad warm).
// Where the loops do not run (Lambda) the preparations run before it
// answers, bounded by ctx.
func (m *Manager) Prefetch(ctx context.Context, req PrefetchRequest) ([]PrefetchResult, error) {
	switch {
	case len(req.Images) == 0:
		return nil, badinput.New("images", "is required: the images the next acquires will ask for")
	case len(req.Images) > maxPrefetchImages:
		return nil, badinput.New("images", "has %d images; at most %d in one prefetch", len(req.Images), maxPrefetchImages)
	case req.Warm < 0 || req.Warm > maxWarm:
		return nil, badinput.New("warm", "is %d; it must be between 0 and %d", req.Warm, maxWarm)
	}
	out := make([]PrefetchResult, len(req.Images))
	seen := map[string]bool{}
	for i, image := range req.Images {
		out[i].Image = image
		cs, cfg, err := m.resolve(ImageRequest{Image: image, Class: req.Class, CPU: req.CPU, Memory: req.Memory, Disk: req.Disk, Owner: req.Owner})
		if err != nil {
			out[i].State, out[i].Err = PrefetchRefused, err
			continue
		}
		out[i].Pool, out[i].Ref = cfg.Name, cfg.Image
		if p := m.odPool(cfg.Name); p != nil && p.od.active() && req.Warm == 0 {
			out[i].State = PrefetchReady
			continue
		}
		out[i].State = PrefetchQueued
		if seen[cfg.Name] {
			continue
		}
		seen[cfg.Name] = true
		job := prefetchJob{cs: cs, cfg: cfg, warm: min(req.Warm, cfg.MaxTotal)}
		if !m.loopsRun() {
			if err := m.runPrefetch(ctx, job); err != nil {
				out[i].State, out[i].Err = PrefetchRefused, err
			} else {
				out[i].State = PrefetchReady
			}
			continue
		}
		select {
		case m.prefetchQ <- job:
			m.metrics.prefetchQueue.Set(float64(len(m.prefetchQ)))
		default:
			out[i].State = PrefetchRefused
			out[i].Err = fmt.Errorf("%d images wait for their preparation already (QUARRY_PREFETCH_QUEUE); prefetch this one later: %w", cap(m.prefetchQ), ErrNoCapacity)
			m.metrics.prefetchRefused.Inc()
		}
	}
	return out, nil
}

// prefetchWorker prepares the queued images until ctx ends.
func (m *Manager) prefetchWorker(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case job := <-m.prefetchQ:
			m.metrics.prefetchQueue.Set(float64(len(m.prefetchQ)))
			if err := m.runPrefetch(ctx, job); err != nil && ctx.Err() == nil {
				m.log.Warn("prefetch: the image could not be prepared", "image", job.cfg.Image, "class", job.cs.cfg.Name, "err", err)
			}
		}
	}
}

// runPrefetch makes a prefetched image's pool (its image prepared) and
// holds it for the class's prefetch_hold_seconds with its warm floor: this
// replica launches for the floor at once, and the class loop keeps it, and
// keeps the pool from ending for idleness, until the hold has passed.
func (m *Manager) runPrefetch(ctx context.Context, job prefetchJob) error {
	p, err := m.loadPool(ctx, job.cs, job.cfg, true)
	if err != nil {
		return err
	}
	until := m.clock.Now().Add(time.Duration(job.cs.cfg.PrefetchHoldSeconds) * time.Second)
	for attempt := 0; attempt < loadAttempts; attempt++ {
		rec := p.od.record()
		rec.WarmFloor, rec.WarmUntil = job.warm, until
		sctx, cancel := context.WithTimeout(ctx, m.cfg.StoreTimeout)
		out, err := m.store.UpdatePool(sctx, rec)
		if errors.Is(err, ErrConflict) {
			out, err = m.store.GetPool(sctx, rec.Name)
			cancel()
			if err == nil {
				p.od.setRecord(out)
			}
			continue
		}
		cancel()
		if err != nil {
			return fmt.Errorf("record the warm floor of pool %s: %w", p.cfg.Name, err)
		}
		p.od.setRecord(out)
		if job.warm > 0 && p.od.raiseWarm(job.warm) {
			p.poke()
		}
		return nil
	}
	return fmt.Errorf("record the warm floor of pool %s: lost %d races in a row: %w", p.cfg.Name, loadAttempts, ErrConflict)
}

// raiseWarm raises the pool's warm target to at least n and reports
// whether it grew.
func (o *odState) raiseWarm(n int) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if n <= o.warm {
		return false
	}
	o.warm = n
	return true
}

// ImageStatus is one image of an on-demand pool, or one a provider is
// preparing or failed to prepare, as GET /v1/images reports it.
type ImageStatus struct {
	Image     string
	Class     string
	Pool      string // "" while no pool exists for it (its first preparation)
	CPU       float64
	MemoryMiB int
	DiskMiB   int
	// PoolState is the pool record's state ("" without a pool).
	PoolState PoolState
	// Image is its state on the provider (pulling, ready, failed), with
	// Reason, progress and size when the provider reports them; a pool
	// whose provider does not report its image is ready.
	State                 providers.ImageState
	Reason                string
	BytesDone, BytesTotal int64
	SizeBytes             int64
	Digest                string
	CreatedAt, LastUsed   time.Time
	Acquires              int64
	Warm                  int
}

// ImagePage is one page of Images.
type ImagePage struct {
	Images []ImageStatus
	// Next is the cursor of the next page, "" after the last one.
	Next string
}

// Images returns one page (at most limit) of the on-demand pools' images
// after cursor, each with its provider's view of the image (one
// ImageCache.Images call per provider of a class); the first page also
// lists the images providers are preparing or failed to prepare that no
// pool of the page holds. Its work grows with the page and the providers'
// images, not with tasks.
func (m *Manager) Images(ctx context.Context, cursor string, limit int) (ImagePage, error) {
	ctx = ContextWithCaller(ctx, CallerPools)
	page, err := m.poolsPage(ctx, cursor, limit)
	if err != nil {
		return ImagePage{}, err
	}
	out, err := m.imageStatuses(ctx, page.Pools, cursor == "")
	out.Next = page.Next
	return out, err
}

// maxImagesOf bounds the pools of one ImagesOf.
const maxImagesOf = 100

// ImagesOf returns the images of the on-demand pools named (a name with no
// record is left out), with their providers' view, as Images does (one
// record read per pool), and the providers' view of the images named
// (normalized references) that no pool of the answer holds: an image's
// first preparation, before its pool exists, or its failure. At most 100
// of each.
func (m *Manager) ImagesOf(ctx context.Context, pools, images []string) (ImagePage, error) {
	if len(pools) > maxImagesOf || len(images) > maxImagesOf {
		return ImagePage{}, badinput.New("pool", "%d pools and %d images named; at most %d of each", len(pools), len(images), maxImagesOf)
	}
	ctx = ContextWithCaller(ctx, CallerPools)
	recs := make([]PoolRecord, 0, len(pools))
	for _, name := range pools {
		rec, err := m.store.GetPool(ctx, name)
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return ImagePage{}, fmt.Errorf("read on-demand pool %s: %w", name, err)
		}
		recs = append(recs, rec)
	}
	out, err := m.imageStatuses(ctx, recs, len(images) > 0)
	if err != nil || len(images) == 0 {
		return out, err
	}
	named := make(map[string]bool, len(images))
	for _, im := range images {
		named[im] = true
	}
	kept := out.Images[:0] // the pools', and of the others only the images named
	for _, st := range out.Images {
		if st.Pool != "" || named[st.Image] {
			kept = append(kept, st)
		}
	}
	out.Images = kept
	return out, nil
}

// imageStatuses joins pool records with their providers' view of their
// images (one ImageCache.Images call per provider of a class); with loose,
// the images providers are preparing or failed to prepare that no record
// holds follow.
func (m *Manager) imageStatuses(ctx context.Context, recs []PoolRecord, loose bool) (ImagePage, error) {
	infos := map[string]providers.ImageInfo{} // by image reference
	var others []providers.ImageInfo
	asked := map[string]bool{}
	for _, name := range m.classNames {
		cs := m.classes[name]
		ic, ok := cs.provider.(providers.ImageCache)
		if !ok || asked[cs.cfg.Provider] {
			continue
		}
		asked[cs.cfg.Provider] = true
		pctx, cancel := context.WithTimeout(ctx, m.cfg.ProviderTimeout)
		list, err := ic.Images(pctx)
		cancel()
		if err != nil {
			return ImagePage{}, fmt.Errorf("list the images of provider %s: %w", cs.cfg.Provider, err)
		}
		for _, info := range list {
			infos[info.Image] = info
			others = append(others, info)
		}
	}
	var out ImagePage
	held := map[string]bool{}
	for _, rec := range recs {
		st := ImageStatus{
			Image: rec.Image, Class: rec.Class, Pool: rec.Name, CPU: rec.CPU, MemoryMiB: rec.MemoryMiB, DiskMiB: rec.DiskMiB,
			PoolState: rec.State, State: providers.ImageReady, Digest: rec.Digest, CreatedAt: rec.CreatedAt, LastUsed: rec.LastUsed,
			Acquires: rec.Acquires,
		}
		if p := m.odPool(rec.Name); p != nil {
			st.Warm = p.minWarm()
		}
		if info, ok := infos[rec.Image]; ok {
			mergeImageInfo(&st, info)
		}
		held[rec.Image] = true
		out.Images = append(out.Images, st)
	}
	if loose {
		for _, info := range others {
			if held[info.Image] || info.State == providers.ImageReady {
				continue
			}
			st := ImageStatus{Image: info.Image, State: info.State}
			mergeImageInfo(&st, info)
			out.Images = append(out.Images, st)
		}
	}
	return out, nil
}

// mergeImageInfo adds a provider's view of an image to its status.
func mergeImageInfo(st *ImageStatus, info providers.ImageInfo) {
	if info.State != "" {
		st.State = info.State
	}
	st.Reason, st.BytesDone, st.BytesTotal, st.SizeBytes = info.Reason, info.BytesDone, info.BytesTotal, info.SizeBytes
	if info.Digest != "" {
		st.Digest = info.Digest
	}
	if info.LastUsed.After(st.LastUsed) {
		st.LastUsed = info.LastUsed
	}
}

// BuildPrefix starts the repository of every image built through the
// gateway: "quarry-build/<owner's first 12 characters>/<name>", so that a
// key's builds never replace another key's, nor an operator's image.
const BuildPrefix = "quarry-build/"

// buildNamePattern is what a build's name may be: a repository path and
// an optional tag.
var buildNamePattern = regexp.MustCompile(`^[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*){0,3}(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?$`)

// BuildRequest is an image build (BuildImage).
type BuildRequest struct {
	// Class names the class whose provider builds; "" is the first class
	// whose provider builds images.
	Class string
	// Name is the image's NAME[:TAG] (":latest" when it has none); the
	// image built is BuildPrefix + Owner[:12] + "/" + Name.
	Name string
	// Context is a tar stream of the build context; Dockerfile its path in
	// it ("" = "Dockerfile").
	Context    io.Reader
	Dockerfile string
	Owner      string
}

// BuildImage builds an image from a context with a provider that builds
// (providers.ImageBuilder), streaming the build's log to log, and returns
// the image built: a reference that a sandbox may name at once (its class
// permitting). Errors: *badinput.Error for a bad name or a class that does
// not build; *providers.BuildError for a build that ran and failed.
func (m *Manager) BuildImage(ctx context.Context, req BuildRequest, log io.Writer) (providers.ImageInfo, error) {
	if !buildNamePattern.MatchString(req.Name) || len(req.Name) > 200 {
		return providers.ImageInfo{}, badinput.New("name", "%q must be a lowercase repository path (letters, digits, '.', '_', '-', up to 4 elements) with an optional :TAG", req.Name)
	}
	if len(req.Owner) < 12 {
		return providers.ImageInfo{}, badinput.New("owner", "is required")
	}
	var builder providers.ImageBuilder
	for _, name := range m.classNames {
		cs := m.classes[name]
		if req.Class != "" && name != req.Class {
			continue
		}
		if b, ok := cs.provider.(providers.ImageBuilder); ok {
			builder = b
			break
		}
		if req.Class != "" {
			return providers.ImageInfo{}, badinput.New("class", "class %q runs on the %s provider, which builds no images (the docker provider does)", name, cs.cfg.Provider)
		}
	}
	if builder == nil {
		if req.Class != "" && m.classes[req.Class] == nil {
			return providers.ImageInfo{}, badinput.New("class", "unknown class %q (configured classes: %s)", req.Class, strings.Join(m.classNames, ", "))
		}
		return providers.ImageInfo{}, badinput.New("class", "no class of this gateway runs on a provider that builds images (the docker provider does)")
	}
	name := req.Name
	if !strings.Contains(name[strings.LastIndex(name, "/")+1:], ":") {
		name += ":latest"
	}
	tag := BuildPrefix + req.Owner[:12] + "/" + name
	info, err := builder.BuildImage(ctx, providers.BuildRequest{
		Context: req.Context, Dockerfile: req.Dockerfile, Tag: tag, Labels: map[string]string{"quarry.build.owner": req.Owner},
	}, log)
	if err != nil {
		return info, fmt.Errorf("build image %s: %w", tag, err)
	}
	if info.Image == "" {
		info.Image = tag
	}
	return info, nil
}

// poolsPage returns a page of the on-demand pools of every configured
// class, class by class (ListPoolsPage of one class: never a walk of the
// whole store), with a cursor "<class index>/<the class's cursor>".
func (m *Manager) poolsPage(ctx context.Context, cursor string, limit int) (PoolPage, error) {
	i, inner := 0, ""
	if cursor != "" {
		n, rest, ok := strings.Cut(cursor, "/")
		idx, err := strconv.Atoi(n)
		if !ok || err != nil || idx < 0 || idx >= len(m.classNames) {
			return PoolPage{}, badinput.New("cursor", "must be the next of an earlier answer")
		}
		i, inner = idx, rest
	}
	var out PoolPage
	for ; i < len(m.classNames) && len(out.Pools) < limit; i, inner = i+1, "" {
		page, err := m.store.ListPoolsPage(ctx, m.classNames[i], inner, limit-len(out.Pools))
		if err != nil {
			return PoolPage{}, fmt.Errorf("list the on-demand pools of class %s: %w", m.classNames[i], err)
		}
		out.Pools = append(out.Pools, page.Pools...)
		if page.Next != "" {
			out.Next = strconv.Itoa(i) + "/" + page.Next
			return out, nil
		}
	}
	if i < len(m.classNames) && len(out.Pools) >= limit {
		out.Next = strconv.Itoa(i) + "/"
	}
	return out, nil
}
