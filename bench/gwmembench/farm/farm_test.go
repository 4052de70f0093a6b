package farm

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/providers"
)

func TestReadEndpoints(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good")
	require.NoError(t, os.WriteFile(good, []byte(`{"url":"http://127.77.0.1:7070","token":"a"}`+"\n\n"+`{"url":"http://127.77.0.2:7070","token":"b"}`+"\n"), 0o600))
	eps, err := ReadEndpoints(good)
	require.NoError(t, err)
	assert.Equal(t, []Endpoint{{URL: "http://127.77.0.1:7070", Token: "a"}, {URL: "http://127.77.0.2:7070", Token: "b"}}, eps)

	for name, body := range map[string]string{"no token": `{"url":"http://x:1"}`, "not json": `url`} {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(body+"\n"), 0o600))
		_, err := ReadEndpoints(p)
		assert.Error(t, err, name)
	}
	_, err = ReadEndpoints(filepath.Join(dir, "missing"))
	assert.Error(t, err)
}

func TestProvider_LaunchStopReuse(t *testing.T) {
	ctx := context.Background()
	_, err := New(nil)
	require.Error(t, err)
	p, err := New([]Endpoint{{URL: "http://a:1", Token: "ta"}, {URL: "http://b:1", Token: "tb"}})
	require.NoError(t, err)
	spec := providers.Spec{Pool: "bench", Image: "host"}

	tasks, err := p.Launch(ctx, spec, []string{"t1", "t2", "t3"})
	var le *providers.LaunchError
	require.ErrorAs(t, err, &le)
	assert.True(t, errors.Is(err, providers.ErrNoCapacity))
	require.Len(t, tasks, 2, "a partial launch returns what it started")
	assert.NotEqual(t, tasks[0].AgentURL, tasks[1].AgentURL)
	assert.Equal(t, providers.TaskRunning, tasks[0].State)
	assert.Equal(t, "t1", tasks[0].Name)

	got, err := p.Describe(ctx, []string{tasks[0].ID, "nope"})
	require.NoError(t, err)
	assert.Equal(t, providers.TaskRunning, got[0].State)
	assert.Equal(t, providers.TaskStopped, got[1].State)
	assert.Equal(t, "not found", got[1].Reason)

	all, err := p.List(ctx, "bench")
	require.NoError(t, err)
	assert.Len(t, all, 2)
	none, err := p.List(ctx, "other")
	require.NoError(t, err)
	assert.Empty(t, none)

	require.NoError(t, p.Stop(ctx, tasks[0].ID, "done"))
	require.NoError(t, p.Stop(ctx, tasks[0].ID, "done"), "stop is idempotent")
	again, err := p.Launch(ctx, spec, []string{"t4"})
	require.NoError(t, err)
	require.Len(t, again, 1)
	assert.Equal(t, tasks[0].AgentURL, again[0].AgentURL, "a stopped task's endpoint is handed out again")
	assert.Equal(t, tasks[0].AgentToken, again[0].AgentToken)
}
