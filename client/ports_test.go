package client

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPorts_PreviewURLAndPortClient(t *testing.T) {
	var gotPath, gotAuth string
	var gotBody map[string]any
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotPath, gotAuth = r.URL.EscapedPath(), r.Header.Get("Authorization")
		gotBody = nil
		_ = json.NewDecoder(r.Body).Decode(&gotBody)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"url": "http://gw/v1/sandboxes/sbx-1/ports/8000/?quarry_preview=t", "expires_at": "2026-12-02T06:00:00Z"}`)
	}))
	t.Cleanup(gw.Close)
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "auth="+r.Header.Get("Authorization"))
	}))
	t.Cleanup(other.Close)
	c := New(gw.URL, "the-key-0123456789")

	pv, err := c.PreviewURL(context.Background(), "sbx-1", 8000, 1500*time.Millisecond)
	require.NoError(t, err)
	assert.Equal(t, "/v1/sandboxes/sbx-1/ports/8000/url", gotPath)
	assert.Equal(t, map[string]any{"ttl_seconds": float64(2)}, gotBody, "a ttl rounds up to whole seconds")
	assert.Equal(t, "http://gw/v1/sandboxes/sbx-1/ports/8000/?quarry_preview=t", pv.URL)
	assert.Equal(t, time.Date(2026, 12, 2, 6, 0, 0, 0, time.UTC), pv.ExpiresAt.UTC())
	_, err = c.PreviewURL(context.Background(), "sbx-1", 8000, 0)
	require.NoError(t, err)
	assert.Equal(t, map[string]any{}, gotBody, "no ttl: the gateway's default")

	u, err := c.PortURL("sbx 1", 8000, "index.html?x=1")
	require.NoError(t, err)
	assert.Equal(t, gw.URL+"/v1/sandboxes/sbx%201/ports/8000/index.html?x=1", u)
	_, err = c.PortURL("", 8000, "/")
	assert.Error(t, err)

	pc := c.PortClient()
	resp, err := pc.Get(u)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, "Bearer the-key-0123456789", gotAuth, "the gateway's URLs get the key")
	resp, err = pc.Get(other.URL + "/x")
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, "auth=", string(b), "other hosts never see the key")
}
