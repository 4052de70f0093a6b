//go:build integration

package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
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
  - name: tiny
    image: quarry-test/busybox:latest
    memory: 32Mi
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

// runawaySandbox starts a gateway on the runaway pools and leases a
// sandbox of pool.
func runawaySandbox(t *testing.T, pool string) (*dockerTest, *client.Client, context.Context, client.Sandbox) {
	t.Helper()
	d := requireDocker(t)
	g := d.startGateway(dockerRunaway)
	g.waitReady(pool, 1)
	c, ctx := g.client(), ctx(t)
	sbx, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Pool: pool})
	require.NoError(t, err)
	return d, c, ctx, sbx
}

// A command the OOM killer kills is flagged as such, on exec and on
// process results, and the sandbox lives on.
func TestDocker_OOMKilledIsFlagged(t *testing.T) {
	_, c, ctx, sbx := runawaySandbox(t, "small")

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

// A fork bomb meets the pool's pids limit. The agent outlives it, answers
// honestly meanwhile (a command that cannot start is a retryable 503
// pids_limit that names the limit and kill-all, one that ran never reports
// exit 0 with timed_out), and kill-all recovers the sandbox on the same
// lease: echo ok answers 0 at once.
func TestDocker_ForkBombKillAllRecovers(t *testing.T) {
	d, c, ctx, sbx := runawaySandbox(t, "forks")

	h, err := c.Exec(ctx, sbx.ID, agentapi.ExecRequest{Command: "hostname"})
	require.NoError(t, err)
	ctr := d.containerOf(h.Stdout)
	// Every copy forks copies of itself forever: the sandbox stays at its
	// pids limit (a classic :(){ :|:& };: may die down as its forks fail).
	bomb, err := c.StartProcess(ctx, sbx.ID, agentapi.ProcessStartRequest{Command: "b() { while :; do b & done; }; b"})
	require.NoError(t, err)
	eventually(t, dockerWait, "the bomb reaches the pids limit", func() error {
		st, err := d.cli.ContainerStatsOneShot(ctx, ctr)
		if err != nil {
			return err
		}
		defer st.Body.Close()
		var stats container.StatsResponse
		if err := json.NewDecoder(st.Body).Decode(&stats); err != nil {
			return err
		}
		if stats.PidsStats.Current < 190 {
			return fmt.Errorf("%d processes", stats.PidsStats.Current)
		}
		return nil
	})

	// Commands while the sandbox is at its pids limit: each is refused or
	// runs (the bomb's forks fail too, and free pids); the agent stays up.
	var wg sync.WaitGroup
	var refused atomic.Int32
	for range 3 {
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res, err := c.Exec(ctx, sbx.ID, agentapi.ExecRequest{Command: "echo ok", TimeoutMS: 3000})
				if err != nil {
					var cerr *client.Error
					require.ErrorAs(t, err, &cerr)
					assert.Equal(t, 503, cerr.Status, "a command that cannot start, not a dead agent: %v", err)
					assert.Equal(t, agentapi.CodePidsLimit, cerr.Code)
					assert.Equal(t, "the sandbox is at its pids limit (200 processes and threads): nothing can start until some exit; "+
						"retry, or kill every process of the sandbox (POST /v1/sandboxes/"+sbx.ID+"/kill-all)", cerr.Message)
					assert.Positive(t, cerr.RetryAfter)
					refused.Add(1)
					return
				}
				assert.False(t, res.TimedOut && res.ExitCode == 0, "timed out yet exit 0: %+v", res)
			}()
		}
		wg.Wait()
		time.Sleep(500 * time.Millisecond)
	}
	assert.Positive(t, refused.Load(), "at the limit, some command could not start")
	got, err := c.GetSandbox(ctx, sbx.ID)
	require.NoError(t, err)
	require.Equal(t, client.StateActive, got.State, "the agent outlived the bomb: %s", got.Reason)

	killed, err := c.KillAll(ctx, sbx.ID)
	require.NoError(t, err)
	assert.Greater(t, killed.Killed, 150, "the bomb's processes: %+v", killed)
	assert.Zero(t, killed.Left)

	start := time.Now()
	res, err := c.Exec(ctx, sbx.ID, agentapi.ExecRequest{Command: "echo ok"})
	require.NoError(t, err)
	assert.Equal(t, 0, res.ExitCode)
	assert.Equal(t, "ok\n", res.Stdout)
	assert.Less(t, time.Since(start), 2*time.Second, "fast again")
	info, err := c.GetProcess(ctx, sbx.ID, bomb.ID)
	require.NoError(t, err)
	assert.Equal(t, agentapi.ProcessExited, info.State)
	assert.Equal(t, "SIGKILL", info.Signal)
	assert.False(t, info.GroupRunning, "nothing of the bomb runs")
	got, err = c.GetSandbox(ctx, sbx.ID)
	require.NoError(t, err)
	assert.Equal(t, client.StateActive, got.State, "the same lease")
}

// A sandbox whose agent the OOM killer took is lost with a reason that
// says so, with its memory limit and the end of the agent's log (which
// names the OOM kills the agent saw before).
func TestDocker_LostToOOMReasonNamesItWithTheLogTail(t *testing.T) {
	_, c, ctx, sbx := runawaySandbox(t, "tiny")
	// First a command the OOM killer takes while the agent lives on (tail
	// keeps all of /dev/zero, which has no newline): the agent writes its
	// account of it into its log. Without it the agent's account came
	// only if the kernel killed the agent in the second call below, not in
	// the first (timing: it took the first once in a loaded make test).
	res, err := c.Exec(ctx, sbx.ID, agentapi.ExecRequest{Command: "head -c 600m /dev/zero | tail"})
	require.NoError(t, err)
	require.True(t, res.OOMKilled, "the command, not the agent: %+v", res)
	// /dev/shm (Docker's 64 MiB tmpfs) keeps its pages in the container's
	// 64 MiB (memory + work directory) after dd is killed; then the agent
	// itself needs memory for a large output, and only it is left to kill.
	// Which call the kernel kills the agent in depends on timing (the
	// page cache of /dev/shm and the agent's own pages race): on a busy
	// machine it may be the first.
	_, err = c.Exec(ctx, sbx.ID, agentapi.ExecRequest{Command: "dd if=/dev/zero of=/dev/shm/fill bs=1M count=70 2>/dev/null; true"})
	if err == nil {
		_, err = c.Exec(ctx, sbx.ID, agentapi.ExecRequest{Command: "head -c 40m /dev/zero", MaxOutputBytes: 64 << 20})
	}
	require.Error(t, err, "the agent dies answering")

	var got client.Sandbox
	eventually(t, dockerWait, "the lease is lost", func() error {
		got, err = c.GetSandbox(ctx, sbx.ID)
		if err != nil {
			return err
		}
		if got.State != client.StateLost {
			return fmt.Errorf("state %s", got.State)
		}
		return nil
	})
	t.Logf("reason: %s", got.Reason)
	assert.Contains(t, got.Reason, "exited with code 137 (killed for running out of memory: the kernel's OOM killer, at the container's limit of 64 MiB")
	assert.Contains(t, got.Reason, "; its log ends: ")
	assert.Contains(t, got.Reason, "the kernel's OOM killer killed processes of the sandbox", "the agent's own account")
}

// kill-all counts what it killed against a known number: two programs of
// 100 threads each and a shell with 50 sleeps are 53 processes of 253
// threads (what a pids limit counts).
func TestDocker_KillAllCountsProcessesAndThreads(t *testing.T) {
	d := requireDocker(t)
	g := d.startGateway(dockerPythonPool(""))
	g.waitReady("py", 1)
	c, ctx := g.client(), ctx(t)
	sbx, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Pool: "py"})
	require.NoError(t, err)
	threads := "import threading, time\n" +
		"for _ in range(100): threading.Thread(target=time.sleep, args=(1000,)).start()\n" +
		"open('ready-%d', 'w').close()\n" +
		"time.sleep(1000)\n"
	for i := range 2 {
		_, err := c.StartProcess(ctx, sbx.ID, agentapi.ProcessStartRequest{Argv: []string{"python3", "-c", fmt.Sprintf(threads, i)}})
		require.NoError(t, err)
	}
	// ": >" is the shell's own: no process of its own that may still exit.
	_, err = c.StartProcess(ctx, sbx.ID, agentapi.ProcessStartRequest{Command: "for i in $(seq 50); do sleep 1000 & done; : > ready-sleeps; wait"})
	require.NoError(t, err)
	eventually(t, dockerWait, "everything runs", func() error {
		res, err := c.Exec(ctx, sbx.ID, agentapi.ExecRequest{Command: "ls ready-0 ready-1 ready-sleeps"})
		if err == nil && res.ExitCode != 0 {
			err = fmt.Errorf("%s", res.Stderr)
		}
		return err
	})

	killed, err := c.KillAll(ctx, sbx.ID)
	require.NoError(t, err)
	assert.Equal(t, 53, killed.Killed, "two programs, the shell and its 50 sleeps: %+v", killed)
	assert.Equal(t, 253, killed.Threads, "101 threads each, one each: %+v", killed)
	assert.Zero(t, killed.Left)
}
