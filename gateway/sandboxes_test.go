package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/api"
	"github.com/quarryhq/quarry/internal/badinput"
	"github.com/quarryhq/quarry/providers"
	"github.com/quarryhq/quarry/warmpool"
)

func TestAuth_KeysAndOpenRoutes(t *testing.T) {
	gw := startGateway(t, newFakeManager(""), nil)
	tests := []struct {
		name   string
		path   string
		auth   string // raw Authorization header; "" sends none
		status int
	}{
		{name: "healthz needs no key", path: "/healthz", status: http.StatusOK},
		{name: "readyz needs no key", path: "/readyz", status: http.StatusOK},
		{name: "openapi needs no key", path: "/openapi.json", status: http.StatusOK},
		{name: "missing key", path: "/v1/pools", status: http.StatusUnauthorized},
		{name: "wrong key", path: "/v1/pools", auth: "Bearer nope-nope-nope", status: http.StatusUnauthorized},
		{name: "not bearer", path: "/v1/pools", auth: "Basic " + testKey, status: http.StatusUnauthorized},
		{name: "empty bearer", path: "/v1/pools", auth: "Bearer ", status: http.StatusUnauthorized},
		{name: "oversized key", path: "/v1/pools", auth: "Bearer " + strings.Repeat("k", 300), status: http.StatusUnauthorized},
		{name: "right key", path: "/v1/pools", auth: "Bearer " + testKey, status: http.StatusOK},
		{name: "second key", path: "/v1/pools", auth: "Bearer " + otherKey, status: http.StatusOK},
		{name: "lowercase scheme", path: "/v1/pools", auth: "bearer " + testKey, status: http.StatusOK},
		{name: "metrics needs a key", path: "/metrics", status: http.StatusUnauthorized},
		{name: "metrics with key", path: "/metrics", auth: "Bearer " + testKey, status: http.StatusOK},
		{name: "sandbox route needs a key", path: "/v1/sandboxes/sbx-1/sessions", status: http.StatusUnauthorized},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var hdr []string
			if tt.auth != "" {
				hdr = []string{"Authorization", tt.auth}
			}
			resp, body := call(t, http.MethodGet, gw.URL+tt.path, "", nil, hdr...)
			assert.Equal(t, tt.status, resp.StatusCode, "body %s", body)
			if tt.status == http.StatusUnauthorized {
				assert.Equal(t, "unauthorized", decodeError(t, body).Code)
			}
		})
	}
}

func TestOwnerOf_IsStableHashNotKey(t *testing.T) {
	a, b := OwnerOf(testKey), OwnerOf(otherKey)
	assert.Len(t, a, 32)
	assert.Equal(t, a, OwnerOf(testKey))
	assert.NotEqual(t, a, b)
	assert.NotContains(t, a, testKey)
}

func TestSandboxes_CreateGetListHeartbeatDelete(t *testing.T) {
	mgr := newFakeManager("http://127.0.0.1:1")
	gw := startGateway(t, mgr, nil)

	resp, body := callJSON(t, http.MethodPost, gw.URL+"/v1/sandboxes", testKey,
		map[string]any{"pool": "default", "lease_seconds": 600, "env": map[string]string{"TASK": "42"}, "labels": map[string]string{"run": "exp1"}})
	require.Equal(t, http.StatusCreated, resp.StatusCode, "body %s", body)
	sb := decode[api.Sandbox](t, body)
	assert.Equal(t, "default", sb.Pool)
	assert.Equal(t, "active", sb.State)
	assert.Equal(t, 600, sb.LeaseSeconds)
	assert.Equal(t, map[string]string{"run": "exp1"}, sb.Labels)
	assert.NotContains(t, string(body), agentToken, "the agent token never reaches the client")
	assert.NotContains(t, string(body), "agent_url")
	assert.NotContains(t, string(body), "ended_at")

	stored, err := mgr.Get(context.Background(), sb.ID, OwnerOf(testKey))
	require.NoError(t, err, "the lease is owned by the hash of the key")
	assert.Equal(t, map[string]string{"TASK": "42"}, stored.Env)

	resp, body = call(t, http.MethodGet, gw.URL+"/v1/sandboxes/"+sb.ID, testKey, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, "body %s", body)
	assert.Equal(t, sb.ID, decode[api.Sandbox](t, body).ID)

	resp, body = call(t, http.MethodGet, gw.URL+"/v1/sandboxes/"+sb.ID, otherKey, nil)
	assert.Equal(t, http.StatusNotFound, resp.StatusCode, "another key's sandbox is invisible")
	assert.Equal(t, "not_found", decodeError(t, body).Code)

	resp, body = call(t, http.MethodGet, gw.URL+"/v1/sandboxes?pool=default&state=active&label=run=exp1", testKey, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, "body %s", body)
	list := decode[api.SandboxList](t, body)
	require.Len(t, list.Sandboxes, 1)
	assert.Equal(t, sb.ID, list.Sandboxes[0].ID)

	resp, body = call(t, http.MethodGet, gw.URL+"/v1/sandboxes?label=run=other", testKey, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.JSONEq(t, `{"sandboxes": []}`, string(body))

	resp, body = call(t, http.MethodGet, gw.URL+"/v1/sandboxes", otherKey, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.JSONEq(t, `{"sandboxes": []}`, string(body), "lists only the caller's sandboxes")

	resp, body = call(t, http.MethodPost, gw.URL+"/v1/sandboxes/"+sb.ID+"/heartbeat", testKey, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, "body %s", body)
	assert.False(t, decode[api.Sandbox](t, body).ExpiresAt.Before(sb.ExpiresAt))
	resp, body = call(t, http.MethodPost, gw.URL+"/v1/sandboxes/"+sb.ID+"/heartbeat", testKey, strings.NewReader(" {} "))
	require.Equal(t, http.StatusOK, resp.StatusCode, "an empty object is no fields: body %s", body)
	resp, body = call(t, http.MethodPost, gw.URL+"/v1/sandboxes/"+sb.ID+"/heartbeat", testKey, strings.NewReader(`{"lease_seconds": 5}`))
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "a field that would be ignored is refused: body %s", body)
	assert.Contains(t, decodeError(t, body).Message, "heartbeat takes no fields")
	resp, body = call(t, http.MethodPost, gw.URL+"/v1/sandboxes/"+sb.ID+"/heartbeat", testKey, strings.NewReader(strings.Repeat(" ", 9<<20)))
	assert.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode, "a heartbeat body is bounded: body %s", body)

	resp, body = call(t, http.MethodDelete, gw.URL+"/v1/sandboxes/"+sb.ID, testKey, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, "body %s", body)
	released := decode[api.Sandbox](t, body)
	assert.Equal(t, "released", released.State)
	assert.False(t, released.EndedAt.IsZero())

	resp, body = call(t, http.MethodGet, gw.URL+"/v1/sandboxes/"+sb.ID, testKey, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, "ended sandboxes stay visible")
	assert.Equal(t, "released", decode[api.Sandbox](t, body).State)

	resp, body = call(t, http.MethodPost, gw.URL+"/v1/sandboxes/"+sb.ID+"/heartbeat", testKey, nil)
	assert.Equal(t, http.StatusGone, resp.StatusCode)
	e := decodeError(t, body)
	assert.Equal(t, "gone", e.Code)
	assert.Contains(t, e.Message, "was released")
	assert.Contains(t, e.Message, sb.ID)

	resp, body = call(t, http.MethodDelete, gw.URL+"/v1/sandboxes/"+sb.ID, testKey, nil)
	assert.Equal(t, http.StatusGone, resp.StatusCode)
	assert.Contains(t, decodeError(t, body).Message, "was released")
}

func TestSandboxes_Create_IdempotencyKeyReplays(t *testing.T) {
	mgr := newFakeManager("")
	gw := startGateway(t, mgr, nil)
	resp, body := callJSON(t, http.MethodPost, gw.URL+"/v1/sandboxes", testKey, map[string]any{}, "Idempotency-Key", "req-1")
	require.Equal(t, http.StatusCreated, resp.StatusCode, "body %s", body)
	first := decode[api.Sandbox](t, body)
	assert.Equal(t, "default", first.Pool, "an empty body takes the default pool")

	resp, body = callJSON(t, http.MethodPost, gw.URL+"/v1/sandboxes", testKey, map[string]any{}, "Idempotency-Key", "req-1")
	require.Equal(t, http.StatusOK, resp.StatusCode, "body %s", body)
	assert.Equal(t, first.ID, decode[api.Sandbox](t, body).ID)

	resp, body = callJSON(t, http.MethodPost, gw.URL+"/v1/sandboxes", otherKey, map[string]any{}, "Idempotency-Key", "req-1")
	require.Equal(t, http.StatusCreated, resp.StatusCode, "keys are per API key")
	assert.NotEqual(t, first.ID, decode[api.Sandbox](t, body).ID)
}

func TestSandboxes_Create_BadInput(t *testing.T) {
	gw := startGateway(t, newFakeManager(""), func(c *Config) { c.MaxJSONBody = 4096; c.MaxUploadBody = 1 << 20 })
	tests := []struct {
		name    string
		body    string
		hdr     []string
		status  int
		message string // the field named
	}{
		{name: "malformed JSON", body: `{"pool": "default",`, status: 400, message: "body:"},
		{name: "syntax error", body: `{"pool" "default"}`, status: 400, message: "body: malformed JSON"},
		{name: "not an object", body: `[1,2]`, status: 400, message: "body:"},
		{name: "unknown field", body: `{"pool": "default", "colour": "red"}`, status: 400, message: "colour: unknown field"},
		{name: "lease_seconds string", body: `{"lease_seconds": "ten"}`, status: 400, message: "lease_seconds: must be an integer"},
		{name: "lease_seconds negative", body: `{"lease_seconds": -1}`, status: 400, message: "lease_seconds:"},
		{name: "lease_seconds fraction", body: `{"lease_seconds": 1.5}`, status: 400, message: "lease_seconds:"},
		{name: "env not object", body: `{"env": ["A=1"]}`, status: 400, message: "env:"},
		{name: "env bad name", body: `{"env": {"1A": "x"}}`, status: 400, message: "env:"},
		{name: "env value not string", body: `{"env": {"A": 1}}`, status: 400, message: "env"},
		{name: "label bad key", body: `{"labels": {"bad key": "x"}}`, status: 400, message: "labels:"},
		{name: "label value control char", body: `{"labels": {"k": "a\nb"}}`, status: 400, message: "labels.k:"},
		{name: "pool bad name", body: `{"pool": "../etc"}`, status: 400, message: "pool:"},
		{name: "idempotency key too long", body: `{}`, hdr: []string{"Idempotency-Key", strings.Repeat("k", 300)}, status: 400, message: "Idempotency-Key:"},
		{name: "body too large", body: `{"pool": "` + strings.Repeat("p", 5000) + `"}`, status: 413, message: "larger than the limit of 4096 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			hdr := append([]string{"Content-Type", "application/json"}, tt.hdr...)
			resp, body := call(t, http.MethodPost, gw.URL+"/v1/sandboxes", testKey, strings.NewReader(tt.body), hdr...)
			assert.Equal(t, tt.status, resp.StatusCode, "body %s", body)
			assert.Contains(t, decodeError(t, body).Message, tt.message)
		})
	}
}

func TestSandboxes_Create_ChunkedBodyOverLimitIs413(t *testing.T) {
	gw := startGateway(t, newFakeManager(""), func(c *Config) { c.MaxJSONBody = 4096 })
	// An io.Reader of unknown size makes the client send a chunked body.
	body := struct{ *strings.Reader }{strings.NewReader(`{"pool": "` + strings.Repeat("p", 100000) + `"}`)}
	resp, b := call(t, http.MethodPost, gw.URL+"/v1/sandboxes", testKey, body, "Content-Type", "application/json")
	assert.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode, "body %s", b)
	assert.Equal(t, "payload_too_large", decodeError(t, b).Code)
}

func TestSandboxes_ManagerErrorsMapped(t *testing.T) {
	tests := []struct {
		name       string
		err        error
		status     int
		code       string
		message    string
		retryAfter bool
	}{
		{name: "validation", err: badinput.New("lease_seconds", "above the pool's maximum 3600"), status: 400, code: "bad_request", message: "lease_seconds: above the pool's maximum 3600"},
		{name: "unknown pool", err: fmt.Errorf("acquire: %w", warmpool.ErrNotFound), status: 400, code: "bad_request", message: "pool:"},
		{name: "no capacity", err: fmt.Errorf("reserve: %w", warmpool.ErrNoCapacity), status: 503, code: "no_capacity", retryAfter: true},
		{name: "provider no capacity", err: &providers.LaunchError{Pool: "default", Reason: "quota", Err: providers.ErrNoCapacity}, status: 503, code: "no_capacity", retryAfter: true},
		{name: "store unavailable", err: fmt.Errorf("claim: %w", warmpool.ErrUnavailable), status: 503, code: "unavailable", retryAfter: true},
		{name: "store closed", err: warmpool.ErrClosed, status: 503, code: "unavailable", retryAfter: true},
		{name: "throttled", err: providers.ErrThrottled, status: 503, code: "unavailable", retryAfter: true},
		{name: "deadline", err: context.DeadlineExceeded, status: 503, code: "unavailable", retryAfter: true},
		{name: "conflict", err: warmpool.ErrConflict, status: 409, code: "conflict"},
		{name: "bad image", err: &providers.LaunchError{Pool: "default", Image: "nope", Reason: "image not found", Err: providers.ErrInvalidSpec}, status: 500, code: "internal", message: "image not found"},
		{name: "unknown error hides details", err: errors.New("disk on fire at /var/secret"), status: 500, code: "internal", message: "internal error"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mgr := newFakeManager("")
			mgr.AcquireFn = func(context.Context, warmpool.AcquireRequest) (warmpool.Lease, bool, error) {
				return warmpool.Lease{}, false, tt.err
			}
			gw := startGateway(t, mgr, nil)
			resp, body := callJSON(t, http.MethodPost, gw.URL+"/v1/sandboxes", testKey, map[string]any{"pool": "default"})
			assert.Equal(t, tt.status, resp.StatusCode, "body %s", body)
			e := decodeError(t, body)
			assert.Equal(t, tt.code, e.Code)
			assert.Contains(t, e.Message, tt.message)
			assert.NotContains(t, e.Message, "/var/secret")
			if tt.retryAfter {
				assert.Equal(t, "2", resp.Header.Get("Retry-After"))
			} else {
				assert.Empty(t, resp.Header.Get("Retry-After"))
			}
		})
	}
}

func TestSandboxes_LeaseEndedMessagesSayWhich(t *testing.T) {
	tests := []struct {
		name    string
		state   warmpool.LeaseState
		reason  string
		expires time.Duration
		message string
	}{
		{name: "released", state: warmpool.LeaseReleased, expires: time.Hour, message: "was released"},
		{name: "expired by the reaper", state: warmpool.LeaseExpired, expires: -time.Minute, message: "expired"},
		{name: "expired, not reaped yet", state: warmpool.LeaseActive, expires: -time.Second, message: "expired"},
		{name: "lost", state: warmpool.LeaseLost, reason: "task exited with code 137", expires: time.Hour, message: "was lost (task exited with code 137)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mgr := newFakeManager("")
			l := mgr.addLease("sbx-1", testKey, "http://127.0.0.1:1", 1)
			l.State, l.Reason, l.ExpiresAt = tt.state, tt.reason, time.Now().Add(tt.expires)
			mgr.put(l)
			gw := startGateway(t, mgr, nil)

			resp, body := callJSON(t, http.MethodPost, gw.URL+"/v1/sandboxes/sbx-1/exec", testKey, map[string]any{"command": "true"})
			assert.Equal(t, http.StatusGone, resp.StatusCode, "body %s", body)
			e := decodeError(t, body)
			assert.Equal(t, "gone", e.Code)
			assert.Contains(t, e.Message, "sandbox sbx-1 ")
			assert.Contains(t, e.Message, tt.message)

			resp, body = call(t, http.MethodGet, gw.URL+"/v1/sandboxes/sbx-1", testKey, nil)
			require.Equal(t, http.StatusOK, resp.StatusCode)
			want := string(tt.state)
			if tt.state == warmpool.LeaseActive {
				want = "expired"
			}
			assert.Equal(t, want, decode[api.Sandbox](t, body).State)
		})
	}
}

// A paused sandbox's calls are 409 conflict naming the pause (its agent is
// frozen: a call would wait for its deadline), and nothing reaches the
// agent (whose address here refuses connections).
func TestSandboxes_PausedSandboxRefusesCalls(t *testing.T) {
	mgr := newFakeManager("")
	l := mgr.addLease("sbx-1", testKey, refusedURL(t), 1)
	l.PausedAt = time.Now().Add(-time.Minute)
	mgr.put(l)
	gw := startGateway(t, mgr, nil)
	for _, path := range []string{"/v1/sandboxes/sbx-1/exec", "/v1/sandboxes/sbx-1/sessions"} {
		resp, body := callJSON(t, http.MethodPost, gw.URL+path, testKey, map[string]any{"command": "true"})
		assert.Equal(t, http.StatusConflict, resp.StatusCode, "%s: %s", path, body)
		e := decodeError(t, body)
		assert.Equal(t, "conflict", e.Code)
		assert.Contains(t, e.Message, "sandbox sbx-1 is paused")
		assert.Contains(t, e.Message, "resume it")
	}
}

func TestSandboxes_BadPathAndQuery(t *testing.T) {
	gw := startGateway(t, newFakeManager(""), nil)
	tests := []struct {
		name    string
		method  string
		path    string
		status  int
		message string
	}{
		{name: "bad id", method: http.MethodGet, path: "/v1/sandboxes/bad%20id", status: 400, message: "id:"},
		{name: "bad id on proxy", method: http.MethodPost, path: "/v1/sandboxes/.hidden/exec", status: 400, message: "id:"},
		{name: "unknown sandbox", method: http.MethodGet, path: "/v1/sandboxes/sbx-none", status: 404, message: "sandbox sbx-none not found"},
		{name: "unknown sandbox on proxy", method: http.MethodGet, path: "/v1/sandboxes/sbx-none/sessions", status: 404, message: "sandbox sbx-none not found"},
		{name: "bad state", method: http.MethodGet, path: "/v1/sandboxes?state=zombie", status: 400, message: "state:"},
		{name: "bad label", method: http.MethodGet, path: "/v1/sandboxes?label=novalue", status: 400, message: "label:"},
		{name: "bad limit", method: http.MethodGet, path: "/v1/sandboxes?limit=0", status: 400, message: "limit:"},
		{name: "bad pool filter", method: http.MethodGet, path: "/v1/sandboxes?pool=a%20b", status: 400, message: "pool:"},
		{name: "unknown route", method: http.MethodGet, path: "/v1/nothing", status: 404, message: ""},
		{name: "unknown sandbox route", method: http.MethodGet, path: "/v1/sandboxes/sbx-1/teleport", status: 404, message: ""},
		{name: "wrong method", method: http.MethodPatch, path: "/v1/sandboxes/sbx-1", status: 405, message: ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, body := call(t, tt.method, gw.URL+tt.path, testKey, nil)
			assert.Equal(t, tt.status, resp.StatusCode, "body %s", body)
			assert.Contains(t, decodeError(t, body).Message, tt.message)
		})
	}
}

func TestSandboxes_Pools(t *testing.T) {
	gw := startGateway(t, newFakeManager(""), nil)
	resp, body := call(t, http.MethodGet, gw.URL+"/v1/pools", testKey, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.JSONEq(t, `{"pools": [{"name": "default", "provider": "process", "image": "host", "cpu": 0, "memory": 512, "memory_mib": 512,
		"min_warm": 2, "max_total": 16, "default_lease_seconds": 600, "max_lease_seconds": 3600,
		"ready": 2, "launching": 0, "leased": 1, "stopping": 0}]}`, string(body))
	assert.NotContains(t, string(body), "SECRET", "pool env is not exposed")
}

func TestSandboxes_PoolsReportDisk(t *testing.T) {
	mgr := newFakeManager("")
	mgr.PoolsFn = func(context.Context) ([]warmpool.PoolStatus, error) {
		return []warmpool.PoolStatus{{PoolConfig: warmpool.PoolConfig{Name: "small", Provider: "docker", Image: "img",
			CPU: 0.5, Memory: 64, Disk: 2048, MinWarm: 1, MaxTotal: 2, DefaultLeaseSeconds: 60, MaxLeaseSeconds: 60}}}, nil
	}
	gw := startGateway(t, mgr, nil)
	resp, body := call(t, http.MethodGet, gw.URL+"/v1/pools", testKey, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.JSONEq(t, `{"pools": [{"name": "small", "provider": "docker", "image": "img", "cpu": 0.5, "memory": 64, "memory_mib": 64, "disk_mib": 2048,
		"min_warm": 1, "max_total": 2, "default_lease_seconds": 60, "max_lease_seconds": 60,
		"ready": 0, "launching": 0, "leased": 0, "stopping": 0}]}`, string(body))
}

func TestReadyz_StoreDownIs503(t *testing.T) {
	mgr := newFakeManager("")
	mgr.PoolsFn = func(context.Context) ([]warmpool.PoolStatus, error) { return nil, warmpool.ErrUnavailable }
	gw := startGateway(t, mgr, nil)
	resp, body := call(t, http.MethodGet, gw.URL+"/readyz", "", nil)
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	assert.Equal(t, "unavailable", decodeError(t, body).Code)
	assert.NotEmpty(t, resp.Header.Get("Retry-After"))
}

func TestGateway_RestartKeepsLeasesUsable(t *testing.T) {
	mgr := newFakeManager("http://127.0.0.1:1")
	first := startGateway(t, mgr, nil)
	resp, body := callJSON(t, http.MethodPost, first.URL+"/v1/sandboxes", testKey, map[string]any{})
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	id := decode[api.Sandbox](t, body).ID
	ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
	defer cancel()
	require.NoError(t, first.Shutdown(ctx))

	// A new gateway over the same store serves the lease: nothing that
	// matters lived in the first one.
	second := startGateway(t, mgr, nil)
	resp, body = call(t, http.MethodPost, second.URL+"/v1/sandboxes/"+id+"/heartbeat", testKey, nil)
	assert.Equal(t, http.StatusOK, resp.StatusCode, "body %s", body)
}

func TestBody_UnreadLargeBodyClosesConnection(t *testing.T) {
	gw := startGateway(t, newFakeManager(""), nil)
	tests := []struct {
		name      string
		size      int
		wantClose bool
	}{
		{name: "small unread body is drained", size: 1 << 10, wantClose: false},
		{name: "large unread body closes", size: 1 << 20, wantClose: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// No key: the answer (401) comes before the body is read.
			resp, body := call(t, http.MethodPut, gw.URL+"/v1/sandboxes/sbx-1/files?path=x", "", bytes.NewReader(make([]byte, tt.size)))
			assert.Equal(t, http.StatusUnauthorized, resp.StatusCode, "body %s", body)
			assert.Equal(t, tt.wantClose, resp.Close)
			resp, _ = call(t, http.MethodGet, gw.URL+"/healthz", "", nil)
			assert.Equal(t, http.StatusOK, resp.StatusCode, "the next request is parsed correctly")
		})
	}
}
