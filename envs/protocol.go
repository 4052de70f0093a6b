package envs

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/quarryhq/quarry/internal/badinput"
)

// Operations of the JSON-lines protocol (docs/ENVS.md).
const (
	OpReset = "reset"
	OpStep  = "step"
	OpClose = "close"
)

// Error codes an env program may put in an error reply
// ({"error": "message", "code": "..."}); any other code, or none, is an
// env failure (KindEnv).
const (
	ReplyCodeInvalidAction     = "invalid_action"
	ReplyCodeEpisodeNotRunning = "episode_not_running"
)

// maxMessageBytes bounds an env program's error message quoted to callers.
const maxMessageBytes = 4 << 10

// ResetResult is a reset's answer: the first observation of an episode and
// the program's info object.
type ResetResult struct {
	Observation json.RawMessage `json:"observation"`
	Info        json.RawMessage `json:"info"`
}

// StepResult is a step's answer.
type StepResult struct {
	Observation json.RawMessage `json:"observation"`
	Reward      float64         `json:"reward"`
	Terminated  bool            `json:"terminated"`
	Truncated   bool            `json:"truncated"`
	Info        json.RawMessage `json:"info"`
}

// request is one line the service writes to an env program.
type request struct {
	Op      string          `json:"op"`
	Seed    *int64          `json:"seed,omitempty"`
	Options json.RawMessage `json:"options,omitempty"`
	Action  json.RawMessage `json:"action,omitempty"`
}

// EncodeReset returns the reset request line (without its newline). seed
// may be nil; options, when not empty, must be a JSON object.
func EncodeReset(seed *int64, options json.RawMessage) (json.RawMessage, error) {
	if len(options) > 0 && !isObject(options) {
		return nil, badinput.New("options", "must be a JSON object")
	}
	return json.Marshal(request{Op: OpReset, Seed: seed, Options: options})
}

// EncodeStep returns the step request line; action is any JSON value but
// must be present.
func EncodeStep(action json.RawMessage) (json.RawMessage, error) {
	if len(bytes.TrimSpace(action)) == 0 {
		return nil, badinput.New("action", "required: any JSON value the env accepts")
	}
	if !json.Valid(action) {
		return nil, badinput.New("action", "must be a JSON value")
	}
	return json.Marshal(request{Op: OpStep, Action: action})
}

// EncodeClose returns the close request line.
func EncodeClose() json.RawMessage {
	b, _ := json.Marshal(request{Op: OpClose})
	return b
}

// reply is every field a reply may carry; presence is checked on the raw
// object.
type reply struct {
	Observation json.RawMessage `json:"observation"`
	Reward      json.RawMessage `json:"reward"`
	Terminated  json.RawMessage `json:"terminated"`
	Truncated   json.RawMessage `json:"truncated"`
	Info        json.RawMessage `json:"info"`
	Error       json.RawMessage `json:"error"`
	Code        json.RawMessage `json:"code"`
}

// DecodeResetReply validates a reply to reset: {"observation": any,
// "info": {...}} (info may be absent: {}), or an error reply. Violations are
// *Error of KindEnv naming what is wrong; an error reply is an *Error of
// the kind its code says.
func DecodeResetReply(raw json.RawMessage) (ResetResult, error) {
	r, err := decodeReply(OpReset, raw)
	if err != nil {
		return ResetResult{}, err
	}
	info, err := infoOf(OpReset, r.Info)
	if err != nil {
		return ResetResult{}, err
	}
	return ResetResult{Observation: r.Observation, Info: info}, nil
}

// DecodeStepReply validates a reply to step: {"observation": any,
// "reward": number, "terminated": bool, "truncated": bool (may be absent:
// false), "info": {...} (may be absent)}, or an error reply.
func DecodeStepReply(raw json.RawMessage) (StepResult, error) {
	r, err := decodeReply(OpStep, raw)
	if err != nil {
		return StepResult{}, err
	}
	var res StepResult
	res.Observation = r.Observation
	if !present(r.Reward) || json.Unmarshal(r.Reward, &res.Reward) != nil {
		return res, badReply(OpStep, "reward must be a number, got %s", shown(r.Reward))
	}
	if !present(r.Terminated) || json.Unmarshal(r.Terminated, &res.Terminated) != nil {
		return res, badReply(OpStep, "terminated must be true or false, got %s", shown(r.Terminated))
	}
	if present(r.Truncated) && json.Unmarshal(r.Truncated, &res.Truncated) != nil {
		return res, badReply(OpStep, "truncated must be true or false, got %s", shown(r.Truncated))
	}
	if res.Info, err = infoOf(OpStep, r.Info); err != nil {
		return res, err
	}
	return res, nil
}

// decodeReply decodes an object reply, turns an error reply into its
// *Error, and checks that observation is present.
func decodeReply(op string, raw json.RawMessage) (reply, error) {
	var r reply
	if !isObject(raw) {
		return r, badReply(op, "the reply must be a JSON object, got %s", shown(raw))
	}
	if err := json.Unmarshal(raw, &r); err != nil {
		return r, badReply(op, "%s", err.Error())
	}
	if present(r.Error) {
		var msg, code string
		if json.Unmarshal(r.Error, &msg) != nil {
			return r, badReply(op, "error must be a string, got %s", shown(r.Error))
		}
		if present(r.Code) && json.Unmarshal(r.Code, &code) != nil {
			return r, badReply(op, "code must be a string, got %s", shown(r.Code))
		}
		msg = clip(msg)
		switch code {
		case ReplyCodeInvalidAction:
			return r, envError(KindInvalidAction, "the env refused the action: %s", msg)
		case ReplyCodeEpisodeNotRunning:
			return r, envError(KindNotRunning, "no episode is running (call reset): %s", msg)
		default:
			return r, envError(KindEnv, "the env program failed to %s: %s", op, msg)
		}
	}
	if len(r.Observation) == 0 {
		return r, badReply(op, "observation is missing")
	}
	return r, nil
}

// infoOf returns info, {} when absent or null; anything but an object is an
// error.
func infoOf(op string, info json.RawMessage) (json.RawMessage, error) {
	if !present(info) {
		return json.RawMessage(`{}`), nil
	}
	if !isObject(info) {
		return nil, badReply(op, "info must be a JSON object, got %s", shown(info))
	}
	return info, nil
}

func badReply(op, format string, args ...any) error {
	return envError(KindEnv, "the env program's reply to %s breaks the protocol: %s", op, fmt.Sprintf(format, args...))
}

// present reports whether a field was sent with a value other than null.
func present(raw json.RawMessage) bool {
	return len(raw) > 0 && string(raw) != "null"
}

// isObject reports whether raw is a JSON object (not validated beyond its
// first byte; json.Unmarshal validates the rest).
func isObject(raw json.RawMessage) bool {
	b := bytes.TrimSpace(raw)
	return len(b) > 0 && b[0] == '{' && json.Valid(b)
}

// shown quotes a raw value for an error message (clipped; "nothing" when
// absent).
func shown(raw json.RawMessage) string {
	if len(raw) == 0 {
		return "nothing"
	}
	const n = 100
	if len(raw) > n {
		return string(raw[:n]) + "..."
	}
	return string(raw)
}

func clip(s string) string {
	if len(s) > maxMessageBytes {
		return s[:maxMessageBytes] + "..."
	}
	return s
}
