package api

// ErrorBody is the one JSON shape of every error answer of Quarry's API,
// and of the sandbox agent's, which the gateway passes on:
// {"error": {"code": "...", "message": "..."}}.
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail is the inner object of ErrorBody; a stream's "error" event
// carries it alone. Code is one of Codes(); Message is for people.
type ErrorDetail struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// The error codes of Quarry's API (ErrorDetail.Code), with the HTTP status
// the gateway answers each with. The sandbox agent answers some of them
// itself (execagent/agentapi names those). errclass decides which error
// gets which code; docs/API.md says what each means to a caller.
const (
	// CodeBadRequest: malformed input; the message names the field (400).
	CodeBadRequest = "bad_request"
	// CodeInvalidAction: an env program refused the action (400).
	CodeInvalidAction = "invalid_action"
	// CodeUnauthorized: a missing or wrong API key or relay token (401).
	CodeUnauthorized = "unauthorized"
	// CodeForbidden: the sandbox refused the operation (a path its user
	// may not touch), or the gateway did (403).
	CodeForbidden = "forbidden"
	// CodeImageNotAllowed: the image a request named is not one the
	// operator lets this key or class ask for (403); the message names
	// the rules that refused it.
	CodeImageNotAllowed = "image_not_allowed"
	// CodeImageDenied: the image's registry refused the gateway's
	// credentials for it (403).
	CodeImageDenied = "image_denied"
	// CodeNotFound: an unknown sandbox (or another key's), session,
	// process, file, checkpoint, model request or route (404).
	CodeNotFound = "not_found"
	// CodeImageNotFound: the image does not exist in its registry (404).
	CodeImageNotFound = "image_not_found"
	// CodeMethodNotAllowed: the path exists but not for this method (405).
	CodeMethodNotAllowed = "method_not_allowed"
	// CodeConflict: a concurrent change, or a request that contradicts an
	// earlier one (409).
	CodeConflict = "conflict"
	// CodeBusy: a session, process or sandbox is running something else,
	// e.g. a session already running a command (409).
	CodeBusy = "busy"
	// CodeNameInUse: a process start named a running process's name (409).
	CodeNameInUse = "name_in_use"
	// CodeProcessExited: an rpc process had exited before the call (409;
	// nothing was written); the message carries its exit status and stderr
	// tail.
	CodeProcessExited = "process_exited"
	// CodeNoReply: an rpc process exited (or closed its stdout) during a
	// call, before it replied (409); the message carries its exit status
	// and stderr tail.
	CodeNoReply = "no_reply"
	// CodeProtocolError: an rpc process wrote a reply line that is not one
	// JSON value or is over the size limit (409); the agent killed it.
	CodeProtocolError = "protocol_error"
	// CodeEpisodeNotRunning: an env step before reset, after the episode
	// ended or after the env program exited (409).
	CodeEpisodeNotRunning = "episode_not_running"
	// CodeGone: the sandbox's lease has ended (410); from the agent: it is
	// shutting down and killed the command.
	CodeGone = "gone"
	// CodeTooLarge: a body, a file or a checkpoint over its limit (413).
	CodeTooLarge = "payload_too_large"
	// CodeCommandFailed: a command ran and failed where the caller asked
	// for failure to be an error (ROCK's check "raise", a killed command);
	// 422. ROCK's envelope answers it with its command code, 6000.
	CodeCommandFailed = "command_failed"
	// CodeBuildFailed: an image build ran and failed (a step, a bad
	// Dockerfile): 422 with the build's message.
	CodeBuildFailed = "build_failed"
	// CodeQuotaExceeded: a quota of the caller's is spent (the checkpoint
	// store's budget); 429, not retryable: the same request fails until
	// the caller frees some or an operator raises the limit the message
	// names.
	CodeQuotaExceeded = "quota_exceeded"
	// CodeInternal: an unexpected failure, whose details are logged and not
	// shown, or a pool that cannot launch (500).
	CodeInternal = "internal"
	// CodeCheckpointCorrupt: a checkpoint's stored archive does not match
	// its sha256 or size (500); it was refused before anything was
	// restored from it.
	CodeCheckpointCorrupt = "checkpoint_corrupt"
	// CodeAgentUnreachable: the sandbox's agent did not answer, or refused
	// the gateway's token (502).
	CodeAgentUnreachable = "agent_unreachable"
	// CodeUpstreamUnreachable: a model relay upstream failed (502).
	CodeUpstreamUnreachable = "upstream_unreachable"
	// CodePortClosed: nothing listens on the sandbox port a proxied call
	// named (502); the message names the port.
	CodePortClosed = "port_closed"
	// CodeEnvError: an env program failed: it exited before replying, or
	// replied with something malformed or an error of its own (502).
	CodeEnvError = "env_error"
	// CodeUnavailable: the lease store, the provider, the relay or the
	// checkpoint store is unavailable; nothing happened (503, retryable).
	CodeUnavailable = "unavailable"
	// CodeNoCapacity: the pool is at its max_total (503, retryable).
	CodeNoCapacity = "no_capacity"
	// CodePidsLimit: a command, session shell, process or PTY program
	// could not start because the sandbox is at its limit of processes
	// (the fork failed with EAGAIN: its cgroup's pids.max, which counts
	// threads too); 503, retryable: nothing started. The message names the
	// limit when the agent knows it.
	CodePidsLimit = "pids_limit"
	// CodeRegistryUnavailable: the image's registry did not answer (503,
	// retryable).
	CodeRegistryUnavailable = "registry_unavailable"
	// CodeTimeout: the agent (or a trainer, for a relay call) did not
	// answer in time (504).
	CodeTimeout = "timeout"
	// CodeEnvTimeout: an env program did not reply within its step or
	// reset timeout (504).
	CodeEnvTimeout = "env_timeout"
	// CodeInsufficientStorage: a write (a file, an archive upload) found
	// the sandbox's disk full (ENOSPC) or over its quota (EDQUOT); 507. The
	// message names the path and the size of the file system holding it.
	// The write leaves nothing; the sandbox is fine otherwise.
	CodeInsufficientStorage = "insufficient_storage"
)

// Codes returns every error code of Quarry's API, in the order of the
// constants above (by status): the list that gateway/openapi.json,
// docs/API.md and the Python SDK are tested against. Each call returns a
// new slice.
func Codes() []string {
	return []string{
		CodeBadRequest, CodeInvalidAction, CodeUnauthorized, CodeForbidden, CodeImageNotAllowed,
		CodeImageDenied, CodeNotFound, CodeImageNotFound, CodeMethodNotAllowed, CodeConflict, CodeBusy,
		CodeNameInUse, CodeProcessExited, CodeNoReply, CodeProtocolError, CodeEpisodeNotRunning, CodeGone,
		CodeTooLarge, CodeCommandFailed, CodeBuildFailed, CodeQuotaExceeded, CodeInternal,
		CodeCheckpointCorrupt, CodeAgentUnreachable, CodeUpstreamUnreachable, CodePortClosed, CodeEnvError,
		CodeUnavailable, CodeNoCapacity, CodePidsLimit, CodeRegistryUnavailable, CodeTimeout, CodeEnvTimeout,
		CodeInsufficientStorage,
	}
}
