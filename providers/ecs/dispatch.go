package ecs

import (
	"context"
	"sync"
	"sync/atomic"

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
