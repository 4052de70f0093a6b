//go:build integration

package tests

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/client"
	"github.com/quarryhq/quarry/execagent/agentapi"
)

// dockerRunaway are the pools of the runaway suites: a small memory (OOM),
// and a pids limit below what the memory holds (a fork bomb meets the pids
// limit first).
const dockerRunaway = `pools:
  - name: small
    image: quarry-test/busybox:latest
    memory: 64Mi
    min_warm: 1
    max_total: 2
  - name: forks
    image: quarry-test/bash:latest
    memory: 512Mi
    min_warm: 1
    max_total: 2
    options:
      pids_limit: "200"
`

// A command the OOM killer kills is flagged as such, on exec and on
// process results, and the sandbox lives on.
func TestDocker_OOMKilledIsFlagged(t *testing.T) {
	d := requireDocker(t)
	g := d.startGateway(dockerRunaway)
	g.waitReady("small", 1)
	c, ctx := g.client(), ctx(t)
	sbx, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Pool: "small"})
	require.NoError(t, err)

	// tail keeps everything after the last newline: /dev/zero has none.
	res, err := c.Exec(ctx, sbx.ID, agentapi.ExecRequest{Command: "head -c 600m /dev/zero | tail"})
	require.NoError(t, err)
	assert.Equal(t, 137, res.ExitCode, "the shell reports its command's SIGKILL: %+v", res)
	assert.True(t, res.OOMKilled, "flagged: %+v", res)
	assert.False(t, res.TimedOut)

	p, err := c.StartProcess(ctx, sbx.ID, agentapi.ProcessStartRequest{Argv: []string{"sh", "-c", "exec tail < /dev/zero"}})
	require.NoError(t, err)
	var info agentapi.ProcessInfo
	eventually(t, dockerWait, "the process is killed", func() error {
		info, err = c.GetProcess(ctx, sbx.ID, p.ID)
		if err == nil && info.State != agentapi.ProcessExited {
			return assert.AnError
		}
		return err
	})
	assert.Equal(t, "SIGKILL", info.Signal)
	assert.True(t, info.OOMKilled, "flagged: %+v", info)

	res, err = c.Exec(ctx, sbx.ID, agentapi.ExecRequest{Command: "echo ok"})
	require.NoError(t, err)
	assert.Equal(t, "ok\n", res.Stdout)
	assert.False(t, res.OOMKilled)
	got, err := c.GetSandbox(ctx, sbx.ID)
	require.NoError(t, err)
	assert.Equal(t, client.StateActive, got.State)
}
