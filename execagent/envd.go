package execagent

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"mime"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

// E2B's envd data plane on the agent (docs/ARCHITECTURE.md, "E2B's envd on
// the agent"; docs/E2B.md). This file holds the routes, Connect's protocol
// with its JSON codec, and the rendering of the agent's errors in Connect's
// and envd's shapes. envd_wire.go holds the messages, envd_process.go the
// process service, envd_fs.go and envd_watch.go the filesystem service,
// envd_files.go the /files routes, envd_meta.go file metadata.
//
// The gateway forwards envd requests as they came, authenticated as every
// agent route; it names the client's user in X-Quarry-Envd-User. The agent
// accepts any user and ignores it: the sandbox runs unprivileged and cannot
// switch users, so every command runs as the agent's own user (docs/E2B.md).

// Content types of Connect's JSON codec.
const (
	ctJSON        = "application/json"         // unary requests and answers, and errors
	ctConnectJSON = "application/connect+json" // streams
)

// Bounds and defaults of envd streams.
const (
	// envdWriteTimeout bounds writing one envelope of a stream.
	envdWriteTimeout = 30 * time.Second
	// envdDefaultKeepalive is envd's keepalive interval when a stream's
	// request has no Keepalive-Ping-Interval; envdMaxKeepalive bounds one.
	envdDefaultKeepalive = 90 * time.Second
	envdMaxKeepalive     = time.Hour
	// maxTimeoutDigits: Connect-Timeout-Ms is at most 10 digits.
	maxTimeoutDigits = 10
)

// Envelope flags of Connect's streams.
const (
	envelopeHeader  = 5
	flagCompressed  = 0x01
	flagEndOfStream = 0x02
)

// Connect's error codes (the ones the agent answers).
const (
	connectCanceled           = "canceled"
	connectUnknown            = "unknown"
	connectInvalidArgument    = "invalid_argument"
	connectDeadlineExceeded   = "deadline_exceeded"
	connectNotFound           = "not_found"
	connectAlreadyExists      = "already_exists"
	connectPermissionDenied   = "permission_denied"
	connectResourceExhausted  = "resource_exhausted"
	connectFailedPrecondition = "failed_precondition"
	connectAborted            = "aborted"
	connectUnimplemented      = "unimplemented"
	connectInternal           = "internal"
	connectUnavailable        = "unavailable"
	connectUnauthenticated    = "unauthenticated"
)

// connectStatus is Connect's HTTP status of a code (its code→status table).
func connectStatus(code string) int {
	switch code {
	case connectCanceled:
		return 499
	case connectInvalidArgument, connectFailedPrecondition:
		return http.StatusBadRequest
	case connectDeadlineExceeded:
		return http.StatusGatewayTimeout
	case connectNotFound:
		return http.StatusNotFound
	case connectAlreadyExists, connectAborted:
		return http.StatusConflict
	case connectPermissionDenied:
		return http.StatusForbidden
	case connectResourceExhausted:
		return http.StatusTooManyRequests
	case connectUnimplemented:
		return http.StatusNotImplemented
	case connectUnavailable:
		return http.StatusServiceUnavailable
	case connectUnauthenticated:
		return http.StatusUnauthorized
	default: // unknown, internal
		return http.StatusInternalServerError
	}
}

// connectCodeFor is the Connect code of the agent's classification.
func connectCodeFor(agentCode string) string {
	switch agentCode {
	case agentapi.CodeBadRequest:
		return connectInvalidArgument
	case agentapi.CodeUnauthorized:
		return connectUnauthenticated
	case agentapi.CodeForbidden:
		return connectPermissionDenied
	case agentapi.CodeNotFound:
		return connectNotFound
	case agentapi.CodeTooLarge, agentapi.CodeInsufficientStorage, agentapi.CodePidsLimit:
		return connectResourceExhausted
	case agentapi.CodeTimeout:
		return connectDeadlineExceeded
	case agentapi.CodeGone, agentapi.CodeUnavailable:
		return connectUnavailable
	case agentapi.CodeStaleGeneration:
		return connectAborted
	case agentapi.CodeConflict, agentapi.CodeBusy, agentapi.CodeProcessExited, agentapi.CodeNameInUse:
		return connectFailedPrecondition
	case agentapi.CodeInternal:
		return connectInternal
	default:
		return connectUnknown
	}
}

// connectError gives an error a Connect code the agent's classification has
// no class for (already_exists, unimplemented, a slow subscriber's
// resource_exhausted). With status set it is a refusal of the HTTP request
// itself (an unknown method, a wrong content type): answered with that
// status even on a stream route.
type connectError struct {
	code   string
	status int
	err    error
}

func (e *connectError) Error() string { return e.err.Error() }
func (e *connectError) Unwrap() error { return e.err }

// withCode gives err the Connect code code.
func withCode(code string, err error) error { return &connectError{code: code, err: err} }

// connectCodeOf renders err: its Connect code, the HTTP status of a unary
// answer and the message (classify's).
func connectCodeOf(err error) (string, int, string) {
	_, code, msg := classify(err)
	var ce *connectError
	if errors.As(err, &ce) {
		if ce.status != 0 {
			return ce.code, ce.status, msg
		}
		return ce.code, connectStatus(ce.code), msg
	}
	c := connectCodeFor(code)
	return c, connectStatus(c), msg
}

// writeConnectError answers err in Connect's shape: a unary call's JSON
// error with the code's status; on a stream, 200 and the end-of-stream
// envelope carrying it (a refusal of the request itself stays an HTTP
// status).
func writeConnectError(w http.ResponseWriter, r *http.Request, err error) {
	var ce *connectError
	if isStreamRequest(r) && (!errors.As(err, &ce) || ce.status == 0) {
		newConnectStream(w).end(err)
		return
	}
	code, status, msg := connectCodeOf(err)
	writeJSON(w, status, connectErrorBody{Code: code, Message: msg})
}

// writeEnvdFilesError answers err in envd's shape of its HTTP routes
// (/files, /health): {"code": <status>, "message": ...}.
func writeEnvdFilesError(w http.ResponseWriter, _ *http.Request, err error) {
	status, _, msg := classify(err)
	writeJSON(w, status, envdHTTPError{Code: status, Message: msg})
}

// isStreamRequest reports whether r carries a Connect stream's content type.
func isStreamRequest(r *http.Request) bool {
	mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	return strings.HasPrefix(mt, "application/connect+")
}

// envdRoutes registers the envd routes: the Connect services, /files and
// /health. The RPCs and /files are fenced like /v1; /health, like
// /healthz, is only authenticated.
func (s *Server) envdRoutes(mux *http.ServeMux) {
	rpc := func(service string, methods map[string]envdMethod) {
		mux.Handle("POST /"+service+"/{method}", s.wrapAs(envdService(service, methods), true, writeConnectError))
	}
	rpc("process.Process", s.processMethods())
	rpc("filesystem.Filesystem", s.filesystemMethods())
	mux.Handle("GET /files", s.wrapAs(s.handleEnvdDownload, true, writeEnvdFilesError))
	mux.Handle("POST /files", s.wrapAs(s.handleEnvdUpload, true, writeEnvdFilesError))
	mux.Handle("GET /health", s.wrapAs(handleEnvdHealth, false, writeEnvdFilesError))
}

// envdPath resolves a path of an envd request (field names it in errors).
// E2B's home (/home/user for its user "user") is the agent's workdir here:
// "" and "~" are the workdir, "~/x" is under it, and a relative path
// resolves against it (resolvePath); "~name" is refused, the sandbox has
// one user. Absolute paths are taken as they are.
func (s *Server) envdPath(field, p string) (string, error) {
	switch {
	case p == "" || p == "~":
		return s.cfg.Workdir, nil
	case strings.HasPrefix(p, "~/"):
		return s.resolvePath(field, filepath.Join(s.cfg.Workdir, p[2:]))
	case strings.HasPrefix(p, "~"):
		return "", invalid(field, "%q: another user's home is not served; the sandbox has one user, whose home is the workdir", p)
	}
	return s.resolvePath(field, p)
}

// refused logs a refusal at one of the envd bounds (limit names it) and
// returns err: the client sees the error, the operator the log line.
func (s *Server) refused(limit string, err error) error {
	s.log.Warn("envd: refused at a limit", "limit", limit, "err", err)
	return err
}

// handleEnvdHealth answers GET /health: 204, as envd does.
func handleEnvdHealth(w http.ResponseWriter, _ *http.Request) error {
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// envdMethod is one RPC of an envd service.
type envdMethod struct {
	stream bool // the request or the answer is a stream: application/connect+json
	serve  handlerFunc
}

// envdService dispatches a service's methods by name. An unknown method is
// 404 unimplemented; a content type the method does not take is 415.
func envdService(service string, methods map[string]envdMethod) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		name := r.PathValue("method")
		m, ok := methods[name]
		if !ok {
			return &connectError{code: connectUnimplemented, status: http.StatusNotFound,
				err: fmt.Errorf("%s/%s is not served (the agent serves %s)", service, name, strings.Join(slices.Sorted(maps.Keys(methods)), ", "))}
		}
		if err := checkConnectRequest(r, m.stream); err != nil {
			return err
		}
		return m.serve(w, r)
	}
}

// checkConnectRequest checks the content type, protocol version and
// encoding of a Connect request.
func checkConnectRequest(r *http.Request, stream bool) error {
	want, encHeader := ctJSON, "Content-Encoding"
	if stream {
		want, encHeader = ctConnectJSON, "Connect-Content-Encoding"
	}
	ct := r.Header.Get("Content-Type")
	if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != want {
		return &connectError{code: connectInvalidArgument, status: http.StatusUnsupportedMediaType,
			err: fmt.Errorf("content type %q: this method takes %s (Connect's JSON codec; the binary codec is not served)", ct, want)}
	}
	if v := r.Header.Get("Connect-Protocol-Version"); v != "" && v != "1" {
		return &connectError{code: connectInvalidArgument, status: http.StatusBadRequest,
			err: fmt.Errorf("Connect-Protocol-Version %q: only 1 is served", v)}
	}
	if v := r.Header.Get(encHeader); v != "" && v != "identity" {
		return withCode(connectUnimplemented, fmt.Errorf("%s %q: only identity is served (no compression)", encHeader, v))
	}
	return nil
}

// unary serves a unary RPC: one JSON message in, one out.
func unary[Req, Res any](s *Server, fn func(r *http.Request, req *Req) (*Res, error)) envdMethod {
	return envdMethod{serve: func(w http.ResponseWriter, r *http.Request) error {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxJSONBody))
		if err != nil {
			return readBodyError(err)
		}
		var req Req
		if err := decodeProto(body, &req); err != nil {
			return err
		}
		res, err := fn(r, &req)
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, res)
		return nil
	}}
}

// serverStream serves an RPC answering a stream: one enveloped message in,
// then fn sends on st; its error ends the stream.
func serverStream[Req any](s *Server, fn func(r *http.Request, req *Req, st *connectStream) error) envdMethod {
	return envdMethod{stream: true, serve: func(w http.ResponseWriter, r *http.Request) error {
		st := newConnectStream(w)
		var req Req
		err := s.readStreamRequest(r, &req)
		if err == nil {
			err = fn(r, &req, st)
		}
		st.end(err)
		return nil
	}}
}

// readBodyError wraps the failed read of a request body (a body over its
// limit stays *http.MaxBytesError: 413).
func readBodyError(err error) error {
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return err
	}
	return fmt.Errorf("read request body: %w", err)
}

// readStreamRequest reads the one enveloped message of a server stream's
// request into v; more than one is invalid.
func (s *Server) readStreamRequest(r *http.Request, v any) error {
	msg, err := readEnvelope(r.Body, s.cfg.MaxJSONBody)
	if errors.Is(err, io.EOF) {
		return invalid("body", "a stream's request needs one enveloped message, the body is empty")
	}
	if err != nil {
		return err
	}
	// The request is one message: reading to the body's end also lets the
	// HTTP server notice the client leaving (r.Context()) at once.
	if n, _ := io.Copy(io.Discard, io.LimitReader(r.Body, 1)); n > 0 {
		return invalid("body", "a stream's request holds one message, this one holds more")
	}
	return decodeProto(msg, v)
}

// readEnvelope reads one enveloped message of at most limit bytes; io.EOF
// when the body ended cleanly before it.
func readEnvelope(r io.Reader, limit int64) ([]byte, error) {
	var hdr [envelopeHeader]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, io.EOF
		}
		return nil, envelopeError(err)
	}
	if hdr[0]&flagCompressed != 0 {
		return nil, invalid("body", "a compressed message, but no compression is served")
	}
	n := int64(binary.BigEndian.Uint32(hdr[1:]))
	if n > limit {
		return nil, fmt.Errorf("a message of %d bytes is over the limit of %d bytes: %w", n, limit, errTooLarge)
	}
	msg := make([]byte, n)
	if _, err := io.ReadFull(r, msg); err != nil {
		return nil, envelopeError(err)
	}
	return msg, nil
}

// envelopeError explains a body that ended inside an envelope.
func envelopeError(err error) error {
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return invalid("body", "the body ends inside an enveloped message")
	}
	return readBodyError(err)
}

// decodeProto reads a protojson message into v, a pointer to a struct of
// envd_wire.go, as protojson reads: an empty body is the empty message,
// names may be camelCase or the proto's snake_case (renamed at the top
// level: the messages served have multi-word names only there, and a map
// below, such as envs, keeps its keys), and unknown fields are ignored, as
// connect-go's codec ignores them (a newer SDK's new field must not break
// an older agent).
func decodeProto(body []byte, v any) error {
	body = bytes.TrimSpace(body)
	if len(body) == 0 {
		return nil
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil {
		return invalid("body", "not a JSON object: %s", err.Error())
	}
	renamed := make(map[string]json.RawMessage, len(top))
	for k, raw := range top {
		c := lowerCamel(k)
		if _, dup := top[c]; dup && c != k {
			continue // the camelCase name wins, as it does in protojson
		}
		renamed[c] = raw
	}
	b, err := json.Marshal(renamed)
	if err != nil {
		return fmt.Errorf("re-encode request: %w", err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		var br *badRequestError
		var ute *json.UnmarshalTypeError
		switch {
		case errors.As(err, &br):
			return err
		case errors.As(err, &ute):
			return invalid(ute.Field, "must be a JSON %s, not %s", ute.Type.String(), ute.Value)
		}
		return invalid("body", "%s", err.Error())
	}
	return nil
}

// lowerCamel turns a proto field name (snake_case) into its JSON name.
func lowerCamel(name string) string {
	if !strings.Contains(name, "_") {
		return name
	}
	var b strings.Builder
	up := false
	for _, c := range name {
		switch {
		case c == '_':
			up = true
		case up && c >= 'a' && c <= 'z':
			b.WriteRune(c - 'a' + 'A')
			up = false
		default:
			b.WriteRune(c)
			up = false
		}
	}
	return b.String()
}

// connectStream writes a Connect stream's answer: enveloped messages, then
// the end-of-stream envelope. It sends its headers (200) with the first
// envelope. One goroutine uses it at a time.
type connectStream struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	started bool
	ended   bool
	err     error
	buf     []byte
}

func newConnectStream(w http.ResponseWriter) *connectStream {
	return &connectStream{w: w, rc: http.NewResponseController(w)}
}

// send writes one message; after the first failed write (the client is
// gone, or did not read for envdWriteTimeout) every call returns the error.
func (c *connectStream) send(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode stream message: %w", err)
	}
	return c.write(0, b)
}

// end writes the end-of-stream envelope: {} after success, the error's code
// and message after a failure. Later calls do nothing.
func (c *connectStream) end(err error) {
	if c.ended {
		return
	}
	c.ended = true
	body := []byte("{}")
	if err != nil {
		code, _, msg := connectCodeOf(err)
		body, _ = json.Marshal(connectEndStream{Error: &connectErrorBody{Code: code, Message: msg}})
	}
	_ = c.write(flagEndOfStream, body)
}

func (c *connectStream) write(flags byte, msg []byte) error {
	if c.err != nil {
		return c.err
	}
	if !c.started {
		c.started = true
		h := c.w.Header()
		h.Set("Content-Type", ctConnectJSON)
		h.Set("Cache-Control", "no-cache")
		h.Set("X-Accel-Buffering", "no")
		c.w.WriteHeader(http.StatusOK)
	}
	c.buf = append(c.buf[:0], flags, 0, 0, 0, 0)
	binary.BigEndian.PutUint32(c.buf[1:envelopeHeader], uint32(len(msg)))
	c.buf = append(c.buf, msg...)
	_ = c.rc.SetWriteDeadline(time.Now().Add(envdWriteTimeout))
	if _, err := c.w.Write(c.buf); err != nil {
		c.err = fmt.Errorf("write stream message: %w", err)
		return c.err
	}
	if err := c.rc.Flush(); err != nil {
		c.err = fmt.Errorf("flush stream message: %w", err)
	}
	return c.err
}

// keepaliveInterval reads a stream's Keepalive-Ping-Interval (seconds):
// absent or not a number is envd's default; the value is kept within 1 s
// and envdMaxKeepalive.
func keepaliveInterval(r *http.Request) time.Duration {
	n, err := strconv.Atoi(r.Header.Get("Keepalive-Ping-Interval"))
	if err != nil {
		return envdDefaultKeepalive
	}
	return min(max(time.Duration(n)*time.Second, time.Second), envdMaxKeepalive)
}

// requestTimeout reads Connect-Timeout-Ms: 0 when absent.
func requestTimeout(r *http.Request) (time.Duration, error) {
	v := r.Header.Get("Connect-Timeout-Ms")
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n <= 0 || len(v) > maxTimeoutDigits {
		return 0, invalid("Connect-Timeout-Ms", "must be a positive integer of at most %d digits, got %q", maxTimeoutDigits, v)
	}
	return time.Duration(n) * time.Millisecond, nil
}

// streamClock is a stream's keepalive ticker (Keepalive-Ping-Interval,
// reset by each message sent) and its deadline (expired fires at it; nil
// without one). Stop it when the stream ends.
type streamClock struct {
	every   time.Duration
	keep    *time.Ticker
	expired <-chan time.Time
	stop    func()
}

func newStreamClock(r *http.Request, limit time.Duration) *streamClock {
	c := &streamClock{every: keepaliveInterval(r)}
	c.keep = time.NewTicker(c.every)
	c.expired, c.stop = deadline(limit)
	return c
}

// sent restarts the keepalive interval after a message.
func (c *streamClock) sent() { c.keep.Reset(c.every) }

func (c *streamClock) Stop() {
	c.keep.Stop()
	c.stop()
}

// deadline returns a channel that fires after d, or nil (never) when d is
// 0, and its stop.
func deadline(d time.Duration) (<-chan time.Time, func()) {
	if d <= 0 {
		return nil, func() {}
	}
	t := time.NewTimer(d)
	return t.C, func() { t.Stop() }
}
