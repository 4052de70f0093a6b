// Package stats holds the small statistics Quarry's benchmarks report.
//
// It must not import any other Quarry package.
package stats

import (
	"slices"
	"time"
)

// Percentile returns the p-th percentile (0 < p <= 100) of ds by the
// nearest-rank method, or 0 for no samples. ds is not modified.
func Percentile(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (len(s)*p + 99) / 100
	return s[min(max(i-1, 0), len(s)-1)]
}
