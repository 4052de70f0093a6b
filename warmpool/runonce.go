package warmpool

import (
	"context"
	"errors"
	"fmt"
)

// RunOnce runs the background work once, for a gateway without a
// long-lived process (AWS Lambda, invoked by a schedule) instead of Start's
// loops: one reconcile pass per pool (launches included), one reaper pass
// and one orphan sweep, each gated on its lock exactly as on a replica
// (another replica or invocation holding it skips that pass). It waits
// until the launches the passes started are done, then releases the locks
// it took, so that the next invocation, whichever instance runs it, may
// take them at once.
//
// Errors are logged by the passes, as in the loops; RunOnce returns an
// error only when the manager was started (its loops do this work) or
// closed, or when ctx ends before the launches finish (they then go on
// until Close, which waits for them). Calls are serialized; safe for
// concurrent use with every other method.
func (m *Manager) RunOnce(ctx context.Context) error {
	m.runOnce.Lock()
	defer m.runOnce.Unlock()
	m.mu.Lock()
	started, closed := m.started, m.closed
	m.mu.Unlock()
	switch {
	case closed:
		return errors.New("run background work once: the manager is closed")
	case started:
		return errors.New("run background work once: the manager was started; its loops do this work")
	}
	for _, name := range m.names {
		p := m.pools[name]
		pass := m.locked(lockPoolPrefix+name, m.cfg.ReconcileInterval, func(ctx context.Context) { m.reconcile(ctx, p) })
		pass(ContextWithCaller(ctx, CallerReconcile))
	}
	for _, name := range m.classNames {
		cs := m.classes[name]
		m.locked(cs.lock, m.cfg.ReconcileInterval, func(ctx context.Context) { m.classPass(ctx, cs) })(ContextWithCaller(ctx, CallerReconcile))
	}
	m.locked(lockReaper, m.cfg.ReapInterval, m.reap)(ContextWithCaller(ctx, CallerReaper))
	m.locked(lockOrphans, m.cfg.OrphanInterval, m.sweepOrphans)(ContextWithCaller(ctx, CallerOrphans))

	done := make(chan struct{})
	go func() { // ends when the launches do; Close waits for them too
		m.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		return fmt.Errorf("run background work once: wait for launches: %w", ctx.Err())
	}
	m.unlockAll(ContextWithCaller(context.WithoutCancel(ctx), CallerLifecycle))
	return nil
}
