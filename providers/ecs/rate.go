package ecs

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// RateLimiter admits RunTask calls within the account's rates: ECS's
// RunTask call rate and Fargate's task launch rate, which hold for the
// whole account and Region, not per gateway process. The launch
// controller calls Wait before every RunTask call (retries included).
// Implementations are safe for concurrent use: the in-process one
// (NewLocalRate, the default, right for one replica) and
// providers/ecs/ddbrate, which every replica shares through DynamoDB.
type RateLimiter interface {
	// Wait blocks until one RunTask call starting n tasks (1..10) fits
	// both rates and takes its share of them. It fails, taking nothing,
	// when ctx ends first or its deadline would pass before the call fits,
	// and when the limiter itself fails (a shared one's store).
	Wait(ctx context.Context, n int) error
}

// localRate is the in-process RateLimiter: two token buckets.
type localRate struct {
	calls, tasks *rate.Limiter
}

// NewLocalRate returns the in-process RateLimiter of one gateway process:
// callRate RunTask calls per second (burst callBurst) and taskRate tasks
// launched per second (burst taskBurst). Config's RunTaskRate/RunTaskBurst
// and LaunchRate/LaunchBurst are its arguments when no other is given.
func NewLocalRate(callRate float64, callBurst int, taskRate float64, taskBurst int) RateLimiter {
	return &localRate{
		calls: rate.NewLimiter(rate.Limit(callRate), callBurst),
		tasks: rate.NewLimiter(rate.Limit(taskRate), taskBurst),
	}
}

// Wait takes a token of the call bucket, then n of the task bucket.
func (r *localRate) Wait(ctx context.Context, n int) error {
	if err := r.calls.Wait(ctx); err != nil {
		return fmt.Errorf("run task call rate: %w", err)
	}
	if err := r.tasks.WaitN(ctx, n); err != nil {
		return fmt.Errorf("task launch rate: %w", err)
	}
	return nil
}

// callRate is an in-process bucket of one API's calls: the RateLimiter of
// RegisterTaskDefinition's rate when no shared one is given (Deps.Register).
// Every call takes one token, whatever n.
type callRate struct {
	mu  sync.Mutex // reservations in the order of their times
	lim *rate.Limiter
}

// newCallRate returns a bucket of burst calls refilled at r a second.
func newCallRate(r float64, burst int) *callRate {
	return &callRate{lim: rate.NewLimiter(rate.Limit(r), burst)}
}

// Wait takes one token, waiting for it.
func (c *callRate) Wait(ctx context.Context, _ int) error {
	_, err := c.Admit(ctx, 1)
	return err
}

// Admit is Wait, and returns the time the call was admitted at on the
// bucket's clock (its reservation's, however late the caller runs after
// its sleep), as ddbrate.Limiter.Admit does. It fails, taking nothing, when
// ctx ends first or its deadline would pass before the call fits.
func (c *callRate) Admit(ctx context.Context, _ int) (time.Time, error) {
	c.mu.Lock()
	now := time.Now()
	r := c.lim.ReserveN(now, 1)
	c.mu.Unlock()
	if !r.OK() {
		return time.Time{}, errors.New("call rate: the bucket holds no token")
	}
	at := now.Add(r.DelayFrom(now))
	if dl, ok := ctx.Deadline(); ok && at.After(dl) {
		r.CancelAt(now)
		return time.Time{}, fmt.Errorf("call rate: the call could start in %s, after the context's deadline", at.Sub(now).Round(time.Millisecond))
	}
	if !at.After(now) {
		return at, nil
	}
	t := time.NewTimer(at.Sub(now))
	defer t.Stop()
	select {
	case <-ctx.Done():
		r.Cancel()
		return time.Time{}, fmt.Errorf("call rate: %w", ctx.Err())
	case <-t.C:
		return at, nil
	}
}
