package agentapi

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
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
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("encode request: %w", err)
		}
		body = bytes.NewReader(b)
	}
	req, err := c.NewRequest(ctx, method, path, body)
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return fmt.Errorf("call agent %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	if err := CheckResponse(resp); err != nil {
		return err
	}
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("decode agent answer to %s %s: %w", method, path, err)
	}
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
