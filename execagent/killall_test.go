package execagent

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

// Kill-all against commands that fork as fast as they can. When it
// answers, nothing of them is left, not even a zombie (their pids are free
// again), and it counted what it killed. A walker forks its next step and
// exits at once, faster than the agent reads /proc, so a look there seldom
// finds it running: kill-all used to answer at once, killed 0, while it
// walked on; it stays in its process group, which kill-all kills at once.
func TestKillAll_ForkingCommandsLeaveNothing(t *testing.T) {
	for _, tc := range []struct {
		name    string
		command string
		atLeast int // processes in its group before the kill, and killed
	}{
		{name: "walker", command: "w() { w & }; w", atLeast: 1},
		// Its children outlive the test, so the group only grows until the
		// kill: the 100 seen before it are still there when it comes (with
		// children that exited by themselves, how many the kill found
		// depended on the machine's speed: 81 of 100 once under stress-ng).
		{name: "forking loop", command: "while :; do (sleep 300; :) & sleep 0.005; done", atLeast: 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newTestAgent(t, nil)
			ctx := context.Background()
			p, err := a.client.StartProcess(ctx, agentapi.ProcessStartRequest{Command: tc.command})
			require.NoError(t, err)
			eventually(t, func() bool { return len(groupMembers(p.PID)) >= tc.atLeast }, "it forks")

			res, err := a.client.KillAll(ctx)
			require.NoError(t, err)
			assert.Empty(t, groupMembers(p.PID), "nothing of it is left, not even a zombie")
			info, err := a.client.GetProcess(ctx, p.ID)
			require.NoError(t, err)
			assert.False(t, info.GroupRunning)
			assert.Zero(t, res.Left)
			assert.GreaterOrEqual(t, res.Killed, tc.atLeast, "what ran when the kill came: %+v", res)
		})
	}
}
