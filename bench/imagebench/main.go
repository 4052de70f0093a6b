// Command imagebench measures images on demand on the Docker provider with a
// local registry (issue 22's benchmark, `make bench-images`): a SWE-style
// batch of M distinct images (a shared base, quarry-test/busybox, plus a
// per-task layer of a few MB, built and pushed to the registry by the
// benchmark), N sandboxes drawn across them (each image about N/M times, in
// a shuffled order), each running one command, W at a time. Side by side in
// one run:
//
//	a. no prefetch: each create names its image; the first of each waits for the pull;
//	b. prefetch: the batch is announced first (POST /v1/images/prefetch with warm), then the creates;
//	c. pools: the same images pre-pulled and configured as pools with min_warm (today's only way).
//
// It reports time to first command (create → the command's answer) p50/p99, pulls per
// image (the engine's pull events: goal exactly 1 in a and b), the image cache's peak
// against its budget (QUARRY_DOCKER_IMAGE_BUDGET, sampled from the gateway's metrics), and
// sandboxes lost (goal 0). It needs a Docker engine with the test images
// (scripts/images/build.sh) and the open test registry (scripts/registry.sh; its address in
// QUARRY_TEST_REGISTRY or -registry). Every container it starts carries its own gateway id
// and is removed at the end, and so are its images, in the engine and in the registry.
package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	mrand "math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/docker/docker/api/types/image"
	dockerclient "github.com/docker/docker/client"
	"golang.org/x/sync/errgroup"

	"github.com/quarryhq/quarry/bench/internal/dockergw"
	"github.com/quarryhq/quarry/client"
	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/internal/testimages"
)

// benchKey is the gateways' API key.
const benchKey = "imagebench-key-0123456789"

// base is the image every task image builds on (scripts/images/build.sh).
const base = "quarry-test/busybox:latest"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "imagebench:", err)
		os.Exit(1)
	}
}

type options struct {
	bin, registry, out, modes, budget string
	images, sandboxes, workers        int
	layerKB, warm                     int
	seed                              uint64
}

// result is one mode's figures.
type result struct {
	Mode        string   `json:"mode"`
	Sandboxes   int      `json:"sandboxes"`
	Lost        int      `json:"lost"`
	P50MS       float64  `json:"ttfc_p50_ms"`
	P99MS       float64  `json:"ttfc_p99_ms"`
	MaxMS       float64  `json:"ttfc_max_ms"`
	WallS       float64  `json:"wall_s"`
	PrepareS    float64  `json:"prepare_s"` // prefetch until ready (b), pre-pull and warm-up (c)
	PullsMin    int      `json:"pulls_per_image_min"`
	PullsMax    int      `json:"pulls_per_image_max"`
	PeakCacheMB float64  `json:"peak_cache_mib"`
	BudgetMB    float64  `json:"budget_mib"`
	Errors      []string `json:"errors,omitempty"`
}

func run(ctx context.Context) error {
	var o options
	flag.StringVar(&o.bin, "bin", "bin", "directory with the gateway and execagent binaries")
	flag.StringVar(&o.registry, "registry", os.Getenv("QUARRY_TEST_REGISTRY"), "the open test registry's host:port (scripts/registry.sh)")
	flag.StringVar(&o.out, "json", "", "write the results as JSON to this file")
	flag.StringVar(&o.modes, "modes", "a,b,c", "which modes to run: a (no prefetch), b (prefetch), c (pools)")
	flag.StringVar(&o.budget, "budget", "2Gi", "QUARRY_DOCKER_IMAGE_BUDGET of the gateways of a and b")
	flag.IntVar(&o.images, "images", 200, "distinct task images")
	flag.IntVar(&o.sandboxes, "sandboxes", 1000, "sandboxes drawn across them")
	flag.IntVar(&o.workers, "workers", 16, "sandboxes in flight at once")
	flag.IntVar(&o.layerKB, "layer-kb", 3<<10, "size of each image's own layer, KiB")
	flag.IntVar(&o.warm, "warm", 1, "ready sandboxes per image: b's prefetch warm and c's min_warm")
	flag.Uint64Var(&o.seed, "seed", 22, "seed of the draw")
	flag.Parse()
	if o.registry == "" {
		return errors.New("no registry: start scripts/registry.sh and set QUARRY_TEST_REGISTRY (or -registry)")
	}
	cli, gwID, done, err := dockergw.Engine("imagebench")
	if err != nil {
		return err
	}
	defer done()
	fmt.Printf("imagebench: %d images (%s + %d KiB each), %d sandboxes, %d at a time; registry %s; %s\n",
		o.images, base, o.layerKB, o.sandboxes, o.workers, o.registry, time.Now().UTC().Format(time.RFC3339))

	t0 := time.Now()
	refs, err := pushImages(ctx, cli, o)
	defer func() {
		for _, ref := range refs {
			_ = testimages.Remove(context.Background(), cli, o.registry, testimages.User{}, ref)
		}
	}()
	if err != nil {
		return err
	}
	fmt.Printf("built and pushed %d images in %s\n", len(refs), time.Since(t0).Round(time.Second))

	draw := drawOrder(len(refs), o.sandboxes, o.seed)
	var results []result
	for _, mode := range strings.Split(o.modes, ",") {
		if err := removeLocal(ctx, cli, refs); err != nil {
			return err
		}
		r, err := runMode(ctx, cli, gwID+"-"+mode, o, mode, refs, draw)
		if err != nil {
			return fmt.Errorf("mode %s: %w", mode, err)
		}
		results = append(results, r)
		dockergw.RemoveAll(cli, gwID+"-"+mode, "imagebench")
	}
	report(results)
	if o.out != "" {
		b, _ := json.MarshalIndent(results, "", "  ")
		return os.WriteFile(o.out, b, 0o644)
	}
	return nil
}

// pushImages builds and pushes the task images, two at a time.
func pushImages(ctx context.Context, cli testimages.Engine, o options) ([]string, error) {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	ns := "imagebench-" + hex.EncodeToString(b)
	refs := make([]string, o.images)
	var g errgroup.Group
	g.SetLimit(2)
	for i := range refs {
		refs[i] = fmt.Sprintf("%s/%s/task-%04d:v1", o.registry, ns, i)
		g.Go(func() error {
			data := make([]byte, o.layerKB<<10)
			_, _ = rand.Read(data)
			_, err := testimages.BuildPushed(ctx, cli, base, o.registry, testimages.User{}, refs[i], data)
			return err
		})
	}
	return refs, g.Wait()
}

// removeLocal removes the engine's copies of refs (a mode starts with the
// images only in the registry).
func removeLocal(ctx context.Context, cli testimages.Engine, refs []string) error {
	for _, ref := range refs {
		if _, err := cli.ImageRemove(ctx, ref, image.RemoveOptions{PruneChildren: true}); err != nil && !dockerclient.IsErrNotFound(err) {
			return fmt.Errorf("remove %s: %w", ref, err)
		}
	}
	return nil
}

// drawOrder is the images of n sandboxes: each of m images n/m times (the
// rest from the first ones), shuffled with seed.
func drawOrder(m, n int, seed uint64) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i % m
	}
	r := mrand.New(mrand.NewPCG(seed, seed))
	r.Shuffle(n, func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

// classPools is the pools file of modes a and b: a class that serves the
// registry's images, big enough for the workers and the warm sandboxes.
func classPools(o options) string {
	return fmt.Sprintf(`pools:
  - name: plain
    image: %s
    cpu: 0.25
    memory: 128Mi
    min_warm: 0
    max_total: 1
classes:
  - name: swe
    provider: docker
    cpu: 0.25
    memory: 128Mi
    max_total: %d
    max_per_image: 8
    images: ["%s/**"]
    warm_max: 1
`, base, o.images*o.warm+2*o.workers, o.registry)
}

// poolsFile is mode c's: one configured pool per image.
func poolsFile(o options, refs []string) string {
	var b strings.Builder
	b.WriteString("pools:\n")
	for i, ref := range refs {
		fmt.Fprintf(&b, "  - name: task-%04d\n    image: %s\n    cpu: 0.25\n    memory: 128Mi\n    min_warm: %d\n    max_total: 8\n", i, ref, o.warm)
	}
	return b.String()
}

func runMode(ctx context.Context, cli *dockerclient.Client, gwID string, o options, mode string, refs []string, draw []int) (result, error) {
	r := result{Mode: modeName(mode), Sandboxes: len(draw)}
	dir, err := os.MkdirTemp("", "imagebench-")
	if err != nil {
		return r, err
	}
	pools := classPools(o)
	env := []string{"QUARRY_DOCKER_IMAGE_BUDGET=" + o.budget, "QUARRY_POOL_TOUCH_INTERVAL=1s", "QUARRY_DOCKER_LAUNCH_CONCURRENCY=8"}
	start := time.Now()
	if mode == "c" {
		pools = poolsFile(o, refs)
		for _, ref := range refs { // an operator's pre-pull, outside the gateway
			rc, err := cli.ImagePull(ctx, ref, image.PullOptions{})
			if err != nil {
				return r, fmt.Errorf("pull %s: %w", ref, err)
			}
			if err := testimages.ReadStream(rc); err != nil {
				return r, fmt.Errorf("pull %s: %w", ref, err)
			}
		}
	}
	g, err := dockergw.Start(dockergw.Options{Bin: o.bin, Dir: filepath.Join(dir, "gw"), Key: benchKey, GatewayID: gwID, Pools: pools, Env: env})
	if err != nil {
		return r, err
	}
	defer g.Stop()
	for deadline := time.Now().Add(time.Minute); g.C.Health(ctx) != nil; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			return r, fmt.Errorf("the gateway did not answer within a minute: %s", g.LogTail())
		}
	}
	stopPulls := testimages.WatchPulls(ctx, cli)
	peak := &peakSampler{}
	stopSampling := peak.start(ctx, g)
	switch mode {
	case "b":
		res, err := g.C.Prefetch(ctx, client.PrefetchRequest{Images: refs, Warm: o.warm})
		if err != nil {
			return r, fmt.Errorf("prefetch: %w", err)
		}
		if err := waitPrefetched(ctx, g.C, res, o.warm, 15*time.Minute); err != nil {
			return r, err
		}
		r.PrepareS = time.Since(start).Seconds()
	case "c":
		for i := range refs {
			if err := g.WaitPool(ctx, fmt.Sprintf("task-%04d", i), 15*time.Minute, func(p client.Pool) bool { return p.Ready >= o.warm }); err != nil {
				return r, fmt.Errorf("%w; gateway log: %s", err, g.LogTail())
			}
		}
		r.PrepareS = time.Since(start).Seconds()
	}
	lat, lost, errs, wall := drive(ctx, g.C, o, mode, refs, draw)
	stopSampling()
	r.Lost, r.WallS, r.Errors = lost, wall.Seconds(), errs
	sum := dockergw.Summary(lat)
	r.P50MS, r.P99MS, r.MaxMS = sum["p50"], sum["p99"], sum["max"]
	r.PeakCacheMB = peak.max() / (1 << 20)
	if mode != "c" {
		if n, err := parseBytes(o.budget); err == nil {
			r.BudgetMB = float64(n) / (1 << 20)
		}
	}
	pulls := stopPulls()
	r.PullsMin, r.PullsMax = math.MaxInt, 0
	for _, ref := range refs {
		r.PullsMin, r.PullsMax = min(r.PullsMin, pulls[ref]), max(r.PullsMax, pulls[ref])
	}
	return r, nil
}

func modeName(m string) string {
	switch m {
	case "a":
		return "a. no prefetch"
	case "b":
		return "b. prefetch"
	case "c":
		return "c. pools"
	}
	return m
}

// drive runs the draw, W sandboxes at a time: create (image, or pool in
// c) → one command → release; each sandbox's time to first command in ms.
func drive(ctx context.Context, c *client.Client, o options, mode string, refs []string, draw []int) ([]time.Duration, int, []string, time.Duration) {
	var (
		mu   sync.Mutex
		lat  []time.Duration
		errs []string
		lost atomic.Int64
		next atomic.Int64
	)
	start := time.Now()
	var wg sync.WaitGroup
	for range o.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= len(draw) || ctx.Err() != nil {
					return
				}
				req := client.CreateSandboxRequest{Image: refs[draw[i]]}
				if mode == "c" {
					req = client.CreateSandboxRequest{Pool: fmt.Sprintf("task-%04d", draw[i])}
				}
				t := time.Now()
				d, err := oneSandbox(ctx, c, req, t)
				mu.Lock()
				if err != nil {
					lost.Add(1)
					if len(errs) < 5 {
						errs = append(errs, err.Error())
					}
				} else {
					lat = append(lat, d)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return lat, int(lost.Load()), errs, time.Since(start)
}

// oneSandbox creates a sandbox, runs one command in it and releases it;
// the time from t to the command's answer.
func oneSandbox(ctx context.Context, c *client.Client, req client.CreateSandboxRequest, t time.Time) (time.Duration, error) {
	sb, err := c.CreateSandbox(ctx, req)
	if err != nil {
		return 0, fmt.Errorf("create: %w", err)
	}
	res, err := c.Exec(ctx, sb.ID, agentapi.ExecRequest{Command: "head -c 16 /data | wc -c"})
	took := time.Since(t)
	_, _ = c.DeleteSandbox(context.WithoutCancel(ctx), sb.ID)
	if err != nil {
		return 0, fmt.Errorf("exec: %w", err)
	}
	if strings.TrimSpace(res.Stdout) != "16" {
		return 0, fmt.Errorf("exec: stdout %q, want 16", res.Stdout)
	}
	return took, nil
}

// waitPrefetched polls the prefetched pools until each is ready with its
// warm sandboxes, or limit passes.
func waitPrefetched(ctx context.Context, c *client.Client, res []client.PrefetchedImage, warm int, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	pools := make([]string, 0, len(res))
	for _, r := range res {
		if r.Error != nil {
			return fmt.Errorf("prefetch refused %s: %s", r.Image, r.Error.Message)
		}
		pools = append(pools, r.Pool)
	}
	for {
		ready := 0
		for i := 0; i < len(pools); i += 100 {
			page, err := c.ImagesOf(ctx, pools[i:min(i+100, len(pools))], nil)
			if err != nil {
				return err
			}
			for _, im := range page {
				if im.State == "failed" {
					return fmt.Errorf("prefetch of %s failed: %s", im.Image, im.Reason)
				}
				if im.State == "ready" && im.PoolState == "active" && im.Warm >= warm {
					ready++
				}
			}
		}
		if ready == len(pools) {
			return waitWarm(ctx, c, warm, len(pools), deadline)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("prefetch: %d of %d images ready after %s", ready, len(pools), limit)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitWarm waits until the class's tasks number warm per image (the warm
// sandboxes of the prefetch are up).
func waitWarm(ctx context.Context, c *client.Client, warm, images int, deadline time.Time) error {
	for {
		cs, err := c.Classes(ctx)
		if err != nil {
			return err
		}
		for _, cl := range cs {
			if cl.Name == "swe" && cl.Tasks >= warm*images {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return errors.New("prefetch: the warm sandboxes never all started")
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// peakSampler samples the gateway's image cache gauge.
type peakSampler struct {
	mu   sync.Mutex
	peak float64
}

func (p *peakSampler) max() float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.peak
}

// start samples every 250 ms until the returned stop is called.
func (p *peakSampler) start(ctx context.Context, g *dockergw.Gateway) func() {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			if b, err := g.C.Metrics(ctx); err == nil {
				if v, ok := gauge(b, "quarry_docker_image_cache_bytes"); ok {
					p.mu.Lock()
					p.peak = max(p.peak, v)
					p.mu.Unlock()
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return func() { cancel(); <-done }
}

// gauge reads a metric's value (the sum of its series) from the text
// exposition.
func gauge(b []byte, name string) (float64, bool) {
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	sum, found := 0.0, false
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) || strings.HasPrefix(line, "#") {
			continue
		}
		rest := strings.TrimPrefix(line, name)
		if rest != "" && rest[0] != ' ' && rest[0] != '{' {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err == nil {
			sum, found = sum+v, true
		}
	}
	return sum, found
}

// parseBytes reads "2Gi", "512Mi" or a number of bytes.
func parseBytes(s string) (int64, error) {
	for suffix, mult := range map[string]int64{"Gi": 1 << 30, "Mi": 1 << 20, "Ki": 1 << 10} {
		if n, ok := strings.CutSuffix(s, suffix); ok {
			v, err := strconv.ParseInt(n, 10, 64)
			return v * mult, err
		}
	}
	return strconv.ParseInt(s, 10, 64)
}

// report prints the modes side by side, with b's p99 against c's.
func report(rs []result) {
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "mode\tsandboxes\tlost\tTTFC p50\tTTFC p99\tmax\twall\tprepare\tpulls/image\tpeak cache / budget")
	var b, c *result
	for i := range rs {
		r := &rs[i]
		switch r.Mode {
		case "b. prefetch":
			b = r
		case "c. pools":
			c = r
		}
		cache := "-"
		if r.BudgetMB > 0 {
			cache = fmt.Sprintf("%.0f / %.0f MiB", r.PeakCacheMB, r.BudgetMB)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.0f ms\t%.0f ms\t%.0f ms\t%.1f s\t%.1f s\t%d..%d\t%s\n", r.Mode, r.Sandboxes, r.Lost,
			r.P50MS, r.P99MS, r.MaxMS, r.WallS, r.PrepareS, r.PullsMin, r.PullsMax, cache)
	}
	_ = tw.Flush()
	if b != nil && c != nil && c.P99MS > 0 {
		fmt.Printf("b / c, p99: %.2fx (goal <= 1.2x); p50: %.2fx\n", b.P99MS/c.P99MS, b.P50MS/c.P50MS)
	}
	for _, r := range rs {
		for _, e := range r.Errors {
			fmt.Printf("%s: lost: %s\n", r.Mode, e)
		}
	}
}
