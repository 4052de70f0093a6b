package docker

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the provider's Prometheus collectors of images on demand.
// They always exist; the gateway registers them (Provider.Collectors).
type metrics struct {
	pullsStarted prometheus.Counter
	pulls        *prometheus.CounterVec
	evictions    prometheus.Counter
	budgetUnmet  prometheus.Counter
	ledgerBytes  prometheus.GaugeFunc
}

func newMetrics(c *imageCache) *metrics {
	return &metrics{
		pullsStarted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "quarry_docker_image_pulls_started_total",
			Help: "Pulls the Docker provider asked the engine for (one per image however many callers wait).",
		}),
		pulls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "quarry_docker_image_preparations_total",
			Help: "Preparations of an image the engine did not have, by outcome (ready, not_found, denied, unreachable, invalid, error).",
		}, []string{"outcome"}),
		evictions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "quarry_docker_image_evictions_total",
			Help: "Images pulled for on-demand pools that the Docker provider removed to keep within QUARRY_DOCKER_IMAGE_BUDGET.",
		}),
		budgetUnmet: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "quarry_docker_image_budget_unmet_total",
			Help: "Passes after a pull that left the images of on-demand pools above QUARRY_DOCKER_IMAGE_BUDGET (the rest in use, pinned or needed).",
		}),
		ledgerBytes: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "quarry_docker_image_cache_bytes",
			Help: "Bytes of the images the Docker provider pulled for on-demand pools, as the engine sized them (shared layers counted per image).",
		}, func() float64 { return float64(c.ledger.total()) }),
	}
}

// Collectors returns the provider's Prometheus collectors, for the
// gateway's registry: pulls started and their outcomes, removals by the
// image budget and the passes that could not meet it, the cache's bytes.
func (p *Provider) Collectors() []prometheus.Collector {
	m := p.img.metrics
	return []prometheus.Collector{m.pullsStarted, m.pulls, m.evictions, m.budgetUnmet, m.ledgerBytes}
}
