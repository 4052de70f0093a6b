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
// rounds (killRound) until none is left, not even a zombie, or until
// killAllTimeout, and waits (within the same bound) until the sessions and
// processes they were have ended. It returns once what it killed has been
// reaped: the pids are free again (a sandbox at its pids limit starts
// commands at once) and no process group shows a member (group_running).
//
// As PID 1 of the sandbox's pid namespace the agent uses kill(-1), which
// the kernel sends to every other process of the namespace at once, so
// nothing forks past it. Otherwise its processes are those below it in the
// process tree (orphans are reparented to the agent, its subreaper): it
// kills each process group it started at once (kill(-pgid): a process that
// forks and exits faster than the agent reads /proc stays in its group),
// and each process it sees through a pidfd after checking its start time,
// so a pid that was reused by a process of the host is never signaled.
func (s *Server) killAll(ctx context.Context) agentapi.KillAllResult {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, killAllTimeout)
	defer cancel()
	self := os.Getpid()
	killed := killedSet{}
	left := 0
	tick := time.NewTicker(killAllRound)
	defer tick.Stop()
rounds:
	for s.children.killRound(self, killed) > 0 {
		s.children.reapOrphans()
		select {
		case <-tick.C:
		case <-ctx.Done():
			left = s.children.running(self)
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
	res := agentapi.KillAllResult{Killed: len(killed), Threads: killed.threads(), Left: left, DurationMS: time.Since(start).Milliseconds()}
	s.log.Warn("killed every process of the sandbox", "killed", res.Killed, "threads", res.Threads, "left", res.Left, "took_ms", res.DurationMS)
	return res
}

// procKey names one process: its pid and its start time.
type procKey struct {
	pid   int
	start uint64
}

func (p procStat) key() procKey { return procKey{pid: p.pid, start: p.start} }

// killedSet holds the processes a kill-all killed, with their threads.
type killedSet map[procKey]int

// add records p, which the kill reached, with the most threads seen.
func (k killedSet) add(p procStat) { k[p.key()] = max(k[p.key()], p.threads, 1) }

// threads returns the threads of every process in the set.
func (k killedSet) threads() int {
	n := 0
	for _, t := range k {
		n += t
	}
	return n
}

// killRound is one round of kill-all. It sends SIGKILL to the processes
// of the sandbox that run, adds to killed every process the kill reached,
// and returns how many processes, running or zombie, the sandbox had before
// it (none: kill-all is done). It holds mu throughout, so the agent neither
// starts nor reaps a child meanwhile: what the kill reached stays in /proc,
// a zombie at least, for the second look to count — the processes a fork
// bomb forked between the first look and the kill too (kill(-1) and
// kill(-pgid) reach a fork in progress: the kernel fails a fork whose
// parent has a SIGKILL pending). Counted: what ran before the kill, however
// it ended (a shell whose children were killed first may finish its
// script and exit before its own SIGKILL lands: kill-all ended it all the
// same), also when it has gone since (its parent, in wait(), reaped it
// before it died itself); and what was forked meanwhile and died of
// SIGKILL. Not counted: what was a zombie before the kill, and what was
// forked meanwhile and exited by itself.
func (t *childTable) killRound(self int, killed killedSet) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	before := sandboxProcesses(self)
	ran := make(map[procKey]procStat, len(before))
	zombies := make(map[procKey]bool, len(before))
	for _, p := range before {
		if p.dead() {
			zombies[p.key()] = true
		} else {
			ran[p.key()] = p
		}
	}
	if len(ran) == 0 {
		return len(before) // nothing runs: the zombies are the reaper's
	}
	if self == 1 {
		_ = unix.Kill(-1, unix.SIGKILL)
	} else {
		for pgid := range t.groups {
			if _, err := t.signalGroupLocked(pgid, unix.SIGKILL); err != nil {
				t.log.Warn("kill process group", "pgid", pgid, "err", err)
			}
		}
		for _, p := range ran {
			killProcess(p)
		}
	}
	for _, p := range sandboxProcesses(self) {
		r, wasRunning := ran[p.key()]
		if wasRunning {
			delete(ran, p.key())
			p.threads = max(p.threads, r.threads)
		}
		if zombies[p.key()] || (p.dead() && !wasRunning && !p.killedBy(unix.SIGKILL)) {
			continue
		}
		killed.add(p)
	}
	for _, p := range ran { // gone since the first look
		killed.add(p)
	}
	return len(before)
}

// running returns how many processes of the sandbox run (zombies left out).
func (t *childTable) running(self int) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, p := range sandboxProcesses(self) {
		if !p.dead() {
			n++
		}
	}
	return n
}

// sandboxProcesses returns the processes of the sandbox but the agent
// (self), zombies included: every other process in /proc when the agent is
// PID 1 (its pid namespace is the sandbox's), else the agent's
// descendants.
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
	return all
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
