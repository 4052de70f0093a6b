package execagent

import (
	"context"
	"errors"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

// maxPidWait bounds one wait of POST /v1/pids/{pid}/wait.
const maxPidWait = 10 * time.Minute

// handlePidWait serves POST /v1/pids/{pid}/wait: it answers when process
// pid of the sandbox is gone (exited and reaped: "kill -0" no longer finds
// it), when the timeout has passed, or when the caller leaves; with a
// marker that does not exist, at once (Skipped). ROCK's nohup commands are
// polled with "kill -0 PID" every five seconds: the gateway holds such a
// poll here until the command ends (docs/ROCK.md).
func (s *Server) handlePidWait(w http.ResponseWriter, r *http.Request) error {
	pid, err := strconv.Atoi(r.PathValue("pid"))
	if err != nil || pid < 1 {
		return invalid("pid", "must be a process id (a positive number), got %q", r.PathValue("pid"))
	}
	var req agentapi.PidWaitRequest
	if err := s.decodeJSON(w, r, &req); err != nil {
		return err
	}
	if req.TimeoutMS < 0 || time.Duration(req.TimeoutMS)*time.Millisecond > maxPidWait {
		return invalid("timeout_ms", "must be between 0 and %d", maxPidWait.Milliseconds())
	}
	marker := ""
	if req.Marker != "" {
		m, err := s.resolvePath("marker", req.Marker)
		if err != nil {
			return err
		}
		if !marks(m, pid) {
			writeJSON(w, http.StatusOK, agentapi.PidWaitResult{Skipped: true, Exited: !pidExists(pid)})
			return nil
		}
		marker = m
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(r.Context(), time.Duration(req.TimeoutMS)*time.Millisecond)
	defer cancel()
	gone := waitGone(ctx, pid)
	if gone && marker != "" {
		_ = os.Remove(marker)
	}
	writeJSON(w, http.StatusOK, agentapi.PidWaitResult{Exited: gone, WaitedMS: time.Since(start).Milliseconds()})
	return nil
}

// marks reports whether the file marker exists and names process pid: the
// process (when it still exists) started no later than the marker was
// written, give or take the second of the boot time's precision; a later
// process that reuses the pid is not the one marked.
func marks(marker string, pid int) bool {
	fi, err := os.Stat(marker)
	if err != nil {
		return false
	}
	st, ok := readProcStat(pid)
	if !ok {
		return true // gone: nothing to wait for, and the answer is at once
	}
	boot := bootTime()
	if boot.IsZero() {
		return true
	}
	started := boot.Add(time.Duration(st.start) * time.Second / userHZ)
	return !started.After(fi.ModTime().Add(time.Second))
}

// userHZ is the unit of /proc's clock ticks (USER_HZ, 100 on every Linux
// architecture the agent is built for).
const userHZ = 100

// bootTime is when the system booted (/proc/stat's btime), zero when
// unknown.
var bootTime = sync.OnceValue(func() time.Time {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return time.Time{}
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "btime "); ok {
			if secs, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil {
				return time.Unix(secs, 0)
			}
		}
	}
	return time.Time{}
})

// waitGone waits until no process pid exists (it exited and its parent
// reaped it) and reports true, or reports false when ctx ends first. It
// waits for the process's exit on a pidfd in the runtime's poller (no
// thread, no polling), then for its reaping, which its parent does at once
// (a zombie still answers kill -0), looking again after 1 ms, doubling up
// to 50 ms; without pidfds it looks that way all along.
func waitGone(ctx context.Context, pid int) bool {
	if !pidExists(pid) {
		return true
	}
	if fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK); err == nil {
		f := os.NewFile(uintptr(fd), "pidfd") // non-blocking: registered with the poller
		waitReadable(ctx, f)
		_ = f.Close()
	}
	for d := time.Millisecond; ; d = min(2*d, 50*time.Millisecond) {
		if !pidExists(pid) {
			return true
		}
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return !pidExists(pid)
		case <-t.C:
		}
	}
}

// waitReadable blocks until f, a pidfd, is readable (its process has
// terminated) or ctx ends.
func waitReadable(ctx context.Context, f *os.File) {
	rc, err := f.SyscallConn()
	if err != nil {
		return
	}
	stop := context.AfterFunc(ctx, func() { _ = f.SetReadDeadline(time.Now()) })
	defer stop()
	_ = rc.Read(func(fd uintptr) bool {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, 0)
		return ctx.Err() != nil || err != nil && !errors.Is(err, unix.EINTR) || n > 0 && fds[0].Revents != 0
	})
}
