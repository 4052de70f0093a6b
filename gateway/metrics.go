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
)

// metrics are the gateway's Prometheus metrics and the /metrics handler.
type metrics struct {
	requests      *prometheus.CounterVec
	duration      *prometheus.HistogramVec
	acceptRetries prometheus.Counter
	acceptLog     logLimit
	handler       fiber.Handler
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
	clients := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "quarry_gateway_agent_clients",
		Help: "Agent HTTP clients cached by the gateway (one per agent URL).",
	}, func() float64 { return float64(agents.len()) })
	for _, c := range []prometheus.Collector{m.requests, m.duration, m.acceptRetries, clients, agents.dropped} {
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
