package execagent

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

// A command that exited before its deadline keeps its own result even when
// the agent sees the exit late: under a fork bomb the reaper holds the
// child table while it sweeps zombies, and the exec's wait cannot reap
// until it lets go. It was reported as timed_out with exit_code 0.
func TestExec_ExitSeenAfterTheDeadlineIsNoTimeout(t *testing.T) {
	a := newTestAgent(t, nil)
	s := a.srv
	spec, err := s.commandSpec("echo ok", nil, nil, "")
	require.NoError(t, err)
	var stdout capBuffer
	stdout.max = 1 << 10
	var mu sync.Mutex
	rc, err := s.startCommand(spec, func(stream int, b []byte) {
		mu.Lock()
		defer mu.Unlock()
		if stream == streamStdout {
			stdout.write(b)
		}
	})
	require.NoError(t, err)
	pid := rc.cmd.Process.Pid
	s.children.mu.Lock() // the reaper is busy: nothing is reaped meanwhile
	eventually(t, func() bool { return processState(pid) == "Z" }, "the command exits")
	released := make(chan struct{})
	go func() {
		defer close(released)
		time.Sleep(400 * time.Millisecond) // well past the deadline
		s.children.mu.Unlock()
	}()
	out := rc.wait(context.Background(), 100*time.Millisecond)
	<-released
	assert.False(t, out.timedOut, "it exited before its deadline")
	assert.Equal(t, 0, out.exitCode)
	assert.Empty(t, out.signal)
	mu.Lock()
	assert.Equal(t, "ok\n", string(stdout.buf))
	mu.Unlock()
}

// A session run that times out never reports exit code 0, even when the
// shell itself exits 0 on the interrupt.
func TestSession_Run_TimedOutIsNeverExitZero(t *testing.T) {
	a := newTestAgent(t, nil)
	id := newSession(t, a, agentapi.SessionCreateRequest{})
	res := run(t, a, id, "trap 'exit 0' INT; sleep 1000", 200)
	assert.True(t, res.TimedOut)
	assert.True(t, res.Closed, "the trap ended the shell")
	assert.Equal(t, exitInterrupted, res.ExitCode, "a timed-out run is not a success")
}

// kill-all kills everything the agent started and what that started in
// turn: a session's shell and its background job, a process's children
// that left its group (setsid), a running exec; sessions end, processes
// show SIGKILL, and the sandbox runs commands again at once.
func TestKillAll_KillsEveryProcessButTheAgent(t *testing.T) {
	a := newTestAgent(t, nil)
	ctx := context.Background()
	sid := newSession(t, a, agentapi.SessionCreateRequest{})
	job := run(t, a, sid, "sleep 1000 & echo $!", 0)
	jobPID, err := strconv.Atoi(strings.TrimSpace(job.Output))
	require.NoError(t, err, job.Output)

	pidFile := filepath.Join(a.cfg.Workdir, "escaped.pid")
	p, err := a.client.StartProcess(ctx, agentapi.ProcessStartRequest{
		Command: "setsid sh -c 'echo $$ > " + pidFile + "; for i in 1 2 3 4 5 6 7 8; do sleep 1000 & done; wait' & wait"})
	require.NoError(t, err)
	var escaped int
	eventually(t, func() bool {
		b, err := os.ReadFile(pidFile)
		escaped, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil && escaped > 0
	}, "the escaped shell starts")

	execStarted := filepath.Join(a.cfg.Workdir, "exec.started")
	execDone := make(chan agentapi.ExecResult, 1)
	go func() {
		// A builtin marks the start: touch would be a 14th process, still
		// running (and so killed) when kill-all comes on a loaded machine.
		res, _ := a.client.Exec(ctx, agentapi.ExecRequest{Command: ": > " + execStarted + "; exec sleep 1000", TimeoutMS: 600_000})
		execDone <- res
	}()
	eventually(t, func() bool { return len(groupMembers(escaped)) == 9 }, "the escaped shell's children start")
	eventually(t, func() bool { _, err := os.Stat(execStarted); return err == nil }, "the exec starts")
	members := groupMembers(escaped)

	res, err := a.client.KillAll(ctx)
	require.NoError(t, err)
	assert.Equal(t, 13, res.Killed, "shell, job, process, escaped shell and 8 children, exec: %+v", res)
	assert.Zero(t, res.Left)

	for _, pid := range append(members, jobPID, p.PID) {
		assert.True(t, processDead(pid), "pid %d survived", pid)
	}
	sessions, err := a.client.ListSessions(ctx)
	require.NoError(t, err)
	assert.Empty(t, sessions, "sessions end with their shells")
	info, err := a.client.GetProcess(ctx, p.ID)
	require.NoError(t, err)
	assert.Equal(t, agentapi.ProcessExited, info.State)
	assert.Equal(t, "SIGKILL", info.Signal)
	select {
	case r := <-execDone:
		assert.Equal(t, "SIGKILL", r.Signal, "the running exec was killed")
		assert.False(t, r.TimedOut)
	case <-time.After(waitLong):
		t.Fatal("the running exec did not return")
	}

	after, err := a.client.Exec(ctx, agentapi.ExecRequest{Command: "echo ok"})
	require.NoError(t, err)
	assert.Equal(t, "ok\n", after.Stdout)
	newSession(t, a, agentapi.SessionCreateRequest{})

	res, err = a.client.KillAll(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, res.Killed, "only the new session's shell: %+v", res)
}

func TestKillAll_BodyIsEmptyOrEmptyObject(t *testing.T) {
	a := newTestAgent(t, nil)
	ctx := context.Background()
	require.NoError(t, a.client.Do(ctx, http.MethodPost, agentapi.RouteKillAll, struct{}{}, nil))
	err := a.client.Do(ctx, http.MethodPost, agentapi.RouteKillAll, map[string]any{"signal": "TERM"}, nil)
	ae := apiError(t, err)
	assert.Equal(t, http.StatusBadRequest, ae.Status)
	assert.Contains(t, ae.Message, "kill-all takes no fields")
}

func TestDescendants_OnlyTheAgentsTree(t *testing.T) {
	all := []procStat{
		{pid: 2, ppid: 1}, {pid: 10, ppid: 2}, // the host's
		{pid: 100, ppid: 50}, {pid: 101, ppid: 100}, {pid: 102, ppid: 101}, {pid: 103, ppid: 50},
		{pid: 200, ppid: 1}, // an orphan the agent is not the subreaper of
	}
	var got []int
	for _, p := range descendants(50, all) {
		got = append(got, p.pid)
	}
	assert.ElementsMatch(t, []int{100, 101, 102, 103}, got)
}

// A pid whose start time is not the one seen belongs to another process
// now (the pid was reused): it is never signaled.
func TestKillProcess_LeavesAReusedPidAlone(t *testing.T) {
	cmd := exec.Command("sleep", "1000")
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	st, ok := readProcStat(cmd.Process.Pid)
	require.True(t, ok)
	killProcess(procStat{pid: st.pid, start: st.start + 1})
	time.Sleep(50 * time.Millisecond)
	assert.Equal(t, "S", processState(cmd.Process.Pid), "not the process that was seen")
	killProcess(st)
	eventually(t, func() bool { return processDead(cmd.Process.Pid) }, "the process that was seen is killed")
}

// A process whose leader exited while what it started still runs (a fork
// bomb's first shell returns at once) says so: its exit code is the
// leader's, and group_running is true until the group is empty.
func TestProcess_GroupRunningAfterTheLeaderExited(t *testing.T) {
	a := newTestAgent(t, func(c *Config) { c.DrainTimeout = 50 * time.Millisecond })
	ctx := context.Background()
	p, err := a.client.StartProcess(ctx, agentapi.ProcessStartRequest{Command: "sleep 1000 & exit 0"})
	require.NoError(t, err)
	var info agentapi.ProcessInfo
	eventually(t, func() bool {
		info, err = a.client.GetProcess(ctx, p.ID)
		return err == nil && info.State == agentapi.ProcessExited
	}, "the leader exits")
	require.NotNil(t, info.ExitCode)
	assert.Equal(t, 0, *info.ExitCode)
	assert.True(t, info.GroupRunning, "its background sleep still runs")

	_, err = a.client.KillAll(ctx)
	require.NoError(t, err)
	info, err = a.client.GetProcess(ctx, p.ID)
	require.NoError(t, err)
	assert.False(t, info.GroupRunning)
}

// A start that fails with EAGAIN (the sandbox is at its pids limit) is a
// retryable 503 pids_limit that names the limit, not a 500 with the fork's
// error.
func TestStart_AtThePidsLimitNamesTheLimit(t *testing.T) {
	fork := &os.SyscallError{Syscall: "fork/exec /bin/bash", Err: syscall.EAGAIN}
	for _, tc := range []struct {
		name    string
		pidsMax int
		want    string
	}{
		{name: "cgroup limit known", pidsMax: 200,
			want: "the sandbox is at its pids limit (200 processes and threads): nothing can start until some exit; retry, or kill every process of the sandbox"},
		{name: "no cgroup limit", pidsMax: 0,
			want: "the sandbox is at its limit of processes: nothing can start until some exit; retry, or kill every process of the sandbox"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tbl := &childTable{log: slog.New(slog.DiscardHandler), pidsMax: tc.pidsMax}
			err := startError("start command", []string{"bash"}, nil, tbl.startFailed(fork))
			status, code, msg := classify(err)
			assert.Equal(t, http.StatusServiceUnavailable, status)
			assert.Equal(t, agentapi.CodePidsLimit, code)
			assert.Equal(t, tc.want, msg)
		})
	}
	other := errors.New("fork/exec /bin/nope: no such file or directory")
	assert.Same(t, other, (&childTable{}).startFailed(other), "other errors pass")
}
