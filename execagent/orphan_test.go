package execagent

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

// orphaned reports whether the agent is orphaned within d.
func orphaned(a *testAgent, d time.Duration) bool {
	select {
	case <-a.srv.Orphaned():
		return true
	case <-time.After(d):
		return false
	}
}

func TestServer_Init_WhetherTheAgentHoldsALease(t *testing.T) {
	a := newTestAgent(t, nil)
	assert.False(t, a.srv.holdsLease(), "never initialized")
	steps := []struct {
		name  string
		init  agentapi.InitRequest
		holds bool
	}{
		{"claim", agentapi.InitRequest{LeaseID: "l1", Generation: 1}, true},
		{"retry of the claim's init", agentapi.InitRequest{LeaseID: "l1", Generation: 1}, true},
		{"fence: same lease, next generation", agentapi.InitRequest{LeaseID: "l1", Generation: 2}, false},
		{"retry of the fence", agentapi.InitRequest{LeaseID: "l1", Generation: 2}, false},
		{"the next claim", agentapi.InitRequest{LeaseID: "l2", Generation: 3}, true},
		{"no lease id", agentapi.InitRequest{Generation: 4}, false},
		{"a claim after that", agentapi.InitRequest{LeaseID: "l3", Generation: 5}, true},
	}
	for _, st := range steps {
		_, err := a.client.Init(context.Background(), st.init)
		require.NoError(t, err, st.name)
		assert.Equal(t, st.holds, a.srv.holdsLease(), st.name)
	}
}

func TestServer_Orphaned_WhenTheOwnerDirIsGone(t *testing.T) {
	owner := filepath.Join(t.TempDir(), "task")
	require.NoError(t, os.Mkdir(owner, 0o700))
	a := newTestAgent(t, func(c *Config) { c.OwnerDir, c.OwnerCheckInterval = owner, 20*time.Millisecond })
	_, err := a.client.Init(context.Background(), agentapi.InitRequest{LeaseID: "l1", Generation: 1})
	require.NoError(t, err)
	assert.False(t, orphaned(a, 200*time.Millisecond))
	assert.NoError(t, a.srv.OrphanReason())

	require.NoError(t, os.Remove(owner))
	require.True(t, orphaned(a, waitLong), "a leased agent whose owner directory is gone is orphaned")
	assert.ErrorIs(t, a.srv.OrphanReason(), ErrOrphaned)
	assert.Contains(t, a.srv.OrphanReason().Error(), owner)
	_, err = a.client.Health(context.Background())
	assert.NoError(t, err, "an orphaned agent serves until its owner closes it")
}

func TestServer_Orphaned_IdleCountsFromTheLastCallsEnd(t *testing.T) {
	a := newTestAgent(t, func(c *Config) { c.IdleExit, c.OwnerCheckInterval = 300*time.Millisecond, 20*time.Millisecond })
	// A call that lasts longer than IdleExit keeps the agent owned while it runs.
	res, err := a.client.Exec(context.Background(), agentapi.ExecRequest{Command: "sleep 0.6"})
	require.NoError(t, err)
	require.Equal(t, 0, res.ExitCode)
	ended := time.Now()
	select {
	case <-a.srv.Orphaned():
		require.Fail(t, "orphaned while a call was in flight, or sooner than IdleExit after it ended")
	case <-time.After(200 * time.Millisecond):
	}
	require.True(t, orphaned(a, waitLong), "an idle agent with no lease is orphaned")
	assert.GreaterOrEqual(t, time.Since(ended), 250*time.Millisecond, "IdleExit (300 ms) after the call ended, less the answer's way back")
	assert.Contains(t, a.srv.OrphanReason().Error(), "holds no lease")
}
