package main

// Suite "fleet" (issue 13, "How to show it", part 2): real sandboxes on this
// machine. One real gateway (process provider, embedded store) and N real
// agents: a warm run (the pool filled to N first, the fill timed, then N
// trainers at once) and a cold run (N trainers at once against a pool of
// min_warm 32), each trainer acquiring a sandbox, running one command in a
// session and releasing it; then the Docker provider as far as one host
// allows. docs/BENCHMARKS.md ("Real sandboxes on one machine") explains
// each number.

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/quarryhq/quarry/internal/stats"
)

type fleetOptions struct {
	n           int
	coldWarm    int
	agentMB     int
	dockerMax   int
	dockerTime  time.Duration
	dockerImage string
}

func (f *fleetOptions) flags() {
	flag.IntVar(&f.n, "fleet-n", 1000, "suite fleet: sandboxes (and trainers at once); 0 runs Docker only")
	flag.IntVar(&f.coldWarm, "fleet-cold-warm", 32, "suite fleet: the cold run's min_warm")
	flag.IntVar(&f.agentMB, "fleet-agent-mb", 12, "suite fleet: memory one agent needs (MB); the suite refuses to start when MemAvailable cannot hold n of them")
	flag.IntVar(&f.dockerMax, "docker-max", 1100, "suite fleet: Docker sandboxes to try (0: skip Docker); one bridge holds about 1,023")
	flag.DurationVar(&f.dockerTime, "docker-time", 5*time.Minute, "suite fleet: how long the Docker fill may take")
	flag.StringVar(&f.dockerImage, "docker-image", "quarry-test/busybox:latest", "suite fleet: the Docker sandboxes' image")
}

// fleetSuite runs the warm and cold runs of N process sandboxes, then
// Docker.
func (b *bench) fleetSuite(ctx context.Context, gatewayBin, agentBin string) error {
	o := b.o.fleet
	if avail := memAvailableMB(); avail < o.n*o.agentMB {
		return fmt.Errorf("suite fleet: MemAvailable is %d MB; %d agents need about %d MB (-fleet-agent-mb)", avail, o.n, o.n*o.agentMB)
	}
	// Every trainer has its own connection, as 1,000 trainer processes would.
	hc := &http.Client{Timeout: 5 * time.Minute, Transport: &http.Transport{
		MaxIdleConns: 2 * o.n, MaxIdleConnsPerHost: 2 * o.n, IdleConnTimeout: time.Minute,
	}}
	defer hc.CloseIdleConnections()

	runs := []struct {
		name    string
		minWarm int
	}{{"warm", o.n}, {"cold", o.coldWarm}}
	if o.n == 0 {
		runs = nil
	}
	for _, run := range runs {
		dataDir := filepath.Join(b.tmp, "fleet-"+run.name)
		pools := fmt.Sprintf("pools:\n  - name: fleet\n    provider: process\n    image: host\n    min_warm: %d\n    max_total: %d\n", run.minWarm, o.n+run.minWarm)
		g, err := b.launchGateway(gatewaySpec{bin: gatewayBin, agentBin: agentBin, name: "fleet-" + run.name, dataDir: dataDir, pools: pools})
		if err != nil {
			return err
		}
		start := time.Now()
		if err := g.waitReadyWithin(ctx, hc, "fleet", run.minWarm, 10*time.Minute); err != nil {
			b.stopGateway(g, dataDir)
			return err
		}
		fill := time.Since(start)
		if run.name == "warm" {
			b.record(fmt.Sprintf("fleet: fill of %d process sandboxes", o.n), "real agents on this machine; from the gateway's start",
				"s", fill.Seconds(), "per_s", float64(o.n)/fill.Seconds())
		}
		cpu0 := cpuByComponentIn(g.pid, dataDir)
		t0 := time.Now()
		res := g.trainers(ctx, hc, "fleet", o.n)
		wall := time.Since(t0)
		cpu1 := cpuByComponentIn(g.pid, dataDir)
		peak, _ := statusKB(g.pid, "VmHWM")
		rss, _ := statusKB(g.pid, "VmRSS")
		note := "1,000 warm at once: goal p99 <= 500 ms"
		if run.name == "cold" {
			note = fmt.Sprintf("min_warm %d; goal p99 <= 10 s, none lost", run.minWarm)
		}
		b.record(fmt.Sprintf("fleet %s: %d acquires at once", run.name, o.n), note,
			"ok", len(res.acquire), "lost", o.n-len(res.released), "p50_ms", ms(stats.Percentile(res.acquire, 50)),
			"p99_ms", ms(stats.Percentile(res.acquire, 99)), "max_ms", ms(stats.Percentile(res.acquire, 100)), "wall_s", wall.Seconds())
		b.record(fmt.Sprintf("fleet %s: session run in each", run.name), "one command ('true') in a new session",
			"ok", len(res.run), "p50_ms", ms(stats.Percentile(res.run, 50)), "p99_ms", ms(stats.Percentile(res.run, 99)))
		b.record(fmt.Sprintf("fleet %s: gateway memory", run.name), "process provider, embedded store",
			"rss_MB", float64(rss)/1024, "peak_MB", float64(peak)/1024)
		b.record(fmt.Sprintf("fleet %s: release", run.name), "DELETE /v1/sandboxes/{id} after the session (the task is stopped)",
			"ok", len(res.release), "p50_ms", ms(stats.Percentile(res.release, 50)), "p99_ms", ms(stats.Percentile(res.release, 99)))
		b.record(fmt.Sprintf("fleet %s: CPU during the trainers", run.name), "seconds of CPU over the run (agents come and go, so they are not summed)",
			"gateway_s", float64(cpu1["gateway"]-cpu0["gateway"])/1e6, "client_s", float64(cpu1["client"]-cpu0["client"])/1e6)
		if len(res.errors) > 0 {
			b.record(fmt.Sprintf("fleet %s: errors", run.name), res.errorText())
		}
		b.stopGateway(g, dataDir)
	}
	if o.dockerMax > 0 {
		return b.dockerFleet(ctx, gatewayBin, agentBin, hc)
	}
	return nil
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

// fleetResult is what n trainers saw.
type fleetResult struct {
	acquire, run, release []time.Duration
	released              []string
	errors                map[string]int
}

func (r fleetResult) errorText() string {
	keys := make([]string, 0, len(r.errors))
	for k := range r.errors {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%d× %s", r.errors[k], k))
	}
	return strings.Join(parts, "; ")
}

// trainers runs n trainers at once: each acquires a sandbox from pool,
// opens a session, runs one command in it and releases the sandbox.
func (g *gateway) trainers(ctx context.Context, hc *http.Client, pool string, n int) fleetResult {
	res := fleetResult{errors: map[string]int{}}
	var mu sync.Mutex
	fail := func(stage string, err error) {
		mu.Lock()
		res.errors[stage+": "+errText(err)]++
		mu.Unlock()
	}
	var wg sync.WaitGroup
	startLine := make(chan struct{})
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-startLine
			t0 := time.Now()
			id, err := g.createSandboxIn(ctx, hc, pool)
			if err != nil {
				fail("acquire", err)
				return
			}
			acq := time.Since(t0)
			s, err := g.newSession(ctx, hc, id)
			var run time.Duration
			if err == nil {
				t1 := time.Now()
				if err = s.run(ctx, hc, "true"); err == nil {
					run = time.Since(t1)
				}
			}
			if err != nil {
				fail("session", err)
			}
			t2 := time.Now()
			rerr := g.release(ctx, hc, id)
			rel := time.Since(t2)
			if rerr != nil {
				fail("release", rerr)
			}
			mu.Lock()
			if rerr == nil {
				res.release = append(res.release, rel)
			}
			res.acquire = append(res.acquire, acq)
			if run > 0 {
				res.run = append(res.run, run)
			}
			res.released = append(res.released, id)
			mu.Unlock()
		}()
	}
	close(startLine)
	wg.Wait()
	return res
}

// errText shortens an error to its status and code for the counts.
func errText(err error) string {
	s := err.Error()
	if i := strings.Index(s, `"code":"`); i >= 0 {
		code, _, _ := strings.Cut(s[i+8:], `"`)
		if j := strings.Index(s, ": "); j >= 0 && j+5 <= len(s) {
			return s[j+2:j+5] + " " + code
		}
		return code
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return "client deadline"
	}
	if len(s) > 120 {
		s = s[:120]
	}
	return s
}

// dockerFleet fills a Docker pool of -docker-max sandboxes for at most
// -docker-time and reports how far it got and what stopped it.
func (b *bench) dockerFleet(ctx context.Context, gatewayBin, agentBin string, hc *http.Client) error {
	o := b.o.fleet
	gwID := fmt.Sprintf("quarrybench-fleet-%d", os.Getpid())
	dataDir := filepath.Join(b.tmp, "fleet-docker")
	pools := fmt.Sprintf("pools:\n  - name: fleet\n    provider: docker\n    image: %s\n    cpu: 0.25\n    memory: 64Mi\n    min_warm: %d\n    max_total: %d\n",
		o.dockerImage, o.dockerMax, o.dockerMax)
	g, err := b.launchGateway(gatewaySpec{bin: gatewayBin, agentBin: agentBin, name: "fleet-docker", dataDir: dataDir, pools: pools,
		env: []string{"QUARRY_PROVIDER=docker", "QUARRY_GATEWAY_ID=" + gwID}})
	if err != nil {
		return err
	}
	defer removeContainers(gwID)
	defer b.stopGateway(g, dataDir)
	mem0 := memAvailableMB()
	start := time.Now()
	best, bestAt, why, maxPorts := 0, time.Duration(0), "", 0
	for {
		maxPorts = max(maxPorts, bridgePorts())
		var ps struct {
			Pools []struct {
				Name      string `json:"name"`
				Ready     int    `json:"ready"`
				Launching int    `json:"launching"`
			} `json:"pools"`
		}
		if err := g.call(ctx, hc, http.MethodGet, "/v1/pools", nil, &ps); err == nil {
			for _, p := range ps.Pools {
				if p.Name == "fleet" && p.Ready > best {
					best, bestAt = p.Ready, time.Since(start)
				}
			}
		}
		switch {
		case best >= o.dockerMax:
			why = "every sandbox asked for is ready"
		case time.Since(start) > o.dockerTime:
			why = fmt.Sprintf("the time limit (-docker-time %s)", o.dockerTime)
		case best > 0 && time.Since(start)-bestAt > 3*time.Minute:
			why = "no sandbox became ready for 3 minutes"
		case memAvailableMB() < 2048:
			why = "MemAvailable fell below 2 GB (the suite's guard)"
		case ctx.Err() != nil:
			return ctx.Err()
		}
		if why != "" {
			break
		}
		time.Sleep(2 * time.Second)
	}
	elapsed := time.Since(start)
	perSbx := 0.0
	if best > 0 {
		perSbx = float64(mem0-memAvailableMB()) / float64(best)
	}
	b.record(fmt.Sprintf("fleet docker: ready of %d asked", o.dockerMax), "stopped by: "+why+"; "+lastLaunchError(filepath.Join(b.tmp, "fleet-docker.log")),
		"ready", best, "s", elapsed.Seconds(), "per_s", float64(best)/max(bestAt.Seconds(), 0.001), "host_MB_per_sandbox", perSbx,
		"bridge_ports", bridgePorts(), "bridge_ports_max", maxPorts)
	return nil
}

// lastLaunchError returns the last launch failure a gateway logged, or "no
// launch failure logged".
func lastLaunchError(logFile string) string {
	f, err := os.Open(logFile)
	if err != nil {
		return "no gateway log"
	}
	defer f.Close()
	last := ""
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 1<<20), 1<<20)
	for s.Scan() {
		if line := s.Text(); strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") {
			last = line
		}
	}
	if last == "" {
		return "no launch failure logged"
	}
	if len(last) > 300 {
		last = last[:300]
	}
	return "last warning: " + last
}

// bridgePorts counts the ports of the docker0 bridge (one per container
// on the default network), or -1.
func bridgePorts() int {
	entries, err := os.ReadDir("/sys/class/net/docker0/brif")
	if err != nil {
		return -1
	}
	return len(entries)
}

// removeContainers removes every container the gateway id labelled.
func removeContainers(gwID string) {
	out, err := exec.Command("docker", "ps", "-aq", "--filter", "label=quarry.gateway="+gwID).Output()
	if err != nil {
		return
	}
	ids := strings.Fields(string(out))
	for len(ids) > 0 {
		n := min(len(ids), 100)
		_ = exec.Command("docker", append([]string{"rm", "-f"}, ids[:n]...)...).Run()
		ids = ids[n:]
	}
}

// memAvailableMB returns the machine's MemAvailable in MB (0 when unknown).
func memAvailableMB() int {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "MemAvailable:"); ok {
			kb, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			return kb / 1024
		}
	}
	return 0
}
