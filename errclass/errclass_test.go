package errclass_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/quarryhq/quarry/checkpoints"
	"github.com/quarryhq/quarry/envs"
	"github.com/quarryhq/quarry/errclass"
	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/internal/badinput"
	"github.com/quarryhq/quarry/modelservice"
	"github.com/quarryhq/quarry/providers"
	"github.com/quarryhq/quarry/warmpool"
)

func call(err error) error { return &agentapi.CallError{Method: "POST", Path: "/v1/exec", Err: err} }

// TestOf holds the classification of every class of error, wrapped as
// callers wrap them.
func TestOf(t *testing.T) {
	tests := []struct {
		name      string
		err       error
		status    int
		code      string
		retryable bool
		message   string
	}{
		{name: "bad input", err: fmt.Errorf("create: %w", badinput.New("lease_seconds", "above %d", 60)), status: 400, code: "bad_request", message: "lease_seconds: above 60"},
		{name: "client body", err: &errclass.BodyReadError{Err: errors.New("unexpected EOF")}, status: 400, code: "bad_request", message: "body: unexpected EOF"},
		{name: "too large", err: fmt.Errorf("body: larger than the limit of 10 bytes: %w", errclass.ErrTooLarge), status: 413, code: "payload_too_large", message: "larger than the limit of 10 bytes"},
		{name: "unauthorized", err: errclass.Unauthorized("invalid API key"), status: 401, code: "unauthorized", message: "invalid API key"},
		{name: "status 404", err: &errclass.StatusError{Status: 404, Message: "Cannot GET /v1/nope"}, status: 404, code: "not_found", message: "Cannot GET /v1/nope"},
		{name: "status 405", err: &errclass.StatusError{Status: 405, Message: "Method Not Allowed"}, status: 405, code: "method_not_allowed"},
		{name: "status 408", err: &errclass.StatusError{Status: 408, Message: "Request Timeout"}, status: 408, code: "timeout"},
		{name: "status 413", err: &errclass.StatusError{Status: 413, Message: "Request Entity Too Large"}, status: 413, code: "payload_too_large"},
		{name: "status 431", err: &errclass.StatusError{Status: 431, Message: "Request Header Fields Too Large"}, status: 431, code: "bad_request"},
		{name: "status 500", err: &errclass.StatusError{Status: 500, Message: "Internal Server Error"}, status: 500, code: "internal"},
		{name: "command failed", err: &errclass.CommandError{Message: "exit code 2"}, status: 422, code: "command_failed", message: "exit code 2"},
		{name: "not found", err: errclass.Sandbox("sbx-1", warmpool.ErrNotFound), status: 404, code: "not_found", message: "sandbox sbx-1 not found"},
		{name: "not held is not found", err: errclass.Sandbox("sbx-1", warmpool.ErrLeaseNotHeld), status: 404, code: "not_found", message: "sandbox sbx-1 not found"},
		{name: "released", err: errclass.Sandbox("sbx-1", &warmpool.LeaseEndedError{State: warmpool.LeaseReleased}), status: 410, code: "gone", message: "sandbox sbx-1 was released"},
		{name: "expired, reaped", err: &warmpool.LeaseEndedError{State: warmpool.LeaseExpired, Reason: warmpool.ReasonNotRenewed}, status: 410, code: "gone", message: "the sandbox expired (its lease was not renewed before expires_at)"},
		{name: "expired, not reaped yet", err: &warmpool.LeaseEndedError{State: warmpool.LeaseExpired}, status: 410, code: "gone", message: "the sandbox expired: its lease was not renewed before expires_at"},
		{name: "lost with reason", err: &warmpool.LeaseEndedError{State: warmpool.LeaseLost, Reason: "task exited with code 137"}, status: 410, code: "gone", message: "was lost (task exited with code 137)"},
		{name: "ended", err: fmt.Errorf("heartbeat: %w", warmpool.ErrLeaseEnded), status: 410, code: "gone", message: "its lease has ended"},
		{name: "sandbox disk full", err: errclass.Sandbox("sbx-1", &agentapi.Error{Status: 507, Code: agentapi.CodeInsufficientStorage,
			Message: `write "/home/sandbox/f": no space left on device: the file system holding it is full (16 MiB, 0 bytes free)`}),
			status: 507, code: "insufficient_storage", message: `sandbox sbx-1: write "/home/sandbox/f": no space left on device: the file system holding it is full (16 MiB`},
		{name: "sandbox at its pids limit", err: errclass.Sandbox("sbx-1", &agentapi.Error{Status: 503, Code: agentapi.CodePidsLimit,
			Message: "the sandbox is at its pids limit (200 processes and threads): nothing can start until some exit; retry, or kill every process of the sandbox"}),
			status: 503, code: "pids_limit", retryable: true,
			message: "the sandbox is at its pids limit (200 processes and threads): nothing can start until some exit; retry, or kill every process of the sandbox (POST /v1/sandboxes/sbx-1/kill-all)"},
		{name: "stale generation", err: &agentapi.Error{Status: 409, Code: agentapi.CodeStaleGeneration, Message: "stale"}, status: 410, code: "gone", message: "belongs to a newer lease"},
		{name: "idempotency mismatch", err: fmt.Errorf("acquire: %w", warmpool.ErrIdempotencyMismatch), status: 409, code: "conflict", message: "first used with a different request"},
		{name: "store conflict", err: warmpool.ErrConflict, status: 409, code: "conflict", retryable: true, message: "changed concurrently; retry"},
		{name: "no capacity", err: fmt.Errorf("reserve: %w", warmpool.ErrNoCapacity), status: 503, code: "no_capacity", retryable: true, message: "retry later"},
		{name: "provider no capacity", err: &providers.LaunchError{Pool: "p", Reason: "quota", Err: providers.ErrNoCapacity}, status: 503, code: "no_capacity", retryable: true, message: "retry later"},
		{name: "throttled", err: &providers.LaunchError{Pool: "p", Reason: "rate", Err: providers.ErrThrottled}, status: 503, code: "unavailable", retryable: true, message: "retry later"},
		{name: "store unavailable", err: warmpool.ErrUnavailable, status: 503, code: "unavailable", retryable: true},
		{name: "deadline", err: context.DeadlineExceeded, status: 503, code: "unavailable", retryable: true},
		{name: "bad image", err: &providers.LaunchError{Pool: "p", Image: "nope", Reason: "image not found", Err: providers.ErrInvalidSpec}, status: 500, code: "internal", message: "image not found"},
		{name: "image not found", err: fmt.Errorf("prepare: %w", &providers.ImageError{Image: "127.0.0.1:5000/nope:1", Kind: providers.ImageNotFound, Registry: "127.0.0.1:5000", Answer: "manifest unknown"}),
			status: 404, code: "image_not_found", message: `image "127.0.0.1:5000/nope:1" does not exist in its registry (registry 127.0.0.1:5000): manifest unknown`},
		{name: "image denied", err: &providers.ImageError{Image: "r/x", Kind: providers.ImageDenied, Registry: "r", Answer: "unauthorized: authentication required"},
			status: 403, code: "image_denied", message: "refused by its registry (credentials) (registry r): unauthorized"},
		{name: "registry down", err: &providers.LaunchError{Pool: "p", Reason: "pull", Err: &providers.ImageError{Image: "r/x", Kind: providers.ImageUnreachable, Registry: "r", Answer: "connection refused"}},
			status: 503, code: "registry_unavailable", retryable: true, message: "did not answer (registry r): connection refused; retry later"},
		{name: "image of another platform", err: &providers.ImageError{Image: "x", Kind: providers.ImageInvalid, Answer: "arm64 only"},
			status: 400, code: "bad_request", message: `image "x" cannot run as a sandbox: arm64 only`},
		{name: "image not allowed", err: fmt.Errorf("acquire: %w", &warmpool.ImageNotAllowedError{Image: "quay.io/x:1", Refused: "no class serves it"}),
			status: 403, code: "image_not_allowed", message: `image "quay.io/x:1" is not allowed: no class serves it`},
		{name: "build failed", err: &providers.BuildError{Tag: "t", Message: "step 2: exit code 1"}, status: 422, code: "build_failed", message: "build t: step 2: exit code 1"},
		{name: "unknown hides details", err: errors.New("disk on fire at /var/secret"), status: 500, code: "internal", message: "internal error"},
		{name: "agent connection limit", err: errclass.Sandbox("s", call(agentapi.ErrCallLimit)), status: 503, code: "unavailable", retryable: true},
		{name: "agent answer too large", err: call(fmt.Errorf("read: %w", agentapi.ErrAnswerTooLarge)), status: 502, code: "agent_unreachable"},
		{name: "agent timeout", err: call(os.ErrDeadlineExceeded), status: 504, code: "timeout", message: "did not answer in time"},
		{name: "agent deadline", err: call(context.DeadlineExceeded), status: 504, code: "timeout"},
		{name: "agent refused", err: call(errors.New("connection refused")), status: 502, code: "agent_unreachable", message: "connection refused"},
		{name: "agent 5xx", err: &agentapi.Error{Status: 500, Code: "internal", Message: "boom"}, status: 502, code: "agent_unreachable", message: "boom"},
		{name: "agent 4xx passes", err: &agentapi.Error{Status: 404, Code: "not_found", Message: "no session"}, status: 404, code: "not_found", message: "no session"},
		{name: "agent 403 is the sandbox's answer", err: &agentapi.Error{Status: 403, Code: "forbidden", Message: "/root: permission denied"}, status: 403, code: "forbidden", message: "permission denied"},
		{name: "agent 401 is the gateway's token", err: &agentapi.Error{Status: 401, Code: "unauthorized", Message: "bad token"}, status: 502, code: "agent_unreachable", message: "refused the gateway's credentials"},
		{name: "relay token", err: modelservice.ErrBadToken, status: 401, code: "unauthorized"},
		{name: "relay upstream", err: &modelservice.UpstreamError{URL: "http://x", Err: errors.New("refused")}, status: 502, code: "upstream_unreachable"},
		{name: "relay full", err: modelservice.ErrFull, status: 503, code: "unavailable", retryable: true},
		{name: "relay timeout", err: modelservice.ErrTimeout, status: 504, code: "timeout"},
		{name: "relay shutdown", err: fmt.Errorf("relay: %w", modelservice.ErrShuttingDown), status: 503, code: "unavailable", retryable: true},
		{name: "env API off", err: fmt.Errorf("make: %w", envs.ErrOff), status: 404, code: "not_found", message: "QUARRY_ENVS_FILE"},
		{name: "not an env", err: errclass.Sandbox("s", fmt.Errorf("label missing: %w", envs.ErrNotEnv)), status: 409, code: "conflict", message: "label missing"},
		{name: "env refused the action", err: &envs.Error{Kind: envs.KindInvalidAction, Message: "not a digit"}, status: 400, code: "invalid_action", message: "not a digit"},
		{name: "env timeout", err: &envs.Error{Kind: envs.KindTimeout, Message: "5s"}, status: 504, code: "env_timeout"},
		{name: "env failed", err: &envs.Error{Kind: envs.KindEnv, Message: "exited"}, status: 502, code: "env_error"},
		{name: "checkpoint not found", err: fmt.Errorf("get checkpoint ckp-1: %w", checkpoints.ErrNotFound), status: 404, code: "not_found", message: "checkpoint not found"},
		{name: "checkpoint too large", err: fmt.Errorf("put checkpoint: archive larger than 10 bytes: %w", checkpoints.ErrTooLarge),
			status: 413, code: "payload_too_large", message: "larger than 10 bytes: checkpoint archive too large (QUARRY_MAX_CHECKPOINT_BYTES)"},
		{name: "checkpoint corrupt", err: fmt.Errorf("read: %w", checkpoints.ErrCorrupt), status: 500, code: "checkpoint_corrupt", message: "take a new checkpoint"},
		{name: "corrupt archive streamed into an agent", err: errclass.Sandbox("sbx-1", call(fmt.Errorf("send body: %w", checkpoints.ErrCorrupt))),
			status: 500, code: "checkpoint_corrupt", message: "damaged"},
		{name: "checkpoint id taken", err: checkpoints.ErrExists, status: 409, code: "conflict", retryable: true, message: "retry"},
		{name: "checkpoint store unavailable", err: fmt.Errorf("put: %w", checkpoints.ErrUnavailable), status: 503, code: "unavailable", retryable: true, message: "checkpoint store"},
		{name: "checkpoint store closed", err: checkpoints.ErrClosed, status: 503, code: "unavailable", retryable: true},
		{name: "checkpoint budget per key", err: errclass.Sandbox("sbx-1", fmt.Errorf("put checkpoint: %w",
			&checkpoints.BudgetError{Scope: checkpoints.ScopeOwner, Limit: 1 << 30, Used: 900 << 20, Need: 124<<20 + 1, AtLeast: true})),
			status: 429, code: "quota_exceeded",
			message: "checkpoint budget spent: this API key's checkpoints take 900.0 MiB of the 1.0 GiB allowed (QUARRY_CHECKPOINT_BUDGET_PER_KEY=1073741824), with no room for an archive over 124.0 MiB"},
		{name: "checkpoint budget in all", err: &checkpoints.BudgetError{Scope: checkpoints.ScopeTotal, Limit: 50 << 30, Used: 50<<30 - 10, Need: 537 << 20},
			status: 429, code: "quota_exceeded",
			message: "all API keys together, take 50.0 GiB of the 50.0 GiB allowed (QUARRY_CHECKPOINT_BUDGET_TOTAL=53687091200), with no room for this 537.0 MiB archive"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := errclass.Of(tt.err)
			assert.Equal(t, tt.status, c.Status)
			assert.Equal(t, tt.code, c.Code)
			assert.Equal(t, tt.retryable, c.Retryable)
			assert.NotEmpty(t, c.Message)
			assert.Contains(t, c.Message, tt.message)
			assert.NotContains(t, c.Message, "/var/secret")
			assert.Equal(t, c.Code == agentapi.CodeInternal, c.Unexpected())
			assert.NotEqual(t, http.StatusOK, c.Status)
		})
	}
}

// A message made of a command's output or a program's own words ends in
// a newline when they do: no surface shows it.
func TestOf_MessageNeverEndsInWhiteSpace(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{name: "a command failed with no output", err: &errclass.CommandError{Message: "Command \"false\" failed with exit code 1. Here is the output:\n"},
			want: "Command \"false\" failed with exit code 1. Here is the output:"},
		{name: "an env program's traceback", err: errclass.Sandbox("sbx-1", &envs.Error{Kind: envs.KindEnv, Message: "Traceback (most recent call last):\n  File \"env.py\"\nValueError: bad\n"}),
			want: "sandbox sbx-1: Traceback (most recent call last):\n  File \"env.py\"\nValueError: bad"},
		{name: "an agent's answer", err: &agentapi.Error{Status: 409, Code: agentapi.CodeBusy, Message: "session ses-1 is running a command\r\n"},
			want: "session ses-1 is running a command"},
		{name: "bad input", err: badinput.New("command", "ends in a tab\t"), want: "command: ends in a tab"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, errclass.Of(tc.err).Message)
		})
	}
}

func TestSandbox_NilStaysNil(t *testing.T) {
	assert.NoError(t, errclass.Sandbox("sbx-1", nil))
}

func TestAgentMayBeDown(t *testing.T) {
	assert.True(t, errclass.AgentMayBeDown(call(errors.New("connection refused"))))
	assert.False(t, errclass.AgentMayBeDown(call(agentapi.ErrCallLimit)))
	assert.False(t, errclass.AgentMayBeDown(call(agentapi.ErrAnswerTooLarge)))
	assert.False(t, errclass.AgentMayBeDown(&agentapi.Error{Status: 500}), "the agent answered")
}
