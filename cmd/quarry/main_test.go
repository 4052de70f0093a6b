package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/client"
	"github.com/quarryhq/quarry/execagent/agentapi"
)

// waitTimeout bounds each CLI run of these tests.
const waitTimeout = 30 * time.Second

// result is what one CLI run printed and its exit status.
type result struct {
	stdout, stderr string
	code           int
}

// runCLI runs the CLI with args and stdin, as main would, without --url or --api-key.
func runCLI(t *testing.T, stdin string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	var out, errb bytes.Buffer
	err := run(ctx, args, strings.NewReader(stdin), &out, &errb)
	code := exitCode(err, &errb)
	return result{out.String(), errb.String(), code}
}

// cli runs the CLI against f.
func (f *fakeGateway) cli(t *testing.T, stdin string, args ...string) result {
	t.Helper()
	return runCLI(t, stdin, append([]string{"--url", f.url, "--api-key", f.key}, args...)...)
}

// mustCreate leases a sandbox in f and returns its id.
func (f *fakeGateway) mustCreate(t *testing.T, args ...string) string {
	t.Helper()
	res := f.cli(t, "", append([]string{"sandbox", "create"}, args...)...)
	require.Equal(t, 0, res.code, res.stderr)
	return strings.TrimSpace(res.stdout)
}

func TestRun_SandboxCreate_PrintsIDAndSendsFlags(t *testing.T) {
	f := newFakeGateway(t)
	res := f.cli(t, "", "sandbox", "create", "--pool", "gpu", "--lease-seconds", "120", "--env", "TASK=42",
		"--env", "B=x=y", "--label", "run=exp1", "--idempotency-key", "k1")
	require.Equal(t, result{"sbx-1\n", "", 0}, res)
	assert.Equal(t, []string{"k1"}, f.idempotency)
	assert.Equal(t, "gpu", f.sandboxes[0].Pool)
	assert.Equal(t, 120, f.sandboxes[0].LeaseSeconds)
	assert.Equal(t, map[string]string{"run": "exp1"}, f.sandboxes[0].Labels)

	res = f.cli(t, "", "sandbox", "create", "--json")
	require.Equal(t, 0, res.code, res.stderr)
	assert.JSONEq(t, `{"id":"sbx-2","pool":"default","state":"active","generation":1,"created_at":"2026-03-04T05:06:07Z",
		"expires_at":"2026-03-04T05:16:07Z","lease_seconds":600}`, res.stdout)
	assert.Equal(t, []string{"k1", ""}, f.idempotency)
}

func TestRun_Config_EnvAndFlags(t *testing.T) {
	f := newFakeGateway(t)
	tests := []struct {
		name     string
		url, key string // environment
		args     []string
		wantCode int
		wantErr  string
	}{
		{"env alone", f.url, f.key, nil, 0, ""},
		{"flag overrides a wrong env key", f.url, "wrong", []string{"--api-key", f.key}, 0, ""},
		{"flag after the command", f.url, "wrong", []string{"sandbox", "ls", "--api-key", f.key}, 0, ""},
		{"wrong key", f.url, "wrong", nil, 1, "quarry: list sandboxes: missing or wrong API key (401 unauthorized)\n"},
		{"no key", f.url, "", nil, 1, "quarry: --api-key (QUARRY_API_KEY): must be set\n"},
		{"bad url", "ftp://x", f.key, nil, 1, "quarry: --url (QUARRY_URL): want http(s)://host:port, got \"ftp://x\"\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("QUARRY_URL", tt.url)
			t.Setenv("QUARRY_API_KEY", tt.key)
			args := tt.args
			if len(args) == 0 || args[0] != "sandbox" {
				args = append(args, "sandbox", "ls")
			}
			res := runCLI(t, "", args...)
			assert.Equal(t, tt.wantCode, res.code)
			assert.Equal(t, tt.wantErr, res.stderr)
		})
	}
}

func TestRun_SandboxLsGetHeartbeatRm(t *testing.T) {
	f := newFakeGateway(t)
	a := f.mustCreate(t, "--label", "run=a", "--label", "z=1")
	b := f.mustCreate(t, "--pool", "gpu", "--label", "run=b")

	res := f.cli(t, "", "sandbox", "ls")
	assert.Equal(t, result{"ID     POOL     STATE   EXPIRES               LABELS\n" +
		"sbx-1  default  active  2026-03-04T05:16:07Z  run=a,z=1\n" +
		"sbx-2  gpu      active  2026-03-04T05:16:07Z  run=b\n", "", 0}, res)

	res = f.cli(t, "", "sandbox", "ls", "--label", "run=b", "--json")
	require.Equal(t, 0, res.code, res.stderr)
	assert.Contains(t, res.stdout, `"id": "sbx-2"`)
	assert.NotContains(t, res.stdout, `"id": "sbx-1"`)

	res = f.cli(t, "", "sandbox", "heartbeat", a)
	assert.Equal(t, 0, res.code, res.stderr)
	assert.Contains(t, res.stdout, "2026-03-04T05:26:07Z", "the new expiry is shown")

	res = f.cli(t, "", "sandbox", "rm", a, "sbx-404", b)
	assert.Equal(t, 1, res.code)
	assert.Equal(t, a+"\n"+b+"\n", res.stdout, "the others are released despite the failure")
	assert.Equal(t, "quarry: release sbx-404: sandbox sbx-404 not found (404 not_found)\n", res.stderr)

	res = f.cli(t, "", "sandbox", "get", "--json", b)
	require.Equal(t, 0, res.code, res.stderr)
	assert.Contains(t, res.stdout, `"state": "released"`)

	res = f.cli(t, "", "sandbox", "heartbeat", b)
	assert.Equal(t, result{"", "quarry: heartbeat sbx-2: sandbox sbx-2 was released (410 gone)\n", 1}, res)

	res = f.cli(t, "", "sandbox", "get", "sbx-404")
	assert.Equal(t, result{"", "quarry: get sandbox sbx-404: sandbox sbx-404 not found (404 not_found)\n", 1}, res)
}

func TestRun_SandboxKillAll(t *testing.T) {
	f := newFakeGateway(t)
	a := f.mustCreate(t)
	res := f.cli(t, "", "sandbox", "kill-all", a)
	assert.Equal(t, result{a + ": killed 201 processes (233 threads) in 37 ms\n", "", 0}, res)
	res = f.cli(t, "", "sandbox", "kill-all", "--json", a)
	require.Equal(t, 0, res.code, res.stderr)
	assert.JSONEq(t, `{"killed": 201, "threads": 233, "left": 0, "duration_ms": 37}`, res.stdout)
	assert.Equal(t, []string{a, a}, f.killAlls)

	res = f.cli(t, "", "sandbox", "kill-all", "sbx-404")
	assert.Equal(t, result{"", "quarry: kill-all sbx-404: sandbox sbx-404 not found (404 not_found)\n", 1}, res)
	res = f.cli(t, "", "sandbox", "kill-all")
	assert.Equal(t, result{"", "quarry: sandbox kill-all: missing arguments (see quarry sandbox kill-all -h)\n", 1}, res)
}

func TestRun_Pools_Table(t *testing.T) {
	f := newFakeGateway(t)
	res := f.cli(t, "", "pools")
	assert.Equal(t, result{"NAME     PROVIDER  READY  LAUNCHING  LEASED  STOPPING  MIN_WARM  MAX_TOTAL\n" +
		"default  process   2      1          3       0         2         8\n" +
		"gpu      ecs       0      0          1       0         0         2\n", "", 0}, res)
}

func TestRun_Usage(t *testing.T) {
	tests := []struct {
		name       string
		args       []string
		wantCode   int
		wantStdout string // a part of it
		wantStderr string
	}{
		{"help", []string{"-h"}, 0, "usage: quarry", ""},
		{"sandbox help", []string{"sandbox"}, 0, "shell", ""},
		{"command help", []string{"sandbox", "exec", "-h"}, 0, "-timeout", ""},
		{"no command", nil, 1, "", "quarry: missing command (see quarry -h)\n"},
		{"unknown command", []string{"sandbox", "frob"}, 1, "", "quarry: unknown command \"frob\" (see quarry sandbox -h)\n"},
		{"unknown flag", []string{"sandbox", "ls", "--frob"}, 1, "", "quarry: sandbox ls: flag provided but not defined: -frob\n"},
		{"bad env flag", []string{"sandbox", "create", "--env", "NOEQUALS"}, 1, "",
			"quarry: sandbox create: invalid value \"NOEQUALS\" for flag -env: want K=V, got \"NOEQUALS\"\n"},
		{"missing id", []string{"sandbox", "get"}, 1, "", "quarry: sandbox get: missing arguments (see quarry sandbox get -h)\n"},
		{"extra argument", []string{"sandbox", "get", "a", "b"}, 1, "", "quarry: sandbox get: unexpected argument \"b\"\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := runCLI(t, "", tt.args...)
			assert.Equal(t, tt.wantCode, res.code)
			assert.Contains(t, res.stdout, tt.wantStdout)
			assert.Equal(t, tt.wantStderr, res.stderr)
		})
	}
}

// The help is made from the command table: quarry -h (and quarry help)
// names every command of every group, each group's help lists its
// commands, every name and alias dispatches, and every command has a usage.
func TestRun_Help_NamesEveryCommand(t *testing.T) {
	for _, top := range [][]string{{"-h"}, {"help"}} {
		res := runCLI(t, "", top...)
		require.Equal(t, 0, res.code, res.stderr)
		for _, g := range groups() {
			line := helpLine(res.stdout, g.name)
			require.NotEmpty(t, line, "quarry %s has no line for %q:\n%s", top[0], g.name, res.stdout)
			listed := strings.FieldsFunc(line, func(r rune) bool { return r == ' ' || r == '|' })
			for _, cmd := range g.cmds {
				assert.Contains(t, listed, cmd.name, "quarry %s names %s %s", top[0], g.name, cmd.name)
			}
		}
	}
	for _, g := range groups() {
		for _, word := range append([]string{g.name}, g.aliases...) {
			for _, cmd := range g.cmds {
				args := []string{word, cmd.name, "-h"}
				if g.single() {
					args = []string{word, "-h"}
				} else {
					res := runCLI(t, "", word, "-h")
					require.Equal(t, 0, res.code, res.stderr)
					assert.NotEmpty(t, helpLine(res.stdout, cmd.name), "quarry %s -h lists %s:\n%s", word, cmd.name, res.stdout)
				}
				res := runCLI(t, "", args...)
				assert.Equal(t, 0, res.code, "%v: %s", args, res.stderr)
				assert.True(t, strings.HasPrefix(res.stdout, "usage: "+cmd.usage+"\n"), "%v prints its usage:\n%s", args, res.stdout)
			}
		}
	}
}

// helpLine is the line of help that starts (after its indent) with the word name.
func helpLine(help, name string) string {
	for _, l := range strings.Split(help, "\n") {
		if f := strings.Fields(l); len(f) > 0 && f[0] == name && strings.HasPrefix(l, "  ") {
			return l
		}
	}
	return ""
}

func TestRun_Help_NeverPrintsTheAPIKey(t *testing.T) {
	t.Setenv("QUARRY_API_KEY", "qk_secret_in_the_environment")
	for _, args := range [][]string{{"-h"}, {"sandbox", "exec", "-h"}, {"--api-key", "qk_secret_on_the_line", "sandbox", "ls", "-h"}} {
		res := runCLI(t, "", args...)
		assert.Equal(t, 0, res.code)
		assert.NotContains(t, res.stdout+res.stderr, "qk_secret", "args %v", args)
	}
}

func TestRun_SandboxExec_StreamsOutputAndExitsWithCommandStatus(t *testing.T) {
	tests := []struct {
		name       string
		args       []string // after "sandbox exec"
		events     func(w sseWriter)
		want       result
		wantReq    agentapi.ExecRequest
		wantNoExec bool
	}{
		{
			name: "argv after --, flags after the id",
			args: []string{"sbx-1", "--timeout", "5s", "--env", "A=1", "--cwd", "/tmp", "--", "ls", "-la", "--color"},
			events: func(w sseWriter) {
				w.event("stdout", agentapi.StreamChunk{Data: "out1 "})
				w.keepAlive()
				w.event("stderr", agentapi.StreamChunk{Data: "err1\n"})
				w.event("stdout", agentapi.StreamChunk{Data: "out2\n"})
				w.event("exit", agentapi.ExecResult{ExitCode: 0})
			},
			want:    result{"out1 out2\n", "err1\n", 0},
			wantReq: agentapi.ExecRequest{Argv: []string{"ls", "-la", "--color"}, TimeoutMS: 5000, Env: map[string]string{"A": "1"}, Cwd: "/tmp", Encoding: agentapi.EncodingBase64, UnlimitedOutput: true},
		},
		{
			name: "shell string and its exit code",
			args: []string{"sbx-1", "echo oops >&2; exit 7"},
			events: func(w sseWriter) {
				w.event("stderr", agentapi.StreamChunk{Data: "oops\n"})
				w.event("exit", agentapi.ExecResult{ExitCode: 7})
			},
			want:    result{"", "oops\n", 7},
			wantReq: agentapi.ExecRequest{Command: "echo oops >&2; exit 7", Encoding: agentapi.EncodingBase64, UnlimitedOutput: true},
		},
		{
			name:    "several words are one shell string",
			args:    []string{"sbx-1", "echo", "a b"},
			want:    result{"", "", 0},
			wantReq: agentapi.ExecRequest{Command: "echo a b", Encoding: agentapi.EncodingBase64, UnlimitedOutput: true},
		},
		{
			name: "timed out and killed",
			args: []string{"sbx-1", "--timeout", "1ms", "sleep 100"},
			events: func(w sseWriter) {
				w.event("exit", agentapi.ExecResult{ExitCode: -1, Signal: "SIGKILL", TimedOut: true})
			},
			want:    result{"", "quarry: command timed out\n", 137},
			wantReq: agentapi.ExecRequest{Command: "sleep 100", TimeoutMS: 1, Encoding: agentapi.EncodingBase64, UnlimitedOutput: true},
		},
		{
			name: "killed by a signal",
			args: []string{"sbx-1", "kill -TERM $$"},
			events: func(w sseWriter) {
				w.event("exit", agentapi.ExecResult{ExitCode: -1, Signal: "SIGTERM"})
			},
			want:    result{"", "quarry: command killed by SIGTERM\n", 143},
			wantReq: agentapi.ExecRequest{Command: "kill -TERM $$", Encoding: agentapi.EncodingBase64, UnlimitedOutput: true},
		},
		{
			name: "error event mid-stream",
			args: []string{"sbx-1", "yes"},
			events: func(w sseWriter) {
				w.event("stdout", agentapi.StreamChunk{Data: "y\n"})
				w.event("error", agentapi.ErrorDetail{Code: "agent_unreachable", Message: "agent connection lost"})
			},
			want:    result{"y\n", "quarry: exec in sbx-1: agent connection lost (agent_unreachable)\n", 1},
			wantReq: agentapi.ExecRequest{Command: "yes", Encoding: agentapi.EncodingBase64, UnlimitedOutput: true},
		},
		{
			name:       "unknown sandbox",
			args:       []string{"sbx-404", "true"},
			want:       result{"", "quarry: exec in sbx-404: sandbox sbx-404 not found (404 not_found)\n", 1},
			wantNoExec: true,
		},
		{
			name:       "missing command",
			args:       []string{"sbx-1"},
			want:       result{"", "quarry: sandbox exec: missing command: give ID -- CMD ARGS… or ID 'SHELL STRING'\n", 1},
			wantNoExec: true,
		},
		{
			name:       "negative timeout",
			args:       []string{"--timeout", "-1s", "sbx-1", "true"},
			want:       result{"", "quarry: --timeout: must not be negative, got -1s\n", 1},
			wantNoExec: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeGateway(t)
			f.mustCreate(t)
			if tt.events != nil {
				f.exec = func(w sseWriter, _ agentapi.ExecRequest) { tt.events(w) }
			}
			res := f.cli(t, "", append([]string{"sandbox", "exec"}, tt.args...)...)
			assert.Equal(t, tt.want, res)
			if tt.wantNoExec {
				assert.Empty(t, f.execs)
				return
			}
			require.Len(t, f.execs, 1)
			assert.Equal(t, tt.wantReq, f.execs[0])
		})
	}
}

func TestRun_SandboxExec_StdinOnlyWithI(t *testing.T) {
	f := newFakeGateway(t)
	f.mustCreate(t)
	res := f.cli(t, "piped text\n", "sandbox", "exec", "-i", "sbx-1", "cat")
	require.Equal(t, 0, res.code, res.stderr)
	res = f.cli(t, "not passed\n", "sandbox", "exec", "sbx-1", "cat")
	require.Equal(t, 0, res.code, res.stderr)
	require.Len(t, f.execs, 2)
	assert.Equal(t, "piped text\n", f.execs[0].Stdin)
	assert.Empty(t, f.execs[1].Stdin, "without -i stdin is left alone (it may never end)")

	res = f.cli(t, strings.Repeat("x", maxExecStdin+1), "sandbox", "exec", "-i", "sbx-1", "cat")
	assert.Equal(t, 1, res.code)
	assert.Contains(t, res.stderr, "stdin is over")
	assert.Len(t, f.execs, 2, "nothing sent")
}

func TestRun_SandboxShell_RunsScriptedStdin(t *testing.T) {
	tests := []struct {
		name        string
		stdin       string
		wantRuns    []string
		want        result
		wantClosed  []string // sessions closed by the CLI
		wantTimeout int64
		args        []string
	}{
		{
			name:     "Ctrl-D ends and closes the session",
			stdin:    "cd /tmp\n\nfalse\necho hi\nprintf no-newline",
			wantRuns: []string{"cd /tmp", "false", "echo hi", "printf no-newline"},
			want: result{"hi\nno-newline\n",
				"session ses-1 in sbx-1 (Ctrl-D ends it)\nsbx-1$ sbx-1$ sbx-1$ sbx-1 [1]$ sbx-1$ sbx-1$ \n", 0},
			wantClosed: []string{"ses-1"},
		},
		{
			name:     "exit ends the shell with its status",
			stdin:    "echo a\nexit 3\necho never\n",
			wantRuns: []string{"echo a", "exit 3"},
			want:     result{"a\n", "session ses-1 in sbx-1 (Ctrl-D ends it)\nsbx-1$ sbx-1$ ", 3},
		},
		{
			name:        "timeout is sent and reported",
			args:        []string{"--timeout", "2s"},
			stdin:       "sleep 100\n",
			wantRuns:    []string{"sleep 100"},
			wantTimeout: 2000,
			want: result{"", "session ses-1 in sbx-1 (Ctrl-D ends it)\nsbx-1$ quarry: command timed out; the session is still usable\n" +
				"sbx-1 [130]$ \n", 0},
			wantClosed: []string{"ses-1"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeGateway(t)
			id := f.mustCreate(t)
			f.run = func(command string) agentapi.SessionRunResult {
				switch command {
				case "false":
					return agentapi.SessionRunResult{ExitCode: 1}
				case "echo hi":
					return agentapi.SessionRunResult{Output: "hi\n"}
				case "echo a":
					return agentapi.SessionRunResult{Output: "a\n"}
				case "printf no-newline":
					return agentapi.SessionRunResult{Output: "no-newline"}
				case "exit 3":
					return agentapi.SessionRunResult{ExitCode: 3, Closed: true}
				case "sleep 100":
					return agentapi.SessionRunResult{ExitCode: 130, TimedOut: true}
				}
				return agentapi.SessionRunResult{}
			}
			res := f.cli(t, tt.stdin, append(append([]string{"sandbox", "shell"}, tt.args...), id)...)
			assert.Equal(t, tt.want, res)
			var runs []string
			for _, r := range f.runs {
				runs = append(runs, r.Command)
				assert.Equal(t, tt.wantTimeout, r.TimeoutMS)
			}
			assert.Equal(t, tt.wantRuns, runs)
			assert.Equal(t, tt.wantClosed, f.closedSessions)
			assert.Empty(t, f.sessions, "no session is left open")
		})
	}
}

func TestRun_SandboxShell_GoneSandboxFailsWithoutLeak(t *testing.T) {
	f := newFakeGateway(t)
	res := f.cli(t, "ls\n", "sandbox", "shell", "sbx-404")
	assert.Equal(t, result{"", "quarry: create session in sbx-404: sandbox sbx-404 not found (404 not_found)\n", 1}, res)
	assert.Empty(t, f.runs)
}

func TestExitCode(t *testing.T) {
	tests := []struct {
		name       string
		err        error
		want       int
		wantStderr string
	}{
		{"nil", nil, 0, ""},
		{"remote status", &exitError{code: 42}, 42, ""},
		{"gateway error on one line", &client.Error{Status: 503, Code: "no_capacity", Message: "pool default\nis full"}, 1,
			"quarry: pool default is full (503 no_capacity)\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b bytes.Buffer
			assert.Equal(t, tt.want, exitCode(tt.err, &b))
			assert.Equal(t, tt.wantStderr, b.String())
		})
	}
}

// ls shows active sandboxes unless asked for more.
func TestRun_SandboxLs_ActiveUnlessAll(t *testing.T) {
	f := newFakeGateway(t)
	a := f.mustCreate(t)
	b := f.mustCreate(t)
	res := f.cli(t, "", "sandbox", "rm", a)
	require.Equal(t, 0, res.code, res.stderr)

	res = f.cli(t, "", "sandbox", "ls", "--json")
	require.Equal(t, 0, res.code, res.stderr)
	assert.Contains(t, res.stdout, `"id": "`+b+`"`)
	assert.NotContains(t, res.stdout, `"id": "`+a+`"`, "a released sandbox is not listed by default")

	res = f.cli(t, "", "sandbox", "ls", "--all", "--json")
	require.Equal(t, 0, res.code, res.stderr)
	assert.Contains(t, res.stdout, `"id": "`+a+`"`)
	assert.Contains(t, res.stdout, `"id": "`+b+`"`)

	res = f.cli(t, "", "sandbox", "ls", "--state", "released", "--json")
	require.Equal(t, 0, res.code, res.stderr)
	assert.Contains(t, res.stdout, `"id": "`+a+`"`)
	assert.NotContains(t, res.stdout, `"id": "`+b+`"`)

	res = f.cli(t, "", "sandbox", "ls", "--all", "--state", "active")
	assert.Equal(t, result{"", "quarry: sandbox ls: --all and --state exclude each other\n", 1}, res)
}

func TestRun_KeyNew(t *testing.T) {
	res := runCLI(t, "", "key", "new")
	require.Equal(t, 0, res.code, res.stderr)
	assert.Regexp(t, `^qk_[0-9a-f]{48}\n$`, res.stdout)
	res = runCLI(t, "", "key", "new", "--e2b")
	require.Equal(t, 0, res.code, res.stderr)
	assert.Regexp(t, `^e2b_[0-9a-f]{40}\n$`, res.stdout, "the shape E2B's SDK checks: ^e2b_[0-9a-f]+$")
	assert.NotEqual(t, res.stdout, runCLI(t, "", "key", "new", "--e2b").stdout)
	res = runCLI(t, "", "key", "new", "extra")
	assert.Equal(t, 1, res.code)
}
