package warmpool

import (
	"container/list"
	"sync"
)

// acquireQueue is the FIFO of one pool's acquires that wait on this
// replica for a task, bounded by Config.AcquireQueue. A task the starter
// makes ready is offered to the first waiter, which claims it by id; a
// launch that failed is handed to the first waiters as an attempt each.
// The first waiter (the head) also claims any ready task now and then, for
// the tasks made ready elsewhere: one claim at a time per pool, whatever
// the queue's length. Safe for concurrent use.
type acquireQueue struct {
	mu      sync.Mutex
	max     int
	waiters *list.List // of *waiter; the front is the head
}

// waiter is one waiting acquire.
type waiter struct {
	offers chan offer    // buffered 1: a task to claim, or a failed launch
	wake   chan struct{} // buffered 1: it may have become the head, or should claim now
	elem   *list.Element // nil while out of the queue (under acquireQueue.mu)
	now    bool          // the head should claim at once: a task may be free (under acquireQueue.mu)
}

// offer is what the queue hands a waiter: a ready task's id, or the error
// of a launch that failed.
type offer struct {
	taskID string
	err    error
}

func newAcquireQueue(max int) *acquireQueue {
	return &acquireQueue{max: max, waiters: list.New()}
}

func (q *acquireQueue) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.waiters.Len()
}

// join queues a new waiter at the back; false when the queue is full.
func (q *acquireQueue) join() (*waiter, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.waiters.Len() >= q.max {
		return nil, false
	}
	w := &waiter{offers: make(chan offer, 1), wake: make(chan struct{}, 1)}
	w.elem = q.waiters.PushBack(w)
	if q.waiters.Len() == 1 {
		signal(w.wake)
	}
	return w, true
}

// rejoin puts a waiter that was handed an offer it could not use back at
// the front: it was first, and stays first.
func (q *acquireQueue) rejoin(w *waiter) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if w.elem == nil {
		w.elem = q.waiters.PushFront(w)
	}
	signal(w.wake)
}

// leave takes w out of the queue for good. An offer it was handed but did
// not take goes to the next waiter.
func (q *acquireQueue) leave(w *waiter) {
	q.mu.Lock()
	if w.elem != nil {
		wasHead := q.waiters.Front() == w.elem
		q.waiters.Remove(w.elem)
		w.elem = nil
		if wasHead {
			q.promoteLocked()
		}
	}
	q.mu.Unlock()
	select {
	case o := <-w.offers:
		if o.taskID != "" {
			q.offer(o.taskID)
		}
	default:
	}
}

// isHead reports whether w is the first waiter.
func (q *acquireQueue) isHead(w *waiter) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return w.elem != nil && q.waiters.Front() == w.elem
}

// takeNow reports (and clears) whether w should claim at once.
func (q *acquireQueue) takeNow(w *waiter) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	now := w.now
	w.now = false
	return now
}

// offer hands a ready task to the first waiter; false when none waits.
func (q *acquireQueue) offer(taskID string) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	w := q.popLocked()
	if w == nil {
		return false
	}
	w.offers <- offer{taskID: taskID}
	return true
}

// fail hands the error of a failed launch to the first n waiters.
func (q *acquireQueue) fail(err error, n int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for ; n > 0; n-- {
		w := q.popLocked()
		if w == nil {
			return
		}
		w.offers <- offer{err: err}
	}
}

// poll makes the first waiter claim at once: a task may have become free.
func (q *acquireQueue) poll() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if front := q.waiters.Front(); front != nil {
		w := front.Value.(*waiter)
		w.now = true
		signal(w.wake)
	}
}

// popLocked takes the first waiter out of the queue (nil when empty) and
// wakes the next one, which becomes the head.
func (q *acquireQueue) popLocked() *waiter {
	front := q.waiters.Front()
	if front == nil {
		return nil
	}
	w := q.waiters.Remove(front).(*waiter)
	w.elem = nil
	q.promoteLocked()
	return w
}

// promoteLocked wakes the head, so that it starts polling.
func (q *acquireQueue) promoteLocked() {
	if front := q.waiters.Front(); front != nil {
		signal(front.Value.(*waiter).wake)
	}
}

// signal sends on a buffered-1 channel without blocking.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
