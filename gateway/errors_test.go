package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"

	"github.com/gofiber/fiber/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"

	"github.com/quarryhq/quarry/api"
	"github.com/quarryhq/quarry/checkpoints"
	"github.com/quarryhq/quarry/envs"
	"github.com/quarryhq/quarry/errclass"
	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/internal/badinput"
	"github.com/quarryhq/quarry/modelservice"
	"github.com/quarryhq/quarry/providers"
	"github.com/quarryhq/quarry/warmpool"
)

// TestErrors_EverySurfaceRendersOneClassification runs one error of every
// class through every API surface that creates a sandbox — Quarry's
// POST /v1/sandboxes and POST /v1/envs, ROCK's start_async and GEM's make —
// and through the close of a WebSocket, and holds each answer to the class the table names: the same status,
// code, retryability and message everywhere, in each surface's own shape.
// Unknown pools are left out: the create routes turn the store's
// ErrNotFound into bad input naming the pool, by design.
func TestErrors_EverySurfaceRendersOneClassification(t *testing.T) {
	tests := []struct {
		name      string
		err       error
		status    int
		code      string
		retryable bool
		rockCode  int // ROCK's result code: 4000 the caller's, 5000 retry or the service's, 6000 the command's
		message   string
	}{
		{name: "bad input", err: badinput.New("lease_seconds", "above the pool's maximum 3600"), status: 400, code: "bad_request", rockCode: 4000, message: "lease_seconds: above the pool's maximum 3600"},
		{name: "unauthorized", err: errclass.Unauthorized("invalid API key"), status: 401, code: "unauthorized", rockCode: 4000, message: "invalid API key"},
		{name: "not held", err: fmt.Errorf("acquire: %w", warmpool.ErrLeaseNotHeld), status: 404, code: "not_found", rockCode: 4000, message: "the sandbox not found"},
		{name: "lease ended", err: &warmpool.LeaseEndedError{State: warmpool.LeaseLost, Reason: "task exited"}, status: 410, code: "gone", rockCode: 4000, message: "the sandbox was lost (task exited)"},
		{name: "idempotency key reused", err: fmt.Errorf("acquire: %w", warmpool.ErrIdempotencyMismatch), status: 409, code: "conflict", rockCode: 4000, message: "a key makes one sandbox: use a new key"},
		{name: "store conflict", err: warmpool.ErrConflict, status: 409, code: "conflict", retryable: true, rockCode: 5000, message: "changed concurrently; retry"},
		{name: "pool full", err: fmt.Errorf("reserve: %w", warmpool.ErrNoCapacity), status: 503, code: "no_capacity", retryable: true, rockCode: 5000,
			message: "no sandbox available: the pool is at its max_total; retry later"},
		{name: "provider out of capacity", err: fmt.Errorf("cold start: %w", &providers.LaunchError{Pool: "default", Reason: "RESOURCE:ENI", Err: providers.ErrNoCapacity}),
			status: 503, code: "no_capacity", retryable: true, rockCode: 5000, message: "no sandbox available: the pool is at its max_total; retry later"},
		{name: "provider throttled", err: &providers.LaunchError{Pool: "default", Reason: "Rate exceeded", Err: providers.ErrThrottled},
			status: 503, code: "unavailable", retryable: true, rockCode: 5000, message: "the lease store or provider is unavailable; retry later"},
		{name: "store unavailable", err: fmt.Errorf("claim: %w", warmpool.ErrUnavailable), status: 503, code: "unavailable", retryable: true, rockCode: 5000, message: "retry later"},
		{name: "deadline", err: context.DeadlineExceeded, status: 503, code: "unavailable", retryable: true, rockCode: 5000, message: "retry later"},
		{name: "relay full", err: modelservice.ErrFull, status: 503, code: "unavailable", retryable: true, rockCode: 5000, message: "the model relay is unavailable"},
		{name: "agent 403 is the sandbox's answer", err: &agentapi.Error{Status: 403, Code: "forbidden", Message: "/root/x: permission denied"},
			status: 403, code: "forbidden", rockCode: 4000, message: "/root/x: permission denied"},
		{name: "agent busy", err: &agentapi.Error{Status: 409, Code: agentapi.CodeBusy, Message: "the session is running a command"},
			status: 409, code: "busy", rockCode: 4000, message: "the session is running a command"},
		{name: "agent refused the token", err: &agentapi.Error{Status: 401, Code: "unauthorized", Message: "bad token"},
			status: 502, code: "agent_unreachable", rockCode: 5000, message: "refused the gateway's credentials"},
		{name: "agent unreachable", err: &agentapi.CallError{Err: errors.New("connection refused")}, status: 502, code: "agent_unreachable", rockCode: 5000, message: "is unreachable: connection refused"},
		{name: "agent timeout", err: agentCallError(fasthttp.ErrTimeout), status: 504, code: "timeout", rockCode: 5000, message: "did not answer in time"},
		{name: "agent connection limit", err: agentCallError(fasthttp.ErrNoFreeConns), status: 503, code: "unavailable", retryable: true, rockCode: 5000, message: "retry later"},
		{name: "sandbox at its pids limit", err: &agentapi.Error{Status: 503, Code: agentapi.CodePidsLimit,
			Message: "the sandbox is at its pids limit (200 processes and threads): nothing can start until some exit; retry, or kill every process of the sandbox"},
			status: 503, code: "pids_limit", retryable: true, rockCode: 5000, message: "the sandbox is at its pids limit (200 processes and threads)"},
		{name: "env program failed", err: &envs.Error{Kind: envs.KindEnv, Message: "exited with code 7"}, status: 502, code: "env_error", rockCode: 5000, message: "exited with code 7"},
		{name: "command failed", err: &errclass.CommandError{Message: "exit code 2"}, status: 422, code: "command_failed", rockCode: 6000, message: "exit code 2"},
		{name: "command failed with no output", err: &errclass.CommandError{Message: "Command \"false\" failed with exit code 1. Here is the output:\n"},
			status: 422, code: "command_failed", rockCode: 6000, message: "Here is the output:"},
		{name: "bad image", err: &providers.LaunchError{Pool: "default", Image: "nope", Reason: "image not found", Err: providers.ErrInvalidSpec},
			status: 500, code: "internal", rockCode: 5000, message: "image not found"},
		{name: "checkpoint not found", err: fmt.Errorf("from checkpoint: %w", checkpoints.ErrNotFound), status: 404, code: "not_found", rockCode: 4000, message: "checkpoint not found"},
		{name: "checkpoint corrupt", err: fmt.Errorf("restore: %w", checkpoints.ErrCorrupt), status: 500, code: api.CodeCheckpointCorrupt, rockCode: 5000,
			message: "take a new checkpoint"},
		{name: "checkpoint store unavailable", err: fmt.Errorf("open: %w", checkpoints.ErrUnavailable), status: 503, code: "unavailable", retryable: true, rockCode: 5000,
			message: "the checkpoint store is unavailable; retry later"},
		{name: "checkpoint budget spent", err: fmt.Errorf("fork: %w", &checkpoints.BudgetError{Scope: checkpoints.ScopeOwner, Limit: 1 << 30, Used: 1 << 30, Need: 1, AtLeast: true}),
			status: 429, code: api.CodeQuotaExceeded, rockCode: 4000,
			message: "checkpoint budget spent: this API key's checkpoints take 1.0 GiB of the 1.0 GiB allowed (QUARRY_CHECKPOINT_BUDGET_PER_KEY=1073741824)"},
		{name: "unknown error hides details", err: errors.New("disk on fire at /var/secret"), status: 500, code: "internal", rockCode: 5000, message: "internal error"},
	}
	reg, err := envs.NewRegistry([]envs.Spec{{ID: "game", Pool: "default", Command: []string{"true"}}})
	require.NoError(t, err)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mgr := newFakeManager("")
			mgr.AcquireFn = func(context.Context, warmpool.AcquireRequest) (warmpool.Lease, bool, error) {
				return warmpool.Lease{}, false, tt.err
			}
			gw := startGatewayDeps(t, mgr, nil, Deps{Envs: reg})
			wantRetryAfter := ""
			if tt.retryable {
				wantRetryAfter = "2"
			}

			for _, route := range []struct{ path, body string }{
				{"/v1/sandboxes", `{"pool": "default"}`},
				{"/v1/envs", `{"env_id": "game"}`},
			} {
				resp, body := callJSON(t, http.MethodPost, gw.URL+route.path, testKey, rawJSON(route.body))
				e := decodeError(t, body)
				assert.Equal(t, tt.status, resp.StatusCode, "%s: %s", route.path, body)
				assert.Equal(t, tt.code, e.Code, route.path)
				assert.Contains(t, e.Message, tt.message, route.path)
				assert.NotRegexp(t, `\s$`, e.Message, "%s: no message ends in white space", route.path)
				assert.NotContains(t, e.Message, "/var/secret", route.path)
				if tt.status == http.StatusServiceUnavailable {
					assert.Equal(t, wantRetryAfter, resp.Header.Get("Retry-After"), route.path)
				} else {
					assert.Empty(t, resp.Header.Get("Retry-After"), route.path)
				}
			}

			resp, body := callJSON(t, http.MethodPost, gw.URL+"/apis/envs/sandbox/v1/start_async", testKey, map[string]any{"image": ""})
			assert.Equal(t, http.StatusOK, resp.StatusCode, "ROCK answers failures in its envelope: %s", body)
			env := decode[struct {
				Status string `json:"status"`
				Error  string `json:"error"`
				Result struct {
					Code          int    `json:"code"`
					FailureReason string `json:"failure_reason"`
				} `json:"result"`
			}](t, body)
			assert.Equal(t, "Failed", env.Status)
			assert.Equal(t, tt.rockCode, env.Result.Code, "ROCK code: %s", body)
			assert.Contains(t, env.Error, tt.message, "ROCK")
			assert.NotRegexp(t, `\s$`, env.Error, "ROCK")
			assert.Equal(t, env.Error, env.Result.FailureReason)
			assert.NotContains(t, env.Error, "/var/secret", "ROCK")
			assert.Equal(t, wantRetryAfter, resp.Header.Get("Retry-After"), "ROCK")

			wantClose := wsClose{WSCloseStatusBase + tt.status, tt.code}
			if tt.status == http.StatusGone {
				wantClose = wsClose{WSCloseLeaseGone, WSReasonLeaseGone}
			}
			assert.Equal(t, wantClose, wsCloseOf(tt.err), "WebSocket close")

			resp, body = callJSON(t, http.MethodPost, gw.URL+"/apis/v1/envs/gem/make", testKey, map[string]any{"env_id": "game"})
			assert.Equal(t, tt.status, resp.StatusCode, "GEM: %s", body)
			detail := decode[map[string]string](t, body)["detail"]
			assert.Contains(t, detail, tt.message, "GEM")
			assert.NotRegexp(t, `\s$`, detail, "GEM")
			assert.NotContains(t, detail, "/var/secret", "GEM")
			assert.Equal(t, wantRetryAfter, resp.Header.Get("Retry-After"), "GEM")
		})
	}
}

// rawJSON is a request body sent as written.
type rawJSON string

func (r rawJSON) MarshalJSON() ([]byte, error) { return []byte(r), nil }

// TestFromFiber_FiberErrorsAreClassifiedByStatus holds the translation of
// fiber's own errors at the edge (errclass knows no fiber): each keeps its
// status and message, and gets the code of its status.
func TestFromFiber_FiberErrorsAreClassifiedByStatus(t *testing.T) {
	tests := []struct {
		name   string
		err    error
		status int
		code   string
	}{
		{name: "route not found", err: fiber.NewError(fiber.StatusNotFound, "Cannot GET /v1/nope"), status: 404, code: api.CodeNotFound},
		{name: "method not allowed", err: fiber.ErrMethodNotAllowed, status: 405, code: api.CodeMethodNotAllowed},
		{name: "body over the server's limit", err: fiber.ErrRequestEntityTooLarge, status: 413, code: api.CodeTooLarge},
		{name: "request timeout", err: fiber.ErrRequestTimeout, status: 408, code: api.CodeTimeout},
		{name: "other 4xx", err: fiber.ErrRequestHeaderFieldsTooLarge, status: 431, code: api.CodeBadRequest},
		{name: "5xx", err: fiber.ErrServiceUnavailable, status: 503, code: api.CodeInternal},
		{name: "wrapped", err: fmt.Errorf("route: %w", fiber.ErrNotFound), status: 404, code: api.CodeNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var fe *fiber.Error
			require.ErrorAs(t, tt.err, &fe)
			got := fromFiber(tt.err)
			assert.ErrorIs(t, got, fe, "the fiber error stays wrapped")
			a := errclass.Of(got)
			assert.Equal(t, tt.status, a.Status)
			assert.Equal(t, tt.code, a.Code)
			assert.Equal(t, fe.Message, a.Message)
		})
	}

	other := fmt.Errorf("acquire: %w", warmpool.ErrNoCapacity)
	assert.Same(t, other, fromFiber(other), "an error of no fiber's passes unchanged")
}
