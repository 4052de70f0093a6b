package gateway

import (
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gofiber/fiber/v2"
)

// leaveWatch notices that a client closed its connection while the agent
// still works for it: from disconnectPoll on, it peeks at the client's
// socket every disconnectPoll (one timer that re-arms itself; no goroutine
// waits between peeks), and the first time it finds the socket closed it
// runs leave once. Its methods are safe for concurrent use.
type leaveWatch struct {
	conn  net.Conn
	leave func()

	mu      sync.Mutex
	t       *time.Timer
	stopped bool
	wg      sync.WaitGroup // a leave in progress
	gone    atomic.Bool    // the client left (leave ran or runs)
}

// watchLeave starts a watch of conn's client that runs leave when it goes.
func watchLeave(conn net.Conn, leave func()) *leaveWatch {
	w := &leaveWatch{conn: conn, leave: leave}
	w.mu.Lock()
	w.t = time.AfterFunc(disconnectPoll, w.check)
	w.mu.Unlock()
	return w
}

func (w *leaveWatch) check() {
	w.mu.Lock()
	if w.stopped {
		w.mu.Unlock()
		return
	}
	if !peerClosed(w.conn) {
		w.t.Reset(disconnectPoll)
		w.mu.Unlock()
		return
	}
	w.gone.Store(true)
	w.wg.Add(1)
	w.mu.Unlock()
	defer w.wg.Done()
	w.leave()
}

// left reports whether the client was found gone (never, for a nil watch).
func (w *leaveWatch) left() bool { return w != nil && w.gone.Load() }

// stop ends the watch and waits for a leave in progress. Idempotent; a nil
// watch (none was started) does nothing.
func (w *leaveWatch) stop() {
	if w == nil {
		return
	}
	w.mu.Lock()
	w.stopped = true
	w.t.Stop()
	w.mu.Unlock()
	w.wg.Wait()
}

// cancelIfClientLeaves watches c's client while the agent runs call callID
// (answered whole or streamed): when the client closes its connection, the
// agent is asked to cancel the call (DELETE /v1/calls/{id}), so the command
// stops (a followed output stops following) and a session is free for the
// client's retry, instead of running to its timeout for nobody. A stream
// learns of a gone client only when a write fails, which on a quiet stream
// waits for the agent's next keep-alive; the watch does not wait. The many
// calls that end within disconnectPoll cost a timer and nothing else. The
// caller stops the watch when the call is over.
func (g *Gateway) cancelIfClientLeaves(c *fiber.Ctx, agent *sandboxAgent, callID string) *leaveWatch {
	return watchLeave(c.Context().Conn(), func() {
		if err := agent.cancel(callID); err != nil {
			g.log.Debug("cancel agent call", "sandbox", agent.id, "call", callID, "err", err)
		}
	})
}
