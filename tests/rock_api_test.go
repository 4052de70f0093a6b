//go:build integration

package tests

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/quarryhq/quarry/client"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// rockEnvelope is ROCK's response shape.
type rockEnvelope struct {
	Status  string  `json:"status"`
	Message *string `json:"message"`
	Error   *string `json:"error"`
	Result  any     `json:"result"`
}

// errMsg returns the error message ("" when there is none).
func (e rockEnvelope) errMsg() string {
	if e.Error == nil {
		return ""
	}
	return *e.Error
}

// res returns the result as an object (nil when it is not one).
func (e rockEnvelope) res() map[string]any {
	m, _ := e.Result.(map[string]any)
	return m
}

// rockCall sends one call to a ROCK route of g and decodes the envelope.
func rockCall(t *testing.T, g *gatewayProc, method, route string, headers map[string]string, body any) (int, rockEnvelope) {
	t.Helper()
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		require.NoError(t, err)
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx(t), method, g.url()+"/apis/envs/sandbox/v1/"+route, r)
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var env rockEnvelope
	require.NoError(t, json.Unmarshal(raw, &env), string(raw))
	return resp.StatusCode, env
}

func TestRock_AuthAndBadInput(t *testing.T) {
	g := startGateway(t, defaultPools)
	key := map[string]string{"X-Key": g.key}
	_, started := rockCall(t, g, http.MethodPost, "start_async", key, map[string]any{"image": "python:3.11"})
	require.Equal(t, "Success", started.Status, started.errMsg())
	id := started.res()["sandbox_id"].(string)

	for _, tc := range []struct {
		name    string
		headers map[string]string
		status  int
	}{
		{name: "no key", headers: nil, status: http.StatusUnauthorized},
		{name: "wrong key", headers: map[string]string{"X-Key": "nope"}, status: http.StatusUnauthorized},
		{name: "wrong bearer", headers: map[string]string{"XRL-Authorization": "Bearer nope"}, status: http.StatusUnauthorized},
		{name: "X-Key", headers: key, status: http.StatusOK},
		{name: "X-API-Key", headers: map[string]string{"X-API-Key": g.key}, status: http.StatusOK},
		{name: "XRL-Authorization bearer", headers: map[string]string{"XRL-Authorization": "Bearer " + g.key}, status: http.StatusOK},
		{name: "Authorization bearer", headers: map[string]string{"Authorization": "Bearer " + g.key}, status: http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, env := rockCall(t, g, http.MethodGet, "get_status?sandbox_id="+id, tc.headers, nil)
			assert.Equal(t, tc.status, status)
			if tc.status == http.StatusOK {
				assert.Equal(t, "Success", env.Status)
				assert.Equal(t, true, env.res()["is_alive"])
				return
			}
			assert.Equal(t, "Failed", env.Status)
			require.NotNil(t, env.Error)
			assert.Contains(t, *env.Error, "API key")
		})
	}

	for _, tc := range []struct {
		name  string
		route string
		body  any
		want  string
	}{
		{name: "sandbox id of the wrong type", route: "execute", body: map[string]any{"sandbox_id": 7, "command": "true"}, want: "sandbox_id"},
		{name: "empty command", route: "execute", body: map[string]any{"sandbox_id": id, "command": ""}, want: "command: must be a non-empty string"},
		{name: "unknown sandbox", route: "execute", body: map[string]any{"sandbox_id": "sbx-aaaaaaaaaaaaaaaaaaaaaaaaaa", "command": "true"}, want: "not found"},
		{name: "unknown session", route: "run_in_session", body: map[string]any{"sandbox_id": id, "session": "nope", "command": "true"}, want: `session "nope" does not exist`},
		{name: "bad check", route: "run_in_session", body: map[string]any{"sandbox_id": id, "command": "true", "check": "maybe"}, want: "check: must be raise, silent or ignore"},
		{name: "bad session name", route: "create_session", body: map[string]any{"sandbox_id": id, "session": "../x"}, want: "session: must be"},
		{name: "remote user", route: "create_session", body: map[string]any{"sandbox_id": id, "session": "s", "remote_user": "admin"}, want: "remote_user"},
		{name: "write without content", route: "write_file", body: map[string]any{"sandbox_id": id, "path": "/tmp/x"}, want: "content: is required"},
		{name: "negative auto clear", route: "start_async", body: map[string]any{"auto_clear_time_minutes": -5}, want: "auto_clear_time_minutes: must be a positive number"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, env := rockCall(t, g, http.MethodPost, tc.route, key, tc.body)
			assert.Equal(t, http.StatusOK, status, "ROCK answers failures with 200 and status Failed")
			assert.Equal(t, "Failed", env.Status)
			require.NotNil(t, env.Error)
			assert.Contains(t, *env.Error, tc.want)
			assert.EqualValues(t, 4000, env.res()["code"])
		})
	}

	// Without an env registry the GEM routes answer 404 with ROCK's detail.
	req, err := http.NewRequestWithContext(ctx(t), http.MethodPost, g.url()+"/apis/v1/envs/gem/make", strings.NewReader(`{"env_id": "x"}`))
	require.NoError(t, err)
	req.Header.Set("X-Key", g.key)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusNotFound, resp.StatusCode)
	assert.Contains(t, string(body), `"detail":"the env API is not configured`)

	// read_file is the one route whose failures carry an HTTP error status:
	// the SDK reads result["content"] without looking at status.
	status, env := rockCall(t, g, http.MethodPost, "read_file", key, map[string]any{"sandbox_id": id, "path": "/no/such/file"})
	assert.Equal(t, http.StatusNotFound, status)
	assert.Equal(t, "Failed", env.Status)
}

func TestRock_SessionsSurviveGatewayRestart(t *testing.T) {
	g := startGateway(t, defaultPools)
	key := map[string]string{"X-Key": g.key}
	_, started := rockCall(t, g, http.MethodPost, "start", key, map[string]any{"sandbox_id": "restart-me"})
	require.Equal(t, "Success", started.Status, started.errMsg())
	_, env := rockCall(t, g, http.MethodPost, "create_session", key, map[string]any{"sandbox_id": "restart-me", "session": "keep"})
	require.Equal(t, "Success", env.Status, env.errMsg())
	_, env = rockCall(t, g, http.MethodPost, "run_in_session", key,
		map[string]any{"sandbox_id": "restart-me", "session": "keep", "command": "cd /tmp && KEPT=yes"})
	require.Equal(t, "Success", env.Status, env.errMsg())

	// Nothing about the session lives in the gateway: a restarted gateway
	// (or any other replica) finds it from the sandbox.
	g.stop()
	g.start()
	_, env = rockCall(t, g, http.MethodPost, "run_in_session", key,
		map[string]any{"sandbox_id": "restart-me", "session": "keep", "command": `echo "$(pwd) $KEPT"`, "check": "silent"})
	require.Equal(t, "Success", env.Status, env.errMsg())
	assert.Equal(t, "/tmp yes", env.res()["output"])
	assert.EqualValues(t, 0, env.res()["exit_code"])

	_, env = rockCall(t, g, http.MethodPost, "run_in_session", key,
		map[string]any{"sandbox_id": "restart-me", "session": "keep", "command": "(exit 5)", "check": "silent"})
	require.Equal(t, "Success", env.Status, env.errMsg())
	assert.EqualValues(t, 5, env.res()["exit_code"], "check silent returns the exit code")
	_, env = rockCall(t, g, http.MethodPost, "run_in_session", key,
		map[string]any{"sandbox_id": "restart-me", "session": "keep", "command": "(exit 5)", "check": "raise"})
	assert.Equal(t, "Failed", env.Status)
	assert.Equal(t, `Command "(exit 5)" failed with exit code 5. Here is the output:`, env.errMsg(),
		"check raise: a failure, its message without the newline that led to the (empty) output")

	// A timeout interrupts the command, not the session.
	_, env = rockCall(t, g, http.MethodPost, "run_in_session", key,
		map[string]any{"sandbox_id": "restart-me", "session": "keep", "command": "sleep 60", "timeout": 1})
	assert.Equal(t, "Failed", env.Status)
	assert.Contains(t, env.errMsg(), "timeout after 1 seconds")
	_, env = rockCall(t, g, http.MethodPost, "run_in_session", key,
		map[string]any{"sandbox_id": "restart-me", "session": "keep", "command": `echo "$(pwd) $KEPT"`})
	require.Equal(t, "Success", env.Status, env.errMsg())
	assert.Equal(t, "/tmp yes", env.res()["output"])

	_, env = rockCall(t, g, http.MethodPost, "stop", key, map[string]any{"sandbox_id": "restart-me"})
	require.Equal(t, "Success", env.Status, env.errMsg())
	_, env = rockCall(t, g, http.MethodPost, "stop", key, map[string]any{"sandbox_id": "restart-me"})
	assert.Equal(t, "Success", env.Status, "stop is idempotent")
}

// Two create_session calls racing for one new name: one wins, the other is
// told the name is taken, and no agent session is left without a name.
func TestRock_CreateSession_ConcurrentSameNameOneWinsNoLeak(t *testing.T) {
	g := startGateway(t, defaultPools)
	key := map[string]string{"X-Key": g.key}
	_, started := rockCall(t, g, http.MethodPost, "start", key, map[string]any{"sandbox_id": "race-me"})
	require.Equal(t, "Success", started.Status, started.errMsg())

	const callers = 6
	envs := make([]rockEnvelope, callers)
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			_, envs[i] = rockCall(t, g, http.MethodPost, "create_session", key, map[string]any{"sandbox_id": "race-me", "session": "shared"})
		})
	}
	wg.Wait()
	winners := 0
	for _, env := range envs {
		if env.Status == "Success" {
			winners++
			continue
		}
		assert.Contains(t, env.errMsg(), "already exists")
	}
	assert.Equal(t, 1, winners)

	sbs, err := g.client().ListSandboxes(ctx(t), client.ListSandboxesRequest{Labels: map[string]string{"rock.sandbox_id": "race-me"}})
	require.NoError(t, err)
	require.Len(t, sbs, 1)
	sessions, err := g.client().ListSessions(ctx(t), sbs[0].ID)
	require.NoError(t, err)
	assert.Len(t, sessions, 1, "the losers closed the sessions they made")

	// The name is free again once closed, and after the shell exits.
	_, env := rockCall(t, g, http.MethodPost, "close_session", key, map[string]any{"sandbox_id": "race-me", "session": "shared"})
	require.Equal(t, "Success", env.Status, env.errMsg())
	_, env = rockCall(t, g, http.MethodPost, "create_session", key, map[string]any{"sandbox_id": "race-me", "session": "shared"})
	require.Equal(t, "Success", env.Status, env.errMsg())
	_, env = rockCall(t, g, http.MethodPost, "run_in_session", key,
		map[string]any{"sandbox_id": "race-me", "session": "shared", "command": "exit 0", "check": "silent"})
	require.Equal(t, "Success", env.Status, env.errMsg())
	_, env = rockCall(t, g, http.MethodPost, "create_session", key, map[string]any{"sandbox_id": "race-me", "session": "shared"})
	require.Equal(t, "Success", env.Status, env.errMsg())
	sessions, err = g.client().ListSessions(ctx(t), sbs[0].ID)
	require.NoError(t, err)
	assert.Len(t, sessions, 1)
}

// A chosen sandbox_id names one sandbox: starting it again after stop is a
// clear bad request, not an internal error; a huge auto-clear time gets the
// pool's longest lease.
func TestRock_StartAfterStopAndLongAutoClear(t *testing.T) {
	g := startGateway(t, defaultPools)
	key := map[string]string{"X-Key": g.key}
	_, env := rockCall(t, g, http.MethodPost, "start", key, map[string]any{"sandbox_id": "once", "auto_clear_time_minutes": 1e30})
	require.Equal(t, "Success", env.Status, env.errMsg())
	sbs, err := g.client().ListSandboxes(ctx(t), client.ListSandboxesRequest{Labels: map[string]string{"rock.sandbox_id": "once"}})
	require.NoError(t, err)
	require.Len(t, sbs, 1)
	assert.Equal(t, 86400, sbs[0].LeaseSeconds, "capped at the pool's max_lease_seconds")

	_, env = rockCall(t, g, http.MethodPost, "stop", key, map[string]any{"sandbox_id": "once"})
	require.Equal(t, "Success", env.Status, env.errMsg())
	_, env = rockCall(t, g, http.MethodPost, "start", key, map[string]any{"sandbox_id": "once"})
	assert.Equal(t, "Failed", env.Status)
	assert.Contains(t, env.errMsg(), "has ended (released")
	assert.Contains(t, env.errMsg(), "choose a new sandbox_id")
	assert.EqualValues(t, 4000, env.res()["code"])
}

// A second start with the same chosen id and other settings names the
// running sandbox instead of replaying it.
func TestRock_StartAgainWithOtherSettingsIsRefused(t *testing.T) {
	g := startGateway(t, defaultPools)
	key := map[string]string{"X-Key": g.key}
	_, env := rockCall(t, g, http.MethodPost, "start", key, map[string]any{"sandbox_id": "twice"})
	require.Equal(t, "Success", env.Status, env.errMsg())
	_, env = rockCall(t, g, http.MethodPost, "start", key, map[string]any{"sandbox_id": "twice"})
	require.Equal(t, "Success", env.Status, "the same start replays: %s", env.errMsg())
	_, env = rockCall(t, g, http.MethodPost, "start", key, map[string]any{"sandbox_id": "twice", "auto_clear_time_minutes": 5})
	assert.Equal(t, "Failed", env.Status)
	assert.Contains(t, env.errMsg(), "started with other settings")
	assert.EqualValues(t, 4000, env.res()["code"])
}
