package storetest

import (
	"slices"
	"testing"
	"time"
)

// ReportLatency reports the p50 and p99 of lat (one sample per operation)
// in milliseconds as the benchmark metrics "p50_ms" and "p99_ms". Store
// and manager benchmarks share it so their numbers compare.
func ReportLatency(b *testing.B, lat []time.Duration) {
	ReportLatencyAs(b, "", lat)
}

// ReportLatencyAs is ReportLatency with the metric names prefixed by name
// and "_" ("put" reports "put_p50_ms" and "put_p99_ms"), for a benchmark
// that measures a second operation beside its own.
func ReportLatencyAs(b *testing.B, name string, lat []time.Duration) {
	if name != "" {
		name += "_"
	}
	if len(lat) == 0 {
		return
	}
	lat = slices.Clone(lat)
	slices.Sort(lat)
	pct := func(p float64) float64 {
		return float64(lat[min(len(lat)-1, int(p*float64(len(lat))))]) / float64(time.Millisecond)
	}
	b.ReportMetric(pct(0.50), name+"p50_ms")
	b.ReportMetric(pct(0.99), name+"p99_ms")
}
