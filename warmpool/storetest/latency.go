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
	if len(lat) == 0 {
		return
	}
	lat = slices.Clone(lat)
	slices.Sort(lat)
	pct := func(p float64) float64 {
		return float64(lat[min(len(lat)-1, int(p*float64(len(lat))))]) / float64(time.Millisecond)
	}
	b.ReportMetric(pct(0.50), "p50_ms")
	b.ReportMetric(pct(0.99), "p99_ms")
}
