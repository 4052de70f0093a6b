package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
)

// DefaultMaxResponseBytes bounds a JSON answer (an exec result holds up to
// twice max_output_bytes of output) and a single streamed event.
const DefaultMaxResponseBytes = 64 << 20

// Client calls one Quarry gateway. It is safe for concurrent use. It has no
// overall timeout of its own: every call is bounded by its ctx, so that long
// commands and streams can run as long as the caller allows.
type Client struct {
	baseURL  string
	apiKey   string
	http     *http.Client
	maxBytes int64
}

// Option configures a Client.
type Option func(*Client)

// WithHTTPClient makes the client send its requests through h (for TLS
// settings, proxies or tests). A nil h is ignored.
func WithHTTPClient(h *http.Client) Option {
	return func(c *Client) {
		if h != nil {
			c.http = h
		}
	}
}

// WithMaxResponseBytes bounds each JSON answer and each streamed event to n
// bytes (default DefaultMaxResponseBytes); a larger one fails the call.
// n <= 0 is ignored.
func WithMaxResponseBytes(n int64) Option {
	return func(c *Client) {
		if n > 0 {
			c.maxBytes = n
		}
	}
}

// New returns a client for the gateway at baseURL (e.g.
// "http://127.0.0.1:8080") that authenticates with apiKey.
func New(baseURL, apiKey string, opts ...Option) *Client {
	c := &Client{
		baseURL:  strings.TrimRight(baseURL, "/"),
		apiKey:   apiKey,
		http:     &http.Client{},
		maxBytes: DefaultMaxResponseBytes,
	}
	for _, o := range opts {
		o(c)
	}
	return c
}

// route is a request path, or why it could not be built (an empty id).
type route struct {
	path string
	err  error
}

// sandboxRoute is /v1/sandboxes/{id}[/rest…] with every segment escaped.
func sandboxRoute(id string, rest ...string) route {
	if id == "" {
		return route{err: errors.New("sandbox id: must not be empty")}
	}
	p := "/v1/sandboxes/" + url.PathEscape(id)
	for _, s := range rest {
		p += "/" + url.PathEscape(s)
	}
	return route{path: p}
}

// childRoute is /v1/sandboxes/{id}/{kind}/{child}[/rest…]; field names the
// child id in the error for an empty one.
func childRoute(id, kind, field, child string, rest ...string) route {
	if child == "" && id != "" {
		return route{err: fmt.Errorf("%s: must not be empty", field)}
	}
	return sandboxRoute(id, append([]string{kind, child}, rest...)...)
}

// call is one request to the gateway.
type call struct {
	method string
	route  route
	query  url.Values
	header http.Header
	accept string    // Accept header; "" means application/json
	in     any       // JSON body, or nil
	body   io.Reader // raw body when in is nil; may be nil
	noAuth bool
}

// send performs cl and returns the response of a 2xx answer, whose body the
// caller must close; any other answer is returned as *Error.
func (c *Client) send(ctx context.Context, cl call) (*http.Response, error) {
	if cl.route.err != nil {
		return nil, cl.route.err
	}
	body := cl.body
	if cl.in != nil {
		b, err := json.Marshal(cl.in)
		if err != nil {
			return nil, fmt.Errorf("encode request: %w", err)
		}
		body = bytes.NewReader(b)
	}
	u := c.baseURL + cl.route.path
	if len(cl.query) > 0 {
		u += "?" + cl.query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, cl.method, u, body)
	if err != nil {
		return nil, fmt.Errorf("build request: %w", err)
	}
	for k, v := range cl.header {
		req.Header[k] = v
	}
	if cl.in != nil {
		req.Header.Set("Content-Type", "application/json")
	} else if cl.body != nil {
		req.Header.Set("Content-Type", "application/octet-stream")
		if n, ok := remainingFileSize(cl.body); ok {
			req.ContentLength = n
		}
	}
	accept := cl.accept
	if accept == "" {
		accept = "application/json"
	}
	req.Header.Set("Accept", accept)
	if !cl.noAuth {
		req.Header.Set("Authorization", "Bearer "+c.apiKey)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", cl.method, cl.route.path, err)
	}
	if err := checkResponse(resp); err != nil {
		resp.Body.Close()
		return nil, err
	}
	return resp, nil
}

// remainingFileSize returns the bytes left in r when r is a regular file,
// so that uploads of files carry a Content-Length instead of being chunked.
func remainingFileSize(r io.Reader) (int64, bool) {
	f, ok := r.(*os.File)
	if !ok {
		return 0, false
	}
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() {
		return 0, false
	}
	pos, err := f.Seek(0, io.SeekCurrent)
	if err != nil || pos > st.Size() {
		return 0, false
	}
	return st.Size() - pos, true
}

// do performs cl and decodes a JSON answer into out (nil discards it).
func (c *Client) do(ctx context.Context, cl call, out any) error {
	resp, err := c.send(ctx, cl)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := c.readBounded(resp.Body)
	if err != nil {
		return fmt.Errorf("read answer to %s %s: %w", cl.method, cl.route.path, err)
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("decode answer to %s %s: %w", cl.method, cl.route.path, err)
	}
	return nil
}

// readBounded reads all of r, failing when it holds more than maxBytes.
func (c *Client) readBounded(r io.Reader) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, c.maxBytes+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > c.maxBytes {
		return nil, fmt.Errorf("answer exceeds %d bytes", c.maxBytes)
	}
	return b, nil
}

// getBytes returns the bounded raw body of a GET.
func (c *Client) getBytes(ctx context.Context, path string, noAuth bool) ([]byte, error) {
	resp, err := c.send(ctx, call{method: http.MethodGet, route: route{path: path}, noAuth: noAuth, accept: "*/*"})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := c.readBounded(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("read answer to GET %s: %w", path, err)
	}
	return b, nil
}

// Health calls GET /healthz (no auth): nil when the gateway process is up.
func (c *Client) Health(ctx context.Context) error {
	_, err := c.getBytes(ctx, "/healthz", true)
	return err
}

// Ready calls GET /readyz (no auth): nil when the gateway's lease store answers.
func (c *Client) Ready(ctx context.Context) error {
	_, err := c.getBytes(ctx, "/readyz", true)
	return err
}

// Metrics returns the Prometheus text exposition of GET /metrics.
func (c *Client) Metrics(ctx context.Context) ([]byte, error) {
	return c.getBytes(ctx, "/metrics", false)
}

// OpenAPI returns the OpenAPI 3 document of GET /openapi.json (no auth).
func (c *Client) OpenAPI(ctx context.Context) (json.RawMessage, error) {
	return c.getBytes(ctx, "/openapi.json", true)
}
