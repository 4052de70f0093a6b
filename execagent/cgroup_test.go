package execagent

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

// writeFile writes content to root/rel, creating its directories.
func writeFile(t *testing.T, root, rel, content string) string {
	t.Helper()
	p := filepath.Join(root, rel)
	require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
	require.NoError(t, os.WriteFile(p, []byte(content), 0o644))
	return p
}

func TestFindOOMCounter(t *testing.T) {
	const v1Control = "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n"
	const v2Events = "low 0\nhigh 0\nmax 12\noom 2\noom_kill 2\noom_group_kill 0\n"
	tests := []struct {
		name   string
		cgroup string
		files  map[string]string
		want   string // path relative to the root; "" for none
		count  int64
	}{
		{name: "cgroup v1 in a container: its own cgroup mounted at the root",
			cgroup: "9:pids:/docker/abc\n4:memory:/docker/abc\n0::/docker/abc\n",
			files:  map[string]string{"memory/memory.oom_control": v1Control},
			want:   "memory/memory.oom_control", count: 3},
		{name: "cgroup v1 on a host: the named cgroup",
			cgroup: "4:memory:/user.slice/session-1.scope\n",
			files: map[string]string{"memory/user.slice/session-1.scope/memory.oom_control": v1Control,
				"memory/memory.oom_control": "oom_kill 99\n"},
			want: "memory/user.slice/session-1.scope/memory.oom_control", count: 3},
		{name: "cgroup v1 with memory among other controllers", cgroup: "5:cpuacct,memory:/x\n",
			files: map[string]string{"memory/x/memory.oom_control": v1Control},
			want:  "memory/x/memory.oom_control", count: 3},
		{name: "cgroup v2 with a namespace", cgroup: "0::/\n",
			files: map[string]string{"memory.events": v2Events},
			want:  "memory.events", count: 2},
		{name: "cgroup v2 on a host", cgroup: "0::/system.slice/quarry.service\n",
			files: map[string]string{"system.slice/quarry.service/memory.events": v2Events},
			want:  "system.slice/quarry.service/memory.events", count: 2},
		{name: "hybrid: v1 memory wins over a v2 hierarchy without memory",
			cgroup: "4:memory:/docker/abc\n0::/docker/abc\n",
			files:  map[string]string{"memory/memory.oom_control": v1Control, "memory.events": v2Events},
			want:   "memory/memory.oom_control", count: 3},
		{name: "a kernel without the counter (before 4.13)", cgroup: "4:memory:/\n",
			files: map[string]string{"memory/memory.oom_control": "oom_kill_disable 0\nunder_oom 0\n"}},
		{name: "no memory cgroup", cgroup: "1:name=systemd:/\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			for rel, content := range tt.files {
				writeFile(t, root, rel, content)
			}
			c := findOOMCounter([]byte(tt.cgroup), root)
			n, ok := c.read()
			if tt.want == "" {
				assert.Empty(t, c.path)
				assert.False(t, ok)
				return
			}
			assert.Equal(t, filepath.Join(root, tt.want), c.path)
			require.True(t, ok)
			assert.Equal(t, tt.count, n)
		})
	}
}

func TestOOMCounter_KilledSince(t *testing.T) {
	p := writeFile(t, t.TempDir(), "memory.events", "oom_kill 1\n")
	c := oomCounter{path: p}
	m := c.mark()
	assert.False(t, c.killedSince(m, -1, "SIGKILL"), "SIGKILL without an OOM kill")
	require.NoError(t, os.WriteFile(p, []byte("oom_kill 2\n"), 0o644))
	assert.True(t, c.killedSince(m, -1, "SIGKILL"))
	assert.True(t, c.killedSince(m, 137, ""), "a shell reporting 128+SIGKILL")
	assert.False(t, c.killedSince(m, 1, ""), "an exit of its own")
	assert.False(t, c.killedSince(m, -1, "SIGTERM"))
	assert.False(t, oomCounter{}.killedSince(oomCounter{}.mark(), -1, "SIGKILL"), "no counter, no flag")
}

// The agent flags a command the OOM killer killed: here the command plays
// the kernel, raising a stand-in counter and dying of SIGKILL. A command
// the agent killed itself is never flagged.
func TestExecAndProcess_OOMKilledFlag(t *testing.T) {
	a := newTestAgent(t, nil)
	counter := writeFile(t, t.TempDir(), "memory.events", "oom_kill 0\n")
	a.srv.children.oom = oomCounter{path: counter}
	oom := "echo oom_kill $(( $(cut -d' ' -f2 " + counter + ") + 1 )) > " + counter + "; kill -9 $$"
	ctx := context.Background()

	res, err := a.client.Exec(ctx, agentapi.ExecRequest{Command: oom})
	require.NoError(t, err)
	assert.Equal(t, "SIGKILL", res.Signal)
	assert.True(t, res.OOMKilled, "killed while the counter rose")

	res, err = a.client.Exec(ctx, agentapi.ExecRequest{Command: "kill -9 $$"})
	require.NoError(t, err)
	assert.Equal(t, "SIGKILL", res.Signal)
	assert.False(t, res.OOMKilled, "SIGKILL with no OOM kill")

	bump := "echo oom_kill 100 > " + counter
	res, err = a.client.Exec(ctx, agentapi.ExecRequest{Command: "(sleep 0.1; " + bump + ") & sleep 1000", TimeoutMS: 500})
	require.NoError(t, err)
	assert.True(t, res.TimedOut)
	assert.False(t, res.OOMKilled, "the agent's own kill at the deadline")

	p, err := a.client.StartProcess(ctx, agentapi.ProcessStartRequest{Command: oom})
	require.NoError(t, err)
	var info agentapi.ProcessInfo
	eventually(t, func() bool {
		info, err = a.client.GetProcess(ctx, p.ID)
		return err == nil && info.State == agentapi.ProcessExited
	}, "the process exits")
	assert.Equal(t, "SIGKILL", info.Signal)
	assert.True(t, info.OOMKilled)
}
