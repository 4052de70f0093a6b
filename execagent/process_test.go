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
)

// waitProcessExited polls a process until it has exited and returns its info.
func waitProcessExited(t testing.TB, a *testAgent, id string) agentapi.ProcessInfo {
	t.Helper()
	var info agentapi.ProcessInfo
	eventually(t, func() bool {
		var err error
		info, err = a.client.GetProcess(context.Background(), id)
		require.NoError(t, err)
		return info.State == agentapi.ProcessExited
	}, "process %s did not exit", id)
	return info
}

func TestProcess_Start_ExitCodeAndOutput(t *testing.T) {
	a := newTestAgent(t, nil)
	ctx := context.Background()
	tests := []struct {
		name   string
		req    agentapi.ProcessStartRequest
		code   int
		signal string
		output string
	}{
		{"exit code", agentapi.ProcessStartRequest{Command: "echo out; echo err >&2; exit 9"}, 9, "", "out\nerr\n"},
		{"argv and env", agentapi.ProcessStartRequest{Argv: []string{"sh", "-c", "echo $P"}, Env: map[string]string{"P": "v"}}, 0, "", "v\n"},
		{"killed by a signal", agentapi.ProcessStartRequest{Command: "kill -KILL $$"}, -1, "SIGKILL", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := a.client.StartProcess(ctx, tt.req)
			require.NoError(t, err)
			assert.NotZero(t, p.PID) // State may already be exited: these are quick

			info := waitProcessExited(t, a, p.ID)
			require.NotNil(t, info.ExitCode)
			assert.Equal(t, tt.code, *info.ExitCode)
			assert.Equal(t, tt.signal, info.Signal)
			assert.NotNil(t, info.EndedAt)
			out, err := a.client.ProcessOutput(ctx, p.ID, 0, 0)
			require.NoError(t, err)
			assert.Equal(t, tt.output, out.Data)
			assert.Equal(t, int64(len(tt.output)), out.NextOffset)
			assert.Equal(t, agentapi.ProcessExited, out.State)
			require.NotNil(t, out.ExitCode)
			assert.Equal(t, tt.code, *out.ExitCode)
		})
	}
}

func TestProcess_Output_OffsetsAndRingDrop(t *testing.T) {
	a := newTestAgent(t, func(c *Config) { c.ProcessOutputBytes = 1000 })
	ctx := context.Background()
	// 0123456789 repeated: 3000 bytes, more than the ring holds.
	p, err := a.client.StartProcess(ctx, agentapi.ProcessStartRequest{Command: "for i in $(seq 300); do printf 0123456789; done"})
	require.NoError(t, err)
	info := waitProcessExited(t, a, p.ID)
	assert.Equal(t, int64(3000), info.OutputBytes)

	tests := []struct {
		name                       string
		offset                     int64
		limit                      int
		from, next, dropped, bytes int64
	}{
		{"old offset starts at the oldest byte", 0, 0, 2000, 3000, 2000, 1000},
		{"inside the ring", 2500, 0, 2500, 3000, 0, 500},
		{"limit", 2003, 4, 2003, 2007, 0, 4},
		{"at the end", 3000, 0, 3000, 3000, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := a.client.ProcessOutput(ctx, p.ID, tt.offset, tt.limit)
			require.NoError(t, err)
			assert.Equal(t, tt.from, out.Offset)
			assert.Equal(t, tt.next, out.NextOffset)
			assert.Equal(t, tt.dropped, out.Dropped)
			assert.Len(t, out.Data, int(tt.bytes))
			if tt.bytes > 0 {
				assert.Equal(t, byte('0'+out.Offset%10), out.Data[0])
			}
		})
	}
	_, err = a.client.ProcessOutput(ctx, p.ID, 3001, 0)
	assert.Equal(t, http.StatusBadRequest, apiError(t, err).Status)
}

func TestProcess_Follow_StreamsUntilExit(t *testing.T) {
	a := newTestAgent(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	p, err := a.client.StartProcess(ctx, agentapi.ProcessStartRequest{
		Command: "echo one; while [ ! -e go ]; do sleep 0.01; done; echo two; exit 5"})
	require.NoError(t, err)
	st, err := a.client.FollowProcessOutput(ctx, p.ID, 0)
	require.NoError(t, err)
	defer st.Close()
	ev, err := st.Next()
	require.NoError(t, err)
	require.Equal(t, agentapi.EventOutput, ev.Name)
	var c agentapi.StreamChunk
	require.NoError(t, ev.Decode(&c))
	assert.Equal(t, "one\n", c.Data)
	assert.Equal(t, int64(0), c.Offset)
	require.NoError(t, os.WriteFile(filepath.Join(a.cfg.Workdir, "go"), nil, 0o644))
	var rest string
	for {
		ev, err := st.Next()
		require.NoError(t, err)
		if ev.Name == agentapi.EventExit {
			var info agentapi.ProcessInfo
			require.NoError(t, ev.Decode(&info))
			assert.Equal(t, agentapi.ProcessExited, info.State)
			require.NotNil(t, info.ExitCode)
			assert.Equal(t, 5, *info.ExitCode)
			break
		}
		var c agentapi.StreamChunk
		require.NoError(t, ev.Decode(&c))
		assert.Equal(t, int64(4+len(rest)), c.Offset)
		rest += c.Data
	}
	assert.Equal(t, "two\n", rest)

	// Following an exited process replays from the offset, then exits.
	st2, err := a.client.FollowProcessOutput(ctx, p.ID, 4)
	require.NoError(t, err)
	defer st2.Close()
	ev, err = st2.Next()
	require.NoError(t, err)
	require.NoError(t, ev.Decode(&c))
	assert.Equal(t, "two\n", c.Data)
	ev, err = st2.Next()
	require.NoError(t, err)
	assert.Equal(t, agentapi.EventExit, ev.Name)
}

func TestProcess_Signal_GoesToGroup(t *testing.T) {
	a := newTestAgent(t, nil)
	ctx := context.Background()
	p, err := a.client.StartProcess(ctx, agentapi.ProcessStartRequest{
		Command: "trap 'echo got-term; exit 0' TERM; sleep 1000 & echo ready; wait"})
	require.NoError(t, err)
	eventually(t, func() bool {
		out, err := a.client.ProcessOutput(ctx, p.ID, 0, 0)
		return err == nil && strings.Contains(out.Data, "ready")
	}, "process never got ready")
	_, err = a.client.SignalProcess(ctx, p.ID, "TERM")
	require.NoError(t, err)
	info := waitProcessExited(t, a, p.ID)
	require.NotNil(t, info.ExitCode)
	assert.Equal(t, 0, *info.ExitCode)
	out, err := a.client.ProcessOutput(ctx, p.ID, 0, 0)
	require.NoError(t, err)
	assert.Equal(t, "ready\ngot-term\n", out.Data)

	tests := []struct {
		name, signal string
		status       int
	}{
		{"unknown name", "NOPE", http.StatusBadRequest},
		{"bad number", "99", http.StatusBadRequest},
		{"exited process", "KILL", http.StatusConflict},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := a.client.SignalProcess(ctx, p.ID, tt.signal)
			assert.Equal(t, tt.status, apiError(t, err).Status)
		})
	}
}

func TestProcess_Stdin_WriteAndClose(t *testing.T) {
	a := newTestAgent(t, nil)
	ctx := context.Background()
	p, err := a.client.StartProcess(ctx, agentapi.ProcessStartRequest{
		Command: `while IFS= read -r line; do echo "got:$line"; done; echo eof`, Stdin: true})
	require.NoError(t, err)
	n, err := a.client.WriteProcessStdin(ctx, p.ID, strings.NewReader("{\"a\":1}\n"), false)
	require.NoError(t, err)
	assert.Equal(t, int64(8), n)
	eventually(t, func() bool {
		out, err := a.client.ProcessOutput(ctx, p.ID, 0, 0)
		return err == nil && out.Data == "got:{\"a\":1}\n"
	}, "first line not echoed")
	var raw map[string]any
	err = a.client.DoRaw(ctx, http.MethodPost, "/v1/processes/"+p.ID+"/stdin?close=true", strings.NewReader("last\n"), &raw)
	require.NoError(t, err)
	assert.Equal(t, map[string]any{"bytes": 5.0}, raw, "the answer is the byte count, with no empty path")
	info := waitProcessExited(t, a, p.ID)
	assert.Equal(t, 0, *info.ExitCode)
	out, err := a.client.ProcessOutput(ctx, p.ID, 0, 0)
	require.NoError(t, err)
	assert.Equal(t, "got:{\"a\":1}\ngot:last\neof\n", out.Data)

	_, err = a.client.WriteProcessStdin(ctx, p.ID, strings.NewReader("more"), false)
	assert.Equal(t, http.StatusConflict, apiError(t, err).Status)

	noStdin, err := a.client.StartProcess(ctx, agentapi.ProcessStartRequest{Command: "cat; echo done"})
	require.NoError(t, err)
	_, err = a.client.WriteProcessStdin(ctx, noStdin.ID, strings.NewReader("x"), false)
	assert.Equal(t, http.StatusConflict, apiError(t, err).Status)
	info = waitProcessExited(t, a, noStdin.ID)
	assert.Equal(t, 0, *info.ExitCode)
}

func TestProcess_ListAndKill(t *testing.T) {
	a := newTestAgent(t, func(c *Config) { c.MaxProcesses = 2 })
	ctx := context.Background()
	p1, err := a.client.StartProcess(ctx, agentapi.ProcessStartRequest{Command: "sleep 1000 & sleep 1000"})
	require.NoError(t, err)
	p2, err := a.client.StartProcess(ctx, agentapi.ProcessStartRequest{Argv: []string{"true"}})
	require.NoError(t, err)
	_, err = a.client.StartProcess(ctx, agentapi.ProcessStartRequest{Argv: []string{"true"}})
	assert.Equal(t, http.StatusConflict, apiError(t, err).Status, "over MaxProcesses")

	list, err := a.client.ListProcesses(ctx)
	require.NoError(t, err)
	require.Len(t, list, 2)
	assert.Equal(t, p1.ID, list[0].ID)
	assert.Equal(t, p2.ID, list[1].ID)
	assert.Equal(t, []string{"true"}, list[1].Argv)

	members := groupMembers(p1.PID)
	require.NotEmpty(t, members)
	info, err := a.client.KillProcess(ctx, p1.ID)
	require.NoError(t, err)
	assert.Equal(t, agentapi.ProcessExited, info.State)
	assert.Equal(t, "SIGKILL", info.Signal)
	for _, pid := range members {
		eventually(t, func() bool { return processGone(pid) }, "group member %d survived", pid)
	}
	_, err = a.client.GetProcess(ctx, p1.ID)
	assert.Equal(t, http.StatusNotFound, apiError(t, err).Status)
	_, err = a.client.KillProcess(ctx, p1.ID)
	assert.Equal(t, http.StatusNotFound, apiError(t, err).Status)
	_, err = a.client.StartProcess(ctx, agentapi.ProcessStartRequest{Argv: []string{"true"}})
	assert.NoError(t, err, "a slot is free again")
}

func TestRing_WriteRead(t *testing.T) {
	tests := []struct {
		name    string
		writes  []string
		off     int64
		limit   int
		want    string
		from    int64
		dropped int64
	}{
		{"empty", nil, 0, 10, "", 0, 0},
		{"partial", []string{"abc"}, 1, 10, "bc", 1, 0},
		{"exactly full", []string{"abcde"}, 0, 10, "abcde", 0, 0},
		{"wrapped", []string{"abcde", "fg"}, 0, 10, "cdefg", 2, 2},
		{"wrapped from inside", []string{"abc", "def", "gh"}, 5, 10, "fgh", 5, 0},
		{"one write larger than the ring", []string{"0123456789"}, 0, 10, "56789", 5, 5},
		{"large write after wrap", []string{"ab", "0123456789xyz"}, 11, 10, "9xyz", 11, 0},
		{"large write after wrap, oldest", []string{"ab", "0123456789xyz"}, 0, 10, "89xyz", 10, 10},
		{"limit", []string{"abcdefgh"}, 3, 2, "de", 3, 0},
		{"many writes", []string{"a", "b", "c", "d", "e", "f", "g", "h", "i"}, 0, 10, "efghi", 4, 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRing(5)
			for _, w := range tt.writes {
				r.write([]byte(w))
			}
			got, from, dropped := r.read(tt.off, tt.limit)
			assert.Equal(t, tt.want, string(got))
			assert.Equal(t, tt.from, from)
			assert.Equal(t, tt.dropped, dropped)
		})
	}
}

func TestProcess_LongCommand_RunsAndRemovesScript(t *testing.T) {
	a := newTestAgent(t, nil)
	ctx := context.Background()
	cmd := ": '" + strings.Repeat("x", 200<<10) + "'\necho long; exit 5"
	info, err := a.client.StartProcess(ctx, agentapi.ProcessStartRequest{Command: cmd})
	require.NoError(t, err)
	assert.Equal(t, cmd, info.Command)
	eventually(t, func() bool {
		pi, err := a.client.GetProcess(ctx, info.ID)
		return err == nil && pi.State == agentapi.ProcessExited
	}, "process %s did not exit", info.ID)
	pi, err := a.client.GetProcess(ctx, info.ID)
	require.NoError(t, err)
	require.NotNil(t, pi.ExitCode)
	assert.Equal(t, 5, *pi.ExitCode)
	page, err := a.client.ProcessOutput(ctx, info.ID, 0, 0)
	require.NoError(t, err)
	assert.Equal(t, "long\n", page.Data)
	assert.Empty(t, scriptFiles(t, a), "the script file outlived the process")
}
