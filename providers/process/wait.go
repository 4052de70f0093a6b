package process

import (
	"context"
	"sync"
	"time"
)

// sleepCtx waits for d or until ctx ends (then it returns ctx.Err()).
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// pollUntil calls cond every pollInterval until it is true or ctx ends.
func pollUntil(ctx context.Context, cond func() bool) error {
	for !cond() {
		if err := sleepCtx(ctx, pollInterval); err != nil {
			return err
		}
	}
	return nil
}

// nameLocks serializes Launch and Stop of one task name within a Provider.
type nameLocks struct {
	mu sync.Mutex
	m  map[string]*nameLock
}

type nameLock struct {
	ch   chan struct{}
	refs int
}

// lock takes the lock of name, or returns ctx.Err() if ctx ends first.
func (l *nameLocks) lock(ctx context.Context, name string) (func(), error) {
	l.mu.Lock()
	if l.m == nil {
		l.m = make(map[string]*nameLock)
	}
	nl := l.m[name]
	if nl == nil {
		nl = &nameLock{ch: make(chan struct{}, 1)}
		l.m[name] = nl
	}
	nl.refs++
	l.mu.Unlock()
	release := func() {
		l.mu.Lock()
		if nl.refs--; nl.refs == 0 {
			delete(l.m, name)
		}
		l.mu.Unlock()
	}
	select {
	case nl.ch <- struct{}{}:
		return func() { <-nl.ch; release() }, nil
	case <-ctx.Done():
		release()
		return nil, ctx.Err()
	}
}
