package ecs

import (
	"context"
	"fmt"

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
