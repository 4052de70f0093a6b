package gateway

import (
	"context"
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/envs"
	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/warmpool"
)

// withEnvs serves a gateway with an env registry whose sandboxes reach one
// real agent: "game" runs examples/envs/text_game.py; "flaky" writes a
// malformed line on its first run in the sandbox and is the game after
// that; "crashy" exits on every request; "slow" never replies (reset
// timeout 300 ms).
func withEnvs(t *testing.T) (*testGateway, *fakeManager) {
	t.Helper()
	game, err := filepath.Abs("../examples/envs/text_game.py")
	require.NoError(t, err)
	reg, err := envs.NewRegistry([]envs.Spec{
		{ID: "game", Pool: "default", Command: []string{"python3", game}, StepTimeoutMS: 20000},
		{ID: "flaky", Pool: "default", Command: []string{"bash", "-c",
			`if [ -e flaky.mark ]; then exec python3 "$GAME"; fi; touch flaky.mark; read -r l; echo "not json"`},
			Env: map[string]string{"GAME": game}},
		{ID: "crashy", Pool: "default", Command: []string{"bash", "-c", `read -r l; echo "dying: $l" >&2; exit 7`}},
		{ID: "slow", Pool: "default", Command: []string{"bash", "-c", `read -r l; echo thinking >&2; sleep 300`}, ResetTimeoutMS: 300},
	})
	require.NoError(t, err)
	agent := startAgent(t)
	mgr := newFakeManager(agent.URL)
	mgr.addLease("sbx-plain", testKey, agent.URL, 1)
	return startGatewayDeps(t, mgr, nil, Deps{Envs: reg}), mgr
}

// makeEnv calls POST /v1/envs and returns the sandbox id.
func makeTestEnv(t *testing.T, gw *testGateway, envID string) string {
	t.Helper()
	resp, body := callJSON(t, http.MethodPost, gw.URL+"/v1/envs", testKey, map[string]any{"env_id": envID})
	require.Equal(t, http.StatusCreated, resp.StatusCode, "body %s", body)
	made := decode[madeEnv](t, body)
	assert.Equal(t, envID, made.EnvID)
	return made.SandboxID
}

func TestEnvs_GameEpisode(t *testing.T) {
	gw, mgr := withEnvs(t)
	id := makeTestEnv(t, gw, "game")
	l, err := mgr.ownLease(id, OwnerOf(testKey))
	require.NoError(t, err)
	assert.Equal(t, "game", l.Labels[envs.LabelEnv])
	base := gw.URL + "/v1/sandboxes/" + id

	resp, body := callJSON(t, http.MethodPost, base+"/env/reset", testKey, map[string]any{"seed": 3, "options": map[string]any{"low": 1, "high": 8, "max_guesses": 8}})
	require.Equal(t, http.StatusOK, resp.StatusCode, "body %s", body)
	reset := decode[envs.ResetResult](t, body)
	assert.Contains(t, string(reset.Observation), "between 1 and 8")
	assert.JSONEq(t, `{"low":1,"high":8,"max_guesses":8}`, string(reset.Info))

	// A linear search ends the episode with reward 1 within 8 guesses.
	var last envs.StepResult
	for guess := 1; guess <= 8 && !last.Terminated; guess++ {
		resp, body = callJSON(t, http.MethodPost, base+"/env/step", testKey, map[string]any{"action": guess})
		require.Equal(t, http.StatusOK, resp.StatusCode, "body %s", body)
		last = decode[envs.StepResult](t, body)
	}
	assert.True(t, last.Terminated)
	assert.Equal(t, 1.0, last.Reward)
	assert.JSONEq(t, `"correct"`, string(last.Observation))

	resp, body = callJSON(t, http.MethodPost, base+"/env/step", testKey, map[string]any{"action": 1})
	assert.Equal(t, http.StatusConflict, resp.StatusCode, "a step after the episode ended; body %s", body)
	assert.Equal(t, string(envs.KindNotRunning), decodeError(t, body).Code)

	// The program is an rpc process of the agent, reachable by its name.
	resp, body = callJSON(t, http.MethodPost, base+"/processes/"+envs.ProcessName+"/call", testKey,
		agentapi.ProcessCallRequest{Request: json.RawMessage(`{"op":"reset","seed":1}`)})
	require.Equal(t, http.StatusOK, resp.StatusCode, "body %s", body)
	assert.Contains(t, string(decode[agentapi.ProcessCallResult](t, body).Reply), "between 1 and 100")

	resp, body = call(t, http.MethodPost, base+"/env/close", testKey, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, "body %s", body)
	assert.Equal(t, []string{"Release:" + id}, mgr.Calls("Release"))
	resp, _ = callJSON(t, http.MethodPost, base+"/env/step", testKey, map[string]any{"action": 1})
	assert.Equal(t, http.StatusGone, resp.StatusCode, "closed: the lease was released")
}

func TestEnvs_Refusals(t *testing.T) {
	gw, _ := withEnvs(t)
	id := makeTestEnv(t, gw, "game")
	base := gw.URL + "/v1/sandboxes/" + id
	tests := []struct {
		name   string
		key    string
		path   string
		body   string
		status int
		code   string
		field  string
	}{
		{name: "step before reset", path: base + "/env/step", body: `{"action": 5}`, status: http.StatusConflict, code: string(envs.KindNotRunning)},
		{name: "step without action", path: base + "/env/step", body: `{}`, status: http.StatusBadRequest, code: agentapi.CodeBadRequest, field: "action"},
		{name: "unknown step field", path: base + "/env/step", body: `{"act": 1}`, status: http.StatusBadRequest, code: agentapi.CodeBadRequest, field: "act"},
		{name: "options not an object", path: base + "/env/reset", body: `{"options": [1]}`, status: http.StatusBadRequest, code: agentapi.CodeBadRequest, field: "options"},
		{name: "seed not an integer", path: base + "/env/reset", body: `{"seed": "x"}`, status: http.StatusBadRequest, code: agentapi.CodeBadRequest, field: "seed"},
		{name: "unknown env", path: gw.URL + "/v1/envs", body: `{"env_id": "nope"}`, status: http.StatusBadRequest, code: agentapi.CodeBadRequest, field: "env_id"},
		{name: "no env id", path: gw.URL + "/v1/envs", body: `{}`, status: http.StatusBadRequest, code: agentapi.CodeBadRequest, field: "env_id"},
		{name: "another key's sandbox", key: otherKey, path: base + "/env/reset", body: `{}`, status: http.StatusNotFound, code: agentapi.CodeNotFound},
		{name: "no key", key: "-", path: base + "/env/reset", body: `{}`, status: http.StatusUnauthorized, code: agentapi.CodeUnauthorized},
		{name: "not an env sandbox", path: gw.URL + "/v1/sandboxes/sbx-plain/env/reset", body: `{}`, status: http.StatusConflict, code: agentapi.CodeConflict, field: envs.LabelEnv},
		{name: "bad sandbox id", path: gw.URL + "/v1/sandboxes/.x/env/step", body: `{"action": 1}`, status: http.StatusBadRequest, code: agentapi.CodeBadRequest, field: "id"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key := tt.key
			switch key {
			case "":
				key = testKey
			case "-":
				key = ""
			}
			resp, body := call(t, http.MethodPost, tt.path, key, strings.NewReader(tt.body), "Content-Type", "application/json")
			assert.Equal(t, tt.status, resp.StatusCode, "body %s", body)
			e := decodeError(t, body)
			assert.Equal(t, tt.code, e.Code)
			assert.Contains(t, e.Message, tt.field)
		})
	}

	resp, body := callJSON(t, http.MethodPost, base+"/env/reset", testKey, map[string]any{"seed": 1})
	require.Equal(t, http.StatusOK, resp.StatusCode, "body %s", body)
	resp, body = callJSON(t, http.MethodPost, base+"/env/step", testKey, map[string]any{"action": "seven"})
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "the env refused the action; body %s", body)
	assert.Equal(t, string(envs.KindInvalidAction), decodeError(t, body).Code)
}

func TestEnvs_MalformedLineThenFreshProgram(t *testing.T) {
	gw, _ := withEnvs(t)
	id := makeTestEnv(t, gw, "flaky")
	base := gw.URL + "/v1/sandboxes/" + id

	resp, body := callJSON(t, http.MethodPost, base+"/env/reset", testKey, map[string]any{"seed": 1})
	require.Equal(t, http.StatusBadGateway, resp.StatusCode, "body %s", body)
	e := decodeError(t, body)
	assert.Equal(t, string(envs.KindEnv), e.Code)
	assert.Contains(t, e.Message, "not json")

	resp, body = callJSON(t, http.MethodPost, base+"/env/reset", testKey, map[string]any{"seed": 1})
	require.Equal(t, http.StatusOK, resp.StatusCode, "the next reset starts a fresh program; body %s", body)
	resp, body = callJSON(t, http.MethodPost, base+"/env/step", testKey, map[string]any{"action": 50})
	require.Equal(t, http.StatusOK, resp.StatusCode, "body %s", body)
}

func TestEnvs_CrashGivesExitAndStderr(t *testing.T) {
	gw, _ := withEnvs(t)
	id := makeTestEnv(t, gw, "crashy")
	base := gw.URL + "/v1/sandboxes/" + id

	resp, body := callJSON(t, http.MethodPost, base+"/env/reset", testKey, map[string]any{})
	require.Equal(t, http.StatusBadGateway, resp.StatusCode, "body %s", body)
	e := decodeError(t, body)
	assert.Equal(t, string(envs.KindEnv), e.Code)
	assert.Contains(t, e.Message, "exit code 7")
	assert.Contains(t, e.Message, `dying: {"op":"reset"}`)

	resp, body = callJSON(t, http.MethodPost, base+"/env/step", testKey, map[string]any{"action": 1})
	assert.Equal(t, http.StatusConflict, resp.StatusCode, "body %s", body)
	assert.Equal(t, string(envs.KindNotRunning), decodeError(t, body).Code)
}

func TestEnvs_ListAndNotConfigured(t *testing.T) {
	gw, _ := withEnvs(t)
	resp, body := call(t, http.MethodGet, gw.URL+"/v1/envs", testKey, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	list := decode[struct {
		Envs []envInfo `json:"envs"`
	}](t, body)
	require.Len(t, list.Envs, 4)
	assert.Equal(t, envInfo{ID: "game", Pool: "default", StepTimeoutMS: 20000, ResetTimeoutMS: envs.DefaultResetTimeout.Milliseconds()}, list.Envs[0])

	plain := startGateway(t, newFakeManager(""), nil)
	for _, path := range []string{"/v1/envs", "/v1/sandboxes/sbx-1/env/reset"} {
		resp, body := call(t, http.MethodPost, plain.URL+path, testKey, strings.NewReader(`{}`))
		assert.Equal(t, http.StatusNotFound, resp.StatusCode)
		assert.Contains(t, decodeError(t, body).Message, "QUARRY_ENVS_FILE")
	}
}

func TestEnvs_Make_UnknownPoolAndIdempotency(t *testing.T) {
	gw, mgr := withEnvs(t)
	mgr.AcquireFn = func(ctx context.Context, req warmpool.AcquireRequest) (warmpool.Lease, bool, error) {
		return warmpool.Lease{}, false, warmpool.ErrNotFound
	}
	resp, body := callJSON(t, http.MethodPost, gw.URL+"/v1/envs", testKey, map[string]any{"env_id": "game"})
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	assert.Contains(t, decodeError(t, body).Message, `pool "default"`)
	mgr.AcquireFn = nil

	first, body := callJSON(t, http.MethodPost, gw.URL+"/v1/envs", testKey, map[string]any{"env_id": "game"}, "Idempotency-Key", "k1")
	require.Equal(t, http.StatusCreated, first.StatusCode, "body %s", body)
	id := decode[madeEnv](t, body).SandboxID
	again, body := callJSON(t, http.MethodPost, gw.URL+"/v1/envs", testKey, map[string]any{"env_id": "game"}, "Idempotency-Key", "k1")
	require.Equal(t, http.StatusCreated, again.StatusCode, "a replay keeps the running program; body %s", body)
	assert.Equal(t, id, decode[madeEnv](t, body).SandboxID)
}

func TestEnvs_TimeoutKillsTheProgram(t *testing.T) {
	gw, _ := withEnvs(t)
	id := makeTestEnv(t, gw, "slow")
	base := gw.URL + "/v1/sandboxes/" + id

	resp, body := callJSON(t, http.MethodPost, base+"/env/reset", testKey, map[string]any{})
	require.Equal(t, http.StatusGatewayTimeout, resp.StatusCode, "body %s", body)
	e := decodeError(t, body)
	assert.Equal(t, string(envs.KindTimeout), e.Code)
	assert.Contains(t, e.Message, "thinking")

	resp, body = call(t, http.MethodGet, base+"/processes/"+envs.ProcessName, testKey, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, "body %s", body)
	assert.Equal(t, agentapi.ProcessExited, decode[agentapi.ProcessInfo](t, body).State, "the agent killed it")
}
