package docker

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/providers"
)

// Pause freezes a container (its agent answers nothing, the engine says
// paused, Describe still says running) and keeps its processes; Resume
// thaws it with them; both are idempotent; Stop removes a paused one.
func TestProvider_PauseFreezesResumeThaws(t *testing.T) {
	e, p := dockerProvider(t)
	task := launchOne(t, p, spec("pause", imageBusybox), "p-1")
	a := agentOf(t, task)
	pid := strings.TrimSpace(execIn(t, a, "sleep 1000 >/dev/null 2>&1 & echo $!").Stdout)
	require.NotEmpty(t, pid)

	ctx := context.Background()
	require.NoError(t, p.Pause(ctx, task.ID))
	require.NoError(t, p.Pause(ctx, task.ID), "pausing a paused task is nil")
	info, err := e.cli.ContainerInspect(ctx, task.ID)
	require.NoError(t, err)
	assert.True(t, info.State.Paused, "the engine froze it")
	hctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	_, err = a.Health(hctx)
	cancel()
	assert.Error(t, err, "a frozen agent answers nothing")
	got, err := p.Describe(ctx, []string{task.ID})
	require.NoError(t, err)
	assert.Equal(t, providers.TaskRunning, got[0].State, "a paused task is not a lost one")

	require.NoError(t, p.Resume(ctx, task.ID))
	require.NoError(t, p.Resume(ctx, task.ID), "resuming a running task is nil")
	agentOf(t, task)
	assert.Equal(t, "alive\n", execIn(t, a, "kill -0 "+pid+" && echo alive").Stdout, "its processes live on")

	require.NoError(t, p.Pause(ctx, task.ID))
	require.NoError(t, p.Stop(ctx, task.ID, "test"), "a paused task stops")
	_, err = e.cli.ContainerInspect(ctx, task.ID)
	assert.True(t, isNotFound(err), "removed: %v", err)
	assert.ErrorIs(t, p.Pause(ctx, task.ID), providers.ErrNotFound)
}
