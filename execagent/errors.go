package execagent

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"strconv"
	"strings"
	"unicode"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

// Sentinel errors of the agent. Handlers return them (wrapped); writeError
// maps them to HTTP statuses in one place.
var (
	errNotFound        = errors.New("not found")
	errBusy            = errors.New("busy")
	errConflict        = errors.New("conflict")
	errStaleGeneration = errors.New("stale generation")
	errTooLarge        = errors.New("too large")
	errTimeout         = errors.New("timed out")
	errClosed          = errors.New("agent is shutting down")
	// errKilledByShutdown: Close killed a running command (exec, session
	// run, rpc call) whose caller was still waiting for it. Answered 410
	// gone: the command did not fail on its own.
	errKilledByShutdown = errors.New("the sandbox is shutting down (its lease ended or it is being stopped); the command was killed")
)

// badRequestError is bad input that a person can fix: Field names the
// request field (JSON name, query parameter or header), Message says what is
// wrong with it.
type badRequestError struct {
	Field   string
	Message string
}

func (e *badRequestError) Error() string { return e.Field + ": " + e.Message }

// invalid returns a *badRequestError for field.
func invalid(field, format string, args ...any) error {
	return &badRequestError{Field: field, Message: fmt.Sprintf(format, args...)}
}

// httpError carries an explicit status and code with a message for people.
type httpError struct {
	Status  int
	Code    string
	Message string
	Err     error // optional sentinel, for errors.Is
}

func (e *httpError) Error() string { return e.Message }
func (e *httpError) Unwrap() error { return e.Err }

// statusError builds an error that writeError answers with status and code;
// err is the sentinel it wraps (may be nil).
func statusError(err error, status int, code, format string, args ...any) error {
	return &httpError{Status: status, Code: code, Message: fmt.Sprintf(format, args...), Err: err}
}

// classify maps an error to its HTTP status, error code and message. It is
// the one place where the agent decides statuses. The message never ends
// in white space (one that quotes a command's output could end in a
// newline): the gateway passes the agent's answers on as they are.
func classify(err error) (int, string, string) {
	status, code, msg := classOf(err)
	return status, code, strings.TrimRightFunc(msg, unicode.IsSpace)
}

func classOf(err error) (int, string, string) {
	var he *httpError
	var br *badRequestError
	var mbe *http.MaxBytesError
	var se *json.SyntaxError
	var ute *json.UnmarshalTypeError
	switch {
	case errors.As(err, &he):
		return he.Status, he.Code, he.Message
	case errors.As(err, &br):
		return http.StatusBadRequest, agentapi.CodeBadRequest, br.Error()
	case errors.As(err, &mbe):
		return http.StatusRequestEntityTooLarge, agentapi.CodeTooLarge,
			fmt.Sprintf("request body is over the limit of %d bytes", mbe.Limit)
	case errors.As(err, &ute):
		return http.StatusBadRequest, agentapi.CodeBadRequest,
			fmt.Sprintf("%s: must be a JSON %s, not %s", ute.Field, ute.Type.String(), ute.Value)
	case errors.As(err, &se):
		return http.StatusBadRequest, agentapi.CodeBadRequest, fmt.Sprintf("body: invalid JSON: %s", se.Error())
	case errors.Is(err, errNotFound), errors.Is(err, fs.ErrNotExist):
		return http.StatusNotFound, agentapi.CodeNotFound, err.Error()
	case errors.Is(err, errBusy):
		return http.StatusConflict, agentapi.CodeBusy, err.Error()
	case errors.Is(err, errStaleGeneration):
		return http.StatusConflict, agentapi.CodeStaleGeneration, err.Error()
	case errors.Is(err, errConflict):
		return http.StatusConflict, agentapi.CodeConflict, err.Error()
	case errors.Is(err, errTooLarge):
		return http.StatusRequestEntityTooLarge, agentapi.CodeTooLarge, err.Error()
	case errors.Is(err, errTimeout):
		return http.StatusGatewayTimeout, agentapi.CodeTimeout, err.Error()
	case errors.Is(err, errKilledByShutdown):
		return http.StatusGone, agentapi.CodeGone, errKilledByShutdown.Error()
	case errors.Is(err, errClosed):
		return http.StatusServiceUnavailable, agentapi.CodeUnavailable, err.Error()
	case errors.Is(err, fs.ErrPermission):
		return http.StatusForbidden, agentapi.CodeForbidden, err.Error()
	default:
		return http.StatusInternalServerError, agentapi.CodeInternal, err.Error()
	}
}

// writeError answers err in the ErrorBody shape.
func writeError(w http.ResponseWriter, err error) {
	status, code, msg := classify(err)
	writeJSON(w, status, agentapi.ErrorBody{Error: agentapi.ErrorDetail{Code: code, Message: msg}})
}

// writeJSON answers v as JSON with status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	err := enc.Encode(v) // ends with a newline
	b := buf.Bytes()
	if err != nil {
		status = http.StatusInternalServerError
		b, _ = json.Marshal(agentapi.ErrorBody{Error: agentapi.ErrorDetail{
			Code: agentapi.CodeInternal, Message: fmt.Sprintf("encode answer: %s", err.Error())}})
		b = append(b, '\n')
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}
