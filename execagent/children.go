package execagent

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

// childTable is the agent's table of OS children: it starts every child
// (exec runs, session shells, background processes) in its own process
// group, tracks the children whose Wait is pending and the groups it owns,
// signals those groups without ever hitting a reused id, and reaps the
// zombies nobody else will wait for. (The API's background processes, by id
// and name, are processTable's.)
//
// The known trap: a blanket wait4(-1) in a reaper races exec.Cmd.Wait and
// steals exit statuses. Here a child is started and registered while holding
// mu, and the reaper holds mu while it reaps, and reaps only children that
// are not registered; a registered child is unregistered only when its Wait
// reaps it. So the reaper never touches a child whose status someone waits
// for.
//
// Ids are reused (pid_max may be 32768 on a busy host): kill(-pgid) is only
// safe while the group's leader is unreaped (its pid, and so the group id,
// stays reserved) or while members of the group are alive. wait therefore
// first waits for the leader to exit without reaping it (waitid WNOWAIT),
// then reaps it while holding mu, and signalGroup holds mu too: a group whose
// leader is unreaped is signaled directly; after that only when no process
// has the leader's pid (had the group emptied and the id been reused, that
// process would exist).
type childTable struct {
	log      *slog.Logger
	oom      oomCounter   // the OOM kills of the agent's memory cgroup (cgroup.go)
	oomScore oomScore     // children's oom_score_adj (limits.go)
	pidsMax  int          // the cgroup's pids limit (0: none known)
	refused  atomic.Int64 // unix ns of the last "could not start" log line

	mu      sync.Mutex
	tracked map[int]struct{} // pids whose Wait is pending
	groups  map[int]*group   // process groups the agent started and has not seen empty
	closed  bool
}

// group is one process group the agent started (its id is the leader's pid).
type group struct {
	leaderReaped bool
}

// newChildTable returns the table of a new agent. It reserves OS threads
// for the agent (reserveThreads: a share of the sandbox's pids limit) and
// reads what the kernel tells about the sandbox's limits.
func newChildTable(log *slog.Logger) *childTable {
	selfCgroup, _ := os.ReadFile("/proc/self/cgroup") // unreadable: no counter, no OOM flags
	pids := pidsMax(selfCgroup, cgroupRoot)
	reserveThreads(threadReserve(pids))
	return &childTable{log: log, oom: findOOMCounter(selfCgroup, cgroupRoot), oomScore: readOOMScore(), pidsMax: pids,
		tracked: map[int]struct{}{}, groups: map[int]*group{}}
}

// errPidsLimit: a child could not start, the sandbox is at its limit of
// processes.
var errPidsLimit = errors.New("at the limit of processes")

// startFailed returns the error of a start that failed with err: the 503
// pids_limit answer, naming the limit, when the fork failed with EAGAIN
// (logged by startRefused); err itself otherwise.
func (t *childTable) startFailed(err error) error {
	if !errors.Is(err, unix.EAGAIN) {
		return err
	}
	t.startRefused(err)
	limit := "its limit of processes"
	if t.pidsMax > 0 {
		limit = fmt.Sprintf("its pids limit (%d processes and threads)", t.pidsMax)
	}
	return statusError(errPidsLimit, http.StatusServiceUnavailable, agentapi.CodePidsLimit,
		"the sandbox is at %s: nothing can start until some exit; retry, or kill every process of the sandbox", limit)
}

// refusedLogEvery bounds how often a refused start is logged.
const refusedLogEvery = 10 * time.Second

// startRefused logs (at most every refusedLogEvery) that a fork failed
// with EAGAIN: the sandbox is at a limit on processes, its pids limit in a
// container. The line tells the sandbox's log, and so the reason of a
// sandbox that is lost later, what happened.
func (t *childTable) startRefused(err error) {
	now := time.Now().UnixNano()
	last := t.refused.Load()
	if now-last < int64(refusedLogEvery) || !t.refused.CompareAndSwap(last, now) {
		return
	}
	t.log.Warn("a command could not start: the sandbox is at its limit of processes", "pids_max", t.pidsMax, "err", err)
}

// oomKilled reports whether a command that started at m and ended with
// code and sig was OOM-killed (oomCounter.killedSince), and logs the OOM
// kills the cgroup counted while it ran (pid is the command's): what the
// sandbox's log then says when it is lost later.
func (t *childTable) oomKilled(m oomMark, code int, sig string, pid int) bool {
	killed := t.oom.killedSince(m, code, sig)
	if n, ok := t.oom.read(); ok && m.ok && n > m.n {
		t.log.Warn("the kernel's OOM killer killed processes of the sandbox", "oom_kills", n-m.n, "while_pid", pid, "the_command", killed)
	}
	return killed
}

// start starts cmd in its own process group, with childOOMScoreAdj, and
// registers it. cmd must set Env explicitly (never nil) so the agent's
// environment is not inherited, and its stdio must be nil or *os.File (so
// Wait never waits for copying).
func (t *childTable) start(cmd *exec.Cmd) error {
	if cmd.Env == nil {
		return errors.New("start process: Env must be set")
	}
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	// A new session (a PTY's program) is its own process group already,
	// and setpgid would fail for a session leader.
	cmd.SysProcAttr.Setpgid = !cmd.SysProcAttr.Setsid
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return errClosed
	}
	if err := cmd.Start(); err != nil {
		return t.startFailed(err)
	}
	pid := cmd.Process.Pid
	t.oomScore.raise(pid)
	t.tracked[pid] = struct{}{}
	t.groups[pid] = &group{}
	return nil
}

// wait waits for a child started by start, reaps and unregisters it. Its
// process group stays registered (for signals and Close) while other
// members are alive.
func (t *childTable) wait(cmd *exec.Cmd) (*os.ProcessState, error) {
	pid := cmd.Process.Pid
	waitExited(pid)
	t.mu.Lock()
	defer t.mu.Unlock()
	err := cmd.Wait()
	delete(t.tracked, pid)
	if g := t.groups[pid]; g != nil {
		g.leaderReaped = true
		if t.groupGoneLocked(pid) {
			delete(t.groups, pid)
		}
	}
	return cmd.ProcessState, err
}

// waitExited blocks until child pid has exited, without reaping it. It
// waits for the child's pidfd in the runtime's poller (Linux 5.3+), so a
// running command holds no OS thread: a blocking wait holds one, and when
// a sandbox is at its pids limit (a fork bomb) the runtime cannot create
// the next thread it needs and dies ("failed to create new OS thread",
// exit code 2). Without pidfds it blocks in waitid.
func waitExited(pid int) {
	if pollExited(pid) {
		return
	}
	var info unix.Siginfo
	for {
		err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if !errors.Is(err, unix.EINTR) {
			return
		}
	}
}

// pollExited waits in the poller until child pid has exited (without
// reaping it) and reports true, or reports false at once when the kernel
// cannot do that (no pidfd_open or P_PIDFD).
func pollExited(pid int) bool {
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		return false
	}
	f := os.NewFile(uintptr(fd), "pidfd") // non-blocking: registered with the poller
	defer f.Close()
	rc, err := f.SyscallConn()
	if err != nil {
		return false
	}
	waited := false
	err = rc.Read(func(fd uintptr) bool {
		var info unix.Siginfo
		err := unix.Waitid(unix.P_PIDFD, int(fd), &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil)
		if errors.Is(err, unix.EINTR) {
			return false
		}
		waited = err == nil
		return err != nil || info.Signo != 0 // exited; or no waiting here (the caller's waitid decides)
	})
	return err == nil && waited
}

// hasExited reports whether child pid, which nobody has reaped yet, has
// exited (without reaping it). A pid that is no longer a child (reaped
// meanwhile) has exited too.
func hasExited(pid int) bool {
	var info unix.Siginfo
	err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil)
	return err != nil || info.Signo != 0
}

// pidExists reports whether a process (or zombie) with this pid exists.
func pidExists(pid int) bool {
	err := unix.Kill(pid, 0)
	return err == nil || errors.Is(err, unix.EPERM)
}

// groupGoneLocked reports whether registered group pgid has no member left
// (or its id was reused). t.mu is held.
func (t *childTable) groupGoneLocked(pgid int) bool {
	g := t.groups[pgid]
	if g == nil {
		return true
	}
	if !g.leaderReaped {
		return false
	}
	if pidExists(pgid) {
		return true // the group emptied and its id now names another process
	}
	return errors.Is(unix.Kill(-pgid, 0), unix.ESRCH)
}

// groupAlive reports whether the process group the agent started with
// leader pgid still has a member (its leader may have exited).
func (t *childTable) groupAlive(pgid int) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.groupGoneLocked(pgid) {
		delete(t.groups, pgid)
		return false
	}
	return true
}

// signalGroup sends sig to the process group the agent started with leader
// pgid. It reports false when the group has no member left (then nothing is
// signaled).
func (t *childTable) signalGroup(pgid int, sig syscall.Signal) (bool, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.signalGroupLocked(pgid, sig)
}

func (t *childTable) signalGroupLocked(pgid int, sig syscall.Signal) (bool, error) {
	if pgid <= 1 {
		return false, fmt.Errorf("signal process group %d: refusing", pgid)
	}
	if t.groupGoneLocked(pgid) {
		delete(t.groups, pgid)
		return false, nil
	}
	if err := unix.Kill(-pgid, sig); err != nil {
		if errors.Is(err, unix.ESRCH) {
			delete(t.groups, pgid)
			return false, nil
		}
		return false, fmt.Errorf("signal process group %d: %w", pgid, err)
	}
	return true, nil
}

// signalLeader sends sig to the tracked (unreaped) child pid only.
func (t *childTable) signalLeader(pid int, sig syscall.Signal) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.tracked[pid]; ok {
		_ = unix.Kill(pid, sig)
	}
}

// killGroup sends sig to a group the agent started; a group that is gone is
// not an error.
func (t *childTable) killGroup(pgid int, sig syscall.Signal) {
	if _, err := t.signalGroup(pgid, sig); err != nil {
		t.log.Warn("signal process group", "pgid", pgid, "signal", signalName(sig), "err", err)
	}
}

// killAll sends SIGKILL to every registered process group and refuses
// later starts.
func (t *childTable) killAll() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closed = true
	for pgid := range t.groups {
		if _, err := t.signalGroupLocked(pgid, unix.SIGKILL); err != nil {
			t.log.Warn("kill process group on shutdown", "pgid", pgid, "err", err)
		}
	}
}

// settle reaps what killAll left behind until every process group the agent
// started is gone, or ctx is done (a process stuck in the kernel).
func (t *childTable) settle(ctx context.Context) {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		t.reapOrphans()
		t.mu.Lock()
		left := len(t.groups)
		t.mu.Unlock()
		if left == 0 {
			return
		}
		select {
		case <-ctx.Done():
			t.log.Warn("process groups left after shutdown", "groups", left)
			return
		case <-tick.C:
		}
	}
}

// reapOrphans reaps every zombie child that is not tracked, and forgets
// process groups that are empty. It returns the number of children reaped.
func (t *childTable) reapOrphans() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	for pgid := range t.groups {
		if t.groupGoneLocked(pgid) {
			delete(t.groups, pgid)
		}
	}
	reaped := 0
	for _, pid := range listChildren() {
		if _, ok := t.tracked[pid]; ok {
			continue
		}
		var ws unix.WaitStatus
		got, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil)
		if err == nil && got == pid {
			reaped++
		}
	}
	return reaped
}

// listChildren returns the pids of the agent's children (running or zombie):
// from /proc/self/task/*/children when the kernel has it, else by scanning
// /proc for processes whose parent is the agent.
func listChildren() []int {
	tasks, err := os.ReadDir("/proc/self/task")
	if err == nil {
		var pids []int
		ok := true
		for _, task := range tasks {
			b, err := os.ReadFile("/proc/self/task/" + task.Name() + "/children")
			if err != nil {
				if errors.Is(err, os.ErrNotExist) && task.Name() == strconv.Itoa(os.Getpid()) {
					ok = false // no CONFIG_PROC_CHILDREN
					break
				}
				continue // the thread ended
			}
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil {
					pids = append(pids, pid)
				}
			}
		}
		if ok {
			return pids
		}
	}
	return scanChildren(os.Getpid())
}

// scanChildren scans /proc for processes whose parent is ppid.
func scanChildren(ppid int) []int {
	return scanProc(func(f procStat) bool { return f.ppid == ppid })
}

// groupMembers lists the processes of process group pgid.
func groupMembers(pgid int) []int {
	return scanProc(func(f procStat) bool { return f.pgrp == pgid })
}

// procStat holds the fields of /proc/<pid>/stat the agent uses.
type procStat struct {
	pid, ppid, pgrp int
	sid             int    // session id
	state           byte   // 'R', 'S', 'D', 'Z', ...
	start           uint64 // start time (clock ticks after boot): with pid, names one process
	threads         int    // its threads (what a pids limit counts)
	exit            int    // a zombie's wait status (Linux 3.5+); -1 when the kernel does not say
}

// dead reports whether the process has exited (a zombie awaiting its reaper).
func (p procStat) dead() bool { return p.state == 'Z' || p.state == 'X' }

// killedBy reports whether the process, dead, died of sig (true as well
// when the kernel does not say how it died).
func (p procStat) killedBy(sig syscall.Signal) bool { return p.exit < 0 || p.exit&0x7f == int(sig) }

// scanProc returns the pids of the processes in /proc that match.
func scanProc(match func(procStat) bool) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, ok := readProcStat(pid); ok && match(st) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// readProcStat reads /proc/<pid>/stat; ok is false when the process is
// gone (or the file is not as expected).
func readProcStat(pid int) (procStat, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, false
	}
	// pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt
	// majflt cmajflt utime stime cutime cstime priority nice threads
	// itrealvalue starttime ... exit_code (the 52nd); comm may contain
	// spaces and parens.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return procStat{}, false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 || len(f[0]) != 1 {
		return procStat{}, false
	}
	ppid, err1 := strconv.Atoi(f[1])
	pgrp, err2 := strconv.Atoi(f[2])
	sid, _ := strconv.Atoi(f[3])
	threads, _ := strconv.Atoi(f[17])
	start, err3 := strconv.ParseUint(f[19], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return procStat{}, false
	}
	exit := -1
	if len(f) >= 50 {
		if n, err := strconv.Atoi(f[49]); err == nil {
			exit = n
		}
	}
	return procStat{pid: pid, ppid: ppid, pgrp: pgrp, sid: sid, state: f[0][0], start: start, threads: threads, exit: exit}, true
}

// reapSignaled runs on SIGCHLD: it peeks at the first zombie child without
// reaping it (waitid WNOWAIT) and reaps it when it is not tracked, until
// there is no zombie or the first one is tracked (its Wait reaps it; any
// other orphan waits for the next signal or the periodic full sweep). This
// keeps the common case — a tracked command exiting — to one system call.
func (t *childTable) reapSignaled() {
	for range 256 { // bounded: the sweep catches the rest
		pid := peekZombie()
		if pid <= 0 {
			return
		}
		t.mu.Lock()
		if _, ok := t.tracked[pid]; ok {
			t.mu.Unlock()
			return
		}
		var ws unix.WaitStatus
		_, _ = unix.Wait4(pid, &ws, unix.WNOHANG, nil)
		t.mu.Unlock()
	}
}

// peekZombie returns the pid of a zombie child without reaping it, or 0.
func peekZombie() int {
	var info unix.Siginfo
	if err := unix.Waitid(unix.P_ALL, 0, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil); err != nil {
		return 0 // ECHILD: no children
	}
	if info.Signo == 0 {
		return 0 // children, but no zombie
	}
	// si_pid follows si_signo, si_errno, si_code and, on 64-bit
	// platforms, 4 bytes of padding.
	raw := (*[unsafe.Sizeof(info)]byte)(unsafe.Pointer(&info))
	off := 3 * unsafe.Sizeof(int32(0))
	if unsafe.Sizeof(uintptr(0)) == 8 {
		off = 16
	}
	return int(int32(binary.NativeEndian.Uint32(raw[off : off+4])))
}

// runReaper reaps untracked zombies on every SIGCHLD (reapSignaled) and
// with a full sweep every interval (reapOrphans) until ctx is done. It makes the process a child subreaper unless
// noSubreaper, so orphans of sandbox commands are reparented to the agent
// (as they are to PID 1 in a container).
func (t *childTable) runReaper(ctx context.Context, interval time.Duration, noSubreaper bool) {
	if !noSubreaper {
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			t.log.Warn("become child subreaper", "err", err)
		}
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, unix.SIGCHLD)
	defer signal.Stop(sigs)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	t.reapOrphans()
	for {
		select {
		case <-ctx.Done():
			return
		case <-sigs:
			t.reapSignaled()
		case <-tick.C:
			t.reapOrphans()
		}
	}
}
