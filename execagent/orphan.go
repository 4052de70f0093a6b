package execagent

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// ErrOrphaned is why an agent that found nothing owning it any more stops
// (Server.Orphaned); the reason wraps it.
var ErrOrphaned = errors.New("nothing owns this agent any more")

// orphanWatch learns whether anything still owns the agent: the owner
// directory (Config.OwnerDir) exists, or the agent holds a lease, or an
// authenticated call came within Config.IdleExit. Safe for concurrent use.
type orphanWatch struct {
	lastCall atomic.Int64 // unix ns when the last authenticated call began or ended
	inFlight atomic.Int64 // authenticated calls being served

	once   sync.Once
	done   chan struct{} // closed when orphaned
	reason error
}

func newOrphanWatch(now time.Time) *orphanWatch {
	w := &orphanWatch{done: make(chan struct{})}
	w.lastCall.Store(now.UnixNano())
	return w
}

// call records an authenticated call; the returned function records its end.
func (w *orphanWatch) call() func() {
	w.inFlight.Add(1)
	w.lastCall.Store(time.Now().UnixNano())
	return func() {
		w.lastCall.Store(time.Now().UnixNano())
		w.inFlight.Add(-1)
	}
}

// idleSince returns since when no authenticated call was served (zero while
// one is).
func (w *orphanWatch) idleSince() time.Time {
	if w.inFlight.Load() > 0 {
		return time.Time{}
	}
	return time.Unix(0, w.lastCall.Load())
}

// orphan marks the agent orphaned for reason (once).
func (w *orphanWatch) orphan(reason error) {
	w.once.Do(func() {
		w.reason = reason
		close(w.done)
	})
}

// Orphaned returns a channel that is closed when the agent finds that
// nothing owns it any more (then OrphanReason says why): its
// Config.OwnerDir is gone, or it holds no lease and got no authenticated
// call for Config.IdleExit. The server keeps serving; its owner (the
// binary) should Close it, which kills every process it started.
func (s *Server) Orphaned() <-chan struct{} { return s.orphan.done }

// OrphanReason is why the agent is orphaned (wrapping ErrOrphaned), or nil
// while it is not.
func (s *Server) OrphanReason() error {
	select {
	case <-s.orphan.done:
		return s.orphan.reason
	default:
		return nil
	}
}

// holdsLease reports whether the agent serves a lease: it was initialized
// and its last init did not end the lease (see initEndsLease).
func (s *Server) holdsLease() bool {
	s.leaseMu.Lock()
	defer s.leaseMu.Unlock()
	return s.initDone && !s.leaseEnded
}

// initEndsLease reports whether, after an init of leaseID at generation
// gen, the agent holds no lease: an init without a lease id, or one that
// keeps the current lease id and raises the generation, which is how the
// manager fences an ended lease's agent (a claim always brings a new lease
// id). A retry of the current generation changes nothing. Called with
// leaseMu held, before the init is applied.
func (s *Server) initEndsLease(leaseID string, gen int64) bool {
	if s.initDone && gen == s.generation {
		return s.leaseEnded
	}
	return leaseID == "" || s.initDone && leaseID == s.leaseID
}

// watchOwner checks every OwnerCheckInterval, until ctx is done, whether
// the agent is orphaned (orphanCheck), and marks it so when it is.
func (s *Server) watchOwner(ctx context.Context) {
	t := time.NewTicker(s.cfg.OwnerCheckInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			if err := s.orphanCheck(now); err != nil {
				s.log.Warn("exec agent orphaned", "reason", err)
				s.orphan.orphan(err)
				return
			}
		}
	}
}

// orphanCheck returns why the agent is orphaned at now, or nil. A leased
// agent is owned whether or not any gateway calls it: leases outlive
// gateway restarts.
func (s *Server) orphanCheck(now time.Time) error {
	if dir := s.cfg.OwnerDir; dir != "" {
		if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("its owner directory %s is gone: %w", dir, ErrOrphaned)
		}
	}
	if s.holdsLease() {
		return nil
	}
	if since := s.orphan.idleSince(); !since.IsZero() && now.Sub(since) >= s.cfg.IdleExit {
		return fmt.Errorf("it holds no lease and got no call for %s (QUARRY_AGENT_IDLE_EXIT): %w",
			now.Sub(since).Round(time.Second), ErrOrphaned)
	}
	return nil
}
