// Package envclient is a small Go client of the gateway's env API
// (docs/ENVS.md): make, reset, step, close. The integration tests and
// bench/envbench use it; trainers in Python speak the same JSON.
//
// It imports only envs (for the result types) and the standard library; it
// must not import server packages.
package envclient

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/quarryhq/quarry/envs"
)

// maxAnswerBytes bounds an answer the client reads.
const maxAnswerBytes = 16 << 20

// Error is a non-2xx answer of the gateway.
type Error struct {
	Status  int
	Code    string
	Message string
}

func (e *Error) Error() string { return fmt.Sprintf("gateway: %d %s: %s", e.Status, e.Code, e.Message) }

// Client calls one gateway with one API key. Safe for concurrent use.
type Client struct {
	base string
	key  string
	http *http.Client
}

// New returns a client of the gateway at baseURL; hc may be nil
// (http.DefaultClient). Every call is bounded by its ctx.
func New(baseURL, apiKey string, hc *http.Client) *Client {
	if hc == nil {
		hc = http.DefaultClient
	}
	return &Client{base: strings.TrimRight(baseURL, "/"), key: apiKey, http: hc}
}

// Make calls POST /v1/envs and returns the new sandbox's id.
func (c *Client) Make(ctx context.Context, envID string) (string, error) {
	var out struct {
		SandboxID string `json:"sandbox_id"`
	}
	err := c.Do(ctx, "/v1/envs", map[string]string{"env_id": envID}, &out)
	return out.SandboxID, err
}

// Reset calls POST /v1/sandboxes/{id}/env/reset; seed and options may be nil.
func (c *Client) Reset(ctx context.Context, id string, seed *int64, options any) (envs.ResetResult, error) {
	body := map[string]any{}
	if seed != nil {
		body["seed"] = *seed
	}
	if options != nil {
		body["options"] = options
	}
	var out envs.ResetResult
	err := c.Do(ctx, envPath(id, "reset"), body, &out)
	return out, err
}

// Step calls POST /v1/sandboxes/{id}/env/step with action.
func (c *Client) Step(ctx context.Context, id string, action any) (envs.StepResult, error) {
	var out envs.StepResult
	err := c.Do(ctx, envPath(id, "step"), map[string]any{"action": action}, &out)
	return out, err
}

// Close calls POST /v1/sandboxes/{id}/env/close (which releases the sandbox).
func (c *Client) Close(ctx context.Context, id string) error {
	return c.Do(ctx, envPath(id, "close"), nil, nil)
}

func envPath(id, op string) string { return "/v1/sandboxes/" + url.PathEscape(id) + "/env/" + op }

// Do POSTs in (nil: no body) as JSON to path and decodes the answer into
// out (nil: discarded). A non-2xx answer is an *Error.
func (c *Client) Do(ctx context.Context, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("encode request: %w", err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+path, body)
	if err != nil {
		return fmt.Errorf("build request: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+c.key)
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("call %s: %w", path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBytes+1))
	if err != nil {
		return fmt.Errorf("read answer of %s: %w", path, err)
	}
	if len(data) > maxAnswerBytes {
		return fmt.Errorf("read answer of %s: over %d bytes", path, maxAnswerBytes)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		var eb struct {
			Error struct {
				Code    string `json:"code"`
				Message string `json:"message"`
			} `json:"error"`
		}
		_ = json.Unmarshal(data, &eb)
		return &Error{Status: resp.StatusCode, Code: eb.Error.Code, Message: eb.Error.Message}
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("decode answer of %s: %w", path, err)
	}
	return nil
}
