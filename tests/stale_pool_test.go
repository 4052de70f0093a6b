//go:build integration

package tests

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/client"
	"github.com/quarryhq/quarry/execagent/agentapi"
)

// The newcomer's sequence: `make run` (process provider), stop it, then
// `QUARRY_PROVIDER=docker QUARRY_POOLS_FILE=scripts/images/pools.yaml make
// run` in the same data dir. The second gateway never hands out a task of
// the process provider (it used to give a root shell on the host), stops
// the old ready agents with the process provider, and keeps the lease held
// on an old task working until it is released, when its agent stops too.
func TestStalePool_ProcessThenDockerInOneDataDir(t *testing.T) {
	needDocker(t, dockerImagePython) // scripts/images/pools.yaml's python pool
	d := requireDocker(t)
	dataDir := t.TempDir()
	host, err := os.Hostname()
	require.NoError(t, err)

	first := startMakeRunIn(t, dataDir, "QUARRY_GATEWAY_ID="+d.gatewayID)
	c := first.client()
	held, err := c.CreateSandbox(ctx(t), client.CreateSandboxRequest{Pool: "default"})
	require.NoError(t, err)
	// Its agent leads the session of every command (the process provider).
	res, err := c.Exec(ctx(t), held.ID, agentapi.ExecRequest{Command: "hostname; cut -d' ' -f6 /proc/self/stat"})
	require.NoError(t, err)
	fields := strings.Fields(res.Stdout)
	require.Len(t, fields, 2, "%q", res.Stdout)
	require.Equal(t, host, fields[0], "the first gateway's sandboxes are host processes")
	heldPID, err := strconv.Atoi(fields[1])
	require.NoError(t, err)
	eventually(t, time.Minute, "the process pool is warm again (min_warm 2)", func() error {
		ps, err := c.Pools(ctx(t))
		if err != nil {
			return err
		}
		if ps[0].Ready < 2 {
			return fmt.Errorf("ready=%d", ps[0].Ready)
		}
		return nil
	})
	old := readTasks(t, dataDir)
	require.Len(t, old, 3, "the held task and two ready ones")
	require.Contains(t, pids(old), heldPID, "the held lease's agent is among the process tasks")
	first.stop()

	second := startMakeRunIn(t, dataDir, "QUARRY_GATEWAY_ID="+d.gatewayID,
		"QUARRY_PROVIDER=docker", "QUARRY_POOLS_FILE=scripts/images/pools.yaml")
	c = second.client()
	for i := range 4 { // more than the two old ready tasks
		sbx, err := c.CreateSandbox(ctx(t), client.CreateSandboxRequest{Pool: "default"})
		require.NoError(t, err, "create %d", i)
		res, err := c.Exec(ctx(t), sbx.ID, agentapi.ExecRequest{Command: "hostname; id -u"})
		require.NoError(t, err)
		lines := strings.Fields(res.Stdout)
		require.Len(t, lines, 2, "%q", res.Stdout)
		assert.NotEqual(t, host, lines[0], "sandbox %d of the docker pool runs on the host", i)
		d.containerOf(lines[0]) // fails the test unless it is one of this gateway's containers
		assert.NotEqual(t, "0", lines[1], "a docker sandbox is not root")
	}

	// The old ready agents are stopped by the process provider; the held
	// one keeps working until its lease ends.
	eventually(t, time.Minute, "the old ready agents are gone", func() error {
		for _, tf := range old {
			if tf.PID != heldPID && isAgent(tf.PID) {
				return fmt.Errorf("agent of %s (pid %d) still runs", tf.Name, tf.PID)
			}
		}
		return nil
	})
	res, err = c.Exec(ctx(t), held.ID, agentapi.ExecRequest{Command: "hostname"})
	require.NoError(t, err, "a lease held on an old task keeps working")
	assert.Equal(t, host, strings.TrimSpace(res.Stdout))
	_, err = c.DeleteSandbox(ctx(t), held.ID)
	require.NoError(t, err)
	eventually(t, time.Minute, "the released old agent is gone", func() error {
		if isAgent(heldPID) {
			return fmt.Errorf("agent pid %d still runs", heldPID)
		}
		return nil
	})
	assert.Empty(t, readTasks(t, dataDir), "no process task is left in the data dir")
}

func pids(tasks []taskFile) []int {
	out := make([]int, len(tasks))
	for i, tf := range tasks {
		out[i] = tf.PID
	}
	return out
}
