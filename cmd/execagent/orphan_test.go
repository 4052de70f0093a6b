package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

// orphanWait bounds how long an orphaned agent may take to exit: a few
// check intervals of the tests' 100 ms, on a busy machine.
const orphanWait = 10 * time.Second

// exitsWithin reports whether p exits within d, and fails the test when it
// exited with an error.
func (p *agentProc) exitsWithin(t *testing.T, d time.Duration) bool {
	t.Helper()
	select {
	case <-p.done:
		require.NoError(t, p.waitErr, "stderr: %s", p.stderr.String())
		return true
	case <-time.After(d):
		return false
	}
}

// startSleeper starts a background `sleep 1000` in the agent and returns its pid.
func startSleeper(t *testing.T, c *agentapi.Client) int {
	t.Helper()
	pr, err := c.StartProcess(context.Background(), agentapi.ProcessStartRequest{Command: "sleep 1000"})
	require.NoError(t, err)
	return pr.PID
}

// An agent whose owner directory is removed exits and kills what it
// started, leased or not: nothing will ever stop it otherwise.
func TestRun_OwnerDirGoneKillsChildrenAndExits(t *testing.T) {
	owner := filepath.Join(t.TempDir(), "task")
	require.NoError(t, os.Mkdir(owner, 0o700))
	p := startAgent(t, "QUARRY_AGENT_TOKEN=tok", "QUARRY_AGENT_OWNER_DIR="+owner, "QUARRY_AGENT_OWNER_CHECK_INTERVAL=100ms")
	c := agentapi.New("http://"+p.addr, "tok", nil)
	_, err := c.Init(context.Background(), agentapi.InitRequest{LeaseID: "lease-1", Generation: 1})
	require.NoError(t, err)
	child := startSleeper(t, c.WithGeneration(1))

	assert.False(t, p.exitsWithin(t, time.Second), "an agent whose owner directory exists runs on")
	require.NoError(t, os.RemoveAll(owner))
	require.True(t, p.exitsWithin(t, orphanWait), "the agent did not exit after its owner directory went; stderr: %s", p.stderr.String())
	assert.Contains(t, p.stderr.String(), "owner directory")
	assert.Eventually(t, func() bool { return gone(child) }, waitLong, 5*time.Millisecond, "the agent's child %d survived it", child)
}

// An agent that holds no lease and gets no call for QUARRY_AGENT_IDLE_EXIT
// exits (killing what it started); a leased agent never does, whoever calls
// it, until its lease is fenced.
func TestRun_IdleUnleasedAgentExits(t *testing.T) {
	const idle = "QUARRY_AGENT_IDLE_EXIT=600ms"
	const check = "QUARRY_AGENT_OWNER_CHECK_INTERVAL=100ms"

	t.Run("never initialized", func(t *testing.T) {
		p := startAgent(t, "QUARRY_AGENT_TOKEN=tok", idle, check)
		child := startSleeper(t, agentapi.New("http://"+p.addr, "tok", nil))
		require.True(t, p.exitsWithin(t, orphanWait), "an idle agent that was never leased runs on; stderr: %s", p.stderr.String())
		assert.Contains(t, p.stderr.String(), "holds no lease")
		assert.Eventually(t, func() bool { return gone(child) }, waitLong, 5*time.Millisecond, "the agent's child %d survived it", child)
	})

	t.Run("leased, then fenced", func(t *testing.T) {
		p := startAgent(t, "QUARRY_AGENT_TOKEN=tok", idle, check)
		c := agentapi.New("http://"+p.addr, "tok", nil)
		_, err := c.Init(context.Background(), agentapi.InitRequest{LeaseID: "lease-1", Generation: 1})
		require.NoError(t, err)
		child := startSleeper(t, c.WithGeneration(1))
		assert.False(t, p.exitsWithin(t, 2*time.Second), "a leased agent runs on without calls (its gateway may be restarting)")

		// The manager fences an ended lease's agent: same lease id, next generation.
		_, err = c.Init(context.Background(), agentapi.InitRequest{LeaseID: "lease-1", Generation: 2})
		require.NoError(t, err)
		require.True(t, p.exitsWithin(t, orphanWait), "an idle agent whose lease was fenced runs on; stderr: %s", p.stderr.String())
		assert.Eventually(t, func() bool { return gone(child) }, waitLong, 5*time.Millisecond, "the agent's child %d survived it", child)
	})
}
