package envs

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseRegistry_YAMLAndJSON(t *testing.T) {
	yamlDoc := `
envs:
  - id: terminal/sum
    pool: python
    command: [python3, /opt/quarry/envs/terminal_task.py]
    env: {TASK_LEVEL: "2"}
    cwd: /tmp
    defaults: {max_steps: 20}
    step_timeout_ms: 30000
  - id: game
    pool: python
    command: [python3, text_game.py]
`
	jsonDoc := `{"envs":[{"id":"terminal/sum","pool":"python","command":["python3","/opt/quarry/envs/terminal_task.py"],
"env":{"TASK_LEVEL":"2"},"cwd":"/tmp","defaults":{"max_steps":20},"step_timeout_ms":30000},
{"id":"game","pool":"python","command":["python3","text_game.py"]}]}`
	for name, doc := range map[string]string{"yaml": yamlDoc, "json": jsonDoc} {
		t.Run(name, func(t *testing.T) {
			r, err := ParseRegistry([]byte(doc))
			require.NoError(t, err)
			list := r.List()
			require.Len(t, list, 2)
			assert.Equal(t, "terminal/sum", list[0].ID, "file order")
			s, ok := r.Get("terminal/sum")
			require.True(t, ok)
			assert.Equal(t, []string{"python3", "/opt/quarry/envs/terminal_task.py"}, s.Command)
			assert.JSONEq(t, `{"max_steps":20}`, string(s.defaults))
			assert.Equal(t, 30*time.Second, s.StepTimeout())
			assert.Equal(t, DefaultResetTimeout, s.ResetTimeout())
			g, ok := r.Get("game")
			require.True(t, ok)
			assert.Nil(t, g.defaults)
			assert.Equal(t, DefaultStepTimeout, g.StepTimeout())
			_, ok = r.Get("nope")
			assert.False(t, ok)
		})
	}
}

func TestParseRegistry_Invalid(t *testing.T) {
	tests := []struct {
		name     string
		doc      string
		contains string
	}{
		{"empty", "", "envs"},
		{"no envs", "envs: []", "at least one env"},
		{"unknown field", "envs: [{id: a, pool: p, command: [x], colour: red}]", "colour"},
		{"duplicate id", "envs: [{id: a, pool: p, command: [x]}, {id: a, pool: p, command: [y]}]", "envs[1].id: duplicate"},
		{"bad id", "envs: [{id: -a, pool: p, command: [x]}]", "envs[0].id"},
		{"no pool", "envs: [{id: a, command: [x]}]", "envs[0].pool"},
		{"no command", "envs: [{id: a, pool: p}]", "envs[0].command"},
		{"empty argv0", "envs: [{id: a, pool: p, command: ['']}]", "envs[0].command"},
		{"negative step timeout", "envs: [{id: a, pool: p, command: [x], step_timeout_ms: -1}]", "envs[0].step_timeout_ms"},
		{"huge reset timeout", "envs: [{id: a, pool: p, command: [x], reset_timeout_ms: 99999999999}]", "envs[0].reset_timeout_ms"},
		{"bad env name", "envs: [{id: a, pool: p, command: [x], env: {'A-B': x}}]", "envs[0].env"},
		{"negative lease", "envs: [{id: a, pool: p, command: [x], lease_seconds: -5}]", "envs[0].lease_seconds"},
		{"defaults not a map", "envs: [{id: a, pool: p, command: [x], defaults: [1]}]", "defaults"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseRegistry([]byte(tt.doc))
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.contains)
		})
	}
}

func TestLoadRegistry_NamesTheFile(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "envs.yaml")
	require.NoError(t, os.WriteFile(good, []byte("envs: [{id: a, pool: p, command: [x]}]"), 0o600))
	r, err := LoadRegistry(good)
	require.NoError(t, err)
	assert.Len(t, r.List(), 1)

	bad := filepath.Join(dir, "bad.yaml")
	require.NoError(t, os.WriteFile(bad, []byte("envs: [{id: a}]"), 0o600))
	_, err = LoadRegistry(bad)
	require.Error(t, err)
	assert.Contains(t, err.Error(), bad)

	_, err = LoadRegistry(filepath.Join(dir, "missing.yaml"))
	assert.ErrorIs(t, err, os.ErrNotExist)
}
