package ecs

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func nopLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// counterValue returns a counter's value.
func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	require.NoError(t, c.Write(&m))
	return m.GetCounter().GetValue()
}

// admitter is a limiter that says when it admitted a call, on its own
// clock: callRate and ddbrate.Limiter.
type admitter interface {
	Admit(ctx context.Context, n int) (time.Time, error)
}

// admissions is a RateLimiter that records, for each call its limiter
// admitted, the time of the admission on the limiter's clock (not when
// the caller ran after its wait: a loaded machine runs goroutines late).
type admissions struct {
	l  admitter
	mu sync.Mutex
	at []time.Time
}

func (a *admissions) Wait(ctx context.Context, n int) error {
	at, err := a.l.Admit(ctx, n)
	if err == nil {
		a.mu.Lock()
		a.at = append(a.at, at)
		a.mu.Unlock()
	}
	return err
}

// times returns the admissions in order.
func (a *admissions) times() []time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.SortedFunc(slices.Values(a.at), time.Time.Compare)
}

// checkAdmissions asserts that the admissions at (in order) keep a bucket
// of burst refilled at rate a second: in every window from an admission at
// most burst + rate × its length, and all of them spread over at least
// (len(at) − burst) / rate.
func checkAdmissions(t *testing.T, at []time.Time, rate float64, burst int) {
	t.Helper()
	for i := range at {
		for j := i; j < len(at); j++ {
			w := at[j].Sub(at[i]).Seconds()
			require.LessOrEqual(t, float64(j-i+1), float64(burst)+rate*w+1e-6,
				"%d admissions within %.3fs of admission %d: more than the bucket allows", j-i+1, w, i)
		}
	}
	if len(at) > burst {
		span := at[len(at)-1].Sub(at[0]).Seconds()
		assert.GreaterOrEqual(t, span, float64(len(at)-burst)/rate-1e-6, "%d admissions in %.3fs", len(at), span)
	}
}
