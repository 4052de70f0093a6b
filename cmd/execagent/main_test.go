package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/internal/syncbuf"
)

// waitLong is the generous deadline of the polling waits (busy CI machine).
const waitLong = 30 * time.Second

// buildAgent builds the static agent binary once per test binary run.
func buildAgent(t testing.TB) string {
	t.Helper()
	bin := filepath.Join(os.TempDir(), fmt.Sprintf("quarry-execagent-test-%d", os.Getpid()))
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", bin, ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "build execagent: %s", out)
	return bin
}

func TestMain(m *testing.M) {
	code := m.Run()
	_ = os.Remove(filepath.Join(os.TempDir(), fmt.Sprintf("quarry-execagent-test-%d", os.Getpid())))
	os.Exit(code)
}

// agentProc is a started agent binary.
type agentProc struct {
	cmd     *exec.Cmd
	stderr  *syncbuf.Buffer
	addr    string
	done    chan struct{} // closed when the agent exited; then waitErr is set
	waitErr error
}

// baseEnv is a minimal environment for the agent under test.
func baseEnv() []string {
	return []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/root", "LANG=C.UTF-8"}
}

// startAgent starts the binary with env and waits for its address file.
func startAgent(t testing.TB, env ...string) *agentProc {
	t.Helper()
	dir := t.TempDir()
	addrFile := filepath.Join(dir, "addr")
	cmd := exec.Command(buildAgent(t))
	cmd.Dir = dir
	cmd.Env = append(append(baseEnv(), "QUARRY_AGENT_ADDR=127.0.0.1:0", "QUARRY_AGENT_ADDR_FILE="+addrFile), env...)
	p := &agentProc{cmd: cmd, stderr: &syncbuf.Buffer{}, done: make(chan struct{})}
	cmd.Stderr = p.stderr
	require.NoError(t, cmd.Start())
	go func() { p.waitErr = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM) // the agent kills its children
		select {
		case <-p.done:
		case <-time.After(waitLong):
			_ = cmd.Process.Signal(syscall.SIGKILL)
			<-p.done
		}
	})
	deadline := time.Now().Add(waitLong)
	for {
		b, err := os.ReadFile(addrFile)
		if err == nil && len(b) > 0 {
			p.addr = string(b)
			break
		}
		select {
		case <-p.done:
			require.Failf(t, "agent exited during start-up", "%v: %s", p.waitErr, p.stderr.String())
		default:
		}
		require.True(t, time.Now().Before(deadline), "no address file; stderr: %s", p.stderr.String())
		time.Sleep(5 * time.Millisecond)
	}
	return p
}

func TestRun_RefusesToStartWithoutToken(t *testing.T) {
	bin := buildAgent(t)
	keyHex := strings.Repeat("5a", 32)
	key, from := "QUARRY_AGENT_TOKEN_KEY="+keyHex, "QUARRY_AGENT_TOKEN_NONCE_FROM=ecs-task-arn"
	tests := []struct {
		name string
		env  []string
		want string
	}{
		{"no token", nil, "QUARRY_AGENT_TOKEN or QUARRY_AGENT_TOKEN_FILE"},
		{"empty token file", []string{"QUARRY_AGENT_TOKEN_FILE=" + writeTemp(t, "  \n")}, "QUARRY_AGENT_TOKEN_FILE"},
		{"missing token file", []string{"QUARRY_AGENT_TOKEN_FILE=/no/such/file"}, "QUARRY_AGENT_TOKEN_FILE"},
		{"both set", []string{"QUARRY_AGENT_TOKEN=a", "QUARRY_AGENT_TOKEN_FILE=" + writeTemp(t, "b")}, "both"},
		{"key without nonce", []string{"QUARRY_AGENT_TOKEN_KEY=" + strings.Repeat("5a", 32)}, "set both or neither"},
		{"nonce without key", []string{"QUARRY_AGENT_TOKEN_NONCE=n"}, "set both or neither"},
		{"short key", []string{"QUARRY_AGENT_TOKEN_KEY=abcd", "QUARRY_AGENT_TOKEN_NONCE=n"}, "QUARRY_AGENT_TOKEN_KEY"},
		{"token and key", []string{"QUARRY_AGENT_TOKEN=a", "QUARRY_AGENT_TOKEN_KEY=" + strings.Repeat("5a", 32), "QUARRY_AGENT_TOKEN_NONCE=n"}, "both set"},
		{"bad limit", []string{"QUARRY_AGENT_TOKEN=a", "QUARRY_AGENT_MAX_TIMEOUT=soon"}, "MAX_TIMEOUT"},
		{"workdir is a file", []string{"QUARRY_AGENT_TOKEN=a", "QUARRY_AGENT_WORKDIR=" + writeTemp(t, "x")}, "QUARRY_AGENT_WORKDIR"},
		{"relative workdir", []string{"QUARRY_AGENT_TOKEN=a", "QUARRY_AGENT_WORKDIR=work"}, "QUARRY_AGENT_WORKDIR"},
		{"bad address", []string{"QUARRY_AGENT_TOKEN=a", "QUARRY_AGENT_ADDR=nope"}, "QUARRY_AGENT_ADDR"},
		{"nonce source without key", []string{from, "ECS_CONTAINER_METADATA_URI_V4=http://127.0.0.1:1/v4/x"}, "set both or neither"},
		{"nonce and nonce source", []string{key, from, "QUARRY_AGENT_TOKEN_NONCE=n"}, "QUARRY_AGENT_TOKEN_NONCE and QUARRY_AGENT_TOKEN_NONCE_FROM are both set"},
		{"unknown nonce source", []string{key, "QUARRY_AGENT_TOKEN_NONCE_FROM=hostname"}, `QUARRY_AGENT_TOKEN_NONCE_FROM: want "ecs-task-arn", got "hostname"`},
		{"no metadata endpoint", []string{key, from}, "ECS_CONTAINER_METADATA_URI_V4 is not set"},
		{"bad metadata endpoint", []string{key, from, "ECS_CONTAINER_METADATA_URI_V4=169.254.170.2/v4/x"}, "ECS_CONTAINER_METADATA_URI_V4: want the http URL ECS sets"},
		{"token and nonce source", []string{"QUARRY_AGENT_TOKEN=a", key, from}, "both set"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cmd := exec.Command(bin)
			cmd.Env = append(baseEnv(), tt.env...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err := cmd.Run()
			var ee *exec.ExitError
			require.ErrorAs(t, err, &ee, "the agent must refuse to start")
			assert.Equal(t, 1, ee.ExitCode())
			assert.Contains(t, stderr.String(), tt.want)
			assert.NotContains(t, stderr.String(), keyHex, "errors never show the key")
		})
	}
}

func writeTemp(t testing.TB, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "f")
	require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
	return p
}

func TestRun_Version(t *testing.T) {
	out, err := exec.Command(buildAgent(t), "--version").Output()
	require.NoError(t, err)
	assert.Equal(t, "execagent "+agentapi.Version+"\n", string(out))
}

func TestRun_ServesWithTokenAndAddrFile(t *testing.T) {
	tokenFile := writeTemp(t, "file-token\n")
	p := startAgent(t, "QUARRY_AGENT_TOKEN_FILE="+tokenFile, "SANDBOX_VAR=visible", "QUARRY_AGENT_CUSTOM=secret")
	assert.True(t, strings.HasPrefix(p.addr, "127.0.0.1:"), "addr %q", p.addr)
	ctx := context.Background()

	_, err := agentapi.New("http://"+p.addr, "wrong", nil).Health(ctx)
	var ae *agentapi.Error
	require.ErrorAs(t, err, &ae)
	assert.Equal(t, http.StatusUnauthorized, ae.Status)

	c := agentapi.New("http://"+p.addr, "file-token", nil)
	h, err := c.Health(ctx)
	require.NoError(t, err)
	assert.Equal(t, agentapi.Version, h.Version)

	res, err := c.Exec(ctx, agentapi.ExecRequest{Command: "env"})
	require.NoError(t, err)
	assert.Contains(t, res.Stdout, "SANDBOX_VAR=visible")
	assert.NotContains(t, res.Stdout, "QUARRY_AGENT_")
	assert.NotContains(t, res.Stdout, "file-token")

	sid, err := c.CreateSession(ctx, agentapi.SessionCreateRequest{})
	require.NoError(t, err)
	run, err := c.RunSession(ctx, sid.ID, agentapi.SessionRunRequest{Command: "env | grep -c QUARRY_AGENT_ || true"})
	require.NoError(t, err)
	assert.Equal(t, "0\n", run.Output)
	pr, err := c.StartProcess(ctx, agentapi.ProcessStartRequest{Argv: []string{"sh", "-c", "cat /proc/$$/environ | tr '\\0' '\\n' | grep -c QUARRY_AGENT_ || true"}})
	require.NoError(t, err)
	var out agentapi.ProcessOutput
	deadline := time.Now().Add(waitLong)
	for out.State != agentapi.ProcessExited && time.Now().Before(deadline) {
		out, err = c.ProcessOutput(ctx, pr.ID, 0, 0)
		require.NoError(t, err)
		time.Sleep(5 * time.Millisecond)
	}
	assert.Equal(t, "0\n", out.Data)
	// The agent's own environment was scrubbed too.
	env, err := os.ReadFile("/proc/" + strconv.Itoa(p.cmd.Process.Pid) + "/environ")
	require.NoError(t, err)
	assert.Contains(t, string(env), "QUARRY_AGENT_TOKEN_FILE", "the kernel keeps the initial environment")
}

func TestRun_SIGTERMKillsChildrenAndExits(t *testing.T) {
	p := startAgent(t, "QUARRY_AGENT_TOKEN=tok")
	c := agentapi.New("http://"+p.addr, "tok", nil)
	ctx := context.Background()
	pr, err := c.StartProcess(ctx, agentapi.ProcessStartRequest{Command: "sleep 1000"})
	require.NoError(t, err)
	sid, err := c.CreateSession(ctx, agentapi.SessionCreateRequest{})
	require.NoError(t, err)
	res, err := c.RunSession(ctx, sid.ID, agentapi.SessionRunRequest{Command: "sleep 1000 & echo $!"})
	require.NoError(t, err)
	job, err := strconv.Atoi(strings.TrimSpace(res.Output))
	require.NoError(t, err)

	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-p.done:
		require.NoError(t, p.waitErr, "stderr: %s", p.stderr.String())
	case <-time.After(waitLong):
		require.Fail(t, "agent did not exit on SIGTERM")
	}
	for _, pid := range []int{pr.PID, job} {
		deadline := time.Now().Add(waitLong)
		for !gone(pid) {
			require.True(t, time.Now().Before(deadline), "pid %d survived the agent", pid)
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// gone reports whether pid has exited (gone, or a zombie awaiting its reaper).
func gone(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if errors.Is(err, os.ErrNotExist) {
		return true
	}
	i := bytes.LastIndexByte(b, ')')
	return err == nil && i > 0 && i+2 < len(b) && b[i+2] == 'Z'
}

// BenchmarkAgent_IdleRSS starts the built binary and reports its resident
// memory (VmRSS) when idle, after one health check.
func BenchmarkAgent_IdleRSS(b *testing.B) {
	if runtime.GOOS != "linux" {
		b.Fatal("VmRSS needs /proc (linux)")
	}
	p := startAgent(b, "QUARRY_AGENT_TOKEN=tok")
	_, err := agentapi.New("http://"+p.addr, "tok", nil).Health(context.Background())
	require.NoError(b, err)
	status := "/proc/" + strconv.Itoa(p.cmd.Process.Pid) + "/status"
	var kb float64
	for b.Loop() {
		s, err := os.ReadFile(status)
		require.NoError(b, err)
		for _, line := range strings.Split(string(s), "\n") {
			if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
				kb, err = strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
				require.NoError(b, err)
			}
		}
	}
	b.ReportMetric(kb/1024, "idle-rss-MB")
}

func TestRun_CreatesMissingWorkdir(t *testing.T) {
	work := filepath.Join(t.TempDir(), "a", "work")
	p := startAgent(t, "QUARRY_AGENT_TOKEN=tok", "QUARRY_AGENT_WORKDIR="+work)
	res, err := agentapi.New("http://"+p.addr, "tok", nil).Exec(context.Background(), agentapi.ExecRequest{Command: "pwd"})
	require.NoError(t, err)
	assert.Equal(t, work+"\n", res.Stdout, "commands run in the created work dir")
}
