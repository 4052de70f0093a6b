//go:build integration

package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/envs"
	"github.com/quarryhq/quarry/envs/envclient"
)

// envsRegistry is the env registry of the process-provider tests: the two
// example envs (run from the repository on the host) and a broken one.
func envsRegistry(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs("../examples/envs")
	require.NoError(t, err)
	return fmt.Sprintf(`envs:
  - id: terminal
    pool: default
    command: [python3, %[1]s/terminal_task.py]
    defaults: {max_steps: 25, command_timeout: 20}
  - id: game
    pool: default
    command: [python3, %[1]s/text_game.py]
  - id: broken
    pool: default
    command: [bash, -c, 'read -r l; echo "I am not JSON"; sleep 300']
`, dir)
}

// startEnvGateway starts a gateway with the registry of envsRegistry.
func startEnvGateway(t *testing.T, opts ...gwOption) (*gatewayProc, *envclient.Client) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "envs.yaml")
	require.NoError(t, os.WriteFile(file, []byte(envsRegistry(t)), 0o644))
	g := startGateway(t, defaultPools, append(opts, withEnv("QUARRY_ENVS_FILE="+file))...)
	return g, envclient.New(g.url(), g.key, nil)
}

// envErr returns err as *envclient.Error (failing the test otherwise).
func envErr(t *testing.T, err error) *envclient.Error {
	t.Helper()
	var e *envclient.Error
	require.ErrorAs(t, err, &e)
	return e
}

func seed(n int64) *int64 { return &n }

// observation decodes a JSON string observation.
func observation(t *testing.T, raw json.RawMessage) string {
	t.Helper()
	var s string
	require.NoError(t, json.Unmarshal(raw, &s), "observation %s", raw)
	return s
}

// An episode of the terminal task: commands run in the sandbox, submit runs
// the verifier, whose number is the reward.
func TestEnvs_TerminalTaskEpisode(t *testing.T) {
	_, c := startEnvGateway(t)
	ctx := ctx(t)
	id, err := c.Make(ctx, "terminal")
	require.NoError(t, err)

	res, err := c.Reset(ctx, id, seed(7), nil)
	require.NoError(t, err)
	assert.Contains(t, observation(t, res.Observation), "answer.txt")
	var info struct {
		MaxSteps int `json:"max_steps"`
	}
	require.NoError(t, json.Unmarshal(res.Info, &info))
	assert.Equal(t, 25, info.MaxSteps, "the env's defaults are the reset options")

	st, err := c.Step(ctx, id, `awk '{s += $1} END {print s}' input.txt > answer.txt && echo wrote`)
	require.NoError(t, err)
	assert.Equal(t, "exit code: 0\nwrote\n", observation(t, st.Observation))
	assert.False(t, st.Terminated)
	st, err = c.Step(ctx, id, "ls; exit 3")
	require.NoError(t, err)
	assert.Equal(t, "exit code: 3\nanswer.txt\ninput.txt\n", observation(t, st.Observation))

	st, err = c.Step(ctx, id, "submit")
	require.NoError(t, err)
	assert.True(t, st.Terminated)
	assert.Equal(t, 1.0, st.Reward)
	assert.Contains(t, observation(t, st.Observation), "correct")

	_, err = c.Step(ctx, id, "ls")
	e := envErr(t, err)
	assert.Equal(t, http.StatusConflict, e.Status, "the episode ended")
	assert.Equal(t, string(envs.KindNotRunning), e.Code)

	// The next episode is fresh: submitting without an answer scores 0.
	_, err = c.Reset(ctx, id, seed(8), nil)
	require.NoError(t, err)
	st, err = c.Step(ctx, id, "submit")
	require.NoError(t, err)
	assert.True(t, st.Terminated)
	assert.Equal(t, 0.0, st.Reward)

	// Max steps truncate the episode.
	_, err = c.Reset(ctx, id, seed(9), map[string]any{"max_steps": 2})
	require.NoError(t, err)
	st, err = c.Step(ctx, id, "true")
	require.NoError(t, err)
	assert.False(t, st.Truncated)
	st, err = c.Step(ctx, id, "true")
	require.NoError(t, err)
	assert.True(t, st.Truncated)
	assert.Equal(t, 0.0, st.Reward)

	require.NoError(t, c.Close(ctx, id))
	_, err = c.Step(ctx, id, "ls")
	assert.Equal(t, http.StatusGone, envErr(t, err).Status, "close released the sandbox")
}

// playGame plays one seeded episode of guess-the-number by binary search and
// returns the observations and the final step.
func playGame(ctx context.Context, c *envclient.Client, id string, s int64) ([]string, envs.StepResult, error) {
	res, err := c.Reset(ctx, id, &s, nil)
	if err != nil {
		return nil, envs.StepResult{}, err
	}
	obs := []string{string(res.Observation)}
	lo, hi := 1, 100
	var st envs.StepResult
	for !st.Terminated && !st.Truncated {
		guess := (lo + hi) / 2
		if st, err = c.Step(ctx, id, guess); err != nil {
			return obs, st, err
		}
		obs = append(obs, string(st.Observation))
		switch string(st.Observation) {
		case `"higher"`:
			lo = guess + 1
		case `"lower"`:
			hi = guess - 1
		}
	}
	return obs, st, nil
}

// Two trainers play the text game on two sandboxes at once; a seeded game
// is deterministic, so both see the same episode.
func TestEnvs_TextGameConcurrentTrainers(t *testing.T) {
	g, c := startEnvGateway(t)
	other := envclient.New(g.url(), "other-"+g.key, nil)
	ctx := ctx(t)

	type outcome struct {
		obs  []string
		last envs.StepResult
		err  error
	}
	results := make([]outcome, 2)
	var wg sync.WaitGroup
	for i, cl := range []*envclient.Client{c, other} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id, err := cl.Make(ctx, "game")
			if err != nil {
				results[i].err = err
				return
			}
			defer func() { _ = cl.Close(context.WithoutCancel(ctx), id) }()
			for range 3 {
				results[i].obs, results[i].last, results[i].err = playGame(ctx, cl, id, 42)
				if results[i].err != nil {
					return
				}
			}
		}()
	}
	wg.Wait()
	for i, r := range results {
		require.NoError(t, r.err, "trainer %d", i)
		assert.True(t, r.last.Terminated, "binary search finds the number in 7 guesses")
		assert.Equal(t, 1.0, r.last.Reward)
	}
	assert.Equal(t, results[0].obs, results[1].obs, "same seed, same episode")
}

// A crash (the command kills the env program) is a clear 502 with the exit
// status; steps are refused until a reset starts a fresh program.
func TestEnvs_CrashThenFreshProgram(t *testing.T) {
	_, c := startEnvGateway(t)
	ctx := ctx(t)
	id, err := c.Make(ctx, "terminal")
	require.NoError(t, err)
	_, err = c.Reset(ctx, id, seed(1), nil)
	require.NoError(t, err)

	_, err = c.Step(ctx, id, "echo about to die >&2; kill -9 $PPID")
	e := envErr(t, err)
	assert.Equal(t, http.StatusBadGateway, e.Status)
	assert.Equal(t, string(envs.KindEnv), e.Code)
	assert.Contains(t, e.Message, "SIGKILL")
	assert.Contains(t, e.Message, "exited before it replied")

	_, err = c.Step(ctx, id, "ls")
	e = envErr(t, err)
	assert.Equal(t, http.StatusConflict, e.Status)
	assert.Contains(t, e.Message, "call reset")

	res, err := c.Reset(ctx, id, seed(1), nil)
	require.NoError(t, err, "the next reset starts a fresh program")
	assert.Contains(t, observation(t, res.Observation), "answer.txt")
	st, err := c.Step(ctx, id, "cat input.txt | wc -l")
	require.NoError(t, err)
	assert.False(t, st.Terminated)
}

// A malformed reply line is a clear 502 quoting it; step before reset is 409.
func TestEnvs_MalformedLineAndStepBeforeReset(t *testing.T) {
	_, c := startEnvGateway(t)
	ctx := ctx(t)
	id, err := c.Make(ctx, "broken")
	require.NoError(t, err)
	_, err = c.Reset(ctx, id, nil, nil)
	e := envErr(t, err)
	assert.Equal(t, http.StatusBadGateway, e.Status)
	assert.Equal(t, string(envs.KindEnv), e.Code)
	assert.Contains(t, e.Message, "I am not JSON")

	game, err := c.Make(ctx, "game")
	require.NoError(t, err)
	_, err = c.Step(ctx, game, 50)
	e = envErr(t, err)
	assert.Equal(t, http.StatusConflict, e.Status, "step before reset")
	assert.Equal(t, string(envs.KindNotRunning), e.Code)
}

// Bad input is a 400 naming the field; another key's sandbox is a 404.
func TestEnvs_BadInputAndOtherKey(t *testing.T) {
	g, c := startEnvGateway(t)
	ctx := ctx(t)
	id, err := c.Make(ctx, "game")
	require.NoError(t, err)
	_, err = c.Reset(ctx, id, seed(1), nil)
	require.NoError(t, err)

	sbx := "/v1/sandboxes/" + id + "/env/"
	cases := []struct {
		name, path, key, body string
		status                int
		contains              string
	}{
		{"unknown env", "/v1/envs", g.key, `{"env_id": "chess"}`, 400, "env_id"},
		{"env id of the wrong type", "/v1/envs", g.key, `{"env_id": 5}`, 400, "env_id"},
		{"step without action", sbx + "step", g.key, `{}`, 400, "action"},
		{"step with malformed JSON", sbx + "step", g.key, `{"action":`, 400, "bad_request"},
		{"options not an object", sbx + "reset", g.key, `{"options": "hard"}`, 400, "options"},
		{"action the env refuses", sbx + "step", g.key, `{"action": {"guess": 5}}`, 400, "invalid_action"},
		{"another key's sandbox", sbx + "step", "other-" + g.key, `{"action": 5}`, 404, "not_found"},
		{"another key's close", sbx + "close", "other-" + g.key, ``, 404, "not_found"},
		{"unknown sandbox", "/v1/sandboxes/sbx-nope/env/reset", g.key, `{}`, 404, "not_found"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			status, body := g.raw(ctx, t, http.MethodPost, tc.path, tc.key, tc.body)
			assert.Equal(t, tc.status, status, body)
			assert.Contains(t, body, tc.contains)
		})
	}
	// Nothing was lost: the episode goes on for its owner.
	st, err := c.Step(ctx, id, 50)
	require.NoError(t, err)
	assert.Contains(t, []string{`"higher"`, `"lower"`, `"correct"`}, string(st.Observation))
}
