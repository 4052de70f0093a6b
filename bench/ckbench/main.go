// Command ckbench measures checkpoints (issue 14) on the Docker provider with a warm pool,
// through a real gateway (bin/gateway, QUARRY_PROVIDER=docker, the embedded checkpoint
// store) and real agents, for two workspaces generated locally: 10 MB in 1,000 files and
// 100 MB in 10,000 files (source-like text, so that it compresses as code does). For each:
//
//  1. checkpoint: POST /v1/sandboxes/{id}/checkpoints of the work dir, to its answer;
//  2. restore in place: POST /v1/sandboxes/{id}/restore, to its answer;
//  3. from_checkpoint acquire: POST /v1/sandboxes {from_checkpoint} -> first exec answered;
//  4. fork x8 (and x64 for the 10 MB workspace): POST /v1/sandboxes/{id}/fork -> every fork
//     answered a command;
//  5. the baseline: the same state reached by a cold start (a pool with no warm sandbox) plus
//     an upload of the same files (PUT files/archive, a tar) -> first exec answered; and a
//     cold start alone -> first exec (from_checkpoint's goal: cold start + 100 ms);
//  6. copy-on-write (pool ckcow, option cow=always): from_checkpoint -> first exec, and forks
//     x8 and x64 -> all answered, each sandbox a cold start on the checkpoint's layer, with the
//     space that the layer (in memory or on disk: QUARRY_DOCKER_LAYER_MEDIUM, inherited by the
//     gateway) and the forks' upper layers hold (du on the volumes).
//
// p50 and p99 of each. It needs a Docker engine (scripts/docker-up.sh) and the test images
// (scripts/images/build.sh); every container it starts carries its own gateway id and is
// removed at the end. `make bench` runs it; docs/BENCHMARKS.md "Checkpoints" has the numbers.
package main

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	dockerclient "github.com/docker/docker/client"

	"github.com/quarryhq/quarry/bench/internal/dockergw"
	"github.com/quarryhq/quarry/client"
	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/internal/stats"
	"github.com/quarryhq/quarry/providers/docker"
)

// benchKey is the gateway's API key (at least 16 characters).
const benchKey = "ckbench-key-0123456789"

// The pools: warm (forks, restores), cold (the baseline: nothing warm), and
// cow (sandboxes made from a checkpoint start on a copy-on-write layer:
// option cow=always, since its disk bound would keep them on the copy).
const (
	warmPool = "ck"
	coldPool = "ckcold"
	cowPool  = "ckcow"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "ckbench:", err)
		os.Exit(1)
	}
}

type options struct {
	bin      string
	image    string
	out      string
	runs     int
	forkRuns int
	bigForks int
	level    string
	wait     time.Duration
}

// workspace is one generated tree: its size and files.
type workspace struct {
	Name  string `json:"name"`
	Files int    `json:"files"`
	Bytes int64  `json:"bytes"`
}

// result is one workspace's numbers (milliseconds: p50, p99, min, max, and n).
type result struct {
	Workspace      workspace                     `json:"workspace"`
	ArchiveBytes   int64                         `json:"archive_bytes"`
	Ops            map[string]map[string]float64 `json:"ops"`
	ColdUploadBase string                        `json:"baseline"`
}

func run(ctx context.Context) error {
	var o options
	flag.StringVar(&o.bin, "bin", "bin", "directory with the gateway and execagent binaries")
	flag.StringVar(&o.image, "image", "quarry-test/busybox:latest", "image of the sandboxes")
	flag.StringVar(&o.out, "json", "", "write the results as JSON to this file")
	flag.IntVar(&o.runs, "runs", 15, "runs of checkpoint, restore and from_checkpoint per workspace (100 MB: a third)")
	flag.IntVar(&o.forkRuns, "fork-runs", 5, "runs of each fork measurement (x64 and 100 MB: fewer, see the code)")
	flag.IntVar(&o.bigForks, "forks", 64, "the larger fork's count (10 MB workspace only)")
	flag.StringVar(&o.level, "compression", "", "QUARRY_CHECKPOINT_COMPRESSION of the gateway: none, fast or small (\"\": the gateway's default, none)")
	flag.DurationVar(&o.wait, "wait", 5*time.Minute, "bound of each wait (a pool filling)")
	flag.Parse()

	bin, err := filepath.Abs(o.bin)
	if err != nil {
		return err
	}
	cli, gwID, done, err := dockergw.Engine("ckbench")
	if err != nil {
		return err
	}
	defer done()

	tmp, err := os.MkdirTemp("", "ckbench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	g, err := startGateway(ctx, o, bin, gwID, tmp)
	if err != nil {
		return err
	}
	g.cli, g.id = cli, gwID
	defer g.Stop()
	fmt.Printf("Docker provider, image %s, gateway id %s, warm pool of %d, compression %q, layers in %s\n", o.image, gwID, g.warm, o.level, layerMedium())

	var results []result
	for _, ws := range []workspace{{"10MB-1k", 1000, 10 << 20}, {"100MB-10k", 10000, 100 << 20}} {
		r, err := measure(ctx, o, g, ws, filepath.Join(tmp, ws.Name))
		if err != nil {
			return fmt.Errorf("workspace %s: %w", ws.Name, err)
		}
		results = append(results, r)
	}
	if o.out != "" {
		b, err := json.MarshalIndent(results, "", "  ")
		if err != nil {
			return err
		}
		return os.WriteFile(o.out, append(b, '\n'), 0o644)
	}
	return nil
}

// measure runs every measurement on one workspace.
func measure(ctx context.Context, o options, g *gateway, ws workspace, dir string) (result, error) {
	if err := generate(dir, ws); err != nil {
		return result{}, err
	}
	res := result{Workspace: ws, Ops: map[string]map[string]float64{},
		ColdUploadBase: "cold start (no warm sandbox) + PUT files/archive of the same files (tar) -> first exec"}
	fmt.Printf("\n== workspace %s: %d files, %d MB (generated source-like text)\n", ws.Name, ws.Files, ws.Bytes>>20)
	big := ws.Bytes > 50<<20
	runs, forkRuns := o.runs, o.forkRuns
	if big {
		runs, forkRuns = max(3, o.runs/3), max(2, o.forkRuns/2)
	}
	report := func(name string, ds []time.Duration) {
		res.Ops[name] = summary(ds)
		fmt.Printf("  %-34s %s\n", name, dockergw.Line(ds))
	}

	if err := g.waitReady(ctx, warmPool, g.warm, o.wait); err != nil {
		return res, err
	}
	src, err := g.C.CreateSandbox(ctx, client.CreateSandboxRequest{Pool: warmPool, LeaseSeconds: 3600})
	if err != nil {
		return res, err
	}
	defer func() { _, _ = g.C.DeleteSandbox(context.WithoutCancel(ctx), src.ID) }()
	if err := upload(ctx, g.C, src.ID, dir); err != nil {
		return res, fmt.Errorf("seed the source sandbox: %w", err)
	}

	// 1. checkpoint.
	var cks []time.Duration
	var ck client.Checkpoint
	for i := range runs {
		start := time.Now()
		c, err := g.C.CreateCheckpoint(ctx, src.ID, client.CreateCheckpointRequest{})
		if err != nil {
			return res, fmt.Errorf("checkpoint: %w", err)
		}
		cks = append(cks, time.Since(start))
		if i < runs-1 {
			if err := g.C.DeleteCheckpoint(ctx, c.ID); err != nil {
				return res, err
			}
		}
		ck = c
	}
	res.ArchiveBytes = ck.SizeBytes
	fmt.Printf("  archive: %d entries, %.1f MB stored (format %s)\n", ck.Files, float64(ck.SizeBytes)/(1<<20), ck.Format)
	report("checkpoint", cks)

	// 2. restore in place (each after a change to the tree), and beside it
	// `cp -a` of the same tree to a new directory on the same file system
	// (the work dir's tmpfs), in the sandbox: the copy's own time, as its
	// exec's duration_ms (issue 27: a restore within 1.5x of a copy).
	var rs, agentRs, cps []time.Duration
	const cpDir = ".ckbench-cp"
	for range runs {
		if _, err := g.C.Exec(ctx, src.ID, agentapi.ExecRequest{Command: "echo changed > d00/s00/f0000.txt; echo new > new.txt"}); err != nil {
			return res, err
		}
		start := time.Now()
		rr, err := g.C.RestoreSandbox(ctx, src.ID, ck.ID)
		if err != nil {
			return res, fmt.Errorf("restore: %w", err)
		}
		rs = append(rs, time.Since(start))
		agentRs = append(agentRs, time.Duration(rr.DurationMS)*time.Millisecond)
		cp, err := g.C.Exec(ctx, src.ID, agentapi.ExecRequest{Command: "mkdir " + cpDir + " && cp -a $(ls -A | grep -vx " + cpDir + ") " + cpDir + "/"})
		if err == nil && cp.ExitCode != 0 {
			err = fmt.Errorf("exit %d: %s", cp.ExitCode, cp.Stderr)
		}
		if err != nil {
			return res, fmt.Errorf("cp -a: %w", err)
		}
		cps = append(cps, time.Duration(cp.DurationMS)*time.Millisecond)
		if rm, err := g.C.Exec(ctx, src.ID, agentapi.ExecRequest{Command: "rm -rf " + cpDir}); err != nil || rm.ExitCode != 0 {
			return res, fmt.Errorf("rm the copy: %v %+v", err, rm)
		}
	}
	report("restore in place", rs)
	report("  of which the agent's (duration_ms)", agentRs)
	report("  cp -a of the same tree (same tmpfs)", cps)
	ratio := float64(stats.Percentile(agentRs, 50)) / float64(stats.Percentile(cps, 50))
	res.Ops["restore/cp"] = map[string]float64{"p50": ratio}
	fmt.Printf("  %-34s %.2fx (goal <= 1.5x)\n", "agent's restore / cp -a, p50", ratio)

	// 3. from_checkpoint acquire -> first exec, from a full warm pool.
	var fc []time.Duration
	for range runs {
		if err := g.waitReady(ctx, warmPool, g.warm-1, o.wait); err != nil {
			return res, err
		}
		start := time.Now()
		sb, err := g.C.CreateSandbox(ctx, client.CreateSandboxRequest{FromCheckpoint: ck.ID})
		if err == nil {
			_, err = g.C.Exec(ctx, sb.ID, agentapi.ExecRequest{Command: "true"})
		}
		if err != nil {
			return res, fmt.Errorf("from_checkpoint: %w", err)
		}
		fc = append(fc, time.Since(start))
		if _, err := g.C.DeleteSandbox(ctx, sb.ID); err != nil {
			return res, err
		}
	}
	report("from_checkpoint acquire -> exec", fc)

	// 4. forks until every fork answered a command.
	counts := []int{8}
	if !big && o.bigForks > 8 {
		counts = append(counts, o.bigForks)
	}
	for _, n := range counts {
		var fs []time.Duration
		for range forkRunsFor(n, forkRuns) {
			d, err := g.fork(ctx, src.ID, n, func() error { return g.waitReady(ctx, warmPool, g.warm-1, o.wait) }, nil)
			if err != nil {
				return res, fmt.Errorf("fork x%d: %w", n, err)
			}
			fs = append(fs, d)
		}
		report(fmt.Sprintf("fork x%d -> all answered", n), fs)
	}

	// 5. baseline: cold start + upload -> first exec; and a cold start
	// alone -> first exec, what from_checkpoint's goal is measured against
	// (cold start + 100 ms), alternating.
	var base, cold []time.Duration
	for range forkRuns {
		for _, withFiles := range []bool{true, false} {
			if err := g.waitIdle(ctx, coldPool, o.wait); err != nil {
				return res, err
			}
			start := time.Now()
			sb, err := g.C.CreateSandbox(ctx, client.CreateSandboxRequest{Pool: coldPool})
			if err == nil && withFiles {
				err = upload(ctx, g.C, sb.ID, dir)
			}
			if err == nil {
				_, err = g.C.Exec(ctx, sb.ID, agentapi.ExecRequest{Command: "true"})
			}
			if err != nil {
				return res, fmt.Errorf("cold start (upload %v): %w", withFiles, err)
			}
			if withFiles {
				base = append(base, time.Since(start))
			} else {
				cold = append(cold, time.Since(start))
			}
			if _, err := g.C.DeleteSandbox(ctx, sb.ID); err != nil {
				return res, err
			}
		}
	}
	report("baseline: cold start + upload", base)
	report("cold start alone -> exec", cold)
	if err := g.C.DeleteCheckpoint(ctx, ck.ID); err != nil {
		return res, err
	}
	return res, measureCow(ctx, o, g, dir, counts, runs, forkRuns, report, &res)
}

// measureCow measures sandboxes made from a checkpoint on a copy-on-write
// layer (pool ckcow): from_checkpoint -> first exec, and forks until every
// fork answered, with the engine's disk that the layer and the forks'
// upper layers hold while the largest fork's sandboxes are alive.
func measureCow(ctx context.Context, o options, g *gateway, dir string, counts []int, runs, forkRuns int,
	report func(string, []time.Duration), res *result) error {
	fmt.Printf("  -- copy-on-write (pool %s: sandboxes start on the checkpoint's layer)\n", cowPool)
	idle := func() error { // the source alone, nothing starting or stopping
		return g.WaitPool(ctx, cowPool, o.wait, func(p client.Pool) bool {
			return p.Leased == 1 && p.Launching == 0 && p.Stopping == 0
		})
	}
	if err := g.waitReady(ctx, cowPool, 1, o.wait); err != nil {
		return err
	}
	src, err := g.C.CreateSandbox(ctx, client.CreateSandboxRequest{Pool: cowPool, LeaseSeconds: 3600})
	if err != nil {
		return err
	}
	defer func() { _, _ = g.C.DeleteSandbox(context.WithoutCancel(ctx), src.ID) }()
	if err := upload(ctx, g.C, src.ID, dir); err != nil {
		return fmt.Errorf("seed the copy-on-write source: %w", err)
	}
	ck, err := g.C.CreateCheckpoint(ctx, src.ID, client.CreateCheckpointRequest{})
	if err != nil {
		return err
	}
	var fc []time.Duration
	for range runs {
		if err := idle(); err != nil {
			return err
		}
		start := time.Now()
		sb, err := g.C.CreateSandbox(ctx, client.CreateSandboxRequest{Pool: cowPool, FromCheckpoint: ck.ID})
		if err == nil {
			_, err = g.C.Exec(ctx, sb.ID, agentapi.ExecRequest{Command: "true"})
		}
		if err != nil {
			return fmt.Errorf("from_checkpoint on a layer: %w", err)
		}
		fc = append(fc, time.Since(start))
		if _, err := g.C.DeleteSandbox(ctx, sb.ID); err != nil {
			return err
		}
	}
	report("cow: from_checkpoint -> exec", fc)
	if err := g.C.DeleteCheckpoint(ctx, ck.ID); err != nil {
		return err
	}
	if !slices.Contains(counts, o.bigForks) {
		counts = append(counts, o.bigForks)
	}
	for _, n := range counts {
		var fs []time.Duration
		var disk map[string]int64
		for range forkRunsFor(n, forkRuns) {
			d, err := g.fork(ctx, src.ID, n, idle, func() (err error) {
				disk, err = dockergw.VolumeBytes(ctx, g.cli, g.id)
				return err
			})
			if err != nil {
				return fmt.Errorf("cow fork x%d: %w", n, err)
			}
			fs = append(fs, d)
		}
		report(fmt.Sprintf("cow: fork x%d -> all answered", n), fs)
		res.Ops[fmt.Sprintf("cow: fork x%d disk MB", n)] = map[string]float64{"layer": mb(disk["layer"]), "uppers": mb(disk["upper"] + disk["work"])}
		fmt.Printf("  %-34s layer %.1f MB (%s), the %d forks' upper layers %.1f MB (disk) (du on the engine's volumes)\n",
			fmt.Sprintf("cow: fork x%d engine volumes", n), mb(disk["layer"]), layerMedium(), n, mb(disk["upper"]+disk["work"]))
	}
	return nil
}

func mb(n int64) float64 { return float64(n) / (1 << 20) }

// layerMedium is where the gateway it starts (which inherits this
// process's environment) keeps layers: QUARRY_DOCKER_LAYER_MEDIUM, or the
// provider's default.
func layerMedium() string {
	if m := os.Getenv("QUARRY_DOCKER_LAYER_MEDIUM"); m != "" {
		return m
	}
	return docker.DefaultLayerMedium
}

// forkRunsFor is how many runs a fork of n gets: the x64 fork refills 64 containers after
// each run, so it gets three.
func forkRunsFor(n, runs int) int {
	if n > 8 {
		return min(runs, 3)
	}
	return runs
}

// fork waits for a full warm pool, forks src n times and runs a command in every fork; it
// returns the time from the fork request to the last answer, and releases the forks.
//
// ready waits for the pool before the fork; alive, when set, runs while the
// forks are alive (after the last answer, before their release).
func (g *gateway) fork(ctx context.Context, src string, n int, ready func() error, alive func() error) (time.Duration, error) {
	if err := ready(); err != nil {
		return 0, err
	}
	start := time.Now()
	fr, err := g.C.ForkSandbox(ctx, src, client.ForkRequest{Count: n})
	if err != nil {
		return 0, err
	}
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for i, f := range fr.Forks {
		if f.Error != nil {
			errs = append(errs, fmt.Errorf("fork %d: %s", i, f.Error.Message))
			continue
		}
		wg.Add(1)
		go func(id string) {
			defer wg.Done()
			if _, err := g.C.Exec(ctx, id, agentapi.ExecRequest{Command: "true"}); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}(f.Sandbox.ID)
	}
	wg.Wait()
	took := time.Since(start)
	if alive != nil && len(errs) == 0 {
		errs = append(errs, alive())
	}
	for _, f := range fr.Forks {
		if f.Sandbox != nil {
			if _, err := g.C.DeleteSandbox(ctx, f.Sandbox.ID); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return took, errors.Join(errs...)
}

// vocabulary is what the generated files are made of: identifiers and punctuation, as in
// source code.
var vocabulary = []string{"func", "return", "if", "err", "!=", "nil", "{", "}", "(", ")", "ctx", "context.Context",
	"for", "range", "var", "const", "type", "struct", "string", "int64", "map", "[]byte", "fmt.Errorf", "%w",
	"client", "sandbox", "lease", "pool", "checkpoint", "archive", "restore", "store", ":=", "=", "&&", "||",
	"errors.Is", "time.Now()", "defer", "go", "select", "case", "<-", "chan", "make", "append", "len", "0", "1"}

// generate writes ws under dir (once): files in two directory levels, each a run of
// vocabulary words and random identifiers, deterministic by seed.
func generate(dir string, ws workspace) error {
	r := mrand.New(mrand.NewPCG(uint64(ws.Files), uint64(ws.Bytes)))
	per := ws.Bytes / int64(ws.Files)
	var buf bytes.Buffer
	for i := range ws.Files {
		p := filepath.Join(dir, fmt.Sprintf("d%02d", i%20), fmt.Sprintf("s%02d", (i/20)%10), fmt.Sprintf("f%04d.txt", i))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		buf.Reset()
		for int64(buf.Len()) < per {
			if r.IntN(8) == 0 {
				fmt.Fprintf(&buf, "id%x ", r.Uint32())
			} else {
				buf.WriteString(vocabulary[r.IntN(len(vocabulary))])
				buf.WriteByte(' ')
			}
			if r.IntN(12) == 0 {
				buf.WriteByte('\n')
			}
		}
		if err := os.WriteFile(p, buf.Bytes()[:per], 0o644); err != nil {
			return err
		}
	}
	return nil
}

// upload sends dir as a tar into the sandbox's work dir, streamed.
func upload(ctx context.Context, c *client.Client, id, dir string) error {
	pr, pw := io.Pipe()
	go func() {
		tw := tar.NewWriter(pw)
		err := tw.AddFS(os.DirFS(dir))
		if err == nil {
			err = tw.Close()
		}
		pw.CloseWithError(err)
	}()
	_, err := c.UploadArchive(ctx, id, ".", pr)
	_ = pr.Close()
	return err
}

// gateway is a bin/gateway process on the Docker provider; warm is its warm pool's size.
type gateway struct {
	*dockergw.Gateway
	warm int
	cli  *dockerclient.Client // the engine (its volumes' disk)
	id   string               // the gateway id
}

func startGateway(ctx context.Context, o options, bin, gwID, tmp string) (*gateway, error) {
	warm := max(o.bigForks, 8) + 2 // the forks, the source, one spare
	pools := fmt.Sprintf(`pools:
  - name: %s
    image: %s
    cpu: 1
    memory: 1Gi
    disk: 512Mi
    min_warm: %d
    max_total: %d
  - name: %s
    image: %s
    cpu: 1
    memory: 1Gi
    disk: 512Mi
    min_warm: 0
    max_total: 2
  - name: %s
    image: %s
    cpu: 1
    memory: 1Gi
    disk: 512Mi
    min_warm: 1
    max_total: %d
    options: {cow: always}
`, warmPool, o.image, warm, warm+2, coldPool, o.image, cowPool, o.image, warm+2)
	gw, err := dockergw.Start(dockergw.Options{Bin: bin, Dir: filepath.Join(tmp, "gateway"), Key: benchKey, GatewayID: gwID,
		Pools: pools, Env: []string{"QUARRY_CREATE_TIMEOUT=5m", "QUARRY_CHECKPOINT_COMPRESSION=" + o.level,
			"QUARRY_CHECKPOINT_COW_MIN_BYTES=1"}}) // every checkpoint; pool ck keeps the copy (its disk bound)
	if err != nil {
		return nil, err
	}
	g := &gateway{Gateway: gw, warm: warm}
	if err := g.waitReady(ctx, warmPool, warm, o.wait); err != nil {
		log := g.LogTail()
		g.Stop()
		return nil, fmt.Errorf("%w; gateway log:\n%s", err, log)
	}
	return g, nil
}

// waitReady waits until pool has n ready tasks and none launching or stopping.
func (g *gateway) waitReady(ctx context.Context, pool string, n int, limit time.Duration) error {
	return g.WaitPool(ctx, pool, limit, func(p client.Pool) bool {
		return p.Ready >= n && p.Launching == 0 && p.Stopping == 0
	})
}

// waitIdle waits until pool has nothing leased, launching or stopping.
func (g *gateway) waitIdle(ctx context.Context, pool string, limit time.Duration) error {
	return g.WaitPool(ctx, pool, limit, func(p client.Pool) bool {
		return p.Leased == 0 && p.Launching == 0 && p.Stopping == 0
	})
}

// summary is dockergw.Summary with the count.
func summary(ds []time.Duration) map[string]float64 {
	m := dockergw.Summary(ds)
	m["n"] = float64(len(ds))
	return m
}
