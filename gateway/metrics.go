package gateway

import (
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/middleware/adaptor"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/quarryhq/quarry/api"
)

// metrics are the gateway's Prometheus metrics and the /metrics handler.
type metrics struct {
	requests      *prometheus.CounterVec
	duration      *prometheus.HistogramVec
	acceptRetries prometheus.Counter
	acceptLog     logLimit
	handler       fiber.Handler

	// Checkpoints (checkpoints.go): by operation (create, restore), the
	// bytes moved, the time taken, failures; forks by outcome.
	ckOps      *prometheus.CounterVec
	ckBytes    *prometheus.CounterVec
	ckDuration *prometheus.HistogramVec
	ckFailures *prometheus.CounterVec
	ckRefused  *prometheus.CounterVec
	forks      *prometheus.CounterVec
}

// logLimit lets a repeated log line through at most once a minute. Safe for
// concurrent use.
type logLimit struct{ last atomic.Int64 }

// logEvery is how often a logLimit lets its line through.
const logEvery = time.Minute

func (l *logLimit) allow(now time.Time) bool {
	last := l.last.Load()
	if last != 0 && now.UnixNano()-last < int64(logEvery) {
		return false
	}
	return l.last.CompareAndSwap(last, now.UnixNano())
}

// newMetrics registers the gateway's metrics on reg. It fails when they are
// registered already (two gateways on one registry).
func newMetrics(reg *prometheus.Registry, agents *agentClients) (*metrics, error) {
	labels := []string{"route", "method", "status"}
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "quarry_gateway_requests_total",
			Help: "Requests answered by the gateway, by route template, method and status.",
		}, labels),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "quarry_gateway_request_duration_seconds",
			Help:    "Time from request to the start of the answer (streams: to their first byte), by route template, method and status.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 10),
		}, labels),
		acceptRetries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "quarry_gateway_accept_retries_total",
			Help: "Client connections the gateway could not accept at once for want of file descriptors (RLIMIT_NOFILE); the accept is retried.",
		}),
	}
	m.ckOps = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quarry_gateway_checkpoint_operations_total",
		Help: "Checkpoints taken (op=create) and restored (op=restore) by the gateway.",
	}, []string{"op"})
	m.ckBytes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quarry_gateway_checkpoint_bytes_total",
		Help: "Archive bytes streamed from agents into the checkpoint store (op=create) and back (op=restore).",
	}, []string{"op"})
	m.ckDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "quarry_gateway_checkpoint_duration_seconds",
		Help:    "Time to take (op=create) or restore (op=restore) one checkpoint, agent and store included.",
		Buckets: prometheus.ExponentialBuckets(0.005, 2.5, 10),
	}, []string{"op"})
	m.ckFailures = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quarry_gateway_checkpoint_failures_total",
		Help: "Checkpoints that could not be taken (op=create) or restored (op=restore).",
	}, []string{"op"})
	m.ckRefused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quarry_gateway_checkpoint_budget_refusals_total",
		Help: "Checkpoints refused for the store's budget, by the variable that sets the limit they passed.",
	}, []string{"limit"})
	m.forks = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quarry_gateway_forks_total",
		Help: "Forked sandboxes by outcome: ok, or the error code of the fork (no_capacity, ...).",
	}, []string{"outcome"})
	clients := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "quarry_gateway_agent_clients",
		Help: "Agent HTTP clients cached by the gateway (one per agent URL).",
	}, func() float64 { return float64(agents.len()) })
	for _, c := range []prometheus.Collector{m.requests, m.duration, m.acceptRetries, clients, agents.dropped, m.ckOps, m.ckBytes, m.ckDuration, m.ckFailures, m.ckRefused, m.forks} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register gateway metrics: %w", err)
		}
	}
	m.handler = adaptor.HTTPHandler(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	return m, nil
}

// observe records one answered request. route must be a registered template
// or "unmatched"; method is copied to a constant (label values are kept).
func (m *metrics) observe(route string, method []byte, status int, d time.Duration) {
	s := strconv.Itoa(status)
	meth := methodLabel(method)
	m.requests.WithLabelValues(route, meth, s).Inc()
	m.duration.WithLabelValues(route, meth, s).Observe(d.Seconds())
}

// methods are the method label values; any other method is "other".
var methods = [...]string{fiber.MethodGet, fiber.MethodPost, fiber.MethodPut, fiber.MethodDelete,
	fiber.MethodHead, fiber.MethodPatch, fiber.MethodOptions}

func methodLabel(m []byte) string {
	for _, k := range methods {
		if string(m) == k {
			return k
		}
	}
	return "other"
}

// checkpointTaken records a checkpoint taken: its archive's bytes and how
// long it took.
func (m *metrics) checkpointTaken(bytes int64, d time.Duration) { m.checkpointDone("create", bytes, d) }

// checkpointRestored records a checkpoint restored.
func (m *metrics) checkpointRestored(bytes int64, d time.Duration) {
	m.checkpointDone("restore", bytes, d)
}

func (m *metrics) checkpointDone(op string, bytes int64, d time.Duration) {
	m.ckOps.WithLabelValues(op).Inc()
	m.ckBytes.WithLabelValues(op).Add(float64(bytes))
	m.ckDuration.WithLabelValues(op).Observe(d.Seconds())
}

// checkpointFailed records a checkpoint operation (create, restore) that
// failed.
func (m *metrics) checkpointFailed(op string) { m.ckFailures.WithLabelValues(op).Inc() }

// checkpointRefused records a checkpoint refused for the budget limit
// names (its variable).
func (m *metrics) checkpointRefused(limit string) { m.ckRefused.WithLabelValues(limit).Inc() }

// forked records the outcomes of one fork.
func (m *metrics) forked(forks []api.Fork) {
	for outcome, n := range forkOutcomes(forks) {
		m.forks.WithLabelValues(outcome).Add(float64(n))
	}
}
