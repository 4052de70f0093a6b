package execagent

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

func TestThreadReserve_AShareOfThePidsLimit(t *testing.T) {
	tests := []struct{ pidsMax, want int }{
		{pidsMax: 0, want: maxReservedThreads}, // no limit
		{pidsMax: 1024, want: maxReservedThreads},
		{pidsMax: 200, want: maxReservedThreads},
		{pidsMax: 64, want: 8},
		{pidsMax: 16, want: 2}, // the Docker provider's smallest pids_limit
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, threadReserve(tt.pidsMax), "pids.max %d", tt.pidsMax)
	}
}

// threads counts the OS threads of this process.
func threads(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/task")
	require.NoError(t, err)
	return len(ents)
}

func TestReserveThreads_KeepsIdleThreads(t *testing.T) {
	n := threads(t) + 8 // more than there are: the reserve must start new ones
	reserveThreads(n)
	assert.GreaterOrEqual(t, threads(t), n, "the runtime keeps the threads it started")
}

func TestPidsMax(t *testing.T) {
	tests := []struct {
		name, cgroup string
		files        map[string]string
		want         int
	}{
		{name: "v1 container", cgroup: "8:pids:/docker/abc\n", files: map[string]string{"pids/pids.max": "200\n"}, want: 200},
		{name: "v1 unlimited", cgroup: "8:pids:/\n", files: map[string]string{"pids/pids.max": "max\n"}, want: 0},
		{name: "v2", cgroup: "0::/sbx\n", files: map[string]string{"sbx/pids.max": "1024\n"}, want: 1024},
		{name: "none", cgroup: "0::/\n", want: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			for rel, content := range tt.files {
				writeFile(t, root, rel, content)
			}
			assert.Equal(t, tt.want, pidsMax([]byte(tt.cgroup), root))
		})
	}
}

// The agent's children are the OOM killer's first choice: they get
// childOOMScoreAdj, the agent keeps its own value.
func TestChildren_OOMScoreAboveTheAgents(t *testing.T) {
	own, err := os.ReadFile("/proc/self/oom_score_adj")
	require.NoError(t, err)
	ownN, err := strconv.Atoi(strings.TrimSpace(string(own)))
	require.NoError(t, err)
	want := strconv.Itoa(childOOMScoreAdj)
	if ownN >= childOOMScoreAdj {
		want = strings.TrimSpace(string(own)) // nothing above it to give
	}
	a := newTestAgent(t, nil)
	p, err := a.client.StartProcess(context.Background(), agentapi.ProcessStartRequest{Argv: []string{"sleep", "1000"}})
	require.NoError(t, err)
	got, err := os.ReadFile("/proc/" + strconv.Itoa(p.PID) + "/oom_score_adj")
	require.NoError(t, err)
	assert.Equal(t, want, strings.TrimSpace(string(got)))
	again, err := os.ReadFile("/proc/self/oom_score_adj")
	require.NoError(t, err)
	assert.Equal(t, string(own), string(again), "the agent's own value is unchanged")
}
