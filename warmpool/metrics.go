package warmpool

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Acquire outcomes, the "outcome" label of the acquire metrics.
const (
	outcomeWarm     = "warm"     // a ready task was claimed
	outcomeCold     = "cold"     // a task was launched for this acquire
	outcomeReplayed = "replayed" // an idempotency key returned an earlier lease
	outcomeError    = "error"    // no lease (no capacity, bad input, launch or init failures)
)

// metrics are the manager's Prometheus collectors. They always exist; they
// are registered only when Deps.Metrics is set.
type metrics struct {
	acquires        *prometheus.CounterVec
	acquireSeconds  *prometheus.HistogramVec
	tasks           *prometheus.GaugeVec
	launches        *prometheus.CounterVec
	launchFailures  *prometheus.CounterVec
	reaped          prometheus.Counter
	orphans         *prometheus.CounterVec
	lockAttempts    *prometheus.CounterVec
	lockHeld        *prometheus.GaugeVec
	lockedPasses    *prometheus.CounterVec
	refillBlocked   *prometheus.CounterVec
	queueFull       *prometheus.CounterVec
	queueLength     *prometheus.GaugeVec
	passSeconds     *prometheus.HistogramVec
	walked          *prometheus.CounterVec
	describes       *prometheus.CounterVec
	taskEvents      *prometheus.CounterVec
	orphanWalked    prometheus.Counter
	staleTasks      *prometheus.CounterVec
	prepareSeconds  *prometheus.HistogramVec
	odPools         *prometheus.GaugeVec
	odEnded         *prometheus.CounterVec
	classTasks      *prometheus.GaugeVec
	prefetchQueue   prometheus.Gauge
	prefetchRefused prometheus.Counter
	countWaiting    prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		acquires: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "quarry_acquires_total",
			Help: "Lease acquires by pool and outcome (warm, cold, replayed, error).",
		}, []string{"pool", "outcome"}),
		acquireSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "quarry_acquire_duration_seconds",
			Help:    "Time to acquire a lease, by pool and outcome.",
			Buckets: []float64{.001, .002, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120},
		}, []string{"pool", "outcome"}),
		tasks: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "quarry_pool_tasks",
			Help: "Tasks of a pool by state (ready, launching, leased, stopping), as last seen by this gateway's reconciler.",
		}, []string{"pool", "state"}),
		launches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "quarry_task_launches_total",
			Help: "Tasks launched, by pool.",
		}, []string{"pool"}),
		launchFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "quarry_task_launch_failures_total",
			Help: "Launches that did not become ready (launch error, agent never healthy, deadline), by pool.",
		}, []string{"pool"}),
		reaped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "quarry_leases_reaped_total",
			Help: "Leases ended by the reaper because they were not renewed in time.",
		}),
		orphans: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "quarry_orphan_tasks_stopped_total",
			Help: "Provider tasks stopped because no task record accounted for them, by provider.",
		}, []string{"provider"}),
		lockAttempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "quarry_lock_attempts_total",
			Help: "Attempts of this replica to take or renew a background-work lock, by lock and outcome (held, busy: another replica holds it, error, canceled: the replica was closing).",
		}, []string{"lock", "outcome"}),
		lockHeld: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "quarry_lock_held",
			Help: "1 while this replica holds the lock (and so runs the job): pool/<name> (the pool's reconciler), reaper, orphans.",
		}, []string{"lock"}),
		lockedPasses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "quarry_locked_passes_total",
			Help: "Passes of a background job that this replica ran while holding its lock, by lock.",
		}, []string{"lock"}),
		refillBlocked: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "quarry_refill_blocked_total",
			Help: "Refills of a pool that could not launch all they wanted, by pool and reason (max_total: acquires wait at max_total; store: the reservation failed; backoff: launches failed recently; concurrency: QUARRY_LAUNCH_CONCURRENCY launch calls in flight).",
		}, []string{"pool", "reason"}),
		queueFull: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "quarry_acquire_queue_full_total",
			Help: "Acquires refused at once because QUARRY_ACQUIRE_QUEUE acquires of the pool waited already on this gateway, by pool.",
		}, []string{"pool"}),
		queueLength: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "quarry_acquire_queue_length",
			Help: "Acquires of a pool waiting on this gateway for a task, by pool.",
		}, []string{"pool"}),
		passSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "quarry_reconcile_pass_duration_seconds",
			Help:    "Time of one reconciler pass over a pool (one budget of its walk, and a refill), by pool.",
			Buckets: []float64{.001, .005, .01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"pool"}),
		walked: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "quarry_walked_tasks_total",
			Help: "Task records the reconciler's walks read, by pool.",
		}, []string{"pool"}),
		describes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "quarry_describe_calls_total",
			Help: "Describe calls of the starter and the walks (QUARRY_DESCRIBE_RATE bounds them), by provider.",
		}, []string{"provider"}),
		taskEvents: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "quarry_task_events_total",
			Help: "Task events of providers with events, by provider and outcome (handled; ignored: not a task of a configured pool, or its record disagrees; dropped: QUARRY_EVENT_QUEUE was full).",
		}, []string{"provider", "outcome"}),
		orphanWalked: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "quarry_orphan_walked_tasks_total",
			Help: "Task records the orphan sweep's walks read.",
		}),
		staleTasks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "quarry_stale_tasks_total",
			Help: "Tasks found launched for another configuration of their pool (another provider, image, resources, env or options), by pool and what was done (retired: a ready one was stopped; leased: a lease holds one, which keeps working until it ends; unstoppable: its provider is not configured, so it is left running and reported).",
		}, []string{"pool", "action"}),
		prepareSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "quarry_image_prepare_duration_seconds",
			Help:    "Time to prepare an on-demand pool's image (a pull, a task definition's registration; cheap when ready), by class and outcome (ready, failed).",
			Buckets: []float64{.001, .01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900},
		}, []string{"class", "outcome"}),
		odPools: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "quarry_ondemand_pools_loaded",
			Help: "On-demand pools this gateway holds in memory, by class (QUARRY_MAX_ONDEMAND_POOLS bounds them).",
		}, []string{"class"}),
		odEnded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "quarry_ondemand_pools_ended_total",
			Help: "On-demand pools ended by this gateway, by class and how (idle: no acquire for idle_seconds; deleted: its record went after retention_seconds).",
		}, []string{"class", "how"}),
		classTasks: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "quarry_class_tasks",
			Help: "Tasks of a class's on-demand pools together (what its max_total bounds), as last read by the class loop.",
		}, []string{"class"}),
		prefetchQueue: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "quarry_prefetch_queue_length",
			Help: "Images of prefetches waiting on this gateway for their preparation (QUARRY_PREFETCH_QUEUE bounds them).",
		}),
		prefetchRefused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "quarry_prefetch_refused_total",
			Help: "Images of prefetches refused because QUARRY_PREFETCH_QUEUE images waited already.",
		}),
		countWaiting: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "quarry_count_reads_waiting",
			Help: "Reads of a pool's counts waiting for one of QUARRY_COUNT_READS slots on this gateway.",
		}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{
		m.acquires, m.acquireSeconds, m.tasks, m.launches, m.launchFailures, m.reaped, m.orphans,
		m.lockAttempts, m.lockHeld, m.lockedPasses, m.refillBlocked, m.queueFull, m.queueLength, m.passSeconds,
		m.walked, m.describes, m.taskEvents, m.orphanWalked, m.staleTasks,
		m.prepareSeconds, m.odPools, m.odEnded, m.classTasks, m.prefetchQueue, m.prefetchRefused, m.countWaiting,
	} {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				return nil, fmt.Errorf("register warm pool metrics (a second manager on the same registry?): %w", err)
			}
			return nil, fmt.Errorf("register warm pool metrics: %w", err)
		}
	}
	return m, nil
}

// setTaskCounts publishes a pool's task counts.
func (m *metrics) setTaskCounts(pool string, c TaskCounts) {
	m.tasks.WithLabelValues(pool, string(TaskReady)).Set(float64(c.Ready))
	m.tasks.WithLabelValues(pool, string(TaskLaunching)).Set(float64(c.Launching))
	m.tasks.WithLabelValues(pool, string(TaskLeased)).Set(float64(c.Leased))
	m.tasks.WithLabelValues(pool, string(TaskStopping)).Set(float64(c.Stopping))
}
