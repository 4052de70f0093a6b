package ecs

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"

	"github.com/quarryhq/quarry/providers"
)

// States of a launchItem. Its Launch (giving up when its ctx ends) and
// the dispatcher move it on with compare-and-swaps, so exactly one decides
// each step: queued → dispatched (taken in a batch, waiting for slots and
// the rate) → running (its RunTask is made); queued or dispatched →
// abandoned (its Launch returned; the dispatcher drops it).
const (
	itemQueued int32 = iota
	itemDispatched
	itemRunning
	itemAbandoned
)

// launchItem is one name of a Launch call waiting for its RunTask.
type launchItem struct {
	ctx     context.Context // the Launch call's
	spec    providers.Spec
	set     settings
	taskDef string
	// key is the same for names whose RunTask requests are the same but
	// for their batch id (pool, task definition, network, labels), which
	// may share one RunTask call.
	key   string
	name  string
	state atomic.Int32
	done  chan launchResult // buffer 1: written once
}

// launchResult is what became of one launchItem.
type launchResult struct {
	task *providers.Task
	err  error
}

// finish delivers the item's result (once).
func (it *launchItem) finish(task *providers.Task, err error) {
	it.done <- launchResult{task: task, err: err}
}

// launchQueue holds the names of every Launch call waiting for a RunTask,
// one FIFO per pool, and gives them out in batches of one pool at a time,
// taking the pools in turn (round-robin): a pool's refill of thousands
// delays another pool's launch by one batch per pool ahead of it, never
// by the refill. It is bounded (max live items); safe for concurrent use.
type launchQueue struct {
	mu     sync.Mutex
	pools  map[string][]*launchItem // pool → its FIFO (live and abandoned items)
	ring   []string                 // pools with items, in turn order
	next   int                      // ring index of the next pool's turn
	queued int                      // live (queued) items
	pushed int                      // items ever queued
	max    int
	wake   chan struct{} // buffer 1: something was queued
}

func newLaunchQueue(max int) *launchQueue {
	return &launchQueue{pools: map[string][]*launchItem{}, max: max, wake: make(chan struct{}, 1)}
}

// push queues items (of one pool) in order, as many as the bound allows,
// and returns those it could not queue.
func (q *launchQueue) push(pool string, items []*launchItem) (refused []*launchItem) {
	q.mu.Lock()
	room := max(0, q.max-q.queued)
	take := min(room, len(items))
	if take > 0 {
		if len(q.pools[pool]) == 0 {
			q.ring = append(q.ring, pool)
		}
		q.pools[pool] = append(q.pools[pool], items[:take]...)
		q.queued += take
		q.pushed += take
	}
	q.mu.Unlock()
	if take > 0 {
		select {
		case q.wake <- struct{}{}:
		default:
		}
	}
	return items[take:]
}

// abandon gives up an item whose Launch's ctx ended and reports whether
// it was still queued or waiting for its start slot and the rate: false
// means its RunTask is made, and its result will come.
func (q *launchQueue) abandon(it *launchItem) bool {
	if it.state.CompareAndSwap(itemDispatched, itemAbandoned) {
		return true
	}
	if !it.state.CompareAndSwap(itemQueued, itemAbandoned) {
		return false
	}
	q.mu.Lock()
	q.queued--
	q.mu.Unlock()
	return true
}

// len returns the number of queued (live) items.
func (q *launchQueue) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.queued
}

// counts returns the number of queued (live) items and of items ever
// queued.
func (q *launchQueue) counts() (queued, pushed int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.queued, q.pushed
}

// take returns the next batch: up to n items of the pool whose turn it
// is, those at the head of its FIFO with the head's key, in order, each
// marked dispatched. It waits while the queue is empty; it returns nil
// when ctx ends.
func (q *launchQueue) take(ctx context.Context, n int) []*launchItem {
	for {
		if batch := q.pop(n); len(batch) > 0 {
			return batch
		}
		select {
		case <-ctx.Done():
			return nil
		case <-q.wake:
		}
	}
}

// pop is take without the wait: nil when no live item is queued.
func (q *launchQueue) pop(n int) []*launchItem {
	q.mu.Lock()
	defer q.mu.Unlock()
	for len(q.ring) > 0 {
		if q.next >= len(q.ring) {
			q.next = 0
		}
		pool := q.ring[q.next]
		items := q.pools[pool]
		var batch []*launchItem
		i := 0
		for ; i < len(items) && len(batch) < n; i++ {
			it := items[i]
			if it.state.Load() == itemAbandoned {
				continue
			}
			if len(batch) > 0 && it.key != batch[0].key {
				break
			}
			if it.state.CompareAndSwap(itemQueued, itemDispatched) {
				batch = append(batch, it)
				q.queued--
			}
		}
		clear(items[:i])
		items = items[i:]
		if len(items) == 0 {
			delete(q.pools, pool)
			q.ring = append(q.ring[:q.next], q.ring[q.next+1:]...)
		} else {
			q.pools[pool] = items
			q.next++
		}
		if len(batch) > 0 {
			return batch
		}
	}
	return nil
}

// batchContext returns the context of a RunTask call that starts the
// names of items: it keeps the values of the first item's ctx (the
// caller that is served, for metrics) and ends when every item's ctx has
// ended (nobody waits for the tasks any more) or stop ends (the provider
// closed). Call release when the call is done.
func batchContext(items []*launchItem, stop context.Context) (ctx context.Context, release func()) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(items[0].ctx))
	var left atomic.Int32
	left.Store(int32(len(items)))
	stops := make([]func() bool, 0, len(items)+1)
	for _, it := range items {
		stops = append(stops, context.AfterFunc(it.ctx, func() {
			if left.Add(-1) == 0 {
				cancel()
			}
		}))
	}
	stops = append(stops, context.AfterFunc(stop, cancel))
	return ctx, func() {
		for _, s := range stops {
			s()
		}
		cancel()
	}
}

// batchSize is the most names one RunTask call starts: ECS's limit of 10,
// or fewer when the cap on tasks starting at once is lower (a batch takes
// its start slots together).
func (p *Provider) batchSize() int { return min(maxPerCall, p.cfg.MaxStarting) }

// dispatch gives the launch queue's batches out until Close: for each, in
// the queue's fair order, it takes one start slot per name and waits for
// the RunTask rate (one batch at a time: this is what makes the order
// hold), then starts the batch's RunTask and the waits for its tasks in
// their own goroutine.
func (p *Provider) dispatch() {
	for {
		items := p.queue.take(p.life, p.batchSize())
		if items == nil {
			p.failQueued()
			return
		}
		ctx, release := batchContext(items, p.life)
		n := int64(len(items))
		if err := p.launcher.starting.Acquire(ctx, n); err != nil {
			release()
			if end := p.waitEnded(items[0]); end != nil {
				err = end
			}
			p.failAll(items, fmt.Errorf("wait for a start slot: %w", err))
			continue
		}
		if err := p.launcher.rate.Wait(ctx, len(items)); err != nil {
			release()
			p.launcher.starting.Release(n)
			if end := p.waitEnded(items[0]); end != nil {
				err = end
			} else { // the limiter failed (a shared one's store): no launch is admitted now
				err = fmt.Errorf("%w: %w", providers.ErrThrottled, err)
			}
			p.failAll(items, fmt.Errorf("wait for the run task rate: %w", err))
			continue
		}
		if p.life.Err() != nil {
			release()
			p.launcher.starting.Release(n)
			p.failAll(items, errors.New("provider closed"))
			continue
		}
		live := items[:0]
		for _, it := range items {
			switch {
			case !it.state.CompareAndSwap(itemDispatched, itemRunning): // its Launch gave up
				p.launcher.starting.Release(1)
			case it.ctx.Err() != nil:
				p.launcher.starting.Release(1)
				it.finish(nil, fmt.Errorf("wait in the launch queue: %w", it.ctx.Err()))
			default:
				live = append(live, it)
			}
		}
		if len(live) == 0 {
			release()
			continue
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer release()
			p.runBatch(ctx, live)
		}()
	}
}

// waitEnded says why a wait of a batch ended when it was its item's ctx
// or the provider's end, else nil.
func (p *Provider) waitEnded(it *launchItem) error {
	switch {
	case it.ctx.Err() != nil:
		return it.ctx.Err()
	case p.life.Err() != nil:
		return errors.New("provider closed")
	}
	return nil
}

// failAll fails every item with err.
func (p *Provider) failAll(items []*launchItem, err error) {
	for _, it := range items {
		it.finish(nil, err)
	}
}

// failQueued fails the names still queued when the provider closes.
func (p *Provider) failQueued() {
	for {
		items := p.queue.pop(maxPerCall)
		if len(items) == 0 {
			return
		}
		p.failAll(items, errors.New("provider closed"))
	}
}

// runBatch starts the tasks of items with one RunTask call (its ctx ends
// when every item's has) and waits until each runs, delivering each
// item's task or error. The batch holds one start slot per item; each is
// released when its task runs, stops or is given up.
func (p *Provider) runBatch(ctx context.Context, items []*launchItem) {
	n := len(items)
	first := items[0]
	start := time.Now()
	batch, err := newBatchID()
	if err != nil {
		p.launcher.starting.Release(int64(n))
		p.failAll(items, err)
		return
	}
	in := p.runTaskInput(first.spec, first.set, first.taskDef, batch, start)
	started, failures, err := p.launcher.runTask(ctx, in, n)
	if err != nil {
		p.launcher.starting.Release(int64(n))
		switch {
		case isInactive(err) && first.set.taskDef == "":
			// Deregistered behind this replica's memory (another replica's
			// ForgetImage): forgotten here too, registered again by the
			// next launch.
			p.images.forget(familyOf(first.taskDef), first.taskDef)
			err = fmt.Errorf("run task: task definition %s is INACTIVE (deregistered elsewhere); the next launch registers it again: %w",
				first.taskDef, providers.ErrThrottled)
		case isInvalid(err):
			_, msg := apiError(err)
			err = providers.InvalidSpec(first.spec, "run task: "+msg)
		}
		p.failAll(items, err)
		return
	}
	for _, extra := range started[min(n, len(started)):] { // ECS never starts more than count
		arn := aws.ToString(extra.TaskArn)
		err := p.giveUp(ctx, arn, errors.New("started beyond the count of its RunTask call"))
		p.logger.Warn("run task: stopped a task beyond the call's count", "arn", arn, "batch", batch, "err", err)
	}
	started = started[:min(n, len(started))]
	shared := tagMap(in.Tags)
	var wg sync.WaitGroup
	for i, it := range items {
		if i >= len(started) {
			p.launcher.starting.Release(1)
			if j := i - len(started); j < len(failures) {
				it.finish(nil, failureError(failures[j]))
			} else {
				it.finish(nil, errors.New("run task: ECS started fewer tasks than asked and reported no failure"))
			}
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer p.launcher.starting.Release(1)
			it.finish(p.startOne(it.ctx, it.spec, it.name, shared, started[i], start))
		}()
	}
	wg.Wait()
}
