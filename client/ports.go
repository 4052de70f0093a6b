package client

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// PreviewURL is a signed URL of a sandbox port that works without the API
// key (a browser, a CDP client) until ExpiresAt or the lease's end.
type PreviewURL struct {
	URL       string    `json:"url"`
	ExpiresAt time.Time `json:"expires_at"`
}

// PreviewURL asks for a preview URL of port in sandbox id, valid for ttl
// (0: the gateway's default, 1 h; at most its QUARRY_PREVIEW_MAX_TTL, 24 h).
// It fails with *Error: 400 for a bad port or ttl, 404/410 for an unknown
// or ended sandbox.
func (c *Client) PreviewURL(ctx context.Context, id string, port int, ttl time.Duration) (PreviewURL, error) {
	var out PreviewURL
	in := map[string]any{}
	if ttl > 0 {
		in["ttl_seconds"] = int64((ttl + time.Second - 1) / time.Second)
	}
	err := c.do(ctx, call{method: http.MethodPost, route: sandboxRoute(id, "ports", strconv.Itoa(port), "url"), in: in}, &out)
	return out, err
}

// PortURL returns the gateway URL of path (e.g. "/index.html?x=1") on port
// in sandbox id; requests to it need the API key (PortClient adds it).
func (c *Client) PortURL(id string, port int, path string) (string, error) {
	r := sandboxRoute(id, "ports", strconv.Itoa(port))
	if r.err != nil {
		return "", r.err
	}
	if !strings.HasPrefix(path, "/") {
		path = "/" + path
	}
	return c.baseURL + r.path + path, nil
}

// PortClient returns an http.Client whose requests to this gateway carry
// the API key, for URLs from PortURL: what it fetches is the program's own
// answer (any status), streamed. The client's other requests go out
// unchanged. It shares the transport of the Client.
func (c *Client) PortClient() *http.Client {
	base := c.http.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	hc := *c.http
	hc.Transport = &keyTransport{base: base, prefix: c.baseURL + "/", key: c.apiKey}
	return &hc
}

// keyTransport adds the API key to requests under prefix.
type keyTransport struct {
	base   http.RoundTripper
	prefix string
	key    string
}

func (t *keyTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if !strings.HasPrefix(r.URL.String(), t.prefix) || r.Header.Get("Authorization") != "" {
		return t.base.RoundTrip(r)
	}
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+t.key)
	return t.base.RoundTrip(r)
}
