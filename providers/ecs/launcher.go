package ecs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ecs"
	"github.com/aws/aws-sdk-go-v2/service/ecs/types"
	"golang.org/x/sync/semaphore"
	"golang.org/x/time/rate"

	"github.com/quarryhq/quarry/providers"
)

// describeBatch is the most task ids one DescribeTasks call takes.
const describeBatch = 100

// launcher is the launch controller's AWS side: it keeps RunTask within
// the account's rates (a RateLimiter, in-process or shared by every
// replica), TagResource and DescribeTasks within this process's buckets,
// retries throttled calls with jittered backoff, and holds the start
// slots (tasks between RunTask and running/stopped), shared by every
// Launch of the provider.
type launcher struct {
	api       API
	cfg       Config
	rate      RateLimiter         // RunTask calls and tasks launched
	tags      *rate.Limiter       // TagResource calls
	describes *rate.Limiter       // DescribeTasks calls
	starting  *semaphore.Weighted // tasks between RunTask and running/stopped
	logger    *slog.Logger
}

// newLauncher returns the launcher of cfg on api; rl nil takes the
// in-process buckets of cfg's RunTask and launch rates.
func newLauncher(api API, cfg Config, rl RateLimiter, logger *slog.Logger) *launcher {
	if rl == nil {
		rl = NewLocalRate(cfg.RunTaskRate, cfg.RunTaskBurst, cfg.LaunchRate, cfg.LaunchBurst)
	}
	return &launcher{
		api:       api,
		cfg:       cfg,
		rate:      rl,
		tags:      rate.NewLimiter(rate.Limit(cfg.TagRate), cfg.TagBurst),
		describes: rate.NewLimiter(rate.Limit(cfg.DescribeRate), cfg.DescribeBurst),
		starting:  semaphore.NewWeighted(int64(cfg.MaxStarting)),
		logger:    logger,
	}
}

// retry calls fn until it succeeds, fails with an error that is not a
// throttle (or transient), MaxAttempts tries are spent, or ctx ends. wait
// runs before every try (the token buckets). A throttle that outlasts the
// tries is returned wrapped with providers.ErrThrottled.
func (l *launcher) retry(ctx context.Context, what string, wait func(context.Context) error, fn func(context.Context) error) error {
	var err error
	for attempt := 1; ; attempt++ {
		if wait != nil {
			if werr := wait(ctx); werr != nil {
				return fmt.Errorf("%s: wait for the rate limit: %w", what, errors.Join(werr, err))
			}
		}
		if err = fn(ctx); err == nil || !isRetryable(err) {
			return err
		}
		if attempt >= l.cfg.MaxAttempts {
			break
		}
		d := min(l.cfg.RetryMax, l.cfg.RetryBase<<min(attempt-1, 20))
		d = d/2 + rand.N(d/2+1) // jitter: [d/2, d]
		l.logger.Debug("ecs call throttled; retrying", "call", what, "attempt", attempt, "backoff", d, "err", err)
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%s: %w (last error: %w)", what, ctx.Err(), err)
		case <-t.C:
		}
	}
	if isThrottled(err) {
		return fmt.Errorf("%s: throttled %d times: %w: %w", what, l.cfg.MaxAttempts, providers.ErrThrottled, err)
	}
	return fmt.Errorf("%s: %d tries: %w", what, l.cfg.MaxAttempts, err)
}

// runTask starts count (1..10) tasks from in, with retries, each retry
// within the RunTask rate (the caller waited for the first try's: the
// dispatcher does, in the launch queue's order). ECS's per-task failures
// (no capacity) come back as failures.
func (l *launcher) runTask(ctx context.Context, in ecs.RunTaskInput, count int) ([]types.Task, []types.Failure, error) {
	if count < 1 || count > maxPerCall {
		return nil, nil, fmt.Errorf("run task: count %d outside 1..%d", count, maxPerCall)
	}
	in.Count = aws.Int32(int32(count))
	var out *ecs.RunTaskOutput
	first := true
	err := l.retry(ctx, "run task", func(ctx context.Context) error {
		if first {
			first = false
			return nil
		}
		return l.rate.Wait(ctx, count)
	}, func(ctx context.Context) error {
		var err error
		out, err = l.api.RunTask(ctx, &in)
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	return out.Tasks, out.Failures, nil
}

// tagTask adds tags to the task arn (TagResource), within the tag rate
// limit, with retries. Tagging is idempotent: a retry after a lost answer
// sets the same values again.
func (l *launcher) tagTask(ctx context.Context, arn string, tags []types.Tag) error {
	return l.retry(ctx, "tag task", l.tags.Wait, func(ctx context.Context) error {
		_, err := l.api.TagResource(ctx, &ecs.TagResourceInput{ResourceArn: aws.String(arn), Tags: tags})
		return err
	})
}

// describe returns the tasks of ids (with tags) in batches of 100, and the
// ids ECS reported missing.
func (l *launcher) describe(ctx context.Context, ids []string) (map[string]types.Task, map[string]string, error) {
	found := make(map[string]types.Task, len(ids))
	missing := map[string]string{}
	for start := 0; start < len(ids); start += describeBatch {
		batch := ids[start:min(start+describeBatch, len(ids))]
		var out *ecs.DescribeTasksOutput
		err := l.retry(ctx, "describe tasks", l.describes.Wait, func(ctx context.Context) error {
			var err error
			out, err = l.api.DescribeTasks(ctx, &ecs.DescribeTasksInput{
				Cluster: aws.String(l.cfg.Cluster), Tasks: batch, Include: []types.TaskField{types.TaskFieldTags},
			})
			return err
		})
		if err != nil {
			return nil, nil, err
		}
		for _, t := range out.Tasks {
			found[aws.ToString(t.TaskArn)] = t
		}
		for _, f := range out.Failures {
			missing[aws.ToString(f.Arn)] = aws.ToString(f.Reason)
		}
	}
	return found, missing, nil
}

// watcher polls every starting task of the provider (of every pool and
// Launch call) with batched DescribeTasks every PollInterval and hands
// each waiter its task: one watcher per provider, so N starting tasks
// cost ⌈N/100⌉ calls a tick, however many Launch calls started them.
type watcher struct {
	l       *launcher
	mu      sync.Mutex
	waiting map[string]*waiter // task ARN → its waiter
}

// waiter is one starting task's mailbox: its latest description, and
// its name (for the events, which carry none).
type waiter struct {
	ch         chan types.Task // buffer 1: the latest description
	name, pool string
}

func newWatcher(l *launcher) *watcher {
	return &watcher{l: l, waiting: map[string]*waiter{}}
}

// add registers arn (named name, of pool) and returns the channel its
// latest description arrives on. (A task ECS reports missing right after
// RunTask is only not visible yet: it is polled again until its deadline.)
func (w *watcher) add(arn, name, pool string) <-chan types.Task {
	w.mu.Lock()
	defer w.mu.Unlock()
	wt := &waiter{ch: make(chan types.Task, 1), name: name, pool: pool}
	w.waiting[arn] = wt
	return wt.ch
}

func (w *watcher) remove(arn string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.waiting, arn)
}

// lookup returns the name and pool of a starting task, if it is one.
func (w *watcher) lookup(arn string) (name, pool string, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if wt, ok := w.waiting[arn]; ok {
		return wt.name, wt.pool, true
	}
	return "", "", false
}

// count returns the number of starting tasks watched.
func (w *watcher) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.waiting)
}

// offer hands a description of arn from elsewhere (an event) to its
// waiter, if it is a starting task.
func (w *watcher) offer(arn string, t types.Task) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if wt, ok := w.waiting[arn]; ok {
		wt.put(t)
	}
}

// put makes t the waiter's latest description (replacing one not yet
// read). Called with the watcher's lock held.
func (wt *waiter) put(t types.Task) {
	select {
	case <-wt.ch:
	default:
	}
	wt.ch <- t
}

// run polls until ctx ends. Describe errors are logged and the poll
// repeated at the next tick.
func (w *watcher) run(ctx context.Context) {
	t := time.NewTicker(w.l.cfg.PollInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		w.mu.Lock()
		ids := make([]string, 0, len(w.waiting))
		for arn := range w.waiting {
			ids = append(ids, arn)
		}
		w.mu.Unlock()
		if len(ids) == 0 {
			continue
		}
		found, _, err := w.l.describe(ctx, ids)
		if err != nil {
			if ctx.Err() == nil {
				w.l.logger.Warn("describe starting tasks", "tasks", len(ids), "err", err)
			}
			continue
		}
		w.mu.Lock()
		for arn, task := range found {
			if wt, ok := w.waiting[arn]; ok {
				wt.put(task)
			}
		}
		w.mu.Unlock()
	}
}
