package scalebench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"strings"
	"time"

	"github.com/quarryhq/quarry/api"
	"github.com/quarryhq/quarry/bench/ddbsim"
	"github.com/quarryhq/quarry/bench/ecssim"
)

// Metric names read from the gateways.
const (
	reconcileMetric = "quarry_reconcile_pass_duration_seconds"
	storeMetric     = "quarry_dynamodb_requests_total"
)

// Store names what backs every run: the DynamoDB simulator.
const Store = "bench/ddbsim (a simulator of DynamoDB; simulated)"

// Result is one size's measurements. Every figure is simulated (the ECS
// API, the agents and DynamoDB are simulators) but the latencies, which
// are this machine's wall clock against those simulators.
type Result struct {
	N         int     `json:"n"`
	Replicas  int     `json:"replicas"`
	TimeScale float64 `json:"time_scale"`
	Store     string  `json:"store"`
	Simulated bool    `json:"simulated"`
	// GatewayEnv is what the run set besides the harness's settings.
	GatewayEnv []string `json:"gateway_env,omitempty"`
	Fill       Fill     `json:"fill"`
	// Acquire is N acquires at once; CreateAlive the same trainers to the
	// end of their first exec (ROCK's create → alive).
	Acquire     Latencies `json:"acquire"`
	CreateAlive Latencies `json:"create_alive"`
	Steady      Steady    `json:"steady"`
	// Probes are acquires one at a time with N leased.
	Probes    Latencies          `json:"probes_with_n_leased"`
	Memory    []Memory           `json:"memory"`
	Reconcile Histogram          `json:"reconcile_pass"`
	CPU       map[string]float64 `json:"machine_cpu_busy_percent"`
	Notes     []string           `json:"notes,omitempty"`
}

// Steady is the steady state with N leased and heartbeating, per
// simulated minute.
type Steady struct {
	WindowSimSeconds float64 `json:"window_simulated_seconds"`
	Leased           int     `json:"leased"`
	Heartbeats       int64   `json:"heartbeats"`
	HeartbeatErrors  int64   `json:"heartbeat_errors"`
	// StorePerMin counts ddbsim's requests by operation; ByCallerPerMin
	// the gateways' own count by the manager call they serve.
	StorePerMin         map[string]float64 `json:"store_calls_per_min_by_op"`
	StoreTotalPerMin    float64            `json:"store_calls_per_min"`
	ByCallerPerMin      map[string]float64 `json:"store_calls_per_min_by_caller"`
	NonHeartbeatPer10m  float64            `json:"non_heartbeat_calls_per_lease_per_10_min"`
	ECSPerMin           map[string]float64 `json:"ecs_calls_per_min_by_op"`
	ReadUnits           float64            `json:"read_units"`
	WriteUnits          float64            `json:"write_units"`
	CostPer10kSbxHours  float64            `json:"dynamodb_cost_usd_per_10k_sandbox_hours"`
	PricesPerMillionRRU float64            `json:"price_usd_per_million_read_units"`
	PricesPerMillionWRU float64            `json:"price_usd_per_million_write_units"`
	PriceDate           string             `json:"price_date"`
}

// Run measures every size of cfg in turn and reports as it goes; a size
// that fails to start is reported and the next one runs. It runs the
// fleet scenario: RunImages runs the images scenario.
func Run(ctx context.Context, cfg Config) ([]Result, error) {
	cfg, root, cleanup, logf, err := begin(cfg)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	if cfg.Images > 0 {
		return nil, errors.New("scalebench: Config.Images is set: RunImages runs the images scenario")
	}
	logf("fleet simulation (simulated: ECS, Fargate, the agents and DynamoDB are simulators): %d replicas, time scale %g, store %s, logs in %s",
		cfg.Replicas, cfg.TimeScale, Store, root)
	var results []Result
	for _, n := range cfg.Sizes {
		if ctx.Err() != nil {
			break
		}
		dir := fmt.Sprintf("%s/n%d", root, n)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return results, err
		}
		r, err := runSize(ctx, cfg, n, dir, logf)
		if err != nil {
			r.Notes = append(r.Notes, "run failed: "+err.Error())
			logf("N=%d: run failed: %s", n, err)
		}
		results = append(results, r)
		report(cfg.Log, []Result{r})
		if cfg.Out != "" {
			if err := writeJSON(cfg.Out, results); err != nil {
				return results, err
			}
		}
	}
	fmt.Fprintln(cfg.Log)
	rockTable(cfg.Log, results)
	return results, ctx.Err()
}

// RunImages runs the images scenario (Config.Images > 0) at every size of
// cfg in turn, both modes of each, and reports as it goes; a mode that
// fails is reported and the next one runs. Its error joins the modes'.
func RunImages(ctx context.Context, cfg Config) ([]ImagesResult, error) {
	cfg, root, cleanup, logf, err := begin(cfg)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	if cfg.Images < 1 {
		return nil, errors.New("scalebench: RunImages needs Config.Images, the number of distinct images")
	}
	logf("images scenario (simulated: ECS, Fargate, the registry, the agents and DynamoDB are simulators): %d replicas, time scale %g, store %s, logs in %s",
		cfg.Replicas, cfg.TimeScale, Store, root)
	var (
		results []ImagesResult
		errs    []error
	)
	for _, n := range cfg.Sizes {
		if ctx.Err() != nil {
			break
		}
		r, err := runImages(ctx, cfg, n, fmt.Sprintf("%s/images-n%d-m%d", root, n, cfg.Images), logf)
		if err != nil {
			errs = append(errs, fmt.Errorf("N=%d: %w", n, err))
		}
		results = append(results, r)
		reportImages(cfg.Log, r)
		if cfg.Out != "" {
			if err := writeJSON(cfg.Out, results); err != nil {
				return results, err
			}
		}
	}
	return results, errors.Join(append(errs, ctx.Err())...)
}

// begin is what every run starts with: cfg with its defaults, checked,
// the run's directory (a temp one unless Config.Dir, removed by cleanup
// unless Config.Keep) and a progress logger.
func begin(cfg Config) (Config, string, func(), func(string, ...any), error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return cfg, "", nil, nil, fmt.Errorf("scalebench: %w", err)
	}
	root, cleanup := cfg.Dir, func() {}
	if root == "" {
		d, err := os.MkdirTemp("", "scalebench-")
		if err != nil {
			return cfg, "", nil, nil, err
		}
		root = d
		if !cfg.Keep {
			cleanup = func() { os.RemoveAll(d) }
		}
	}
	logf := func(format string, args ...any) { fmt.Fprintf(cfg.Log, format+"\n", args...) }
	return cfg, root, cleanup, logf, nil
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// runSize builds the world for n, measures it and tears it down.
func runSize(ctx context.Context, cfg Config, n int, dir string, logf func(string, ...any)) (Result, error) {
	r := Result{N: n, Replicas: cfg.Replicas, TimeScale: cfg.TimeScale, Store: Store, Simulated: true, CPU: map[string]float64{},
		GatewayEnv: cfg.GatewayEnv}
	w, err := openWorld(ctx, cfg, n, dir, nil)
	if err != nil {
		return r, err
	}
	defer w.close()

	// 1. Fill: from the replicas' start to N ready (the floor counts the
	// probe pool's tasks too: they share the launch rate).
	floor := Floor(n + cfg.Probes)
	limit := cfg.wall(time.Duration(cfg.FillLimit * float64(floor)))
	logf("N=%d: filling (AWS floor %s simulated, giving up after %s simulated)", n, floor, cfg.sim(limit).Round(time.Second))
	c0 := readCPU()
	ready, took, lastErr := w.waitReady(ctx, poolName, n, limit, func(elapsed time.Duration, p api.Pool) {
		logf("  %s simulated: ready %d, launching %d (ecssim tasks: %v)", cfg.sim(elapsed).Round(time.Second), p.Ready, p.Launching, w.ecsStats().Tasks)
	})
	r.CPU["fill"] = busyPercent(c0, readCPU())
	r.Fill = Fill{Ready: ready, Complete: ready >= n, SimulatedSeconds: round(cfg.sim(took).Seconds()),
		FloorSeconds: floor.Seconds(), LastError: lastErr}
	r.Fill.RatioToFloor = round(r.Fill.SimulatedSeconds / r.Fill.FloorSeconds)
	if r.Fill.Complete {
		logf("N=%d: %d ready after %.1f s (simulated), %.2fx the AWS floor", n, ready, r.Fill.SimulatedSeconds, r.Fill.RatioToFloor)
	} else {
		logf("N=%d: %d of %d ready after %.1f s (simulated); the fill did not complete", n, ready, n, r.Fill.SimulatedSeconds)
		r.Notes = append(r.Notes, fmt.Sprintf("fill incomplete: %d of %d ready after %.0f s (simulated)", ready, n, r.Fill.SimulatedSeconds))
	}

	// 2. N acquires at once, each followed by one exec.
	c0 = readCPU()
	leases, acq, alive := w.acquireAll(ctx, n)
	r.CPU["acquire"] = busyPercent(c0, readCPU())
	r.Acquire, r.CreateAlive = acq, alive
	logf("N=%d: %d acquires at once: %d ok, p50 %.1f ms, p99 %.1f ms, errors %v; create→alive p50 %.1f ms p99 %.1f ms",
		n, n, acq.OK, acq.P50ms, acq.P99ms, acq.Errors, alive.P50ms, alive.P99ms)

	// 3. Steady state with the leases heartbeating.
	hctx, stopHB := context.WithCancel(ctx)
	period := cfg.wall(cfg.Heartbeat)
	sent, failed, waitHB := w.heartbeats(hctx, leases, period)
	defer func() { stopHB(); waitHB() }()
	time.Sleep(period) // one round of heartbeats before the window
	d0, err := w.ddbStats(ctx)
	if err != nil {
		return r, fmt.Errorf("read ddbsim's stats: %w", err)
	}
	e0, g0, s0, f0 := w.ecsStats(), w.counter(ctx, storeMetric, "caller"), sent.Load(), failed.Load()
	c0 = readCPU()
	window := cfg.wall(cfg.SteadyWindow)
	logf("N=%d: steady state with %d leased for %s simulated", n, len(leases), cfg.SteadyWindow)
	select {
	case <-ctx.Done():
		return r, ctx.Err()
	case <-time.After(window):
	}
	d1, err := w.ddbStats(ctx)
	if err != nil {
		return r, fmt.Errorf("read ddbsim's stats: %w", err)
	}
	e1, g1 := w.ecsStats(), w.counter(ctx, storeMetric, "caller")
	r.CPU["steady"] = busyPercent(c0, readCPU())
	r.Steady = steady(cfg, len(leases), d0, d1, e0, e1, g0, g1)
	r.Steady.Heartbeats, r.Steady.HeartbeatErrors = sent.Load()-s0, failed.Load()-f0

	// 4. Acquires one at a time with N leased, from the probe pool.
	probeReady, _, _ := w.waitReady(ctx, probePool, cfg.Probes, cfg.wall(Floor(cfg.Probes)*time.Duration(cfg.FillLimit)), nil)
	if probeReady < cfg.Probes {
		r.Notes = append(r.Notes, fmt.Sprintf("only %d of %d probe tasks were ready when the probes began", probeReady, cfg.Probes))
	}
	r.Probes = w.probes(ctx, cfg.Probes)
	logf("N=%d: %d acquires one at a time with %d leased: p50 %.1f ms, p99 %.1f ms, errors %v", n, cfg.Probes, len(leases), r.Probes.P50ms, r.Probes.P99ms, r.Probes.Errors)

	for _, g := range w.gws {
		r.Memory = append(r.Memory, memoryOf(g.pid))
	}
	r.Reconcile = w.histogram(ctx, reconcileMetric)
	if !r.Reconcile.Found {
		r.Notes = append(r.Notes, "the gateways export no "+reconcileMetric+": reconciler pass time not measured")
	}
	if st := w.ecsStats(); st.FailedToStart > 0 {
		r.Notes = append(r.Notes, fmt.Sprintf("ecssim: %d tasks failed to start (their agent did not come up)", st.FailedToStart))
	}
	return r, nil
}

// steady turns the counters at the window's ends into rates per
// simulated minute and the on-demand cost.
func steady(cfg Config, leased int, d0, d1 ddbsim.Stats, e0, e1 ecssim.Stats, g0, g1 map[string]float64) Steady {
	minutes := cfg.SteadyWindow.Minutes()
	s := Steady{WindowSimSeconds: cfg.SteadyWindow.Seconds(), Leased: leased,
		StorePerMin: map[string]float64{}, ByCallerPerMin: map[string]float64{}, ECSPerMin: map[string]float64{},
		PricesPerMillionRRU: PriceReadUnit * 1e6, PricesPerMillionWRU: PriceWriteUnit * 1e6, PriceDate: PriceDate}
	for op, v := range d1.Operations {
		if dv := float64(v.Requests - d0.Operations[op].Requests); dv > 0 {
			s.StorePerMin[op] = round(dv / minutes)
			s.StoreTotalPerMin += dv / minutes
		}
	}
	s.StoreTotalPerMin = round(s.StoreTotalPerMin)
	for op, v := range e1.Operations {
		if dv := float64(v.Requests - e0.Operations[op].Requests); dv > 0 {
			s.ECSPerMin[op] = round(dv / minutes)
		}
	}
	var other float64
	for caller, v := range g1 {
		dv := v - g0[caller]
		if dv <= 0 {
			continue
		}
		s.ByCallerPerMin[caller] = round(dv / minutes)
		if caller != "heartbeat" {
			other += dv
		}
	}
	if leased > 0 {
		s.NonHeartbeatPer10m = round(other / float64(leased) / (minutes / 10))
	}
	for t, v := range d1.ReadUnits {
		s.ReadUnits += v - d0.ReadUnits[t]
	}
	for t, v := range d1.WriteUnits {
		s.WriteUnits += v - d0.WriteUnits[t]
	}
	if leased > 0 {
		hours := float64(leased) * cfg.SteadyWindow.Hours()
		s.CostPer10kSbxHours = math.Round(1e4*(s.ReadUnits*PriceReadUnit+s.WriteUnits*PriceWriteUnit)/hours*1e4) / 1e4
	}
	return s
}

// counter sums a counter over the replicas by one label.
func (w *world) counter(ctx context.Context, metric, label string) map[string]float64 {
	out := map[string]float64{}
	w.scrape(ctx, metric, func(name string, v float64) { out[labelValue(name, label)] += v })
	return out
}

func round(f float64) float64 { return math.Round(f*100) / 100 }

// report prints each result, every simulated figure labelled.
func report(out interface{ Write([]byte) (int, error) }, rs []Result) {
	p := func(format string, args ...any) { fmt.Fprintf(out, format+"\n", args...) }
	for _, r := range rs {
		p("")
		p("== N = %d (simulated fleet: %d gateway replicas, time scale %g, store %s)", r.N, r.Replicas, r.TimeScale, r.Store)
		if len(r.GatewayEnv) > 0 {
			p("gateway settings besides the defaults: %s", strings.Join(r.GatewayEnv, " "))
		}
		if r.Fill.Complete {
			p("fill to %d ready:            %.1f s (simulated) = %.2fx the AWS floor of %.0f s", r.N, r.Fill.SimulatedSeconds, r.Fill.RatioToFloor, r.Fill.FloorSeconds)
		} else {
			p("fill to %d ready:            %d of %d ready after %.1f s (simulated; floor %.0f s)", r.N, r.Fill.Ready, r.N, r.Fill.SimulatedSeconds, r.Fill.FloorSeconds)
		}
		p("%d acquires at once:         %d ok, p50 %.1f ms, p99 %.1f ms, max %.1f ms, errors %v (wall clock against the simulators; %s)",
			r.N, r.Acquire.OK, r.Acquire.P50ms, r.Acquire.P99ms, r.Acquire.Max, r.Acquire.Errors, simTimes(r.Acquire, r.TimeScale))
		p("create→alive (acquire+exec): %d ok, p50 %.1f ms, p99 %.1f ms, errors %v (%s)", r.CreateAlive.OK, r.CreateAlive.P50ms, r.CreateAlive.P99ms, r.CreateAlive.Errors, simTimes(r.CreateAlive, r.TimeScale))
		p("acquires with %d leased:     %d ok, p50 %.1f ms, p99 %.1f ms, errors %v", r.Steady.Leased, r.Probes.OK, r.Probes.P50ms, r.Probes.P99ms, r.Probes.Errors)
		s := r.Steady
		p("steady state, %d leased (per simulated minute, simulated): store %.0f calls/min %v; by caller %v; ECS %v",
			s.Leased, s.StoreTotalPerMin, s.StorePerMin, s.ByCallerPerMin, s.ECSPerMin)
		p("  heartbeats %d (errors %d); store calls besides heartbeats: %.2f per lease per 10 min (simulated)", s.Heartbeats, s.HeartbeatErrors, s.NonHeartbeatPer10m)
		p("  DynamoDB on-demand: %.0f RRU + %.0f WRU in %.0f s = $%.4f per 10k sandbox-hours (simulated; $%.3f/M RRU, $%.3f/M WRU, us-east-1, prices of %s)",
			s.ReadUnits, s.WriteUnits, s.WindowSimSeconds, s.CostPer10kSbxHours, s.PricesPerMillionRRU, s.PricesPerMillionWRU, s.PriceDate)
		var mem []string
		for i, m := range r.Memory {
			mem = append(mem, fmt.Sprintf("replica %d: RSS %.0f MB (peak %.0f MB)", i, float64(m.RSSKiB)/1024, float64(m.PeakKiB)/1024))
		}
		p("gateway memory:              %s", strings.Join(mem, "; "))
		if r.Reconcile.Found {
			p("reconciler pass (wall):      %0.f passes, mean %.3f s, p50 ≤ %g s, p99 ≤ %g s", r.Reconcile.Count, r.Reconcile.MeanS, r.Reconcile.P50S, r.Reconcile.P99S)
		} else {
			p("reconciler pass:             not measured (no %s)", r.Reconcile.Metric)
		}
		p("machine CPU busy:            %s", cpuLine(r.CPU))
		for _, note := range r.Notes {
			p("note: %s", note)
		}
	}
}

// simTimes renders a latency's p50/p99 as simulated time (wall ÷ s): the
// reading that applies when the calls waited on the simulated world (cold
// starts, throttled launches) rather than on this machine.
func simTimes(l Latencies, s float64) string {
	return fmt.Sprintf("as simulated time: p50 %.1f s, p99 %.1f s", l.P50ms/1000/s, l.P99ms/1000/s)
}

// rockTable prints ROCK's table: concurrency → create→alive p50/p99.
func rockTable(out interface{ Write([]byte) (int, error) }, rs []Result) {
	fmt.Fprintln(out, "| concurrency | create→alive p50 | create→alive p99 | p50 / p99 as simulated time | errors | fill vs AWS floor (simulated) |")
	fmt.Fprintln(out, "|---:|---:|---:|---:|---:|---:|")
	for _, r := range rs {
		errs := 0
		for _, n := range r.CreateAlive.Errors {
			errs += n
		}
		for _, n := range r.Acquire.Errors {
			errs += n
		}
		fill := fmt.Sprintf("%.2fx", r.Fill.RatioToFloor)
		if !r.Fill.Complete {
			fill = fmt.Sprintf("%d of %d ready after %.0f s", r.Fill.Ready, r.N, r.Fill.SimulatedSeconds)
		}
		fmt.Fprintf(out, "| %d | %.2f s | %.2f s | %.1f s / %.1f s | %d | %s |\n", r.N, r.CreateAlive.P50ms/1000, r.CreateAlive.P99ms/1000,
			r.CreateAlive.P50ms/1000/r.TimeScale, r.CreateAlive.P99ms/1000/r.TimeScale, errs, fill)
	}
	fmt.Fprintln(out, "(fleet simulation: simulated ECS, Fargate, agents and DynamoDB; real gateways; create→alive is wall clock on this machine)")
}
