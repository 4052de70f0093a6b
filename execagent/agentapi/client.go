package agentapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// maxErrorBody bounds how much of an error response the client reads.
const maxErrorBody = 64 << 10

// Error is a non-2xx answer of the agent, decoded from its ErrorBody.
type Error struct {
	Status  int
	Code    string
	Message string
}

func (e *Error) Error() string {
	return fmt.Sprintf("agent: %d %s: %s", e.Status, e.Code, e.Message)
}

// CallError is a call to an agent that got no usable answer: the
// connection failed or timed out, or broke before the answer. Err is
// the transport's error. Callers that reach agents another way (the
// gateway's proxy) return it too, so that every surface classifies agent
// failures alike (errclass).
type CallError struct {
	Method, Path string
	Err          error
}

func (e *CallError) Error() string {
	if e.Method == "" {
		return fmt.Sprintf("call agent: %v", e.Err)
	}
	return fmt.Sprintf("call agent %s %s: %v", e.Method, e.Path, e.Err)
}

func (e *CallError) Unwrap() error { return e.Err }

// The transport failures a CallError's Err may wrap, which its caller's
// transport translates to these at the edge (the gateway's fasthttp clients:
// gateway/fence.go); a timeout wraps os.ErrDeadlineExceeded.
var (
	// ErrCallLimit: the caller's own bound on concurrent calls to one agent
	// was reached; nothing was sent. Not a sign that the agent is down.
	ErrCallLimit = errors.New("too many concurrent calls to the agent")
	// ErrAnswerTooLarge: the agent's answer was over the caller's bound.
	// Not a sign that the agent is down.
	ErrAnswerTooLarge = errors.New("the agent's answer is over the limit")
)

// Client calls one exec agent. It is safe for concurrent use. Generation is
// sent as HeaderGeneration on every call (0 sends nothing).
type Client struct {
	BaseURL    string // e.g. "http://127.0.0.1:41234"
	Token      string
	Generation int64
	HTTP       *http.Client
}

// New returns a client for the agent at baseURL. httpClient may be nil
// (http.DefaultClient); callers should pass one with sensible timeouts.
func New(baseURL, token string, httpClient *http.Client) *Client {
	if httpClient == nil {
		httpClient = http.DefaultClient
	}
	return &Client{BaseURL: strings.TrimRight(baseURL, "/"), Token: token, HTTP: httpClient}
}

// WithGeneration returns a copy of c that sends generation gen.
func (c *Client) WithGeneration(gen int64) *Client {
	cp := *c
	cp.Generation = gen
	return &cp
}

// Health calls GET /healthz.
func (c *Client) Health(ctx context.Context) (Health, error) {
	var h Health
	err := c.Do(ctx, http.MethodGet, RouteHealth, nil, &h)
	return h, err
}

// Init calls POST /v1/init.
func (c *Client) Init(ctx context.Context, req InitRequest) (Health, error) {
	var h Health
	err := c.Do(ctx, http.MethodPost, RouteInit, req, &h)
	return h, err
}

// Do sends a JSON request (in may be nil) to path and decodes a JSON answer
// into out (may be nil). A non-2xx answer is returned as *Error.
func (c *Client) Do(ctx context.Context, method, path string, in, out any) error {
	body, err := jsonBody(in)
	if err != nil {
		return err
	}
	ct := ""
	if in != nil {
		ct = "application/json"
	}
	resp, err := c.send(ctx, method, path, body, ct, "")
	if err != nil {
		return err
	}
	return decodeAnswer(resp, method, path, out)
}

// jsonBody encodes in as a request body (nil for nil).
func jsonBody(in any) (io.Reader, error) {
	if in == nil {
		return nil, nil
	}
	b, err := json.Marshal(in)
	if err != nil {
		return nil, fmt.Errorf("encode request: %w", err)
	}
	return bytes.NewReader(b), nil
}

// send sends an authenticated request and returns the response of a 2xx
// answer (the caller closes its body), or *Error.
func (c *Client) send(ctx context.Context, method, path string, body io.Reader, contentType, accept string) (*http.Response, error) {
	req, err := c.NewRequest(ctx, method, path, body)
	if err != nil {
		return nil, err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	return c.do(req, method, path)
}

// do sends req and returns a 2xx answer; any other is *Error.
func (c *Client) do(req *http.Request, method, path string) (*http.Response, error) {
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return nil, &CallError{Method: method, Path: path, Err: err}
	}
	if err := CheckResponse(resp); err != nil {
		resp.Body.Close()
		return nil, err
	}
	return resp, nil
}

// decodeAnswer decodes a JSON answer into out (nil: discard) and closes it.
func decodeAnswer(resp *http.Response, method, path string, out any) error {
	defer resp.Body.Close()
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("decode agent answer to %s %s: %w", method, path, err)
	}
	// Read to EOF (the trailing newline), or the transport will not reuse
	// the connection.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxErrorBody))
	return nil
}

// NewRequest builds an authenticated request to the agent.
func (c *Client) NewRequest(ctx context.Context, method, path string, body io.Reader) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.BaseURL+path, body)
	if err != nil {
		return nil, fmt.Errorf("build agent request: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+c.Token)
	if c.Generation != 0 {
		req.Header.Set(HeaderGeneration, strconv.FormatInt(c.Generation, 10))
	}
	return req, nil
}

// CheckResponse returns nil for a 2xx answer and an *Error otherwise.
func CheckResponse(resp *http.Response) error {
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return nil
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	var eb ErrorBody
	if json.Unmarshal(b, &eb) == nil && eb.Error.Code != "" {
		return &Error{Status: resp.StatusCode, Code: eb.Error.Code, Message: eb.Error.Message}
	}
	return &Error{Status: resp.StatusCode, Code: http.StatusText(resp.StatusCode), Message: strings.TrimSpace(string(b))}
}

// Exec calls POST /v1/exec and waits for the command to finish. The
// http.Client's Timeout, if any, must exceed the command's timeout.
func (c *Client) Exec(ctx context.Context, req ExecRequest) (ExecResult, error) {
	var res ExecResult
	err := c.Do(ctx, http.MethodPost, RouteExec, req, &res)
	return res, err
}

// ExecStream calls POST /v1/exec with Accept: text/event-stream. The stream
// has "stdout" and "stderr" events (StreamChunk) as the command writes, then
// one "exit" event (ExecResult without output). Closing the stream before
// the exit event kills the command.
func (c *Client) ExecStream(ctx context.Context, req ExecRequest) (*EventStream, error) {
	return c.stream(ctx, http.MethodPost, RouteExec, req)
}

// CreateSession calls POST /v1/sessions.
func (c *Client) CreateSession(ctx context.Context, req SessionCreateRequest) (SessionInfo, error) {
	var info SessionInfo
	err := c.Do(ctx, http.MethodPost, RouteSessions, req, &info)
	return info, err
}

// RunSession calls POST /v1/sessions/{id}/run. A session that is running a
// command answers *Error with Code CodeBusy (409).
func (c *Client) RunSession(ctx context.Context, id string, req SessionRunRequest) (SessionRunResult, error) {
	var res SessionRunResult
	err := c.Do(ctx, http.MethodPost, sessionPath(id)+"/run", req, &res)
	return res, err
}

// CloseSession calls DELETE /v1/sessions/{id}.
func (c *Client) CloseSession(ctx context.Context, id string) error {
	return c.Do(ctx, http.MethodDelete, sessionPath(id), nil, nil)
}

// ListSessions calls GET /v1/sessions.
func (c *Client) ListSessions(ctx context.Context) ([]SessionInfo, error) {
	var l SessionList
	err := c.Do(ctx, http.MethodGet, RouteSessions, nil, &l)
	return l.Sessions, err
}

// StartProcess calls POST /v1/processes.
func (c *Client) StartProcess(ctx context.Context, req ProcessStartRequest) (ProcessInfo, error) {
	var info ProcessInfo
	err := c.Do(ctx, http.MethodPost, RouteProcesses, req, &info)
	return info, err
}

// ListProcesses calls GET /v1/processes.
func (c *Client) ListProcesses(ctx context.Context) ([]ProcessInfo, error) {
	var l ProcessList
	err := c.Do(ctx, http.MethodGet, RouteProcesses, nil, &l)
	return l.Processes, err
}

// GetProcess calls GET /v1/processes/{id}.
func (c *Client) GetProcess(ctx context.Context, id string) (ProcessInfo, error) {
	var info ProcessInfo
	err := c.Do(ctx, http.MethodGet, processPath(id), nil, &info)
	return info, err
}

// ProcessOutput calls GET /v1/processes/{id}/output for one page from
// offset; limit <= 0 means the agent's default page size.
func (c *Client) ProcessOutput(ctx context.Context, id string, offset int64, limit int) (ProcessOutput, error) {
	q := url.Values{"offset": {strconv.FormatInt(offset, 10)}}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	var out ProcessOutput
	err := c.Do(ctx, http.MethodGet, processPath(id)+"/output?"+q.Encode(), nil, &out)
	return out, err
}

// FollowProcessOutput streams a process's output from offset: "output"
// events (StreamChunk with Offset) until the process exits, then one "exit"
// event (ProcessInfo).
func (c *Client) FollowProcessOutput(ctx context.Context, id string, offset int64) (*EventStream, error) {
	q := url.Values{"offset": {strconv.FormatInt(offset, 10)}}
	return c.stream(ctx, http.MethodGet, processPath(id)+"/output?"+q.Encode(), nil)
}

// SignalProcess calls POST /v1/processes/{id}/signal; signal is a name
// ("TERM", "SIGKILL") or a number ("9"). It goes to the process's group.
func (c *Client) SignalProcess(ctx context.Context, id, signal string) (ProcessInfo, error) {
	var info ProcessInfo
	err := c.Do(ctx, http.MethodPost, processPath(id)+"/signal", SignalRequest{Signal: signal}, &info)
	return info, err
}

// WriteProcessStdin calls POST /v1/processes/{id}/stdin with body's bytes
// (body may be nil) and closes the process's stdin afterwards when
// closeStdin. It returns the number of bytes written.
func (c *Client) WriteProcessStdin(ctx context.Context, id string, body io.Reader, closeStdin bool) (int64, error) {
	p := processPath(id) + "/stdin"
	if closeStdin {
		p += "?close=true"
	}
	var res WriteResult
	err := c.DoRaw(ctx, http.MethodPost, p, body, &res)
	return res.Bytes, err
}

// CallProcess calls POST /v1/processes/{id}/call (id may be the process's
// name): one request line to an rpc process, its reply line back. The
// http.Client's Timeout, if any, must exceed req.TimeoutMS.
func (c *Client) CallProcess(ctx context.Context, id string, req ProcessCallRequest) (ProcessCallResult, error) {
	var res ProcessCallResult
	err := c.Do(ctx, http.MethodPost, processPath(id)+"/call", req, &res)
	return res, err
}

// KillProcess calls DELETE /v1/processes/{id}: kills the process group (if
// running) and forgets the process. It returns the final ProcessInfo.
func (c *Client) KillProcess(ctx context.Context, id string) (ProcessInfo, error) {
	var info ProcessInfo
	err := c.Do(ctx, http.MethodDelete, processPath(id), nil, &info)
	return info, err
}

// KillAll calls POST /v1/kill-all: SIGKILL to every process in the sandbox
// but the agent (see KillAllResult).
func (c *Client) KillAll(ctx context.Context) (KillAllResult, error) {
	var res KillAllResult
	err := c.Do(ctx, http.MethodPost, RouteKillAll, nil, &res)
	return res, err
}

// WaitPid calls POST /v1/pids/{pid}/wait: it returns when process pid has
// gone, the timeout has passed, or (with marker) at once when the marker
// file does not exist. ctx should outlast the timeout.
func (c *Client) WaitPid(ctx context.Context, pid int, req PidWaitRequest) (PidWaitResult, error) {
	var res PidWaitResult
	err := c.Do(ctx, http.MethodPost, strings.Replace(RoutePidWait, "{pid}", strconv.Itoa(pid), 1), req, &res)
	return res, err
}

// ReadFile calls GET /v1/files and returns the body; the caller closes it.
// length <= 0 reads to the end of the file. A read over the agent's limit
// answers *Error with Code CodeTooLarge (413).
func (c *Client) ReadFile(ctx context.Context, path string, offset, length int64) (io.ReadCloser, error) {
	q := url.Values{"path": {path}}
	if offset > 0 {
		q.Set("offset", strconv.FormatInt(offset, 10))
	}
	if length > 0 {
		q.Set("length", strconv.FormatInt(length, 10))
	}
	return c.get(ctx, RouteFiles+"?"+q.Encode())
}

// WriteFile calls PUT /v1/files: body replaces the file at path (parents
// are created). mode 0 means the agent's default (0644).
func (c *Client) WriteFile(ctx context.Context, path string, mode fs.FileMode, body io.Reader) (WriteResult, error) {
	return c.writeFile(ctx, path, mode, body, false)
}

// CreateFile calls PUT /v1/files?exclusive=true: like WriteFile, but the
// file must not exist yet; when it does the error is an *Error with status
// 409. Of callers racing to create one path, exactly one succeeds.
func (c *Client) CreateFile(ctx context.Context, path string, mode fs.FileMode, body io.Reader) (WriteResult, error) {
	return c.writeFile(ctx, path, mode, body, true)
}

func (c *Client) writeFile(ctx context.Context, path string, mode fs.FileMode, body io.Reader, exclusive bool) (WriteResult, error) {
	q := url.Values{"path": {path}}
	if mode != 0 {
		q.Set("mode", FormatMode(mode))
	}
	if exclusive {
		q.Set("exclusive", "true")
	}
	var res WriteResult
	err := c.DoRaw(ctx, http.MethodPut, RouteFiles+"?"+q.Encode(), body, &res)
	return res, err
}

// CancelCall calls DELETE /v1/calls/{id}: the request in flight that
// carries HeaderCallID id ends as if its client had gone away (a command is
// killed, a session run interrupted). An *Error with status 404 when no
// such call is in flight.
func (c *Client) CancelCall(ctx context.Context, id string) error {
	return c.Do(ctx, http.MethodDelete, "/v1/calls/"+url.PathEscape(id), nil, nil)
}

// DeleteFile calls DELETE /v1/files: removes a file, a symlink or an empty
// directory; an *Error with status 404 when nothing is at path.
func (c *Client) DeleteFile(ctx context.Context, path string) error {
	return c.DoRaw(ctx, http.MethodDelete, RouteFiles+"?"+url.Values{"path": {path}}.Encode(), nil, nil)
}

// Stat calls GET /v1/files/stat (a final symlink is not followed).
func (c *Client) Stat(ctx context.Context, path string) (FileInfo, error) {
	var fi FileInfo
	err := c.Do(ctx, http.MethodGet, RouteFileStat+"?"+url.Values{"path": {path}}.Encode(), nil, &fi)
	return fi, err
}

// ListDir calls GET /v1/files/list.
func (c *Client) ListDir(ctx context.Context, path string) (FileList, error) {
	var l FileList
	err := c.Do(ctx, http.MethodGet, RouteFileList+"?"+url.Values{"path": {path}}.Encode(), nil, &l)
	return l, err
}

// UploadArchive calls PUT /v1/files/archive: body is a tar or tar.gz
// extracted into dir (created).
func (c *Client) UploadArchive(ctx context.Context, dir string, body io.Reader) (WriteResult, error) {
	var res WriteResult
	err := c.DoRaw(ctx, http.MethodPut, RouteFileArchive+"?"+url.Values{"path": {dir}}.Encode(), body, &res)
	return res, err
}

// DownloadArchive calls GET /v1/files/archive and returns the tar (tar.gz
// when gzip) of dir; the caller closes it.
func (c *Client) DownloadArchive(ctx context.Context, dir string, gzip bool) (io.ReadCloser, error) {
	q := url.Values{"path": {dir}}
	if gzip {
		q.Set("gzip", "true")
	}
	return c.get(ctx, RouteFileArchive+"?"+q.Encode())
}

// Checkpoint calls GET /v1/checkpoint: a checkpoint archive of paths
// (absolute or relative to the work dir; none: the work dir) without the
// entries that match exclude, at the agent's default compression. The
// caller reads the archive to its end and closes it; a transfer that
// breaks before the end is an error of the read, never a short valid
// archive. A missing path is an *Error with status 404.
func (c *Client) Checkpoint(ctx context.Context, paths, exclude []string) (io.ReadCloser, CheckpointInfo, error) {
	return c.CheckpointLevel(ctx, paths, exclude, "")
}

// CheckpointLevel is Checkpoint at the compression level compression
// (CompressionFast, CompressionNone, CompressionSmall; "" the default).
func (c *Client) CheckpointLevel(ctx context.Context, paths, exclude []string, compression string) (io.ReadCloser, CheckpointInfo, error) {
	q := url.Values{"path": paths, "exclude": exclude}
	if compression != "" {
		q.Set("compression", compression)
	}
	resp, err := c.send(ctx, http.MethodGet, RouteCheckpoint+"?"+q.Encode(), nil, "", "")
	if err != nil {
		return nil, CheckpointInfo{}, err
	}
	info, err := checkpointInfo(resp.Header)
	if err != nil {
		resp.Body.Close()
		return nil, CheckpointInfo{}, fmt.Errorf("checkpoint: %w", err)
	}
	return resp.Body, info, nil
}

// checkpointInfo reads the headers of a checkpoint answer.
func checkpointInfo(h http.Header) (CheckpointInfo, error) {
	info := CheckpointInfo{Format: h.Get(HeaderFormat)}
	if info.Format != FormatTarGzip && info.Format != FormatTar {
		return info, fmt.Errorf("the agent sent format %q, not %q or %q", info.Format, FormatTarGzip, FormatTar)
	}
	for _, f := range []struct {
		name string
		set  func(int64)
	}{
		{HeaderFiles, func(n int64) { info.Files = int(n) }},
		{HeaderSkipped, func(n int64) { info.Skipped = int(n) }},
		{HeaderBytes, func(n int64) { info.Bytes = n }},
	} {
		n, err := strconv.ParseInt(h.Get(f.name), 10, 64)
		if err != nil || n < 0 {
			return info, fmt.Errorf("the agent sent %s %q, not a count", f.name, h.Get(f.name))
		}
		f.set(n)
	}
	if err := json.Unmarshal([]byte(h.Get(HeaderRoots)), &info.Roots); err != nil || len(info.Roots) == 0 {
		return info, fmt.Errorf("the agent sent %s %q, not a JSON array of paths", HeaderRoots, h.Get(HeaderRoots))
	}
	return info, nil
}

// Restore calls PUT /v1/checkpoint?sha256=: r is a checkpoint archive
// (as Checkpoint returned it) whose bytes hash to sha256 (hex); the agent
// replaces its roots with it atomically. A body that does not hash to
// sha256, or is not such an archive, is an *Error with status 400, a full
// disk 507, another restore running 409 CodeBusy: each leaves the
// sandbox as it was.
//
// When r is a VouchedBody, its sender's check stands for the agent's: the
// body is sent with the trailer TrailerVouchedSHA256, set from r.Vouch once
// r has ended, and the agent does not hash it again.
func (c *Client) Restore(ctx context.Context, sha256 string, r io.Reader) (RestoreResult, error) {
	var res RestoreResult
	path := RouteCheckpoint + "?" + url.Values{"sha256": {sha256}}.Encode()
	vb, ok := r.(VouchedBody)
	if !ok {
		err := c.DoRaw(ctx, http.MethodPut, path, r, &res)
		return res, err
	}
	tb := &trailerBody{body: vb}
	req, err := c.NewRequest(ctx, http.MethodPut, path, tb)
	if err != nil {
		return res, err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	req.ContentLength = -1 // chunked: a trailer follows the last chunk
	req.Trailer = http.Header{TrailerVouchedSHA256: nil}
	tb.trailer = req.Trailer
	resp, err := c.do(req, http.MethodPut, path)
	if err != nil {
		return res, err
	}
	return res, decodeAnswer(resp, http.MethodPut, path, &res)
}

// A VouchedBody is a restore's body whose sender checks the bytes it
// reads: Vouch, called once the body has ended, returns the SHA-256 (hex)
// they hashed to, or "" when the check failed or did not happen.
type VouchedBody interface {
	io.Reader
	Vouch() string
}

// trailerBody is a VouchedBody as a request body: at its end it sets the
// request's TrailerVouchedSHA256 (net/http sends the trailer after the
// body's io.EOF and reads it no sooner).
type trailerBody struct {
	body    VouchedBody
	trailer http.Header
}

func (b *trailerBody) Read(p []byte) (int, error) {
	n, err := b.body.Read(p)
	if err == io.EOF {
		b.trailer.Set(TrailerVouchedSHA256, b.body.Vouch())
	}
	return n, err
}

// DoRaw sends body as application/octet-stream (body may be nil) and
// decodes a JSON answer into out (may be nil). A non-2xx answer is *Error.
func (c *Client) DoRaw(ctx context.Context, method, path string, body io.Reader, out any) error {
	resp, err := c.send(ctx, method, path, body, "application/octet-stream", "")
	if err != nil {
		return err
	}
	return decodeAnswer(resp, method, path, out)
}

// get sends a GET and returns the body of a 2xx answer.
func (c *Client) get(ctx context.Context, path string) (io.ReadCloser, error) {
	resp, err := c.send(ctx, http.MethodGet, path, nil, "", "")
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// stream sends a request (in may be nil) asking for server-sent events.
func (c *Client) stream(ctx context.Context, method, path string, in any) (*EventStream, error) {
	body, err := jsonBody(in)
	if err != nil {
		return nil, err
	}
	ct := ""
	if in != nil {
		ct = "application/json"
	}
	resp, err := c.send(ctx, method, path, body, ct, "text/event-stream")
	if err != nil {
		return nil, err
	}
	return NewEventStream(resp.Body), nil
}

func sessionPath(id string) string { return RouteSessions + "/" + url.PathEscape(id) }
func processPath(id string) string { return RouteProcesses + "/" + url.PathEscape(id) }

// FormatMode formats permission bits (with setuid, setgid, sticky) as four
// octal digits, the format of FileInfo.Mode and of the files API's mode query.
func FormatMode(m fs.FileMode) string {
	return fmt.Sprintf("%04o", ModeBits(m))
}

// ModeBits returns m's permission bits with setuid (0o4000), setgid
// (0o2000) and sticky (0o1000), as chmod and a tar header take them.
func ModeBits(m fs.FileMode) uint32 {
	v := uint32(m.Perm())
	if m&fs.ModeSetuid != 0 {
		v |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		v |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		v |= 0o1000
	}
	return v
}
