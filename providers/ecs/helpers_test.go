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
// the caller ran after its wait: a loaded machine runs goroutines late)
// and its n.
type admissions struct {
	l   admitter
	mu  sync.Mutex
	got []admission
}

// admission is one call a limiter admitted: when (on its clock) and its n.
type admission struct {
	at time.Time
	n  int
}

func (a *admissions) Wait(ctx context.Context, n int) error {
	at, err := a.l.Admit(ctx, n)
	if err == nil {
		a.mu.Lock()
		a.got = append(a.got, admission{at, n})
		a.mu.Unlock()
	}
	return err
}

// all returns the admissions in time order.
func (a *admissions) all() []admission {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.SortedFunc(slices.Values(a.got), func(x, y admission) int { return x.at.Compare(y.at) })
}

// times returns the admissions' times in order.
func (a *admissions) times() []time.Time {
	var out []time.Time
	for _, ad := range a.all() {
		out = append(out, ad.at)
	}
	return out
}

// checkAdmissions asserts that calls admitted at (in order) keep a bucket
// of burst refilled at rate a second (checkBucket, one token a call).
func checkAdmissions(t *testing.T, at []time.Time, rate float64, burst int) {
	t.Helper()
	adm := make([]admission, len(at))
	for i := range at {
		adm[i] = admission{at: at[i], n: 1}
	}
	checkBucket(t, adm, func(admission) int { return 1 }, rate, burst)
}

// checkBucket asserts that admissions (in time order), each taking
// tokens(a), keep a bucket of burst refilled at rate a second: in every
// window from an admission at most burst + rate × its length, and all of
// them spread over at least (their tokens − burst) / rate.
func checkBucket(t *testing.T, adm []admission, tokens func(admission) int, rate float64, burst int) {
	t.Helper()
	total := 0
	for i := range adm {
		n := 0
		for j := i; j < len(adm); j++ {
			n += tokens(adm[j])
			w := adm[j].at.Sub(adm[i].at).Seconds()
			require.LessOrEqual(t, float64(n), float64(burst)+rate*w+1e-6,
				"%d tokens admitted within %.3fs of admission %d: more than the bucket allows", n, w, i)
		}
		total += tokens(adm[i])
	}
	if total > burst {
		span := adm[len(adm)-1].at.Sub(adm[0].at).Seconds()
		assert.GreaterOrEqual(t, span, float64(total-burst)/rate-1e-6, "%d tokens in %.3fs", total, span)
	}
}
