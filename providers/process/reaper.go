package process

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// reapBackstop is how often the reaper looks for exited children even
// without a SIGCHLD (signals coalesce; this is only a safety net).
const reapBackstop = 2 * time.Second

// child is an agent this Provider started, and so must reap.
type child struct {
	pid    int
	mu     sync.Mutex
	reaped bool
	status string // how it ended, once reaped
}

// tryReap collects the child's exit status if it has exited, without
// blocking. It reports whether the child is gone and how it ended. Once a
// child is reaped its pid is never waited for again (it may be reused).
func (c *child) tryReap() (bool, string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.reaped {
		return true, c.status
	}
	var ws unix.WaitStatus
	for {
		pid, err := unix.Wait4(c.pid, &ws, unix.WNOHANG, nil)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil: // ECHILD: not our child any more; nothing to reap
			c.reaped, c.status = true, "exit status unknown"
		case pid == 0:
			return false, ""
		default:
			c.reaped, c.status = true, exitStatus(ws)
		}
		return true, c.status
	}
}

// done reports whether the child has been reaped.
func (c *child) done() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.reaped
}

func exitStatus(ws unix.WaitStatus) string {
	if ws.Signaled() {
		return "killed by " + unix.SignalName(ws.Signal())
	}
	return fmt.Sprintf("exit status %d", ws.ExitStatus())
}

// reaper reaps the agents this Provider started, so that they do not stay
// zombies while the gateway lives. Agents started by an earlier gateway
// process are not our children: their new parent (init or a subreaper)
// reaps them, and liveness is then decided from /proc alone.
//
// One goroutine, started by start and stopped by close, reaps on SIGCHLD
// and every reapBackstop. Callers may also reap a child directly.
type reaper struct {
	logger *slog.Logger

	mu       sync.Mutex
	children map[string]*child // by task name

	stop chan struct{}
	wg   sync.WaitGroup
}

func newReaper(logger *slog.Logger) *reaper {
	return &reaper{logger: logger, children: make(map[string]*child), stop: make(chan struct{})}
}

func (r *reaper) start() {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGCHLD)
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer signal.Stop(sigs)
		tick := time.NewTicker(reapBackstop)
		defer tick.Stop()
		for {
			select {
			case <-r.stop:
				return
			case <-sigs:
			case <-tick.C:
			}
			r.reapAll()
		}
	}()
}

// close stops the reaping goroutine and waits for it. Children stay alive.
func (r *reaper) close() {
	close(r.stop)
	r.wg.Wait()
}

func (r *reaper) reapAll() {
	r.mu.Lock()
	names := make(map[string]*child, len(r.children))
	for n, c := range r.children {
		names[n] = c
	}
	r.mu.Unlock()
	for n, c := range names {
		if c.done() {
			continue
		}
		if gone, status := c.tryReap(); gone {
			r.logger.Debug("agent exited", "task", n, "pid", c.pid, "status", status)
		}
	}
}

// add registers a child started for task name.
func (r *reaper) add(name string, pid int) *child {
	c := &child{pid: pid}
	r.mu.Lock()
	r.children[name] = c
	r.mu.Unlock()
	return c
}

// get returns the child started for task name with this pid, or nil when
// this Provider did not start it.
func (r *reaper) get(name string, pid int) *child {
	r.mu.Lock()
	defer r.mu.Unlock()
	if c := r.children[name]; c != nil && c.pid == pid {
		return c
	}
	return nil
}

// forget drops the child of task name once it has been reaped.
func (r *reaper) forget(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if c := r.children[name]; c != nil {
		if gone, _ := c.tryReap(); gone {
			delete(r.children, name)
		}
	}
}
