package scalebench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"sync"
	"time"

	"github.com/quarryhq/quarry/api"
	"github.com/quarryhq/quarry/bench/ddbsim"
	"github.com/quarryhq/quarry/bench/ecssim"
)

// The images scenario (issue 22, `-images M`): a SWE-style batch of N
// sandboxes over M task images on real gateway replicas, each sandbox
// created with its image, running one command and released, in two modes,
// each in a fresh world (so that every image is new to the account in
// both):
//   - no prefetch: every create names its image straight away;
//   - prefetch: the whole batch is announced first (POST
//     /v1/images/prefetch, at most 1,000 images a call, the calls spread
//     over the replicas), GET /v1/images is walked until every image is
//     ready, then the creates come.
//
// After the batch it waits for the class's pools to end (idle_seconds).

// Modes of the images scenario.
const (
	ModeNoPrefetch = "no prefetch"
	ModePrefetch   = "prefetch"
)

// Metrics read from the gateways in the images scenario.
const (
	prepareMetric        = "quarry_image_prepare_duration_seconds"
	poolsEndedMetric     = "quarry_ondemand_pools_ended_total"
	prefetchRefuseMetric = "quarry_prefetch_refused_total"
	orphanMetric         = "quarry_orphan_tasks_stopped_total"
	acquiresMetric       = "quarry_acquires_total"
	refillBlockedMetric  = "quarry_refill_blocked_total"
)

// runImages runs both modes of size n, each in a fresh world.
func runImages(ctx context.Context, cfg Config, n int, dir string, logf func(string, ...any)) (ImagesResult, error) {
	begin := time.Now()
	set := newImageSet(n, cfg.Images)
	r := ImagesResult{N: n, M: cfg.Images, Replicas: cfg.Replicas, TimeScale: cfg.TimeScale, Store: Store, Simulated: true,
		PullRate: cfg.ImagePullRate, ClassWarmMax: cfg.ImageWarmMax, IdleSeconds: cfg.ImageIdleSeconds,
		PrefetchWarm: cfg.PrefetchWarm, GatewayEnv: cfg.GatewayEnv}
	r.ImageBytes.Min, r.ImageBytes.Max = set.largest(), 0
	var total int64
	for _, v := range set.sizes {
		r.ImageBytes.Min, r.ImageBytes.Max = min(r.ImageBytes.Min, v), max(r.ImageBytes.Max, v)
		total += v
	}
	r.ImageBytes.Mean = total / int64(len(set.sizes))
	r.Floor = imageFloor(n, cfg.Images, set.largest(), cfg.ImagePullRate)
	logf("images N=%d over M=%d images (simulated): AWS floor of the batch %.0f s (registrations %.0f s, launches %.0f s, slowest start %.0f s)",
		n, cfg.Images, r.Floor.Batch, r.Floor.Register, r.Floor.Launch, r.Floor.Start)
	var errs []error
	for _, mode := range []string{ModeNoPrefetch, ModePrefetch} {
		if ctx.Err() != nil {
			break
		}
		mdir := fmt.Sprintf("%s/%s", dir, map[string]string{ModeNoPrefetch: "no-prefetch", ModePrefetch: "prefetch"}[mode])
		m, err := runImageMode(ctx, cfg, n, mdir, &set, mode, r.Floor, logf)
		if err != nil {
			m.Notes = append(m.Notes, "run failed: "+err.Error())
			logf("images N=%d, %s: run failed: %s", n, mode, err)
			errs = append(errs, fmt.Errorf("%s: %w", mode, err))
		}
		r.Modes = append(r.Modes, m)
	}
	r.WallSeconds = round(time.Since(begin).Seconds())
	return r, errors.Join(errs...)
}

// runImageMode builds a world, runs one mode's batch in it, waits for the
// pools to end and tears the world down.
func runImageMode(ctx context.Context, cfg Config, n int, dir string, set *imageSet, mode string, floor ImageFloor,
	logf func(string, ...any)) (m ModeResult, err error) {
	begin := time.Now()
	m = ModeResult{Mode: mode, CPU: map[string]float64{}}
	defer func() { m.WallSeconds = round(time.Since(begin).Seconds()) }()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return m, err
	}
	w, err := openWorld(ctx, cfg, n, dir, set)
	if err != nil {
		return m, err
	}
	defer w.close()
	d0, err := w.ddbStats(ctx)
	if err != nil {
		return m, fmt.Errorf("read ddbsim's stats: %w", err)
	}
	e0 := w.ecsStats()
	hc := w.trainerClient(n)
	defer hc.CloseIdleConnections()

	start := time.Now()
	if mode == ModePrefetch {
		c0 := readCPU()
		m.Prefetch = w.prefetch(ctx, floor, logf)
		m.CPU["prefetch"] = busyPercent(c0, readCPU())
		m.Prefetch.PoolsEndedIdle = w.counter(ctx, poolsEndedMetric, "how")["idle"]
	}
	d1, err := w.ddbStats(ctx)
	if err != nil {
		return m, fmt.Errorf("read ddbsim's stats: %w", err)
	}

	creates := time.Now()
	// The creates give up after FillLimit times their floor: the batch's
	// (registrations included) without a prefetch, the creates' alone
	// after one.
	base := floor.Batch
	if mode == ModePrefetch {
		base = floor.Creates
	}
	limit := cfg.wall(time.Duration(cfg.FillLimit * base * float64(time.Second)))
	logf("images N=%d, %s: %d creates at once (giving up after %s simulated)", n, mode, n, cfg.sim(limit).Round(time.Second))
	c0 := readCPU()
	b := w.imageBatch(ctx, hc, creates.Add(limit), logf)
	m.CPU["batch"] = busyPercent(c0, readCPU())
	m.FirstCommand, m.CreateOK, m.Exec = b.first, b.create, b.exec
	m.Retries, m.Lost, m.LostBy, m.ReleaseErrors = b.retries, b.lost, b.lostBy, b.releaseErrors
	m.CreatesSimSeconds = round(cfg.sim(b.last.Sub(creates)).Seconds())
	m.BatchSimSeconds = round(cfg.sim(b.last.Sub(start)).Seconds())
	m.Complete = b.lost == 0
	m.EndedSimSeconds = round(cfg.sim(b.ended.Sub(start)).Seconds())
	m.CreatesFloor = floor.Creates
	m.BatchFloor = floor.Batch
	if mode == ModePrefetch {
		m.ModeFloor = floor.Prefetched
	} else {
		m.ModeFloor = floor.Batch
	}
	m.CreatesRatio = ratio(m.CreatesSimSeconds, m.CreatesFloor)
	m.BatchRatio = ratio(m.BatchSimSeconds, m.BatchFloor)
	m.ModeRatio = ratio(m.BatchSimSeconds, m.ModeFloor)
	logf("images N=%d, %s: %d of %d ran their command, the last at %.0f s (simulated; %.2fx the AWS floor of %.0f s), the trainers done at %.0f s; first command p50 %.0f s, p99 %.0f s (simulated); lost %d %v",
		n, mode, b.first.OK, n, m.BatchSimSeconds, m.BatchRatio, m.BatchFloor, m.EndedSimSeconds,
		b.first.P50ms/1000/cfg.TimeScale, b.first.P99ms/1000/cfg.TimeScale, m.Lost, m.LostBy)

	d2, err := w.ddbStats(ctx)
	if err != nil {
		return m, fmt.Errorf("read ddbsim's stats: %w", err)
	}
	e2 := w.ecsStats()
	m.account(n, len(set.names), e0, e2, d0, d1, d2)
	m.ByCaller = w.counter(ctx, storeMetric, "caller")
	m.Prepare = w.histogram(ctx, prepareMetric)
	m.PoolsEnded = w.counter(ctx, poolsEndedMetric, "how")
	m.Acquires = w.counter(ctx, acquiresMetric, "outcome")
	m.RefillBlocked = w.counter(ctx, refillBlockedMetric, "reason")
	m.PrefetchRefused = w.counter(ctx, prefetchRefuseMetric, "")[""]
	for _, g := range w.gws {
		m.Memory = append(m.Memory, memoryOf(g.pid))
	}

	m.OrphanStops = sum(w.counter(ctx, orphanMetric, "provider"))
	c0 = readCPU()
	m.End = w.waitPoolsEnd(ctx, d2, logf)
	m.CPU["end"] = busyPercent(c0, readCPU())
	m.End.OrphanStops = sum(w.counter(ctx, orphanMetric, "provider")) - m.OrphanStops
	m.End.StopTaskCalls = w.ecsStats().Operations["StopTask"].Requests - e2.Operations["StopTask"].Requests
	for i, g := range w.gws {
		if i < len(m.Memory) {
			m.Memory[i].PeakKiB = memoryOf(g.pid).PeakKiB
		}
	}
	if st := w.ecsStats(); st.PullNotFound > 0 {
		m.Notes = append(m.Notes, fmt.Sprintf("ecssim: %d tasks named an image its registry does not hold", st.PullNotFound))
	}
	return m, nil
}

// trainerClient is the trainers' HTTP client: a connection for each
// trainer (a rollout holds its create open for as long as the image and
// the start take; a shared bound would measure the client's queue).
func (w *world) trainerClient(n int) *http.Client {
	per := n/len(w.gws) + 64
	return &http.Client{Timeout: w.cfg.wall(5*time.Minute) + 30*time.Second, Transport: &http.Transport{
		MaxIdleConns: n + 64, MaxIdleConnsPerHost: per, MaxConnsPerHost: per, IdleConnTimeout: time.Minute,
	}}
}

// prefetch announces the whole batch (calls of at most maxPrefetch images,
// spread over the replicas) and walks GET /v1/images until every image is
// ready or has failed, or FillLimit × the registrations' floor has passed.
func (w *world) prefetch(ctx context.Context, floor ImageFloor, logf func(string, ...any)) *PrefetchPhase {
	ph := &PrefetchPhase{States: map[string]int{}, RegisterFloor: floor.Register}
	names := w.imgs.names
	start := time.Now()
	var calls []time.Duration
	errs := map[string]int{}
	for k := 0; k*maxPrefetch < len(names); k++ {
		chunk := names[k*maxPrefetch : min(len(names), (k+1)*maxPrefetch)]
		var out api.PrefetchResponse
		t := time.Now()
		err := w.call(ctx, w.gws[k%len(w.gws)], http.MethodPost, "/v1/images/prefetch",
			api.PrefetchRequest{Images: chunk, Class: imageClass, Warm: w.cfg.PrefetchWarm}, &out)
		if err != nil {
			errs[errKey(err)]++
			ph.States["call failed"] += len(chunk)
			continue
		}
		calls = append(calls, time.Since(t))
		for _, im := range out.Images {
			ph.States[im.State]++
		}
	}
	ph.Calls = latencies(calls, errs)
	limit := w.cfg.wall(time.Duration(w.cfg.FillLimit * float64(max(floor.Register, 60)) * float64(time.Second)))
	logf("  prefetch: %d images announced in %d calls (%v); waiting for GET /v1/images to show them ready (floor %.0f s simulated)",
		len(names), len(calls), ph.States, floor.Register)
	want := make(map[string]bool, len(names))
	for _, name := range names {
		want[name] = true
	}
	poll := min(max(w.cfg.wall(2*time.Second), 100*time.Millisecond), time.Second)
	var walks []time.Duration
	walkErrs := map[string]int{}
	lastShown := time.Now()
	for {
		t := time.Now()
		v, err := w.imageView(ctx, w.gws[0], want)
		if err != nil {
			walkErrs[errKey(err)]++
		} else {
			walks = append(walks, time.Since(t))
			ph.Ready, ph.Failed, ph.Ended = v.ready, v.failed, v.ended
		}
		if time.Since(lastShown) >= 10*time.Second {
			logf("  %s simulated: %d ready, %d failed, %d of their pools ended (ecssim: %d task definitions, %d register throttles)",
				w.cfg.sim(time.Since(start)).Round(time.Second), ph.Ready, ph.Failed, ph.Ended, w.ecsStats().TaskDefinitions, w.ecsStats().RefusedRegisterRate)
			lastShown = time.Now()
		}
		if ph.Ready+ph.Failed >= len(names) || time.Since(start) > limit || ctx.Err() != nil {
			break
		}
		time.Sleep(poll)
	}
	ph.Complete = ph.Ready >= len(names)
	ph.ReadySimSeconds = round(w.cfg.sim(time.Since(start)).Seconds())
	ph.Ratio = ratio(ph.ReadySimSeconds, ph.RegisterFloor)
	ph.Walks = latencies(walks, walkErrs)
	logf("  prefetch: %d of %d ready after %.0f s (simulated) = %.2fx the registrations' floor; a walk of GET /v1/images p50 %.0f ms, p99 %.0f ms",
		ph.Ready, len(names), ph.ReadySimSeconds, ph.Ratio, ph.Walks.P50ms, ph.Walks.P99ms)
	return ph
}

// imageView counts the batch's images as one walk of GET /v1/images shows
// them.
type imageView struct{ ready, failed, ended, active int }

// imageView walks every page of GET /v1/images on g and counts the images
// of want by state.
func (w *world) imageView(ctx context.Context, g *replica, want map[string]bool) (imageView, error) {
	var v imageView
	seen := make(map[string]bool, len(want))
	cursor := ""
	for range 1000 {
		q := url.Values{"limit": {"1000"}}
		if cursor != "" {
			q.Set("cursor", cursor)
		}
		var page api.ImageList
		if err := w.call(ctx, g, http.MethodGet, "/v1/images?"+q.Encode(), nil, &page); err != nil {
			return v, err
		}
		for _, im := range page.Images {
			if !want[im.Image] || im.Pool == "" || seen[im.Image] {
				continue
			}
			seen[im.Image] = true
			switch im.State {
			case api.ImageReady:
				v.ready++
			case api.ImageFailed:
				v.failed++
			}
			if im.PoolState == "ended" {
				v.ended++
			} else {
				v.active++
			}
		}
		if cursor = page.Next; cursor == "" {
			return v, nil
		}
	}
	return v, errors.New("GET /v1/images: more than 1,000 pages")
}

// batchOut is what the trainers of one batch measured.
type batchOut struct {
	first, create, exec Latencies
	retries             map[string]int
	lost                int
	lostBy              map[string]int
	releaseErrors       int
	last                time.Time // when the last command ended
	ended               time.Time // when the last trainer was done (ran or gave up)
}

// imageBatch runs the N trainers at once: each creates a sandbox of its
// image (retrying what a trainer retries: 5xx, 429 and transport errors,
// with a backoff of 1–30 simulated seconds, until deadline), runs one
// command in it and releases it.
func (w *world) imageBatch(ctx context.Context, hc *http.Client, deadline time.Time, logf func(string, ...any)) batchOut {
	var (
		mu                 sync.Mutex
		firsts, cr, ex     []time.Duration
		crErr, exErr       = map[string]int{}, map[string]int{}
		out                = batchOut{retries: map[string]int{}, lostBy: map[string]int{}}
		wg                 sync.WaitGroup
		startLine          = make(chan struct{})
		done, lost, leased int
	)
	start := time.Now()
	bctx, cancel := context.WithDeadline(ctx, deadline.Add(w.cfg.wall(5*time.Minute)+time.Minute))
	defer cancel()
	stopProgress := make(chan struct{})
	progressDone := make(chan struct{})
	go func() {
		defer close(progressDone)
		t := time.NewTicker(10 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-stopProgress:
				return
			case <-t.C:
				mu.Lock()
				d, l, s := done, lost, leased
				mu.Unlock()
				st := w.ecsStats()
				logf("  %s simulated: %d commands run, %d leased, %d lost (ecssim: %d task definitions, %d launched, tasks %v)",
					w.cfg.sim(time.Since(start)).Round(time.Second), d, s, l, st.TaskDefinitions, st.Launched, st.Tasks)
			}
		}
	}()
	for i, img := range w.imgs.of {
		g := w.gws[i%len(w.gws)]
		image := w.imgs.names[img]
		idem := map[string]string{"Idempotency-Key": fmt.Sprintf("scalebench-%d", i)}
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-startLine
			begin := time.Now()
			fail := func(why string) {
				mu.Lock()
				out.lostBy[why]++
				lost++
				mu.Unlock()
			}
			var sb api.Sandbox
			backoff := w.cfg.wall(time.Second)
			for {
				t := time.Now()
				// One idempotency key per trainer: a retry after an answer
				// that was lost returns the sandbox the first attempt made.
				err := w.callHeader(bctx, hc, g, http.MethodPost, "/v1/sandboxes", idem,
					api.CreateSandboxRequest{Image: image, Class: imageClass, LeaseSeconds: w.cfg.wallSeconds(w.cfg.LeaseSeconds)}, &sb)
				if err == nil {
					mu.Lock()
					cr = append(cr, time.Since(t))
					leased++
					mu.Unlock()
					break
				}
				key := errKey(err)
				mu.Lock()
				crErr[key]++
				mu.Unlock()
				if !retryable(err) {
					fail("create: " + key)
					return
				}
				mu.Lock()
				out.retries[key]++
				mu.Unlock()
				wait := backoff/2 + rand.N(backoff/2+1)
				if time.Now().Add(wait).After(deadline) {
					fail("create gave up: " + key)
					return
				}
				select {
				case <-bctx.Done():
					fail("create gave up: " + key)
					return
				case <-time.After(wait):
				}
				backoff = min(2*backoff, w.cfg.wall(30*time.Second))
			}
			var err error
			for range 3 {
				t := time.Now()
				ectx, ecancel := context.WithTimeout(bctx, time.Minute)
				err = w.callWith(ectx, hc, g, http.MethodPost, "/v1/sandboxes/"+sb.ID+"/exec", map[string]any{"command": "true"}, nil)
				ecancel()
				if err == nil {
					mu.Lock()
					ex = append(ex, time.Since(t))
					mu.Unlock()
					break
				}
				mu.Lock()
				exErr[errKey(err)]++
				mu.Unlock()
				if !retryable(err) {
					break
				}
			}
			if err != nil {
				fail("exec: " + errKey(err))
			} else {
				now := time.Now()
				mu.Lock()
				firsts = append(firsts, now.Sub(begin))
				done++
				if now.After(out.last) {
					out.last = now
				}
				mu.Unlock()
			}
			rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
			rerr := w.callWith(rctx, hc, g, http.MethodDelete, "/v1/sandboxes/"+sb.ID, nil, nil)
			rcancel()
			if rerr != nil {
				mu.Lock()
				out.releaseErrors++
				mu.Unlock()
			}
		}()
	}
	close(startLine)
	wg.Wait()
	out.ended = time.Now()
	close(stopProgress)
	<-progressDone
	if out.last.IsZero() {
		out.last = time.Now()
	}
	out.lost = lost
	out.first = latencies(firsts, nil)
	out.first.Count, out.first.Errors = len(w.imgs.of), out.lostBy
	out.create, out.exec = latencies(cr, crErr), latencies(ex, exErr)
	return out
}

// retryable reports whether a trainer retries a failed call: a 5xx or 429
// answer, or no answer.
func retryable(err error) bool {
	var he *httpError
	if errors.As(err, &he) {
		return he.status >= 500 || he.status == http.StatusTooManyRequests
	}
	return true
}

// waitPoolsEnd waits, after the batch, for every pool of the batch to end
// (the class's idle_seconds, then the class loop's passes) and for ECS to
// have no task of the batch left running, up to idle_seconds plus twice a
// walk of the class's records plus 2 simulated minutes.
func (w *world) waitPoolsEnd(ctx context.Context, d0 ddbsim.Stats, logf func(string, ...any)) EndPhase {
	m := len(w.imgs.names)
	passes := m/100 + 2 // QUARRY_POOL_PAGE's default
	limitSim := time.Duration(w.cfg.ImageIdleSeconds)*time.Second + 2*time.Duration(passes)*2*time.Second + 2*time.Minute
	want := make(map[string]bool, m)
	for _, name := range w.imgs.names {
		want[name] = true
	}
	e := EndPhase{LimitSimSeconds: limitSim.Seconds()}
	start, lastShown := time.Now(), time.Now()
	poll := min(max(w.cfg.wall(2*time.Second), 100*time.Millisecond), time.Second)
	for {
		v, err := w.imageView(ctx, w.gws[0], want)
		live := liveTasks(w.ecsStats())
		if err == nil {
			e.PoolsEnded, e.PoolsActive = v.ended, v.active
		}
		e.TasksLive = live
		if time.Since(lastShown) >= 10*time.Second {
			logf("  after the batch, %s simulated: %d pools ended, %d active; ecssim tasks not stopped: %d",
				w.cfg.sim(time.Since(start)).Round(time.Second), e.PoolsEnded, e.PoolsActive, live)
			lastShown = time.Now()
		}
		if (err == nil && v.active == 0 && live == 0) || time.Since(start) > w.cfg.wall(limitSim) || ctx.Err() != nil {
			break
		}
		time.Sleep(poll)
	}
	e.Complete = e.PoolsActive == 0 && e.TasksLive == 0
	e.WaitedSimSeconds = round(w.cfg.sim(time.Since(start)).Seconds())
	if d1, err := w.ddbStats(ctx); err == nil && e.WaitedSimSeconds > 0 {
		e.StorePerMin = round(float64(storeRequests(d1)-storeRequests(d0)) / (e.WaitedSimSeconds / 60))
	}
	return e
}

// liveTasks counts ecssim's tasks that are not STOPPED.
func liveTasks(st ecssim.Stats) int {
	n := 0
	for status, c := range st.Tasks {
		if status != "STOPPED" {
			n += c
		}
	}
	return n
}

// storeRequests is ddbsim's request count.
func storeRequests(st ddbsim.Stats) int64 {
	var n int64
	for _, op := range st.Operations {
		n += op.Requests
	}
	return n
}

// sum adds a counter's values.
func sum(m map[string]float64) float64 {
	var n float64
	for _, v := range m {
		n += v
	}
	return n
}

func ratio(a, b float64) float64 {
	if b <= 0 {
		return 0
	}
	return round(a / b)
}
