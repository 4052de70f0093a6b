package execagent

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

// TestSession_ShellDiagnosticsStayOutOfRuns: what the shell itself writes to
// its stderr outside a run's command (an interactive bash that reaps a
// command killed by an interrupt may print "tcsetattr: Inappropriate ioctl
// for device" while it reads the next run's line, which the flake hunt
// caught in the next run's output, 2 runs in 20) is not a run's output.
// The test makes bash write at top level on every line the agent sends: a
// DEBUG trap that prints only outside sourced files, i.e. when the agent's
// own run line and status line run.
func TestSession_ShellDiagnosticsStayOutOfRuns(t *testing.T) {
	a := newTestAgent(t, nil)
	sid := newSession(t, a, agentapi.SessionCreateRequest{})
	res := run(t, a, sid, `trap '[ -n "${BASH_SOURCE[0]}" ] || echo "shell noise" >&2' DEBUG; set -T`, 0)
	require.Equal(t, 0, res.ExitCode, res.Output)
	for i := 0; i < 3; i++ {
		assert.Equal(t, "ok\n", run(t, a, sid, "echo ok", 0).Output)
	}
	assert.Equal(t, "err\n", run(t, a, sid, "echo err >&2", 0).Output, "a command's stderr is still the run's output")
	assert.Equal(t, "both\n", run(t, a, sid, "exec 3>&1; echo both >&2", 0).Output)
}
