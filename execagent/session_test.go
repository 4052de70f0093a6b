package execagent

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

// newSession creates a session and returns its id.
func newSession(t testing.TB, a *testAgent, req agentapi.SessionCreateRequest) string {
	t.Helper()
	info, err := a.client.CreateSession(context.Background(), req)
	require.NoError(t, err)
	require.NotEmpty(t, info.ID)
	return info.ID
}

// run runs command in session id with an optional timeout.
func run(t testing.TB, a *testAgent, id, command string, timeoutMS int64) agentapi.SessionRunResult {
	t.Helper()
	res, err := a.client.RunSession(context.Background(), id, agentapi.SessionRunRequest{Command: command, TimeoutMS: timeoutMS})
	require.NoError(t, err)
	return res
}

func TestSession_Run_StatePersists(t *testing.T) {
	a := newTestAgent(t, nil)
	require.NoError(t, os.Mkdir(filepath.Join(a.cfg.Workdir, "sub"), 0o755))
	id := newSession(t, a, agentapi.SessionCreateRequest{Env: map[string]string{"SESSION_VAR": "s1"}})
	steps := []struct {
		name, command, output string
		code                  int
	}{
		{"cd", "cd sub", "", 0},
		{"cwd persists", "pwd", filepath.Join(a.cfg.Workdir, "sub") + "\n", 0},
		{"export", "export X=42; Y=local", "", 0},
		{"variables persist", "echo $X $Y $SESSION_VAR", "42 local s1\n", 0},
		{"define function", "greet() { echo hello $1; }", "", 0},
		{"function persists", "greet you", "hello you\n", 0},
		{"arrays persist", "declare -a arr=(a b c)", "", 0},
		{"array read", "echo ${#arr[@]} ${arr[2]}", "3 c\n", 0},
		{"real exit code", "(exit 7)", "", 7},
		{"false", "false", "", 1},
		{"stderr is in the output", "echo out; echo err >&2", "out\nerr\n", 0},
		{"stdin is empty", "cat; read x; echo read=$?", "read=1\n", 0},
		{"return ends only the command", "return 5; echo never", "", 5},
		{"syntax error keeps the session", "if then", "", 2},
		{"alive after syntax error", "echo alive", "alive\n", 0},
		{"no job notices", "sleep 0.01 & wait; echo bg", "bg\n", 0},
		{"multi-line", "for i in 1 2; do\n  echo $i\ndone", "1\n2\n", 0},
		{"quotes and NUL-free binary-ish text", `printf '%s\n' "a'b\"c" '$HOME'`, "a'b\"c\n$HOME\n", 0},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			res := run(t, a, id, s.command, 0)
			assert.Equal(t, s.code, res.ExitCode)
			if s.name == "syntax error keeps the session" {
				assert.Contains(t, res.Output, "syntax error")
			} else {
				assert.Equal(t, s.output, res.Output)
			}
			assert.False(t, res.TimedOut)
			assert.False(t, res.Closed)
		})
	}
}

// A shell's error names the shell, not the agent's command file.
func TestSession_Run_ErrorsNameTheShellNotTheAgentsFile(t *testing.T) {
	a := newTestAgent(t, nil)
	id := newSession(t, a, agentapi.SessionCreateRequest{})
	for _, command := range []string{"if then", "no-such-command-xyz"} {
		res := run(t, a, id, command, 0)
		assert.NotEqual(t, 0, res.ExitCode)
		assert.NotContains(t, res.Output, ".cmd", command)
		assert.NotContains(t, res.Output, a.srv.cfg.StateDir, command)
		assert.Regexp(t, `^(bash|sh|dash): `, res.Output, command)
	}
}

func TestSession_Run_LargeCommandAndOutput(t *testing.T) {
	a := newTestAgent(t, nil)
	id := newSession(t, a, agentapi.SessionCreateRequest{})
	// A command larger than a pipe buffer, and output larger than one.
	big := strings.Repeat("x", 200<<10)
	res := run(t, a, id, "v='"+big+"'; echo ${#v}; head -c 300000 /dev/zero | tr '\\0' y", 0)
	assert.Equal(t, 0, res.ExitCode)
	require.True(t, strings.HasPrefix(res.Output, "204800\n"))
	assert.Len(t, res.Output, len("204800\n")+300000)

	res2, err := a.client.RunSession(context.Background(), id, agentapi.SessionRunRequest{
		Command: "head -c 5000 /dev/zero | tr '\\0' z", MaxOutputBytes: 100})
	require.NoError(t, err)
	assert.True(t, res2.Truncated)
	assert.Equal(t, strings.Repeat("z", 100), res2.Output)
	assert.Equal(t, "ok\n", run(t, a, id, "echo ok", 0).Output)
}

func TestSession_Run_TimeoutKeepsSessionUsable(t *testing.T) {
	a := newTestAgent(t, nil)
	id := newSession(t, a, agentapi.SessionCreateRequest{})
	run(t, a, id, "export KEEP=me", 0)
	loops := []struct{ name, command string }{
		{"builtin busy loop", "while true; do :; done"},
		{"loop of sleeps", "while true; do sleep 1; done"},
		{"one long sleep", "sleep 1000"},
		{"output then sleep", "echo partial; sleep 1000"},
		{"large command interrupted", "v='" + strings.Repeat("y", 100<<10) + "'; sleep 1000"},
	}
	for _, l := range loops {
		t.Run(l.name, func(t *testing.T) {
			res := run(t, a, id, l.command, 200)
			assert.True(t, res.TimedOut)
			assert.Equal(t, exitInterrupted, res.ExitCode)
			assert.False(t, res.Closed)
			if l.name == "output then sleep" {
				assert.True(t, strings.HasPrefix(res.Output, "partial\n"), "output %q", res.Output)
			}
			after := run(t, a, id, "echo alive $KEEP", 0)
			assert.Equal(t, "alive me\n", after.Output)
			assert.Equal(t, 0, after.ExitCode)
		})
	}
}

func TestSession_Run_SIGINTTrappingCommandEscalates(t *testing.T) {
	a := newTestAgent(t, func(c *Config) { c.InterruptGrace = 200 * time.Millisecond })
	id := newSession(t, a, agentapi.SessionCreateRequest{})
	// A child that ignores SIGINT: the agent escalates (SIGKILL to the
	// group's other members) and the session survives.
	res := run(t, a, id, "sh -c 'trap \"\" INT; sleep 1000'", 200)
	assert.True(t, res.TimedOut)
	assert.False(t, res.Closed)
	assert.Equal(t, "alive\n", run(t, a, id, "echo alive", 0).Output)
}

func TestSession_Run_ConcurrentRunIsBusy(t *testing.T) {
	a := newTestAgent(t, nil)
	id := newSession(t, a, agentapi.SessionCreateRequest{})
	gate := filepath.Join(a.cfg.Workdir, "go")
	done := make(chan agentapi.SessionRunResult, 1)
	go func() {
		res, _ := a.client.RunSession(context.Background(), id, agentapi.SessionRunRequest{
			Command: "while [ ! -e go ]; do sleep 0.01; done; echo first"})
		done <- res
	}()
	eventually(t, func() bool {
		l, err := a.client.ListSessions(context.Background())
		return err == nil && len(l) == 1 && l[0].Busy
	}, "session never became busy")
	_, err := a.client.RunSession(context.Background(), id, agentapi.SessionRunRequest{Command: "echo second"})
	ae := apiError(t, err)
	assert.Equal(t, http.StatusConflict, ae.Status)
	assert.Equal(t, agentapi.CodeBusy, ae.Code)
	require.NoError(t, os.WriteFile(gate, nil, 0o644))
	assert.Equal(t, "first\n", (<-done).Output)
	assert.Equal(t, "second\n", run(t, a, id, "echo second", 0).Output)
}

func TestSession_Run_ExitClosesSession(t *testing.T) {
	a := newTestAgent(t, nil)
	id := newSession(t, a, agentapi.SessionCreateRequest{})
	bg := run(t, a, id, "sleep 1000 & echo $!", 0)
	pid, err := strconv.Atoi(strings.TrimSpace(bg.Output))
	require.NoError(t, err)
	res := run(t, a, id, "echo bye; exit 3", 0)
	assert.True(t, res.Closed)
	assert.Equal(t, 3, res.ExitCode)
	assert.Equal(t, "bye\n", res.Output)
	_, err = a.client.RunSession(context.Background(), id, agentapi.SessionRunRequest{Command: "true"})
	assert.Equal(t, http.StatusNotFound, apiError(t, err).Status)
	list, err := a.client.ListSessions(context.Background())
	require.NoError(t, err)
	assert.Empty(t, list)
	eventually(t, func() bool { return processGone(pid) }, "background job %d of a closed session survived", pid)
}

func TestSession_Close_KillsShellAndJobs(t *testing.T) {
	a := newTestAgent(t, nil)
	id := newSession(t, a, agentapi.SessionCreateRequest{Cwd: "/"})
	assert.Equal(t, "/\n", run(t, a, id, "pwd", 0).Output)
	shell, err := strconv.Atoi(strings.TrimSpace(run(t, a, id, "echo $$", 0).Output))
	require.NoError(t, err)
	bg, err := strconv.Atoi(strings.TrimSpace(run(t, a, id, "sleep 1000 & echo $!", 0).Output))
	require.NoError(t, err)
	require.NoError(t, a.client.CloseSession(context.Background(), id))
	eventually(t, func() bool { return processGone(shell) && processGone(bg) }, "session processes survived close")
	err = a.client.CloseSession(context.Background(), id)
	assert.Equal(t, http.StatusNotFound, apiError(t, err).Status)
}

func TestSession_Create_Limits(t *testing.T) {
	a := newTestAgent(t, func(c *Config) { c.MaxSessions = 2 })
	newSession(t, a, agentapi.SessionCreateRequest{})
	newSession(t, a, agentapi.SessionCreateRequest{})
	_, err := a.client.CreateSession(context.Background(), agentapi.SessionCreateRequest{})
	assert.Equal(t, http.StatusConflict, apiError(t, err).Status)
	_, err = a.client.CreateSession(context.Background(), agentapi.SessionCreateRequest{Cwd: "/no/such"})
	assert.Equal(t, http.StatusBadRequest, apiError(t, err).Status)
	list, err := a.client.ListSessions(context.Background())
	require.NoError(t, err)
	require.Len(t, list, 2)
	assert.Equal(t, "bash", list[0].Shell)
}

func TestSession_Run_ManySessionsInParallel(t *testing.T) {
	a := newTestAgent(t, nil)
	const n = 8
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			info, err := a.client.CreateSession(context.Background(), agentapi.SessionCreateRequest{})
			if err != nil {
				errs <- err
				return
			}
			for j := range 20 {
				res, err := a.client.RunSession(context.Background(), info.ID, agentapi.SessionRunRequest{
					Command: fmt.Sprintf("echo %d-%d; (exit %d)", i, j, j)})
				if err != nil {
					errs <- err
					return
				}
				if res.Output != fmt.Sprintf("%d-%d\n", i, j) || res.ExitCode != j {
					errs <- fmt.Errorf("session %d run %d: got %q exit %d", i, j, res.Output, res.ExitCode)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		assert.NoError(t, err)
	}
}

func TestSession_Run_WithoutCommandRefused(t *testing.T) {
	a := newTestAgent(t, nil)
	id := newSession(t, a, agentapi.SessionCreateRequest{})
	for _, body := range []string{`{}`, `{"command":""}`} {
		err := a.client.DoRaw(context.Background(), http.MethodPost, "/v1/sessions/"+id+"/run", strings.NewReader(body), nil)
		ae := apiError(t, err)
		assert.Equal(t, http.StatusBadRequest, ae.Status)
		assert.Equal(t, "command: required", ae.Message)
	}
}

func TestSession_Env_ValuesKeptExactly(t *testing.T) {
	value := "line one\nline two\ttab  two spaces\n"
	for _, shell := range []string{"", "/bin/sh"} {
		t.Run("shell "+shell, func(t *testing.T) {
			a := newTestAgent(t, func(c *Config) { c.Shell = shell })
			id := newSession(t, a, agentapi.SessionCreateRequest{Env: map[string]string{"MULTI": value}})
			res := run(t, a, id, `printf '%s' "$MULTI"`, 0)
			assert.Equal(t, value, res.Output)
			ex, err := a.client.Exec(context.Background(), agentapi.ExecRequest{Command: `printf '%s' "$MULTI"`, Env: map[string]string{"MULTI": value}})
			require.NoError(t, err)
			assert.Equal(t, value, ex.Stdout)
		})
	}
}

func TestSession_Run_StatusCarriesToNextRun(t *testing.T) {
	for _, shell := range []string{"", "/bin/sh"} {
		t.Run("shell "+shell, func(t *testing.T) {
			a := newTestAgent(t, func(c *Config) { c.Shell = shell })
			id := newSession(t, a, agentapi.SessionCreateRequest{})
			steps := []struct {
				name, command, output string
				code                  int
				timeoutMS             int64
			}{
				{name: "first run sees 0", command: "echo $?", output: "0\n"},
				{name: "false", command: "false", code: 1},
				{name: "after false", command: "echo $?", output: "1\n"},
				{name: "after echo", command: "echo $?", output: "0\n"},
				{name: "exit code 42", command: "(exit 42)", code: 42},
				{name: "status kept for a test", command: "[ $? -eq 42 ] && echo kept", output: "kept\n"},
				{name: "timed out", command: "sleep 1000", code: exitInterrupted, timeoutMS: 200},
				{name: "after timeout", command: "echo $?", output: "130\n"},
				{name: "errexit on", command: "set -e"},
				{name: "timed out under errexit", command: "sleep 1000", code: exitInterrupted, timeoutMS: 200},
				{name: "errexit session survives the status", command: "echo $?", output: "130\n"},
			}
			for _, s := range steps {
				res := run(t, a, id, s.command, s.timeoutMS)
				assert.Equal(t, s.code, res.ExitCode, s.name)
				if s.timeoutMS == 0 {
					assert.Equal(t, s.output, res.Output, s.name)
				}
			}
		})
	}
}
