package execagent

import (
	"context"
	"sync"
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
