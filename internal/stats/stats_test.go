package stats

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestPercentile(t *testing.T) {
	ms := func(vs ...int) []time.Duration {
		out := make([]time.Duration, len(vs))
		for i, v := range vs {
			out[i] = time.Duration(v) * time.Millisecond
		}
		return out
	}
	tests := []struct {
		name string
		ds   []time.Duration
		p    int
		want time.Duration
	}{
		{name: "empty", ds: nil, p: 50, want: 0},
		{name: "one", ds: ms(7), p: 99, want: 7 * time.Millisecond},
		{name: "median of unsorted", ds: ms(5, 1, 4, 2, 3), p: 50, want: 3 * time.Millisecond},
		{name: "p99 of 100 is the 99th", ds: ms(seq(100)...), p: 99, want: 99 * time.Millisecond},
		{name: "p100 is the max", ds: ms(3, 9, 1), p: 100, want: 9 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := append([]time.Duration(nil), tt.ds...)
			assert.Equal(t, tt.want, Percentile(tt.ds, tt.p))
			assert.Equal(t, in, tt.ds, "input untouched")
		})
	}
}

func seq(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i + 1
	}
	return out
}
