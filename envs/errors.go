package envs

import (
	"errors"
	"fmt"

	"github.com/quarryhq/quarry/api"
)

// ErrNotEnv: the sandbox was not made by Make (it has no LabelEnv label), or
// its env is no longer in the registry. Callers answer 409.
var ErrNotEnv = errors.New("sandbox has no env")

// ErrOff: the gateway was built without an env registry, so the env API
// (Quarry's env routes and ROCK's GEM routes) is off. Callers answer 404.
var ErrOff = errors.New("the env API is not configured on this gateway (QUARRY_ENVS_FILE)")

// Kind classifies an *Error.
type Kind string

// Kinds of *Error, with the HTTP status the gateway answers. Each is the
// error code of Quarry's API that answers it (api.Code*).
const (
	// KindInvalidAction: the env program refused the action (its reply
	// {"error": ..., "code": "invalid_action"}); 400.
	KindInvalidAction Kind = api.CodeInvalidAction
	// KindNotRunning: no episode is running: step before reset, after the
	// episode ended (the program's reply code "episode_not_running"), or
	// after the program exited; 409. The next reset starts a fresh program
	// when needed.
	KindNotRunning Kind = api.CodeEpisodeNotRunning
	// KindEnv: the env program failed: it exited before replying, wrote a
	// malformed or invalid reply, or replied with an error of its own; 502.
	KindEnv Kind = api.CodeEnvError
	// KindTimeout: the env program did not reply within the env's step or
	// reset timeout (the agent killed it; the next reset starts a fresh
	// one); 504.
	KindTimeout Kind = api.CodeEnvTimeout
)

// Error is a failure of, or a refusal by, an env program. Message is for
// people; it carries the program's own message, exit status or stderr tail
// when there is one.
type Error struct {
	Kind    Kind
	Message string
}

func (e *Error) Error() string { return string(e.Kind) + ": " + e.Message }

func envError(kind Kind, format string, args ...any) error {
	return &Error{Kind: kind, Message: fmt.Sprintf(format, args...)}
}
