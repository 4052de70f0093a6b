package execagent

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/internal/testenv"
)

// testPOSIXShell runs the exec and session checks against a POSIX sh.
func testPOSIXShell(t *testing.T, shell string) {
	a := newTestAgent(t, func(c *Config) { c.Shell = shell })
	ctx := context.Background()

	res, err := a.client.Exec(ctx, agentapi.ExecRequest{Command: "echo $0 >/dev/null; echo out; echo err >&2; exit 3"})
	require.NoError(t, err)
	assert.Equal(t, agentapi.ExecResult{ExitCode: 3, Stdout: "out\n", Stderr: "err\n"},
		agentapi.ExecResult{ExitCode: res.ExitCode, Stdout: res.Stdout, Stderr: res.Stderr})

	long := ": '" + strings.Repeat("x", 200<<10) + "'\necho long; exit 6"
	res, err = a.client.Exec(ctx, agentapi.ExecRequest{Command: long})
	require.NoError(t, err)
	assert.Equal(t, 6, res.ExitCode)
	assert.Equal(t, "long\n", res.Stdout)

	info, err := a.client.CreateSession(ctx, agentapi.SessionCreateRequest{Env: map[string]string{"S": "s"}})
	require.NoError(t, err)
	assert.Equal(t, "sh", info.Shell)
	id := info.ID
	require.NoError(t, os.Mkdir(filepath.Join(a.cfg.Workdir, "sub"), 0o755))
	steps := []struct {
		name, command, output string
		code                  int
		timeoutMS             int64
		timedOut              bool
	}{
		{name: "cd and export", command: "cd sub; export X=1; f() { echo f$1; }"},
		{name: "state persists", command: "pwd; echo $X $S; f 2", output: filepath.Join(a.cfg.Workdir, "sub") + "\nX\n"},
		{name: "exit code", command: "(exit 7)", code: 7},
		{name: "syntax error", command: "if then", code: 2},
		{name: "alive after syntax error", command: "echo alive", output: "alive\n"},
		{name: "stdin is empty", command: "cat; echo done", output: "done\n"},
		{name: "builtin loop times out", command: "while true; do :; done", code: exitInterrupted, timeoutMS: 200, timedOut: true},
		{name: "alive after builtin loop", command: "echo alive", output: "alive\n"},
		{name: "sleep loop times out", command: "while true; do sleep 1; done", code: exitInterrupted, timeoutMS: 200, timedOut: true},
		{name: "alive after sleep loop", command: "echo alive", output: "alive\n"},
		{name: "sleep times out", command: "sleep 1000", code: exitInterrupted, timeoutMS: 200, timedOut: true},
		{name: "alive after sleep", command: "echo $X", output: "1\n"},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			res := run(t, a, id, s.command, s.timeoutMS)
			assert.Equal(t, s.code, res.ExitCode)
			assert.Equal(t, s.timedOut, res.TimedOut)
			switch {
			case s.name == "state persists":
				assert.Equal(t, filepath.Join(a.cfg.Workdir, "sub")+"\n1 s\nf2\n", res.Output)
			case s.name == "syntax error":
				assert.Contains(t, strings.ToLower(res.Output), "syntax error")
			case !s.timedOut:
				assert.Equal(t, s.output, res.Output)
			}
		})
	}
	res2 := run(t, a, id, "exit 4", 0)
	assert.True(t, res2.Closed)
	assert.Equal(t, 4, res2.ExitCode)
	_, err = a.client.RunSession(ctx, id, agentapi.SessionRunRequest{Command: "true"})
	assert.Equal(t, http.StatusNotFound, apiError(t, err).Status)
}

func TestSession_POSIXShell_BinSh(t *testing.T) {
	testPOSIXShell(t, "/bin/sh")
}

// TestSession_POSIXShell_Busybox runs the checks in busybox's sh, the
// shell of images without bash. It needs a busybox binary (testenv.Busybox:
// make test installs busybox-static).
func TestSession_POSIXShell_Busybox(t *testing.T) {
	bb := testenv.Busybox(t)
	// busybox picks the applet from argv[0]'s base name.
	dir := t.TempDir()
	sh := filepath.Join(dir, "sh")
	require.NoError(t, os.Symlink(bb, sh))
	testPOSIXShell(t, sh)
}
