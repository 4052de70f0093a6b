package ecs

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Outcomes of one message of the events queue, the "outcome" label of
// quarry_ecs_task_events_total.
const (
	eventDelivered = "delivered" // a state change of this gateway's task, sent to the consumer
	eventIgnored   = "ignored"   // another cluster's or gateway's task, or a state neither running nor stopped
	eventMalformed = "malformed" // not an ECS task state change event
)

// metrics are the provider's Prometheus collectors. They always exist;
// the gateway registers them (Provider.Collectors).
type metrics struct {
	queued   prometheus.GaugeFunc
	starting prometheus.GaugeFunc
	refused  *prometheus.CounterVec
	events   *prometheus.CounterVec
}

func newMetrics(p *Provider) *metrics {
	return &metrics{
		queued: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "quarry_ecs_launch_queued",
			Help: "Task names waiting in the ECS provider's launch queue for a start slot and the RunTask rate.",
		}, func() float64 { return float64(p.queue.len()) }),
		starting: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "quarry_ecs_tasks_starting",
			Help: "ECS tasks between their RunTask and running (or stopped), watched by this gateway process.",
		}, func() float64 { return float64(p.watch.count()) }),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "quarry_ecs_launch_refused_total",
			Help: "Task names the ECS provider refused to launch, by the limit that refused them (max_queued: QUARRY_ECS_MAX_QUEUED).",
		}, []string{"limit"}),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "quarry_ecs_task_events_total",
			Help: "Messages of the ECS task events queue, by outcome (delivered, ignored, malformed).",
		}, []string{"outcome"}),
	}
}

// Collectors returns the provider's Prometheus collectors, for the
// gateway's registry: the launch queue's length, the tasks starting, the
// launches refused by a limit, and the events read.
func (p *Provider) Collectors() []prometheus.Collector {
	return []prometheus.Collector{p.metrics.queued, p.metrics.starting, p.metrics.refused, p.metrics.events}
}
