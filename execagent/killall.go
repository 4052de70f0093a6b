package execagent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

const (
	// killAllTimeout bounds the rounds of a kill-all.
	killAllTimeout = 10 * time.Second
	// killAllRound is the pause between its rounds: the killed exit and
	// are reaped meanwhile.
	killAllRound = 5 * time.Millisecond
)

// handleKillAll answers POST /v1/kill-all (agentapi.KillAllResult). The
// body is empty or {}.
func (s *Server) handleKillAll(w http.ResponseWriter, r *http.Request) error {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxJSONBody))
	if err != nil {
		return fmt.Errorf("read request body: %w", err)
	}
	if len(bytes.TrimSpace(body)) > 0 {
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.DisallowUnknownFields()
		var none struct{}
		if err := dec.Decode(&none); err != nil {
			return invalid("body", "kill-all takes no fields (an empty body or {}): %s", err.Error())
		}
	}
	writeJSON(w, http.StatusOK, s.killAll(r.Context()))
	return nil
}

// killAll sends SIGKILL to every process of the sandbox but the agent, in
// rounds until none runs (a fork bomb forks between a round's look and its
// kill; what it forked dies in the next round) or killAllTimeout, reaps
// them, and waits (within the same bound) until the sessions and processes
// they were have ended.
//
// As PID 1 of the sandbox's pid namespace the agent uses kill(-1), which
// the kernel sends to every other process of the namespace at once, so
// nothing forks past it. Otherwise its processes are those below it in the
// process tree (orphans are reparented to the agent, its subreaper); each
// is killed through a pidfd after checking its start time, so a pid that
// was reused by a process of the host is never signaled.
func (s *Server) killAll(ctx context.Context) agentapi.KillAllResult {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, killAllTimeout)
	defer cancel()
	self := os.Getpid()
	killed := map[procStat]bool{}
	left := 0
	tick := time.NewTicker(killAllRound)
	defer tick.Stop()
rounds:
	for {
		alive := sandboxProcesses(self)
		if len(alive) == 0 {
			break
		}
		for _, p := range alive {
			killed[procStat{pid: p.pid, start: p.start}] = true
		}
		if self == 1 {
			_ = unix.Kill(-1, unix.SIGKILL)
		} else {
			for _, p := range alive {
				killProcess(p)
			}
		}
		s.children.reapOrphans()
		select {
		case <-tick.C:
		case <-ctx.Done():
			left = len(sandboxProcesses(self))
			break rounds
		}
	}
	var ends []<-chan struct{} // a session's shell reaped, a process's exit recorded
	for _, ss := range lockedValues(&s.sessions.mu, s.sessions.m) {
		ends = append(ends, ss.exited)
	}
	for _, p := range lockedValues(&s.processes.mu, s.processes.m) {
		ends = append(ends, p.done)
	}
	waitAll(ctx, ends)
	res := agentapi.KillAllResult{Killed: len(killed), Left: left, DurationMS: time.Since(start).Milliseconds()}
	s.log.Warn("killed every process of the sandbox", "killed", res.Killed, "left", res.Left, "took_ms", res.DurationMS)
	return res
}

// sandboxProcesses returns the running processes of the sandbox but the
// agent (self): every other process in /proc when the agent is PID 1 (its
// pid namespace is the sandbox's), else the agent's descendants. Zombies
// are left out: they have exited.
func sandboxProcesses(self int) []procStat {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	all := make([]procStat, 0, len(ents))
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		if st, ok := readProcStat(pid); ok {
			all = append(all, st)
		}
	}
	if self != 1 {
		all = descendants(self, all)
	}
	out := all[:0]
	for _, p := range all {
		if !p.dead() {
			out = append(out, p)
		}
	}
	return out
}

// descendants returns the processes of all that are below root in the
// process tree.
func descendants(root int, all []procStat) []procStat {
	children := make(map[int][]procStat, len(all))
	for _, p := range all {
		children[p.ppid] = append(children[p.ppid], p)
	}
	var out []procStat
	queue := []int{root}
	for len(queue) > 0 {
		pid := queue[0]
		queue = queue[1:]
		for _, c := range children[pid] {
			out = append(out, c)
			queue = append(queue, c.pid)
		}
	}
	return out
}

// killProcess sends SIGKILL to p if it is still the process that was seen
// (same pid and start time): through a pidfd, which names one process
// whatever happens to its pid, where the kernel has them.
func killProcess(p procStat) {
	fd, err := unix.PidfdOpen(p.pid, 0)
	if err != nil {
		if errors.Is(err, unix.ESRCH) {
			return // gone
		}
		if st, ok := readProcStat(p.pid); ok && st.start == p.start {
			_ = unix.Kill(p.pid, unix.SIGKILL) // no pidfds: a small window for a reused pid remains
		}
		return
	}
	defer unix.Close(fd)
	if st, ok := readProcStat(p.pid); ok && st.start == p.start {
		_ = unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
	}
}

// lockedValues returns the values of m, read holding mu.
func lockedValues[K comparable, V any](mu *sync.Mutex, m map[K]V) []V {
	mu.Lock()
	defer mu.Unlock()
	return slices.Collect(maps.Values(m))
}

// waitAll waits until every channel of done is closed, or ctx is done.
func waitAll(ctx context.Context, done []<-chan struct{}) {
	for _, d := range done {
		select {
		case <-d:
		case <-ctx.Done():
			return
		}
	}
}
