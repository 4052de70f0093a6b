package execagent

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

// envdReq sends a request to an envd route of a as the gateway does (the
// agent's bearer token), with headers hdr ("Name: value").
func envdReq(t *testing.T, ctx context.Context, a *testAgent, method, path, ct string, body io.Reader, hdr ...string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, a.url+path, body)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+testToken)
	if ct != "" {
		req.Header.Set("Content-Type", ct)
	}
	for _, h := range hdr {
		k, v, _ := strings.Cut(h, ": ")
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	return resp
}

// rpc calls a unary RPC ("process.Process/List") with the JSON body and
// returns the status and the decoded answer.
func rpc(t *testing.T, a *testAgent, method, body string, hdr ...string) (int, map[string]any) {
	t.Helper()
	resp := envdReq(t, context.Background(), a, http.MethodPost, "/"+method, ctJSON, strings.NewReader(body),
		append([]string{"Connect-Protocol-Version: 1"}, hdr...)...)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var out map[string]any
	if len(b) > 0 {
		require.NoError(t, json.Unmarshal(b, &out), "answer %s", b)
	}
	return resp.StatusCode, out
}

// rpcOK calls a unary RPC that must succeed.
func rpcOK(t *testing.T, a *testAgent, method, body string) map[string]any {
	t.Helper()
	status, out := rpc(t, a, method, body)
	require.Equal(t, http.StatusOK, status, "%s %s: %v", method, body, out)
	return out
}

// envelope frames msg as one Connect envelope with flags.
func envelope(flags byte, msg string) []byte {
	b := make([]byte, envelopeHeader, envelopeHeader+len(msg))
	b[0] = flags
	binary.BigEndian.PutUint32(b[1:], uint32(len(msg)))
	return append(b, msg...)
}

// envdStream is an open Connect stream's answer.
type envdStream struct {
	t      *testing.T
	resp   *http.Response
	cancel context.CancelFunc
	end    map[string]any // the end-of-stream message, once read
}

// openStream calls a stream RPC with the request messages msgs (one for a
// server stream), enveloped.
func openStream(t *testing.T, a *testAgent, method string, msgs []string, hdr ...string) *envdStream {
	t.Helper()
	var body bytes.Buffer
	for _, m := range msgs {
		body.Write(envelope(0, m))
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	// A reader without a length: the body is chunked, as a streaming
	// client sends it.
	resp := envdReq(t, ctx, a, http.MethodPost, "/"+method, ctConnectJSON, io.MultiReader(&body), hdr...)
	st := &envdStream{t: t, resp: resp, cancel: cancel}
	t.Cleanup(st.close)
	require.Equal(t, http.StatusOK, resp.StatusCode, "a stream answers 200")
	require.Equal(t, ctConnectJSON, resp.Header.Get("Content-Type"))
	return st
}

// close disconnects.
func (s *envdStream) close() {
	s.cancel()
	_ = s.resp.Body.Close()
}

// next returns the next message, or nil after the end-of-stream message
// (kept in s.end).
func (s *envdStream) next() map[string]any {
	s.t.Helper()
	var hdr [envelopeHeader]byte
	_, err := io.ReadFull(s.resp.Body, hdr[:])
	require.NoError(s.t, err, "the stream ended without its end-of-stream message")
	msg := make([]byte, binary.BigEndian.Uint32(hdr[1:]))
	_, err = io.ReadFull(s.resp.Body, msg)
	require.NoError(s.t, err)
	var m map[string]any
	require.NoError(s.t, json.Unmarshal(msg, &m), "message %s", msg)
	if hdr[0]&flagEndOfStream != 0 {
		s.end = m
		return nil
	}
	require.Zero(s.t, hdr[0], "flags of a message")
	return m
}

// endError returns the code of the end-of-stream error ("" for success),
// reading the stream to its end.
func (s *envdStream) endError() string {
	s.t.Helper()
	for s.end == nil {
		s.next()
	}
	if e, ok := s.end["error"].(map[string]any); ok {
		return e["code"].(string)
	}
	return ""
}

// get walks nested JSON objects: get(m, "event", "start", "pid").
func get(m map[string]any, keys ...string) any {
	var v any = m
	for _, k := range keys {
		o, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = o[k]
	}
	return v
}

// Requests the agent refuses are answered in Connect's shape: the code's
// status for unary calls, an HTTP status for a refusal of the request
// itself.
func TestEnvd_Refusals_AreConnectErrors(t *testing.T) {
	a := newTestAgent(t, nil)
	tests := []struct {
		name       string
		path, ct   string
		body       string
		hdr        []string
		wantStatus int
		wantCode   string
	}{
		{name: "unknown method", path: "/process.Process/Fork", ct: ctJSON, body: `{}`,
			wantStatus: http.StatusNotFound, wantCode: connectUnimplemented},
		{name: "unknown method of filesystem", path: "/filesystem.Filesystem/Chown", ct: ctJSON, body: `{}`,
			wantStatus: http.StatusNotFound, wantCode: connectUnimplemented},
		{name: "a stream's content type on a unary method", path: "/process.Process/List", ct: ctConnectJSON,
			body: string(envelope(0, `{}`)), wantStatus: http.StatusUnsupportedMediaType, wantCode: connectInvalidArgument},
		{name: "compression", path: "/process.Process/List", ct: ctJSON, body: `{}`, hdr: []string{"Content-Encoding: gzip"},
			wantStatus: http.StatusNotImplemented, wantCode: connectUnimplemented},
		{name: "another protocol version", path: "/process.Process/List", ct: ctJSON, body: `{}`, hdr: []string{"Connect-Protocol-Version: 2"},
			wantStatus: http.StatusBadRequest, wantCode: connectInvalidArgument},
		{name: "the binary codec", path: "/process.Process/SendSignal", ct: "application/proto", body: "\x0a\x01x",
			wantStatus: http.StatusUnsupportedMediaType, wantCode: connectInvalidArgument},
		{name: "bad JSON", path: "/process.Process/SendSignal", ct: ctJSON, body: `{"process":`,
			wantStatus: http.StatusBadRequest, wantCode: connectInvalidArgument},
		{name: "a field of the wrong type", path: "/process.Process/SendSignal", ct: ctJSON, body: `{"process": 5}`,
			wantStatus: http.StatusBadRequest, wantCode: connectInvalidArgument},
		{name: "a missing file", path: "/filesystem.Filesystem/Stat", ct: ctJSON, body: `{"path": "nope"}`,
			wantStatus: http.StatusNotFound, wantCode: connectNotFound},
		{name: "a field of the wrong type in Stat", path: "/filesystem.Filesystem/Stat", ct: ctJSON, body: `{"path": 5}`,
			wantStatus: http.StatusBadRequest, wantCode: connectInvalidArgument},
		{name: "a process that is not there", path: "/process.Process/SendSignal", ct: ctJSON,
			body: `{"process": {"pid": 999999}, "signal": "SIGNAL_SIGKILL"}`, wantStatus: http.StatusNotFound, wantCode: connectNotFound},
		{name: "no selector", path: "/process.Process/CloseStdin", ct: ctJSON, body: `{}`,
			wantStatus: http.StatusBadRequest, wantCode: connectInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := envdReq(t, context.Background(), a, http.MethodPost, tt.path, tt.ct, strings.NewReader(tt.body), tt.hdr...)
			defer resp.Body.Close()
			assert.Equal(t, tt.wantStatus, resp.StatusCode)
			assert.Equal(t, ctJSON, resp.Header.Get("Content-Type"))
			var e connectErrorBody
			require.NoError(t, json.NewDecoder(resp.Body).Decode(&e))
			assert.Equal(t, tt.wantCode, e.Code)
			assert.NotEmpty(t, e.Message)
		})
	}
}

// The agent's middleware answers in the envd route's shape: Connect's for
// RPCs (an end-of-stream error on a stream), envd's for /files.
func TestEnvd_Middleware_RefusalsInTheRoutesShape(t *testing.T) {
	a := newTestAgent(t, nil)
	_, err := a.client.Init(context.Background(), agentapi.InitRequest{LeaseID: "l2", Generation: 2})
	require.NoError(t, err)
	send := func(path, ct, body string, hdr http.Header) (*http.Response, []byte) {
		req, err := http.NewRequest(http.MethodPost, a.url+path, strings.NewReader(body))
		require.NoError(t, err)
		req.Header = hdr
		req.Header.Set("Content-Type", ct)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, b
	}
	t.Run("no token, unary", func(t *testing.T) {
		resp, b := send("/process.Process/List", ctJSON, `{}`, http.Header{})
		assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)
		assert.JSONEq(t, `{"code":"unauthenticated","message":"missing bearer token (Authorization: Bearer <token>)"}`, string(b))
	})
	t.Run("stale generation, stream", func(t *testing.T) {
		h := http.Header{"Authorization": {"Bearer " + testToken}, agentapi.HeaderGeneration: {"1"}}
		resp, b := send("/process.Process/Start", ctConnectJSON, string(envelope(0, `{"process":{"cmd":"/bin/true"}}`)), h)
		assert.Equal(t, http.StatusOK, resp.StatusCode)
		require.Greater(t, len(b), envelopeHeader)
		assert.Equal(t, byte(flagEndOfStream), b[0])
		assert.Contains(t, string(b[envelopeHeader:]), `"code":"aborted"`)
	})
	t.Run("stale generation, files", func(t *testing.T) {
		h := http.Header{"Authorization": {"Bearer " + testToken}, agentapi.HeaderGeneration: {"1"}}
		resp, b := send("/files?path=x", "application/octet-stream", "x", h)
		assert.Equal(t, http.StatusConflict, resp.StatusCode)
		var e envdHTTPError
		require.NoError(t, json.Unmarshal(b, &e))
		assert.Equal(t, http.StatusConflict, e.Code)
		assert.Contains(t, e.Message, "older than the agent's generation")
	})
}

func TestEnvd_Health_Is204(t *testing.T) {
	a := newTestAgent(t, nil)
	resp := envdReq(t, context.Background(), a, http.MethodGet, "/health", "", nil)
	resp.Body.Close()
	assert.Equal(t, http.StatusNoContent, resp.StatusCode)
}

// Requests are read as protojson reads them: snake_case names, numbers in
// strings, base64 of either alphabet, unknown fields ignored.
func TestDecodeProto_ReadsAsProtojson(t *testing.T) {
	tests := []struct {
		name string
		body string
		want any
		into any
	}{
		{name: "empty body", body: ``, into: &pbWatchRequest{}, want: &pbWatchRequest{}},
		{name: "snake_case names", body: `{"path":"d","include_entry":true,"allow_network_mounts":true}`,
			into: &pbWatchRequest{}, want: &pbWatchRequest{Path: "d", IncludeEntry: true, AllowNetworkMounts: true}},
		{name: "camelCase wins over snake_case", body: `{"watcher_id":"a","watcherId":"b"}`,
			into: &pbWatcherRequest{}, want: &pbWatcherRequest{WatcherID: "b"}},
		{name: "unknown fields", body: `{"path":"d","depth":2,"futureOption":{"x":1}}`,
			into: &pbListDirRequest{}, want: &pbListDirRequest{Path: "d", Depth: 2}},
		{name: "a uint32 in a string", body: `{"process":{"pid":"42"}}`,
			into: &pbProcessRequest{}, want: &pbProcessRequest{Process: &pbProcessSelector{PID: ptrTo(pbUint32(42))}}},
		{name: "envs keep their keys", body: `{"process":{"cmd":"c","envs":{"MY_VAR":"1"}}}`,
			into: &pbStartRequest{}, want: &pbStartRequest{Process: &pbProcessConfig{Cmd: "c", Envs: map[string]string{"MY_VAR": "1"}}}},
		{name: "signal by name", body: `{"signal":"SIGNAL_SIGTERM"}`,
			into: &pbSendSignalRequest{}, want: &pbSendSignalRequest{Signal: signalSIGTERM}},
		{name: "signal by number", body: `{"signal":9}`,
			into: &pbSendSignalRequest{}, want: &pbSendSignalRequest{Signal: signalSIGKILL}},
		{name: "base64, URL-safe, unpadded", body: `{"input":{"stdin":"-_8"}}`,
			into: &pbSendInputRequest{}, want: &pbSendInputRequest{Input: &pbProcessInput{Stdin: ptrTo(pbBytes{0xfb, 0xff})}}},
		{name: "base64, standard, padded", body: `{"input":{"pty":"aGk="}}`,
			into: &pbSendInputRequest{}, want: &pbSendInputRequest{Input: &pbProcessInput{PTY: ptrTo(pbBytes("hi"))}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.NoError(t, decodeProto([]byte(tt.body), tt.into))
			assert.Equal(t, tt.want, tt.into)
		})
	}
	for _, bad := range []string{`[1]`, `{"depth":-1}`, `{"depth":"x"}`, `{"path":1}`} {
		err := decodeProto([]byte(bad), &pbListDirRequest{})
		var br *badRequestError
		assert.ErrorAs(t, err, &br, "%s", bad)
	}
}

func ptrTo[T any](v T) *T { return &v }

// Answers are written as protojson writes them.
func TestEnvdWire_WritesAsProtojson(t *testing.T) {
	out := []byte("hi")
	ts := pbTimestamp(mustTime(t, "2024-05-06T07:08:09.120Z"))
	errMsg := "exit status 3"
	tests := []struct {
		name string
		v    any
		want string
	}{
		{name: "start", v: pbProcessStream{Event: pbProcessEvent{Start: &pbStartEvent{PID: 7}}}, want: `{"event":{"start":{"pid":7}}}`},
		{name: "data", v: pbProcessStream{Event: pbProcessEvent{Data: &pbDataEvent{Stdout: &out}}}, want: `{"event":{"data":{"stdout":"aGk="}}}`},
		{name: "keepalive", v: pbProcessStream{Event: pbProcessEvent{Keepalive: &struct{}{}}}, want: `{"event":{"keepalive":{}}}`},
		{name: "end, success", v: pbProcessStream{Event: pbProcessEvent{End: &pbEndEvent{Exited: true, Status: "exit status 0"}}},
			want: `{"event":{"end":{"exited":true,"status":"exit status 0"}}}`},
		{name: "end, failure", v: pbEndEvent{ExitCode: 3, Exited: true, Status: errMsg, Error: &errMsg},
			want: `{"exitCode":3,"exited":true,"status":"exit status 3","error":"exit status 3"}`},
		{name: "entry", v: pbEntryInfo{Name: "f", Type: fileTypeFile, Path: "/w/f", Size: 5, Mode: 0o644, Permissions: "-rw-r--r--",
			Owner: "root", Group: "root", ModifiedTime: &ts},
			want: `{"name":"f","type":"FILE_TYPE_FILE","path":"/w/f","size":"5","mode":420,"permissions":"-rw-r--r--","owner":"root","group":"root","modifiedTime":"2024-05-06T07:08:09.120Z"}`},
		{name: "list without processes", v: pbListResponse{}, want: `{}`},
		{name: "watch start", v: pbWatchDirResponse{Start: &struct{}{}}, want: `{"start":{}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := json.Marshal(tt.v)
			require.NoError(t, err)
			assert.Equal(t, tt.want, string(b))
		})
	}
}

func mustTime(t *testing.T, s string) time.Time {
	t.Helper()
	tt, err := time.Parse(time.RFC3339Nano, s)
	require.NoError(t, err)
	return tt
}
