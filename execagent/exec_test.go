package execagent

import (
	"bufio"
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

func TestExec_Run_Results(t *testing.T) {
	a := newTestAgent(t, func(c *Config) {
		c.Env = append(c.Env, "BASE_VAR=base", "QUARRY_AGENT_TOKEN=leak", "QUARRY_AGENT_OTHER=leak")
	})
	require.NoError(t, os.Mkdir(filepath.Join(a.cfg.Workdir, "sub"), 0o755))
	tests := []struct {
		name string
		req  agentapi.ExecRequest
		want agentapi.ExecResult
	}{
		{"exit zero", agentapi.ExecRequest{Command: "true"}, agentapi.ExecResult{ExitCode: 0}},
		{"exit code", agentapi.ExecRequest{Command: "exit 42"}, agentapi.ExecResult{ExitCode: 42}},
		{"killed by signal", agentapi.ExecRequest{Command: "kill -TERM $$"}, agentapi.ExecResult{ExitCode: -1, Signal: "SIGTERM"}},
		{"stdout and stderr apart", agentapi.ExecRequest{Command: "echo out; echo err >&2; echo out2"},
			agentapi.ExecResult{Stdout: "out\nout2\n", Stderr: "err\n"}},
		{"argv", agentapi.ExecRequest{Argv: []string{"printf", "%s|", "a b", "$HOME"}}, agentapi.ExecResult{Stdout: "a b|$HOME|"}},
		{"argv exit code", agentapi.ExecRequest{Argv: []string{"sh", "-c", "exit 4"}}, agentapi.ExecResult{ExitCode: 4}},
		{"env per call over base", agentapi.ExecRequest{Command: "echo $BASE_VAR $CALL_VAR", Env: map[string]string{"CALL_VAR": "call"}},
			agentapi.ExecResult{Stdout: "base call\n"}},
		{"agent variables never reach children", agentapi.ExecRequest{Command: "env | grep -c '^QUARRY_AGENT_' || true"},
			agentapi.ExecResult{Stdout: "0\n"}},
		{"default cwd is the workdir", agentapi.ExecRequest{Command: "pwd"}, agentapi.ExecResult{Stdout: a.cfg.Workdir + "\n"}},
		{"relative cwd", agentapi.ExecRequest{Command: "pwd", Cwd: "sub"}, agentapi.ExecResult{Stdout: filepath.Join(a.cfg.Workdir, "sub") + "\n"}},
		{"stdin", agentapi.ExecRequest{Command: "tr a-z A-Z", Stdin: "hello\n"}, agentapi.ExecResult{Stdout: "HELLO\n"}},
		{"no stdin is empty", agentapi.ExecRequest{Command: "cat; echo end"}, agentapi.ExecResult{Stdout: "end\n"}},
		{"truncated", agentapi.ExecRequest{Command: "head -c 100000 /dev/zero | tr '\\0' a; echo e >&2", MaxOutputBytes: 10},
			agentapi.ExecResult{Stdout: "aaaaaaaaaa", Stderr: "e\n", Truncated: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := a.client.Exec(context.Background(), tt.req)
			require.NoError(t, err)
			assert.Equal(t, tt.want.ExitCode, res.ExitCode)
			assert.Equal(t, tt.want.Signal, res.Signal)
			assert.Equal(t, tt.want.Stdout, res.Stdout)
			assert.Equal(t, tt.want.Stderr, res.Stderr)
			assert.Equal(t, tt.want.Truncated, res.Truncated)
			assert.False(t, res.TimedOut)
		})
	}
}

func TestExec_Timeout_KillsWholeGroup(t *testing.T) {
	a := newTestAgent(t, nil)
	res, err := a.client.Exec(context.Background(), agentapi.ExecRequest{
		Command:   "sleep 1000 & echo $!; sleep 1000",
		TimeoutMS: 300,
	})
	require.NoError(t, err)
	assert.True(t, res.TimedOut)
	assert.Equal(t, -1, res.ExitCode)
	assert.Equal(t, "SIGKILL", res.Signal)
	grandchild, err := strconv.Atoi(strings.TrimSpace(res.Stdout))
	require.NoError(t, err, "stdout %q", res.Stdout)
	eventually(t, func() bool { return processGone(grandchild) }, "grandchild %d still exists", grandchild)
}

func TestExec_LeftoverChildHoldingOutput_Returns(t *testing.T) {
	a := newTestAgent(t, func(c *Config) { c.DrainTimeout = 100 * time.Millisecond })
	// The background sleep keeps stdout open; the exec must still return
	// once its shell exited (a hang here fails the test by its deadline).
	res, err := a.client.Exec(context.Background(), agentapi.ExecRequest{Command: "sleep 1000 & echo started"})
	require.NoError(t, err)
	assert.Equal(t, 0, res.ExitCode)
	assert.Equal(t, "started\n", res.Stdout)
	assert.False(t, res.TimedOut)
}

func TestExec_Stream_ChunksBeforeExit(t *testing.T) {
	a := newTestAgent(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	gate := filepath.Join(a.cfg.Workdir, "go")
	st, err := a.client.ExecStream(ctx, agentapi.ExecRequest{
		Command: "echo first; echo warn >&2; while [ ! -e go ]; do sleep 0.01; done; echo second; exit 3",
	})
	require.NoError(t, err)
	defer st.Close()

	seen := map[string]string{}
	for seen["stdout"] != "first\n" || seen["stderr"] != "warn\n" {
		ev, err := st.Next()
		require.NoError(t, err)
		var c agentapi.StreamChunk
		require.NoError(t, ev.Decode(&c))
		seen[ev.Name] += c.Data
	}
	// The command is still blocked on the gate: the chunks were streamed.
	require.NoError(t, os.WriteFile(gate, nil, 0o644))
	out, res := streamToExit(t, st)
	assert.Equal(t, 3, res.ExitCode)
	assert.False(t, res.TimedOut)
	assert.Equal(t, "second\n", out)
}

// streamToExit reads an exec event stream up to its exit event and returns
// the output of its stdout and stderr events and the result.
func streamToExit(t testing.TB, st *agentapi.EventStream) (string, agentapi.ExecResult) {
	t.Helper()
	var out string
	for {
		ev, err := st.Next()
		require.NoError(t, err)
		if ev.Name == agentapi.EventExit {
			var res agentapi.ExecResult
			require.NoError(t, ev.Decode(&res))
			return out, res
		}
		var c agentapi.StreamChunk
		require.NoError(t, ev.Decode(&c))
		out += c.Data
	}
}

func TestExec_Stream_KeepAlives(t *testing.T) {
	a := newTestAgent(t, func(c *Config) { c.KeepAlive = 20 * time.Millisecond })
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	b := strings.NewReader(`{"command":"while [ ! -e go ]; do sleep 0.01; done; echo done"}`)
	req, err := a.client.NewRequest(ctx, http.MethodPost, agentapi.RouteExec, b)
	require.NoError(t, err)
	req.Header.Set("Accept", "text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	lines := bufio.NewScanner(resp.Body)
	keepAlives := 0
	for keepAlives < 3 && lines.Scan() {
		if lines.Text() == ": keep-alive" {
			keepAlives++
		}
	}
	require.Equal(t, 3, keepAlives)
	require.NoError(t, os.WriteFile(filepath.Join(a.cfg.Workdir, "go"), nil, 0o644))
	sse := agentapi.NewSSEReader(resp.Body, 0)
	var names []string
	for {
		ev, err := sse.Next()
		if err != nil {
			break
		}
		names = append(names, ev.Name)
	}
	assert.Equal(t, []string{agentapi.EventStdout, agentapi.EventExit}, names)
}

func TestExec_Stream_DisconnectKillsCommand(t *testing.T) {
	a := newTestAgent(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	st, err := a.client.ExecStream(ctx, agentapi.ExecRequest{Command: "sleep 1000 & echo $!; sleep 1000"})
	require.NoError(t, err)
	ev, err := st.Next()
	require.NoError(t, err)
	var c agentapi.StreamChunk
	require.NoError(t, ev.Decode(&c))
	pid, err := strconv.Atoi(strings.TrimSpace(c.Data))
	require.NoError(t, err)
	require.False(t, processDead(pid))
	require.NoError(t, st.Close())
	eventually(t, func() bool { return processGone(pid) }, "background child %d survived the disconnect", pid)
}

func TestExec_Stream_TimeoutAndTruncation(t *testing.T) {
	a := newTestAgent(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	st, err := a.client.ExecStream(ctx, agentapi.ExecRequest{
		Command: "head -c 5000 /dev/zero | tr '\\0' a; sleep 1000", TimeoutMS: 300, MaxOutputBytes: 1000,
	})
	require.NoError(t, err)
	defer st.Close()
	total := 0
	for {
		ev, err := st.Next()
		require.NoError(t, err)
		if ev.Name == agentapi.EventExit {
			var res agentapi.ExecResult
			require.NoError(t, ev.Decode(&res))
			assert.True(t, res.TimedOut)
			assert.True(t, res.Truncated)
			assert.Equal(t, "SIGKILL", res.Signal)
			break
		}
		var c agentapi.StreamChunk
		require.NoError(t, ev.Decode(&c))
		total += len(c.Data)
	}
	assert.Equal(t, 1000, total)
}

func TestUTF8Split(t *testing.T) {
	euro := "\u20ac" // 3 bytes
	tests := []struct {
		name string
		in   string
		want int
	}{
		{"empty", "", 0},
		{"ascii", "abc", 3},
		{"complete rune", "a" + euro, 4},
		{"one byte of three", "a" + euro[:1], 1},
		{"two bytes of three", "a" + euro[:2], 1},
		{"invalid byte kept", "a\xff", 2},
		{"lone continuation kept", "a\x80", 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, utf8Split([]byte(tt.in)))
		})
	}
}

// scriptFiles lists the command scripts left in the agent's state dir.
func scriptFiles(t testing.TB, a *testAgent) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(a.cfg.StateDir, "cmd-*"))
	require.NoError(t, err)
	return m
}

func TestExec_LongCommand_RunsWithSameSemantics(t *testing.T) {
	a := newTestAgent(t, nil)
	filler := ": '" + strings.Repeat("x", 200<<10) + "'\n" // over MAX_ARG_STRLEN as one argument
	tests := []struct {
		name string
		req  agentapi.ExecRequest
		want agentapi.ExecResult
	}{
		{"exit code", agentapi.ExecRequest{Command: filler + "echo out; echo err >&2; exit 7"},
			agentapi.ExecResult{ExitCode: 7, Stdout: "out\n", Stderr: "err\n"}},
		{"stdin is the caller's", agentapi.ExecRequest{Command: filler + "tr a-z A-Z", Stdin: "hello\n"},
			agentapi.ExecResult{Stdout: "HELLO\n"}},
		{"no positional parameters", agentapi.ExecRequest{Command: filler + "echo $#"},
			agentapi.ExecResult{Stdout: "0\n"}},
		{"killed by signal", agentapi.ExecRequest{Command: filler + "kill -TERM $$"},
			agentapi.ExecResult{ExitCode: -1, Signal: "SIGTERM"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := a.client.Exec(context.Background(), tt.req)
			require.NoError(t, err)
			res.DurationMS = 0
			assert.Equal(t, tt.want, res)
			assert.Empty(t, scriptFiles(t, a), "the script file outlived the command")
		})
	}
	t.Run("stream", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), waitLong)
		defer cancel()
		st, err := a.client.ExecStream(ctx, agentapi.ExecRequest{Command: filler + "echo streamed; exit 4"})
		require.NoError(t, err)
		defer st.Close()
		out, res := streamToExit(t, st)
		assert.Equal(t, 4, res.ExitCode)
		assert.Equal(t, "streamed\n", out)
	})
}

func TestExec_OverKernelLimits_BadRequestNamingField(t *testing.T) {
	a := newTestAgent(t, nil)
	ctx := context.Background()
	big := strings.Repeat("v", 200<<10)
	many := map[string]string{} // each variable fits, together they do not
	for i := range 40 {
		many["V"+strconv.Itoa(i)] = strings.Repeat("v", 100<<10)
	}
	tests := []struct {
		name  string
		path  string
		body  any
		field string
	}{
		{"exec env value", agentapi.RouteExec, agentapi.ExecRequest{Command: "true", Env: map[string]string{"BIG": big}}, "env: BIG: "},
		{"exec env total", agentapi.RouteExec, agentapi.ExecRequest{Command: "true", Env: many}, "env: "},
		{"exec argv element", agentapi.RouteExec, agentapi.ExecRequest{Argv: []string{"true", big}}, "argv[1]: "},
		{"process env value", agentapi.RouteProcesses, agentapi.ProcessStartRequest{Command: "true", Env: map[string]string{"BIG": big}}, "env: BIG: "},
		{"process env total", agentapi.RouteProcesses, agentapi.ProcessStartRequest{Command: "true", Env: many}, "env: "},
		{"session env total", agentapi.RouteSessions, agentapi.SessionCreateRequest{Env: many}, "env: "},
		{"init env value", agentapi.RouteInit, agentapi.InitRequest{LeaseID: "l", Env: map[string]string{"BIG": big}}, "env: BIG: "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := a.client.Do(ctx, http.MethodPost, tt.path, tt.body, nil)
			ae := apiError(t, err)
			assert.Equal(t, http.StatusBadRequest, ae.Status, ae.Message)
			assert.Equal(t, agentapi.CodeBadRequest, ae.Code)
			assert.True(t, strings.HasPrefix(ae.Message, tt.field), "message %q should start with %q", ae.Message, tt.field)
			assert.Contains(t, ae.Message, "exceed")
			assert.Empty(t, scriptFiles(t, a))
		})
	}
}
