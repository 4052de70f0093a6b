//go:build integration

package tests

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/envs/envclient"
)

// The example envs inside Docker sandboxes: quarry-test/python carries them
// in /opt/quarry/envs (scripts/images/python.sh).
func TestEnvs_Docker_TerminalTaskAndGame(t *testing.T) {
	d := requireDocker(t)
	registry := filepath.Join(t.TempDir(), "envs.yaml")
	require.NoError(t, os.WriteFile(registry, []byte(`envs:
  - id: terminal
    pool: py
    command: [python3, /opt/quarry/envs/terminal_task.py]
  - id: game
    pool: py
    command: [python3, /opt/quarry/envs/text_game.py]
`), 0o644))
	g := d.startGateway(fmt.Sprintf(`pools:
  - name: py
    image: %s
    cpu: 1
    memory: 512Mi
    min_warm: 1
    max_total: 3
`, dockerImagePython), withEnv("QUARRY_ENVS_FILE="+registry))
	c := envclient.New(g.url(), g.key, nil)
	ctx := ctx(t)

	id, err := c.Make(ctx, "terminal")
	require.NoError(t, err)
	_, err = c.Reset(ctx, id, seed(5), nil)
	require.NoError(t, err)
	st, err := c.Step(ctx, id, `awk '{s += $1} END {print s}' input.txt > answer.txt && id -u`)
	require.NoError(t, err)
	assert.Contains(t, observation(t, st.Observation), "exit code: 0")
	st, err = c.Step(ctx, id, "submit")
	require.NoError(t, err)
	assert.True(t, st.Terminated)
	assert.Equal(t, 1.0, st.Reward)
	require.NoError(t, c.Close(ctx, id))

	game, err := c.Make(ctx, "game")
	require.NoError(t, err)
	_, last, err := playGame(ctx, c, game, 7)
	require.NoError(t, err)
	assert.True(t, last.Terminated)
	assert.Equal(t, 1.0, last.Reward)
	require.NoError(t, c.Close(ctx, game))
}
