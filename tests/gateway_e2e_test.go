//go:build integration

package tests

import (
	"archive/tar"
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/client"
	"github.com/quarryhq/quarry/execagent/agentapi"
)

// The walk-through of the README, against real processes: a gateway binary, the process
// provider, real exec agents and the embedded store.
func TestE2E_Walkthrough(t *testing.T) {
	g := startGateway(t, defaultPools)
	c := g.client()
	ctx := ctx(t)

	sbx, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{
		Pool: "default", Env: map[string]string{"TASK_ID": "42"}, Labels: map[string]string{"run": "e2e"},
	})
	require.NoError(t, err)
	assert.Equal(t, client.StateActive, sbx.State)
	assert.True(t, sbx.ExpiresAt.After(time.Now()))

	// One-shot exec sees the lease's env and separates the streams.
	res, err := c.Exec(ctx, sbx.ID, agentapi.ExecRequest{Command: `echo "task=$TASK_ID"; echo oops >&2; exit 4`})
	require.NoError(t, err)
	assert.Equal(t, 4, res.ExitCode)
	assert.Equal(t, "task=42\n", res.Stdout)
	assert.Equal(t, "oops\n", res.Stderr)

	// The agent's token never reaches sandbox commands.
	res, err = c.Exec(ctx, sbx.ID, agentapi.ExecRequest{Command: "env"})
	require.NoError(t, err)
	assert.NotContains(t, res.Stdout, "QUARRY_AGENT_TOKEN")

	// Streaming exec delivers output before the exit event.
	st, err := c.ExecStream(ctx, sbx.ID, agentapi.ExecRequest{Command: "echo one; sleep 0.3; echo two"})
	require.NoError(t, err)
	var events []client.ExecEvent
	for {
		ev, err := st.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		events = append(events, ev)
	}
	require.NotEmpty(t, events)
	assert.Equal(t, agentapi.EventStdout, events[0].Type)
	assert.Equal(t, agentapi.EventExit, events[len(events)-1].Type)
	assert.Equal(t, 0, events[len(events)-1].Result.ExitCode)

	// A session keeps cwd, variables and functions; exit codes are real.
	ses, err := c.CreateSession(ctx, sbx.ID, agentapi.SessionCreateRequest{})
	require.NoError(t, err)
	run := func(cmd string) agentapi.SessionRunResult {
		r, err := c.RunSession(ctx, sbx.ID, ses.ID, agentapi.SessionRunRequest{Command: cmd})
		require.NoError(t, err, cmd)
		return r
	}
	run("mkdir -p sub && cd sub && export GREETING=hello && greet() { echo \"$GREETING from $(basename $PWD)\"; }")
	r := run("greet; (exit 7)")
	assert.Equal(t, 7, r.ExitCode)
	assert.Equal(t, "hello from sub\n", r.Output)
	r, err = c.RunSession(ctx, sbx.ID, ses.ID, agentapi.SessionRunRequest{Command: "sleep 30", TimeoutMS: 300})
	require.NoError(t, err)
	assert.True(t, r.TimedOut)
	assert.Equal(t, "hello from sub\n", run("greet").Output, "the session survives a timeout")

	// Background process: real exit code and output by offset.
	p, err := c.StartProcess(ctx, sbx.ID, agentapi.ProcessStartRequest{Command: "for i in 1 2 3; do echo line$i; done; exit 3"})
	require.NoError(t, err)
	eventually(t, 30*time.Second, "process exits", func() error {
		info, err := c.GetProcess(ctx, sbx.ID, p.ID)
		if err != nil {
			return err
		}
		if info.State != agentapi.ProcessExited {
			return fmt.Errorf("state %s", info.State)
		}
		if info.ExitCode == nil || *info.ExitCode != 3 {
			return fmt.Errorf("exit code %v", info.ExitCode)
		}
		return nil
	})
	out, err := c.ProcessOutput(ctx, sbx.ID, p.ID, 6, 0)
	require.NoError(t, err)
	assert.Equal(t, "line2\nline3\n", out.Data)

	// Files: a binary round trip, stat, list, and a directory archive round trip.
	blob := make([]byte, 3<<20+17)
	_, _ = rand.Read(blob)
	_, err = c.WriteFile(ctx, sbx.ID, "data/blob.bin", 0o600, bytes.NewReader(blob))
	require.NoError(t, err)
	rc, err := c.ReadFile(ctx, sbx.ID, "data/blob.bin", 0, 0)
	require.NoError(t, err)
	got, err := io.ReadAll(rc)
	rc.Close()
	require.NoError(t, err)
	assert.True(t, bytes.Equal(blob, got), "file content round trip")
	fi, err := c.Stat(ctx, sbx.ID, "data/blob.bin")
	require.NoError(t, err)
	assert.Equal(t, int64(len(blob)), fi.Size)
	assert.Equal(t, "0600", fi.Mode)

	var tarBuf bytes.Buffer
	tw := tar.NewWriter(&tarBuf)
	for name, body := range map[string]string{"a.txt": "alpha", "nested/b.txt": "beta"} {
		require.NoError(t, tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(body))}))
		_, _ = tw.Write([]byte(body))
	}
	require.NoError(t, tw.Close())
	_, err = c.UploadArchive(ctx, sbx.ID, "tree", &tarBuf)
	require.NoError(t, err)
	list, err := c.ListDir(ctx, sbx.ID, "tree")
	require.NoError(t, err)
	names := []string{}
	for _, e := range list.Entries {
		names = append(names, e.Name)
	}
	assert.ElementsMatch(t, []string{"a.txt", "nested"}, names)
	res, err = c.Exec(ctx, sbx.ID, agentapi.ExecRequest{Command: "cat tree/nested/b.txt"})
	require.NoError(t, err)
	assert.Equal(t, "beta", res.Stdout)

	// Heartbeat moves the expiry; listing filters by label.
	hb, err := c.Heartbeat(ctx, sbx.ID)
	require.NoError(t, err)
	assert.False(t, hb.ExpiresAt.Before(sbx.ExpiresAt))
	listed, err := c.ListSandboxes(ctx, client.ListSandboxesRequest{Labels: map[string]string{"run": "e2e"}})
	require.NoError(t, err)
	require.Len(t, listed, 1)
	assert.Equal(t, sbx.ID, listed[0].ID)

	// Release: the task is stopped (never reused) and the lease answers 410 from now on.
	rel, err := c.DeleteSandbox(ctx, sbx.ID)
	require.NoError(t, err)
	assert.Equal(t, client.StateReleased, rel.State)
	_, err = c.Exec(ctx, sbx.ID, agentapi.ExecRequest{Command: "true"})
	assert.True(t, client.IsGone(err), "exec after release: %v", err)
	_, err = c.Heartbeat(ctx, sbx.ID)
	assert.True(t, client.IsGone(err), "heartbeat after release: %v", err)
	eventually(t, 30*time.Second, "released task stopped", func() error { return checkTaskGone(g) })
}

// checkTaskGone is satisfied when every live agent is accounted for by a pool (ready,
// launching or leased): a released sandbox's task must be gone, not idle.
func checkTaskGone(g *gatewayProc) error {
	live := 0
	for _, tf := range g.tasks() {
		if isAgent(tf.PID) {
			live++
		}
	}
	ps, err := g.client().Pools(ctx(g.t))
	if err != nil {
		return err
	}
	want := 0
	for _, p := range ps {
		want += p.Ready + p.Launching + p.Leased
	}
	if live > want {
		return fmt.Errorf("%d live agents, pools account for %d", live, want)
	}
	return nil
}

// Leases, sessions and files survive a gateway crash: all state is in the store and the
// sandboxes, none in the gateway process.
func TestE2E_GatewayRestartKeepsLeases(t *testing.T) {
	g := startGateway(t, defaultPools)
	c := g.client()
	ctx := ctx(t)
	sbx, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Pool: "default"})
	require.NoError(t, err)
	ses, err := c.CreateSession(ctx, sbx.ID, agentapi.SessionCreateRequest{})
	require.NoError(t, err)
	_, err = c.RunSession(ctx, sbx.ID, ses.ID, agentapi.SessionRunRequest{Command: "export KEEP=me; cd /tmp"})
	require.NoError(t, err)

	g.kill()
	g.start()

	got, err := c.GetSandbox(ctx, sbx.ID)
	require.NoError(t, err)
	assert.Equal(t, client.StateActive, got.State)
	r, err := c.RunSession(ctx, sbx.ID, ses.ID, agentapi.SessionRunRequest{Command: "echo $KEEP $PWD"})
	require.NoError(t, err)
	assert.Equal(t, "me /tmp\n", r.Output)

	// A graceful restart too.
	g.stop()
	g.start()
	r, err = c.RunSession(ctx, sbx.ID, ses.ID, agentapi.SessionRunRequest{Command: "echo $KEEP"})
	require.NoError(t, err)
	assert.Equal(t, "me\n", r.Output)
}

// A lease that is not renewed expires: its sandbox answers 410 and its task is stopped.
func TestE2E_LeaseExpires(t *testing.T) {
	g := startGateway(t, `pools:
  - name: short
    image: host
    min_warm: 1
    max_total: 4
    default_lease_seconds: 1
    max_lease_seconds: 5
`)
	c := g.client()
	ctx := ctx(t)
	sbx, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Pool: "short"})
	require.NoError(t, err)
	assert.Equal(t, 1, sbx.LeaseSeconds)
	eventually(t, 30*time.Second, "lease expires", func() error {
		_, err := c.Exec(ctx, sbx.ID, agentapi.ExecRequest{Command: "true"})
		if client.IsGone(err) {
			return nil
		}
		return fmt.Errorf("exec: %v", err)
	})
	waitState(t, c, sbx.ID, client.StateExpired)
	_, err = c.CreateSandbox(ctx, client.CreateSandboxRequest{Pool: "short", LeaseSeconds: 6})
	assert.True(t, client.IsBadRequest(err), "lease_seconds over the pool's maximum: %v", err)
}

// A sandbox killed from outside: the next call gives a clear error (not a hang) and the
// lease is marked lost; the pool refills.
func TestE2E_SandboxKilledFromOutside(t *testing.T) {
	g := startGateway(t, defaultPools)
	c := g.client()
	ctx := ctx(t)
	sbx, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{})
	require.NoError(t, err)
	_, err = c.Exec(ctx, sbx.ID, agentapi.ExecRequest{Command: "echo $$ > pidfile"})
	require.NoError(t, err)
	// Find the agent serving this sandbox: the one whose work dir has the pid file.
	var victim taskFile
	for _, tf := range g.tasks() {
		if _, err := os.Stat(filepath.Join(g.dataDir, "process", tf.Name, "work", "pidfile")); err == nil {
			victim = tf
		}
	}
	require.NotZero(t, victim.PID, "found the sandbox's agent")
	killSession(victim.PID)

	_, err = c.Exec(ctx, sbx.ID, agentapi.ExecRequest{Command: "true"})
	require.Error(t, err)
	var ce *client.Error
	require.ErrorAs(t, err, &ce)
	assert.Contains(t, []int{http.StatusGone, http.StatusBadGateway}, ce.Status, "clear error: %v", err)
	waitState(t, c, sbx.ID, client.StateLost)
	_, err = c.Exec(ctx, sbx.ID, agentapi.ExecRequest{Command: "true"})
	assert.True(t, client.IsGone(err), "lost lease: %v", err)
	g.waitReady("default", 2)
}

// max_total is a hard limit: a full pool answers 503 no_capacity with Retry-After, and a
// release makes room again.
func TestE2E_PoolCapacity(t *testing.T) {
	g := startGateway(t, `pools:
  - name: tiny
    image: host
    min_warm: 1
    max_total: 3
`)
	c := g.client()
	ctx := ctx(t)
	var ids []string
	for i := 0; i < 3; i++ {
		s, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Pool: "tiny"})
		require.NoError(t, err)
		ids = append(ids, s.ID)
	}
	_, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Pool: "tiny"})
	require.True(t, client.IsNoCapacity(err), "fourth acquire: %v", err)
	var ce *client.Error
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, http.StatusServiceUnavailable, ce.Status)
	assert.Positive(t, ce.RetryAfter)

	_, err = c.DeleteSandbox(ctx, ids[0])
	require.NoError(t, err)
	eventually(t, 30*time.Second, "room after a release", func() error {
		_, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Pool: "tiny"})
		return err
	})
	live := 0
	for _, tf := range g.tasks() {
		if isAgent(tf.PID) {
			live++
		}
	}
	assert.LessOrEqual(t, live, 3, "never more than max_total tasks")
}

// Many trainers acquire at once: every sandbox is a different task.
func TestE2E_ConcurrentAcquiresNeverShareATask(t *testing.T) {
	g := startGateway(t, `pools:
  - name: default
    image: host
    min_warm: 4
    max_total: 24
`)
	c := g.client()
	ctx := ctx(t)
	const n = 16
	var wg sync.WaitGroup
	ids := make([]string, n)
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{})
			ids[i], errs[i] = s.ID, err
		}()
	}
	wg.Wait()
	dirs := map[string]string{}
	for i := range n {
		require.NoError(t, errs[i])
		res, err := c.Exec(ctx, ids[i], agentapi.ExecRequest{Command: "pwd"})
		require.NoError(t, err)
		prev, dup := dirs[res.Stdout]
		assert.False(t, dup, "sandboxes %s and %s share the task %s", prev, ids[i], res.Stdout)
		dirs[res.Stdout] = ids[i]
	}
}

// Idempotency-Key: a retried create returns the same sandbox.
func TestE2E_IdempotentCreate(t *testing.T) {
	g := startGateway(t, defaultPools)
	c := g.client()
	ctx := ctx(t)
	req := client.CreateSandboxRequest{IdempotencyKey: "trainer-7-episode-99"}
	a, err := c.CreateSandbox(ctx, req)
	require.NoError(t, err)
	b, err := c.CreateSandbox(ctx, req)
	require.NoError(t, err)
	assert.Equal(t, a.ID, b.ID)
	// Another tenant's identical key is its own.
	o, err := g.otherClient().CreateSandbox(ctx, req)
	require.NoError(t, err)
	assert.NotEqual(t, a.ID, o.ID)
	// The same key with another body is refused, as Stripe-style APIs do.
	req.Labels = map[string]string{"run": "another"}
	_, err = c.CreateSandbox(ctx, req)
	var ae *client.Error
	require.ErrorAs(t, err, &ae)
	assert.Equal(t, 409, ae.Status)
	assert.Contains(t, ae.Message, "use a new key")
}

// Bad input gets a clear 4xx and changes nothing.
func TestE2E_BadInput(t *testing.T) {
	g := startGateway(t, defaultPools, withEnv("QUARRY_MAX_JSON_BODY=4096"))
	c := g.client()
	ctx := ctx(t)
	sbx, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{})
	require.NoError(t, err)

	cases := []struct {
		name, method, path, key, body string
		status                        int
		contains                      string
	}{
		{"no key", "POST", "/v1/sandboxes", "", `{}`, 401, "unauthorized"},
		{"wrong key", "GET", "/v1/sandboxes", "nope", ``, 401, "unauthorized"},
		{"malformed json", "POST", "/v1/sandboxes", g.key, `{"pool":`, 400, "bad_request"},
		{"wrong type", "POST", "/v1/sandboxes", g.key, `{"pool": 5}`, 400, "pool"},
		{"unknown pool", "POST", "/v1/sandboxes", g.key, `{"pool": "nope"}`, 400, "pool"},
		{"unknown field", "POST", "/v1/sandboxes", g.key, `{"pools": "default"}`, 400, "pools"},
		{"negative lease", "POST", "/v1/sandboxes", g.key, `{"lease_seconds": -1}`, 400, "lease_seconds"},
		{"too large", "POST", "/v1/sandboxes/" + sbx.ID + "/exec", g.key, `{"command": "` + strings.Repeat("x", 8192) + `"}`, 413, "payload_too_large"},
		{"unknown sandbox", "POST", "/v1/sandboxes/sbx-doesnotexist/exec", g.key, `{"command": "true"}`, 404, "not_found"},
		{"another tenant's sandbox", "POST", "/v1/sandboxes/" + sbx.ID + "/exec", "other-" + g.key, `{"command": "true"}`, 404, "not_found"},
		{"exec without command", "POST", "/v1/sandboxes/" + sbx.ID + "/exec", g.key, `{}`, 400, "command"},
		{"exec negative timeout", "POST", "/v1/sandboxes/" + sbx.ID + "/exec", g.key, `{"command": "true", "timeout_ms": -5}`, 400, "timeout_ms"},
		{"unknown session", "POST", "/v1/sandboxes/" + sbx.ID + "/sessions/ses-nope/run", g.key, `{"command": "true"}`, 404, "not_found"},
		{"missing file", "GET", "/v1/sandboxes/" + sbx.ID + "/files?path=/nonexistent/x", g.key, ``, 404, "not_found"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			status, body := g.raw(ctx, t, tc.method, tc.path, tc.key, tc.body)
			assert.Equal(t, tc.status, status, body)
			assert.Contains(t, body, tc.contains)
			assert.Contains(t, body, `"error"`)
		})
	}
	// Nothing was lost: the sandbox still works for its owner.
	res, err := c.Exec(ctx, sbx.ID, agentapi.ExecRequest{Command: "echo fine"})
	require.NoError(t, err)
	assert.Equal(t, "fine\n", res.Stdout)
}

// The CLI against the real gateway: exec propagates exit codes, cp moves files and trees.
func TestE2E_CLI(t *testing.T) {
	g := startGateway(t, defaultPools)
	quarry := func(stdin string, args ...string) (string, int) {
		cmd := exec.Command(bins.quarry, args...)
		cmd.Env = append(os.Environ(), "QUARRY_URL="+g.url(), "QUARRY_API_KEY="+g.key)
		cmd.Stdin = strings.NewReader(stdin)
		out, err := cmd.CombinedOutput()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else {
			require.NoError(t, err)
		}
		return string(out), code
	}
	out, code := quarry("", "sandbox", "create")
	require.Equal(t, 0, code, out)
	id := strings.TrimSpace(out)
	require.True(t, strings.HasPrefix(id, "sbx-"), out)

	out, code = quarry("", "sandbox", "exec", id, "echo from-cli; exit 5")
	assert.Equal(t, 5, code)
	assert.Contains(t, out, "from-cli")

	local := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(local, "tree", "deep"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(local, "tree", "deep", "f.txt"), []byte("deep file"), 0o644))
	out, code = quarry("", "sandbox", "cp", filepath.Join(local, "tree"), id+":up")
	require.Equal(t, 0, code, out)
	out, code = quarry("", "sandbox", "exec", id, "cat up/deep/f.txt")
	require.Equal(t, 0, code, out)
	assert.Equal(t, "deep file", out)
	back := filepath.Join(t.TempDir(), "back")
	out, code = quarry("", "sandbox", "cp", id+":up", back)
	require.Equal(t, 0, code, out)
	data, err := os.ReadFile(filepath.Join(back, "deep", "f.txt"))
	require.NoError(t, err)
	assert.Equal(t, "deep file", string(data))

	out, code = quarry("cd /tmp\nexport V=7\necho $V $PWD\n", "sandbox", "shell", id)
	require.Equal(t, 0, code, out)
	assert.Contains(t, out, "7 /tmp")

	out, code = quarry("", "sandbox", "ls")
	require.Equal(t, 0, code, out)
	assert.Contains(t, out, id)
	out, code = quarry("", "sandbox", "rm", id)
	require.Equal(t, 0, code, out)
	_, code = quarry("", "sandbox", "exec", id, "true")
	assert.Equal(t, 1, code, "exec on a released sandbox fails")
}

// Shutting the gateway down never stops sandboxes.
func TestE2E_ShutdownLeavesSandboxesRunning(t *testing.T) {
	g := startGateway(t, defaultPools)
	g.waitReady("default", 2)
	before := 0
	for _, tf := range g.tasks() {
		if isAgent(tf.PID) {
			before++
		}
	}
	require.GreaterOrEqual(t, before, 2)
	g.stop()
	for _, tf := range g.tasks() {
		assert.True(t, isAgent(tf.PID) || syscall.Kill(tf.PID, 0) != nil, "task %s", tf.Name)
	}
	after := 0
	for _, tf := range g.tasks() {
		if isAgent(tf.PID) {
			after++
		}
	}
	assert.Equal(t, before, after)
}

// waitState waits until the sandbox's lease is in state.
func waitState(t *testing.T, c *client.Client, id, state string) {
	t.Helper()
	eventually(t, 30*time.Second, "sandbox "+id+" becomes "+state, func() error {
		s, err := c.GetSandbox(ctx(t), id)
		if err != nil {
			return err
		}
		if s.State != state {
			return fmt.Errorf("state %s", s.State)
		}
		return nil
	})
}
