//go:build integration

package tests

import (
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/client"
	"github.com/quarryhq/quarry/internal/testenv"
)

func TestRock_GEMClientDrivesEnv(t *testing.T) {
	py := testenv.RockPython(t)
	program, err := filepath.Abs("rock/gem_env.py")
	require.NoError(t, err)
	registry := fmt.Sprintf(`{"envs": [{"id": "guess-v0", "pool": "default", "command": ["python3", %q]}]}`, program)
	g := startGateway(t, defaultPools, withEnv("QUARRY_ENVS="+registry))
	g.waitReady("default", 1)

	u, err := url.Parse(g.url())
	require.NoError(t, err)
	u.User = url.UserPassword("rock", g.key)
	steps := runRockDriver(t, py, "gem_driver.py", "ROCK_BASE_URL="+u.String(), "ROCK_ENV_ID=guess-v0")

	id, _ := step(t, steps, "make")["sandbox_id"].(string)
	assert.True(t, strings.HasPrefix(id, "sbx-"), "sandbox id %q", id)
	reset := step(t, steps, "reset")
	assert.Equal(t, "guess a number from 0 to 3", reset["observation"])
	assert.EqualValues(t, map[string]any{"seed": float64(6)}, reset["info"])

	miss := step(t, steps, "step_miss")
	assert.Equal(t, "higher", miss["observation"])
	assert.EqualValues(t, 0, miss["reward"])
	assert.Equal(t, false, miss["terminated"])

	inv := step(t, steps, "step_invalid")
	assert.Equal(t, true, inv["raised"])
	assert.Contains(t, inv["message"], "HTTP error 400")
	assert.Contains(t, inv["message"], "must be a digit string")

	hit := step(t, steps, "step_hit")
	assert.Equal(t, "correct", hit["observation"])
	assert.EqualValues(t, 1, hit["reward"])
	assert.Equal(t, true, hit["terminated"])
	step(t, steps, "close")

	bad := step(t, steps, "bad_env")
	assert.Equal(t, true, bad["raised"])
	assert.Contains(t, bad["message"], `unknown env`)

	// close released the env's sandbox.
	sbs, err := g.client().ListSandboxes(ctx(t), client.ListSandboxesRequest{State: "active"})
	require.NoError(t, err)
	assert.Empty(t, sbs)
}
