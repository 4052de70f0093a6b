package execagent

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

// startJob starts "sleep" in the background of a session, marks it the way
// ROCK's rewritten nohup start does (": > marker" right after "&"), and
// returns its pid and the marker; the job ends when the file release
// appears.
func startJob(t *testing.T, a *testAgent, sid string) (pid int, marker, release string) {
	t.Helper()
	dir := t.TempDir()
	marker, release = filepath.Join(dir, "job.mark"), filepath.Join(dir, "release")
	res := run(t, a, sid, "( while [ ! -e "+release+" ]; do sleep 0.01; done ) > /dev/null 2>&1 & : > "+marker+"; echo $!", 0)
	pid, err := strconv.Atoi(strings.TrimSpace(res.Output))
	require.NoError(t, err, res.Output)
	return pid, marker, release
}

// A wait answers when the marked job exits and is reaped (kill -0 no longer
// finds it), and removes the marker.
func TestPidWait_AnswersWhenTheJobIsGone(t *testing.T) {
	a := newTestAgent(t, nil)
	sid := newSession(t, a, agentapi.SessionCreateRequest{})
	pid, marker, release := startJob(t, a, sid)

	done := make(chan agentapi.PidWaitResult, 1)
	go func() {
		res, err := a.client.WaitPid(context.Background(), pid, agentapi.PidWaitRequest{TimeoutMS: waitLong.Milliseconds(), Marker: marker})
		assert.NoError(t, err)
		done <- res
	}()
	select {
	case res := <-done:
		t.Fatalf("answered while the job runs: %+v", res)
	default:
	}
	require.True(t, pidExists(pid))
	require.NoError(t, os.WriteFile(release, nil, 0o600))
	res := <-done
	assert.True(t, res.Exited)
	assert.False(t, res.Skipped)
	assert.False(t, pidExists(pid), "kill -0 fails once the wait answered")
	assert.NoFileExists(t, marker)
	check := run(t, a, sid, "kill -0 "+strconv.Itoa(pid)+" 2>&1; echo rc=$?", 0)
	assert.Contains(t, check.Output, "rc=1")
}

// A wait with a timeout answers at the timeout while the job runs, with
// the job alive.
func TestPidWait_TimeoutAnswersAlive(t *testing.T) {
	a := newTestAgent(t, nil)
	sid := newSession(t, a, agentapi.SessionCreateRequest{})
	pid, marker, release := startJob(t, a, sid)
	defer func() { _ = os.WriteFile(release, nil, 0o600) }()
	res, err := a.client.WaitPid(context.Background(), pid, agentapi.PidWaitRequest{TimeoutMS: 50, Marker: marker})
	require.NoError(t, err)
	assert.False(t, res.Exited)
	assert.GreaterOrEqual(t, res.WaitedMS, int64(50))
	assert.True(t, pidExists(pid))
	assert.FileExists(t, marker, "the marker stays while the job runs")
}

// Without its marker, or with a marker older than the process (a later
// process with a reused pid), nothing is waited for.
func TestPidWait_UnmarkedProcessesAreNotWaitedFor(t *testing.T) {
	a := newTestAgent(t, nil)
	sid := newSession(t, a, agentapi.SessionCreateRequest{})
	res := run(t, a, sid, "sleep 1000 > /dev/null 2>&1 & echo $!", 0)
	pid, err := strconv.Atoi(strings.TrimSpace(res.Output))
	require.NoError(t, err)
	defer func() { _ = syscall.Kill(pid, syscall.SIGKILL) }()

	noMarker := filepath.Join(t.TempDir(), "none")
	got, err := a.client.WaitPid(context.Background(), pid, agentapi.PidWaitRequest{TimeoutMS: waitLong.Milliseconds(), Marker: noMarker})
	require.NoError(t, err)
	assert.True(t, got.Skipped)
	assert.False(t, got.Exited)

	stale := filepath.Join(t.TempDir(), "stale")
	require.NoError(t, os.WriteFile(stale, nil, 0o600))
	old := time.Now().Add(-time.Hour)
	require.NoError(t, os.Chtimes(stale, old, old))
	got, err = a.client.WaitPid(context.Background(), pid, agentapi.PidWaitRequest{TimeoutMS: waitLong.Milliseconds(), Marker: stale})
	require.NoError(t, err)
	assert.True(t, got.Skipped, "a marker written before the process started names another process")

	gone, err := a.client.WaitPid(context.Background(), 4194000, agentapi.PidWaitRequest{TimeoutMS: waitLong.Milliseconds(), Marker: stale})
	require.NoError(t, err)
	assert.True(t, gone.Exited, "no such process: answered at once")
}

// A caller that leaves ends its wait; bad input is refused.
func TestPidWait_CallerLeavesAndBadInput(t *testing.T) {
	a := newTestAgent(t, nil)
	sid := newSession(t, a, agentapi.SessionCreateRequest{})
	pid, marker, release := startJob(t, a, sid)
	defer func() { _ = os.WriteFile(release, nil, 0o600) }()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := a.client.WaitPid(ctx, pid, agentapi.PidWaitRequest{TimeoutMS: waitLong.Milliseconds(), Marker: marker})
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.True(t, pidExists(pid), "a wait that ends leaves the job alone")

	for _, tc := range []struct {
		name string
		pid  int
		req  agentapi.PidWaitRequest
	}{
		{name: "negative timeout", pid: pid, req: agentapi.PidWaitRequest{TimeoutMS: -1}},
		{name: "timeout over the limit", pid: pid, req: agentapi.PidWaitRequest{TimeoutMS: maxPidWait.Milliseconds() + 1}},
		{name: "pid 0", pid: 0, req: agentapi.PidWaitRequest{TimeoutMS: 1}},
		{name: "pid not a number", pid: -5, req: agentapi.PidWaitRequest{TimeoutMS: 1}},
		{name: "marker with a NUL byte", pid: pid, req: agentapi.PidWaitRequest{TimeoutMS: 1, Marker: "a\x00b"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := a.client.WaitPid(context.Background(), tc.pid, tc.req)
			var ae *agentapi.Error
			require.ErrorAs(t, err, &ae)
			assert.Equal(t, http.StatusBadRequest, ae.Status, err)
		})
	}
}
