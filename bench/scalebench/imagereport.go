package scalebench

import (
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/quarryhq/quarry/bench/ddbsim"
	"github.com/quarryhq/quarry/bench/ecssim"
)

// ImagesResult is one size of the images scenario: the batch, its floor
// and both modes. Every figure is simulated (ECS, Fargate, the registry,
// the agents and DynamoDB are simulators; image sizes and the pull rate
// are assumed) but the wall-clock latencies, which are this machine's
// against those simulators.
type ImagesResult struct {
	N         int     `json:"n"`
	M         int     `json:"images"`
	Replicas  int     `json:"replicas"`
	TimeScale float64 `json:"time_scale"`
	Store     string  `json:"store"`
	Simulated bool    `json:"simulated"`
	// PullRate is the assumed pull rate (bytes per simulated second);
	// ImageBytes the batch's assumed image sizes.
	PullRate   float64 `json:"pull_rate_bytes_per_simulated_second"`
	ImageBytes struct {
		Min  int64 `json:"min"`
		Max  int64 `json:"max"`
		Mean int64 `json:"mean"`
	} `json:"image_bytes_assumed"`
	ClassWarmMax int        `json:"class_warm_max"`
	IdleSeconds  int        `json:"class_idle_seconds"`
	PrefetchWarm int        `json:"prefetch_warm"`
	GatewayEnv   []string   `json:"gateway_env,omitempty"`
	Floor        ImageFloor `json:"aws_floor"`
	Modes        []ModeResult
	// WallSeconds is how long both modes took on this machine.
	WallSeconds float64  `json:"wall_seconds"`
	Notes       []string `json:"notes,omitempty"`
}

// ModeResult is one mode's batch.
type ModeResult struct {
	Mode     string         `json:"mode"`
	Prefetch *PrefetchPhase `json:"prefetch,omitempty"`
	// BatchSimSeconds runs from the batch's start (the prefetch's in the
	// prefetch mode) to the last command's end; CreatesSimSeconds from the
	// creates' start. Each against its floor: the batch's
	// (ImageFloor.Batch), this mode's (Batch, or Prefetched: the prefetch
	// then the creates) and the creates' (ImageFloor.Creates).
	// Complete is whether every sandbox ran its command; EndedSimSeconds
	// when the last trainer was done (ran its command or gave up).
	Complete          bool    `json:"complete"`
	EndedSimSeconds   float64 `json:"ended_simulated_seconds"`
	BatchSimSeconds   float64 `json:"batch_simulated_seconds"`
	BatchFloor        float64 `json:"batch_floor_seconds"`
	BatchRatio        float64 `json:"batch_ratio_to_floor"`
	ModeFloor         float64 `json:"mode_floor_seconds"`
	ModeRatio         float64 `json:"mode_ratio_to_floor"`
	CreatesSimSeconds float64 `json:"creates_simulated_seconds"`
	CreatesFloor      float64 `json:"creates_floor_seconds"`
	CreatesRatio      float64 `json:"creates_ratio_to_floor"`
	// FirstCommand is each sandbox's time from its first create to its
	// command's end (wall; ÷ the time scale for simulated time); its
	// errors are the sandboxes lost, by why. CreateOK and Exec are the
	// successful calls' own latencies and every failed attempt by kind.
	FirstCommand Latencies `json:"time_to_first_command"`
	CreateOK     Latencies `json:"create_calls"`
	Exec         Latencies `json:"exec_calls"`
	// Retries counts the creates retried, by the answer that was retried.
	Retries       map[string]int `json:"create_retries,omitempty"`
	Lost          int            `json:"lost"`
	LostBy        map[string]int `json:"lost_by,omitempty"`
	ReleaseErrors int            `json:"release_errors"`
	// ECS, from the gateways' start to the batch's end (ecssim's counts):
	// task definitions registered (revisions), RegisterTaskDefinition
	// calls and the throttled ones, DescribeTaskDefinition calls, every
	// operation's calls, the refusals by limit, and tasks launched.
	Registrations       int              `json:"task_definitions_registered"`
	RegistrationsPerImg float64          `json:"task_definitions_per_image"`
	RegisterCalls       int64            `json:"register_calls"`
	RegisterThrottled   int64            `json:"register_throttled"`
	DescribeTDCalls     int64            `json:"describe_task_definition_calls"`
	ECSCalls            map[string]int64 `json:"ecs_calls"`
	RefusedCallRate     int64            `json:"refused_run_task_call_rate"`
	RefusedLaunchRate   int64            `json:"refused_launch_rate"`
	TasksLaunched       int64            `json:"tasks_launched"`
	TasksPerSandbox     float64          `json:"tasks_per_sandbox"`
	FailedToStart       int64            `json:"tasks_failed_to_start"`
	// The store (ddbsim's counts): calls during the prefetch (per image)
	// and during the creates (per sandbox), by operation, and throttles;
	// ByCaller is the gateways' own count by the manager call served.
	PrefetchStoreCalls   int64              `json:"prefetch_store_calls"`
	PrefetchStorePerImg  float64            `json:"prefetch_store_calls_per_image"`
	BatchStoreCalls      int64              `json:"batch_store_calls"`
	BatchStorePerSandbox float64            `json:"batch_store_calls_per_sandbox"`
	BatchStoreByOp       map[string]int64   `json:"batch_store_calls_by_op"`
	BatchStoreErrors     map[string]int64   `json:"batch_store_errors_by_op,omitempty"`
	StoreThrottled       int64              `json:"store_throttled"`
	ByCaller             map[string]float64 `json:"store_calls_by_caller"`
	// Prepare is the gateways' image preparations (wall);
	// PoolsEnded their count of pools ended, by reason; PrefetchRefused
	// images a full prefetch queue refused.
	// Acquires and RefillBlocked are the gateways' acquires by outcome and
	// refills held by reason (quarry_acquires_total,
	// quarry_refill_blocked_total) by the batch's end.
	Acquires      map[string]float64 `json:"acquires_by_outcome,omitempty"`
	RefillBlocked map[string]float64 `json:"refill_blocked_by_reason,omitempty"`
	// OrphanStops is the orphan sweep's stops (quarry_orphan_tasks_stopped_total)
	// by the batch's end.
	OrphanStops     float64            `json:"orphan_stops"`
	Prepare         Histogram          `json:"image_prepare"`
	PoolsEnded      map[string]float64 `json:"pools_ended_by_how,omitempty"`
	PrefetchRefused float64            `json:"prefetch_refused"`
	End             EndPhase           `json:"after_the_batch"`
	Memory          []Memory           `json:"memory"`
	CPU             map[string]float64 `json:"machine_cpu_busy_percent"`
	WallSeconds     float64            `json:"wall_seconds"`
	Notes           []string           `json:"notes,omitempty"`
}

// PrefetchPhase is the prefetch mode's announcement and wait.
type PrefetchPhase struct {
	// Calls are the POST /v1/images/prefetch calls (wall); States the
	// images by the state their answer gave.
	Calls  Latencies      `json:"calls"`
	States map[string]int `json:"states"`
	// Ready, Failed: the images GET /v1/images showed so at the end of the
	// wait; Ended those whose pool had ended meanwhile (idle) and
	// PoolsEndedIdle the gateways' count of them.
	Ready          int     `json:"ready"`
	Failed         int     `json:"failed"`
	Ended          int     `json:"ended"`
	PoolsEndedIdle float64 `json:"pools_ended_idle"`
	Complete       bool    `json:"complete"`
	// ReadySimSeconds is the wait from the first call (simulated), against
	// the registrations' floor.
	ReadySimSeconds float64 `json:"ready_simulated_seconds"`
	RegisterFloor   float64 `json:"register_floor_seconds"`
	Ratio           float64 `json:"ratio_to_floor"`
	// Walks are the walks of every page of GET /v1/images (wall).
	Walks Latencies `json:"images_walks"`
}

// EndPhase is the wait after the batch for the pools to end.
type EndPhase struct {
	LimitSimSeconds  float64 `json:"limit_simulated_seconds"`
	WaitedSimSeconds float64 `json:"waited_simulated_seconds"`
	PoolsEnded       int     `json:"pools_ended"`
	PoolsActive      int     `json:"pools_active"`
	TasksLive        int     `json:"ecs_tasks_not_stopped"`
	Complete         bool    `json:"complete"`
	// StorePerMin is the store's calls per simulated minute meanwhile;
	// OrphanStops the orphan sweep's stops and StopTaskCalls ECS's
	// StopTask calls meanwhile.
	StorePerMin   float64 `json:"store_calls_per_simulated_minute"`
	OrphanStops   float64 `json:"orphan_stops"`
	StopTaskCalls int64   `json:"stop_task_calls"`
}

// account fills m's ECS and store counts from the simulators' counters at
// the gateways' start (0), the prefetch's end (d1) and the batch's end (2).
func (m *ModeResult) account(n, images int, e0, e2 ecssim.Stats, d0, d1, d2 ddbsim.Stats) {
	op := func(a, b ecssim.Stats, name string) ecssim.OpStats {
		return ecssim.OpStats{Requests: b.Operations[name].Requests - a.Operations[name].Requests,
			Throttled: b.Operations[name].Throttled - a.Operations[name].Throttled}
	}
	m.Registrations = e2.TaskDefinitions - e0.TaskDefinitions
	m.RegistrationsPerImg = ratio(float64(m.Registrations), float64(images))
	reg := op(e0, e2, "RegisterTaskDefinition")
	m.RegisterCalls, m.RegisterThrottled = reg.Requests, reg.Throttled
	m.DescribeTDCalls = op(e0, e2, "DescribeTaskDefinition").Requests
	m.ECSCalls = map[string]int64{}
	for name := range e2.Operations {
		if v := op(e0, e2, name).Requests; v > 0 {
			m.ECSCalls[name] = v
		}
	}
	m.RefusedCallRate = e2.RefusedCallRate - e0.RefusedCallRate
	m.RefusedLaunchRate = e2.RefusedLaunchRate - e0.RefusedLaunchRate
	m.TasksLaunched = e2.Launched - e0.Launched
	m.TasksPerSandbox = ratio(float64(m.TasksLaunched), float64(n))
	m.FailedToStart = e2.FailedToStart - e0.FailedToStart
	m.PrefetchStoreCalls = storeRequests(d1) - storeRequests(d0)
	m.PrefetchStorePerImg = ratio(float64(m.PrefetchStoreCalls), float64(images))
	m.BatchStoreCalls = storeRequests(d2) - storeRequests(d1)
	m.BatchStorePerSandbox = ratio(float64(m.BatchStoreCalls), float64(n))
	m.BatchStoreByOp = map[string]int64{}
	for name, v := range d2.Operations {
		if dv := v.Requests - d1.Operations[name].Requests; dv > 0 {
			m.BatchStoreByOp[name] = dv
		}
		if dv := v.Errors - d1.Operations[name].Errors; dv > 0 {
			if m.BatchStoreErrors == nil {
				m.BatchStoreErrors = map[string]int64{}
			}
			m.BatchStoreErrors[name] = dv
		}
		m.StoreThrottled += v.Throttled - d0.Operations[name].Throttled
	}
}

// reportImages prints one size of the images scenario, every simulated
// figure labelled, the two modes side by side.
func reportImages(out io.Writer, r ImagesResult) {
	p := func(format string, args ...any) { fmt.Fprintf(out, format+"\n", args...) }
	gib := func(b int64) string { return fmt.Sprintf("%.2f GiB", float64(b)/(1<<30)) }
	f := r.Floor
	p("")
	p("== images: N = %d sandboxes over M = %d images (simulated fleet: %d gateway replicas, time scale %g, store %s)",
		r.N, r.M, r.Replicas, r.TimeScale, r.Store)
	if len(r.GatewayEnv) > 0 {
		p("gateway settings besides the defaults: %s", strings.Join(r.GatewayEnv, " "))
	}
	p("images (assumed): %s to %s (mean %s), each pulled whole by each task at %.0f MiB/s (assumed; simulated pulls)",
		gib(r.ImageBytes.Min), gib(r.ImageBytes.Max), gib(r.ImageBytes.Mean), r.PullRate/(1<<20))
	p("class %q: max_total %d, images \"*\", warm_max %d, idle_seconds %d (simulated); prefetch warm %d",
		imageClass, r.N, r.ClassWarmMax, r.IdleSeconds, r.PrefetchWarm)
	p("AWS floor (simulated): registrations (M − 20) / 1/s = %.0f s; launches (N − 100) / 20/s = %.0f s; slowest start 90 s + largest pull = %.0f s",
		f.Register, f.Launch, f.Start)
	p("  batch max(registrations, launches) + start = %.0f s; creates alone = %.0f s; prefetch then creates = %.0f s", f.Batch, f.Creates, f.Prefetched)
	p("")
	byMode := map[string]*ModeResult{}
	for i := range r.Modes {
		byMode[r.Modes[i].Mode] = &r.Modes[i]
	}
	modes := []string{ModeNoPrefetch, ModePrefetch}
	p("| simulated unless marked | %s | %s |", modes[0], modes[1])
	p("|---|---|---|")
	row := func(label string, cell func(m *ModeResult) string) {
		cells := make([]string, len(modes))
		for i, name := range modes {
			cells[i] = "—"
			if m := byMode[name]; m != nil {
				if c := cell(m); c != "" {
					cells[i] = c
				}
			}
		}
		p("| %s | %s |", label, strings.Join(cells, " | "))
	}
	sim := func(ms float64) float64 { return ms / 1000 / r.TimeScale }
	row("prefetch: images ready (GET /v1/images)", func(m *ModeResult) string {
		if m.Prefetch == nil {
			return ""
		}
		ph := m.Prefetch
		vs := "the registrations' floor is 0 s (within the burst)"
		if ph.RegisterFloor > 0 {
			vs = fmt.Sprintf("%.2fx the registrations' floor (%.0f s)", ph.Ratio, ph.RegisterFloor)
		}
		return fmt.Sprintf("%d of %d after %.0f s; %s; %d failed; %d pools ended idle while waiting",
			ph.Ready, r.M, ph.ReadySimSeconds, vs, ph.Failed, int(ph.PoolsEndedIdle))
	})
	row("whole batch (start → last command)", func(m *ModeResult) string {
		if !m.Complete {
			return fmt.Sprintf("**incomplete**: %d of %d ran, the last at %.0f s; the rest gave up by %.0f s (%.2fx the batch's floor of %.0f s)",
				m.FirstCommand.OK, r.N, m.BatchSimSeconds, m.EndedSimSeconds, ratio(m.EndedSimSeconds, m.BatchFloor), m.BatchFloor)
		}
		s := fmt.Sprintf("%.0f s = **%.2fx** the batch's floor (%.0f s)", m.BatchSimSeconds, m.BatchRatio, m.BatchFloor)
		if m.ModeFloor != m.BatchFloor {
			s += fmt.Sprintf("; %.2fx this mode's floor (prefetch then creates, %.0f s)", m.ModeRatio, m.ModeFloor)
		}
		return s
	})
	row("creates (first create → last command)", func(m *ModeResult) string {
		if !m.Complete {
			return fmt.Sprintf("incomplete (the creates' floor: %.0f s)", m.CreatesFloor)
		}
		return fmt.Sprintf("%.0f s = %.2fx the creates' floor (%.0f s)", m.CreatesSimSeconds, m.CreatesRatio, m.CreatesFloor)
	})
	row("time to first command p50 / p99", func(m *ModeResult) string {
		return fmt.Sprintf("%.0f s / %.0f s", sim(m.FirstCommand.P50ms), sim(m.FirstCommand.P99ms))
	})
	row("the same, wall clock on this machine", func(m *ModeResult) string {
		return fmt.Sprintf("%.1f s / %.1f s", m.FirstCommand.P50ms/1000, m.FirstCommand.P99ms/1000)
	})
	row("sandboxes lost (goal 0)", func(m *ModeResult) string {
		return fmt.Sprintf("**%d** of %d %s", m.Lost, r.N, kinds(m.LostBy))
	})
	row("creates retried (by answer)", func(m *ModeResult) string { return fmt.Sprintf("%d %s", total(m.Retries), kinds(m.Retries)) })
	row("task definitions per image (goal 1)", func(m *ModeResult) string {
		return fmt.Sprintf("**%.2f** (%d registered; %d RegisterTaskDefinition calls, %d throttled)", m.RegistrationsPerImg, m.Registrations, m.RegisterCalls, m.RegisterThrottled)
	})
	row("other throttles (ECS: RunTask calls, launches; DynamoDB)", func(m *ModeResult) string {
		return fmt.Sprintf("%d, %d; %d", m.RefusedCallRate, m.RefusedLaunchRate, m.StoreThrottled)
	})
	row("ECS tasks launched per sandbox", func(m *ModeResult) string {
		return fmt.Sprintf("%.2f (%d; %d failed to start)", m.TasksPerSandbox, m.TasksLaunched, m.FailedToStart)
	})
	row("ECS calls", func(m *ModeResult) string { return kindsInt(m.ECSCalls) })
	row("store calls: prefetch per image; creates per sandbox", func(m *ModeResult) string {
		return fmt.Sprintf("%.1f; %.1f %s", m.PrefetchStorePerImg, m.BatchStorePerSandbox, kindsInt(m.BatchStoreByOp))
	})
	row("store errors in the creates (by operation)", func(m *ModeResult) string { return kindsInt(m.BatchStoreErrors) })
	row("store calls by caller, whole mode (the gateways' count)", func(m *ModeResult) string { return kindsFloat(m.ByCaller) })
	row("acquires by outcome; refills held by reason (the gateways' counts)", func(m *ModeResult) string {
		return kindsFloat(m.Acquires) + "; " + kindsFloat(m.RefillBlocked)
	})
	row("image preparations (wall): count, mean, p99 ≤", func(m *ModeResult) string {
		if !m.Prepare.Found {
			return "not exported"
		}
		return fmt.Sprintf("%.0f, %.2f s, %g s", m.Prepare.Count, m.Prepare.MeanS, m.Prepare.P99S)
	})
	row("orphan sweep's stops by the batch's end", func(m *ModeResult) string { return fmt.Sprintf("%.0f", m.OrphanStops) })
	row("after the batch: pools ended; ECS tasks left", func(m *ModeResult) string {
		e := m.End
		return fmt.Sprintf("%d of %d ended after %.0f s (limit %.0f s), %d active; %d tasks not stopped; store %.0f calls/min; %d StopTask calls, %.0f orphan stops",
			e.PoolsEnded, r.M, e.WaitedSimSeconds, e.LimitSimSeconds, e.PoolsActive, e.TasksLive, e.StorePerMin, e.StopTaskCalls, e.OrphanStops)
	})
	row("gateway RSS after the batch (peak), per replica", func(m *ModeResult) string {
		var s []string
		for _, mem := range m.Memory {
			s = append(s, fmt.Sprintf("%.0f (%.0f) MB", float64(mem.RSSKiB)/1024, float64(mem.PeakKiB)/1024))
		}
		return strings.Join(s, ", ")
	})
	row("machine CPU busy (real)", func(m *ModeResult) string { return cpuLine(m.CPU) })
	row("this mode's wall time (real)", func(m *ModeResult) string { return fmt.Sprintf("%.0f s", m.WallSeconds) })
	for _, name := range modes {
		if m := byMode[name]; m != nil {
			for _, note := range m.Notes {
				p("note (%s): %s", name, note)
			}
		}
	}
	for _, note := range r.Notes {
		p("note: %s", note)
	}
	p("(images scenario: simulated ECS, Fargate, registry, agents and DynamoDB; real gateways; both modes took %.0f s of wall time)", r.WallSeconds)
}

// kinds renders counts by kind, largest first: "(5× 503 no_capacity)".
func kinds(m map[string]int) string {
	if len(m) == 0 {
		return ""
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return m[keys[i]] > m[keys[j]] || m[keys[i]] == m[keys[j]] && keys[i] < keys[j] })
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%d× %s", m[k], k)
	}
	return "(" + strings.Join(parts, ", ") + ")"
}

// kindsInt is kinds of int64 counts.
func kindsInt(m map[string]int64) string {
	c := make(map[string]int, len(m))
	for k, v := range m {
		c[k] = int(v)
	}
	return kinds(c)
}

// kindsFloat is kinds of a metric's values.
func kindsFloat(m map[string]float64) string {
	c := make(map[string]int, len(m))
	for k, v := range m {
		c[k] = int(v)
	}
	return kinds(c)
}

func total(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// cpuLine renders CPU use by phase, sorted.
func cpuLine(cpu map[string]float64) string {
	keys := make([]string, 0, len(cpu))
	for k := range cpu {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %.0f%%", k, cpu[k])
	}
	return strings.Join(parts, ", ")
}
