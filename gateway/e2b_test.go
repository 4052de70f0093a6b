package gateway

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/checkpoints"
	"github.com/quarryhq/quarry/e2bcompat"
	"github.com/quarryhq/quarry/warmpool"
)

// e2bCall calls E2B's control plane with key as X-API-KEY (none when
// empty) and a JSON body (none when "").
func e2bCall(t *testing.T, gw *testGateway, method, path, key, body string) (*http.Response, []byte) {
	t.Helper()
	var hdr []string
	if key != "" {
		hdr = append(hdr, e2bcompat.HeaderAPIKey, key)
	}
	if body == "" {
		return call(t, method, gw.URL+path, "", nil, hdr...)
	}
	return call(t, method, gw.URL+path, "", strings.NewReader(body), append(hdr, "Content-Type", "application/json")...)
}

// e2bError decodes E2B's error body and checks that its code is the status.
func e2bError(t *testing.T, resp *http.Response, b []byte) e2bcompat.Error {
	t.Helper()
	e := decode[e2bcompat.Error](t, b)
	assert.Equal(t, resp.StatusCode, e.Code, "%s", b)
	assert.NotEmpty(t, e.Message)
	return e
}

// lease returns the fake's stored lease id.
func (m *fakeManager) lease(id string) warmpool.Lease {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.leases[id]
}

func TestE2B_Create(t *testing.T) {
	mgr := newFakeManager(refusedURL(t))
	gw := startGateway(t, mgr, nil)
	for _, path := range []string{"/sandboxes", "/v2/sandboxes"} {
		t.Run(path, func(t *testing.T) {
			resp, b := e2bCall(t, gw, http.MethodPost, path, testKey,
				`{"templateID": "base", "timeout": 120, "metadata": {"run": "7"}, "envVars": {"A": "1"}, "secure": true, "autoPause": false, "mcp": null}`)
			require.Equal(t, http.StatusCreated, resp.StatusCode, "%s", b)
			sbx := decode[map[string]any](t, b)
			id, _ := sbx["sandboxID"].(string)
			l := mgr.lease(id)
			require.NotEmpty(t, l.ID, "a lease: %s", b)
			assert.Equal(t, "default", l.Pool, "base is the default pool")
			assert.Equal(t, 2*time.Minute, l.Duration)
			assert.Equal(t, map[string]string{"run": "7"}, l.Labels)
			assert.Equal(t, map[string]string{"A": "1"}, l.Env)
			assert.Equal(t, OwnerOf(testKey), l.Owner)
			assert.Equal(t, "base", sbx["templateID"])
			assert.Equal(t, e2bcompat.EnvdVersion, sbx["envdVersion"])
			assert.Equal(t, gw.envdToken(l), sbx["envdAccessToken"])
			assert.NotEmpty(t, sbx["clientID"])
			assert.Contains(t, sbx, "domain")
			assert.Nil(t, sbx["domain"], "no QUARRY_E2B_DOMAIN: null")
		})
	}

	// A pool by name; refusals in E2B's body.
	resp, b := e2bCall(t, gw, http.MethodPost, "/sandboxes", testKey, `{"templateID": "gpu"}`)
	require.Equal(t, http.StatusCreated, resp.StatusCode, "%s", b)
	assert.Equal(t, "gpu", mgr.lease(decode[e2bcompat.Sandbox](t, b).SandboxID).Pool)
	for _, tc := range []struct{ name, key, body, msg string }{
		{"no template", testKey, `{"timeout": 5}`, "templateID"},
		{"no body", testKey, "", "body"},
		{"malformed", testKey, `{"templateID": `, "malformed JSON"},
		{"negative timeout", testKey, `{"templateID": "base", "timeout": -1}`, "timeout"},
		{"volumes", testKey, `{"templateID": "base", "volumeMounts": [{"name": "v", "path": "/v"}]}`, "volumeMounts"},
		{"mcp", testKey, `{"templateID": "base", "mcp": {"x": {}}}`, "mcp"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, b := e2bCall(t, gw, http.MethodPost, "/sandboxes", tc.key, tc.body)
			assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "%s", b)
			assert.Contains(t, e2bError(t, resp, b).Message, tc.msg)
		})
	}
	resp, b = e2bCall(t, gw, http.MethodPost, "/sandboxes", "", `{"templateID": "base"}`)
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	assert.Contains(t, e2bError(t, resp, b).Message, "X-API-KEY")
	resp, b = e2bCall(t, gw, http.MethodPost, "/sandboxes", "e2b_00", `{"templateID": "base"}`)
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	assert.Equal(t, "unauthorized", e2bError(t, resp, b).ErrorCode)
	// Quarry's Authorization: Bearer is not E2B's credential.
	resp, _ = call(t, http.MethodPost, gw.URL+"/sandboxes", testKey, strings.NewReader(`{"templateID": "base"}`))
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)
}

func TestE2B_CreateAnswersTheDomain(t *testing.T) {
	mgr := newFakeManager(refusedURL(t))
	gw := startGateway(t, mgr, func(c *Config) { c.E2BDomain = "sbx.example.com" })
	resp, b := e2bCall(t, gw, http.MethodPost, "/sandboxes", testKey, `{"templateID": "base"}`)
	require.Equal(t, http.StatusCreated, resp.StatusCode, "%s", b)
	assert.Equal(t, "sbx.example.com", *decode[e2bcompat.Sandbox](t, b).Domain)

	for _, bad := range []string{"https://x.example", "x.example:0", "x.example:65536", "x.example:", "x.example:8443/p", ":8443", "x.example:08443"} {
		_, err := New(Config{APIKeys: []string{testKey}, E2BDomain: bad}, Deps{Manager: mgr})
		assert.ErrorContains(t, err, "QUARRY_E2B_DOMAIN", bad)
	}
	_, err := New(Config{APIKeys: []string{testKey}, E2BDomain: "sbx.localhost:8443"}, Deps{Manager: mgr})
	assert.NoError(t, err, "a domain with a port")
}

// TestE2B_TokenOpensTheDataPlane: the envdAccessToken a create answers
// reaches the sandbox's envd through the gateway, as the SDK sends it.
func TestE2B_TokenOpensTheDataPlane(t *testing.T) {
	s := newEnvdSetup(t)
	s.mgr.Generation = s.lease.Generation
	resp, b := e2bCall(t, s.gw, http.MethodPost, "/sandboxes", testKey, `{"templateID": "base"}`)
	require.Equal(t, http.StatusCreated, resp.StatusCode, "%s", b)
	sbx := decode[e2bcompat.Sandbox](t, b)
	resp, b = envdCall(t, s.gw, http.MethodGet, "/health", "", nil,
		append(routed(sbx.SandboxID, e2bcompat.EnvdPort), e2bcompat.HeaderAccessToken, sbx.EnvdAccessToken)...)
	assert.Equal(t, http.StatusNoContent, resp.StatusCode, "%s", b)

	// Connect answers the same token; a killed sandbox's no longer works.
	resp, b = e2bCall(t, s.gw, http.MethodPost, "/sandboxes/"+sbx.SandboxID+"/connect", testKey, `{"timeout": 60}`)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
	assert.Equal(t, sbx.EnvdAccessToken, decode[e2bcompat.Sandbox](t, b).EnvdAccessToken)
	resp, _ = e2bCall(t, s.gw, http.MethodDelete, "/sandboxes/"+sbx.SandboxID, testKey, "")
	require.Equal(t, http.StatusNoContent, resp.StatusCode)
	resp, _ = envdCall(t, s.gw, http.MethodGet, "/health", "", nil,
		append(routed(sbx.SandboxID, e2bcompat.EnvdPort), e2bcompat.HeaderAccessToken, sbx.EnvdAccessToken)...)
	assert.Equal(t, http.StatusBadGateway, resp.StatusCode, "is_running() reads 502 as not running")
}

func TestE2B_ConnectTimeoutRefresh(t *testing.T) {
	mgr := newFakeManager(refusedURL(t))
	gw := startGateway(t, mgr, nil)
	l := mgr.addLease(warmpool.NewLeaseID(), testKey, mgr.AgentURL, 1) // expires in 10 minutes
	sbx := "/sandboxes/" + l.ID
	near := func(want time.Time) {
		t.Helper()
		got := mgr.lease(l.ID).ExpiresAt
		assert.WithinDuration(t, want, got, 5*time.Second)
	}

	// Connect only extends.
	resp, b := e2bCall(t, gw, http.MethodPost, sbx+"/connect", testKey, `{"timeout": 60}`)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
	assert.Equal(t, l.ID, decode[e2bcompat.Sandbox](t, b).SandboxID)
	near(l.ExpiresAt)
	assert.Empty(t, mgr.Calls("SetExpiry"), "a shorter timeout leaves the expiry")
	resp, _ = e2bCall(t, gw, http.MethodPost, "/v2"+sbx+"/connect", testKey, `{"timeout": 3600}`)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	near(time.Now().Add(time.Hour))
	resp, _ = e2bCall(t, gw, http.MethodPost, "/v2"+sbx+"/connect", testKey, "")
	assert.Equal(t, http.StatusOK, resp.StatusCode, "v2's body is optional")

	// The timeout sets the expiry from now, sooner too.
	resp, _ = e2bCall(t, gw, http.MethodPost, sbx+"/timeout", testKey, `{"timeout": 30}`)
	require.Equal(t, http.StatusNoContent, resp.StatusCode)
	near(time.Now().Add(30 * time.Second))
	resp, b = e2bCall(t, gw, http.MethodPost, sbx+"/timeout", testKey, `{}`)
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	assert.Contains(t, e2bError(t, resp, b).Message, "timeout")
	resp, _ = e2bCall(t, gw, http.MethodPost, sbx+"/timeout", testKey, `{"timeout": 99999999}`)
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)

	// Refresh: by a duration, or a heartbeat.
	resp, _ = e2bCall(t, gw, http.MethodPost, sbx+"/refreshes", testKey, `{"duration": 600}`)
	require.Equal(t, http.StatusNoContent, resp.StatusCode)
	near(time.Now().Add(10 * time.Minute))
	resp, _ = e2bCall(t, gw, http.MethodPost, sbx+"/refreshes", testKey, "")
	require.Equal(t, http.StatusNoContent, resp.StatusCode)
	assert.Len(t, mgr.Calls("Heartbeat"), 1)
	resp, _ = e2bCall(t, gw, http.MethodPost, sbx+"/refreshes", testKey, `{"duration": 3601}`)
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)

	// Another owner's, an unknown and an ended sandbox are 404.
	ended := mgr.addLease(warmpool.NewLeaseID(), testKey, mgr.AgentURL, 1)
	ended.State = warmpool.LeaseExpired
	mgr.put(ended)
	for _, tc := range []struct{ name, key, id string }{
		{"another owner's", otherKey, l.ID}, {"unknown", testKey, "sbx-none"}, {"ended", testKey, ended.ID},
	} {
		for _, op := range []struct{ method, path, body string }{
			{http.MethodPost, "/connect", `{"timeout": 60}`}, {http.MethodPost, "/timeout", `{"timeout": 60}`},
			{http.MethodPost, "/refreshes", ""}, {http.MethodGet, "", ""}, {http.MethodDelete, "", ""},
		} {
			resp, b := e2bCall(t, gw, op.method, "/sandboxes/"+tc.id+op.path, tc.key, op.body)
			assert.Equal(t, http.StatusNotFound, resp.StatusCode, "%s %s %s: %s", tc.name, op.method, op.path, b)
			e2bError(t, resp, b)
		}
	}
	resp, _ = e2bCall(t, gw, http.MethodGet, "/sandboxes/.bad", testKey, "")
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
}

func TestE2B_GetKillLogsMetricsPause(t *testing.T) {
	mgr := newFakeManager(refusedURL(t))
	gw := startGateway(t, mgr, func(c *Config) { c.E2BDomain = "sbx.example.com" })
	l := mgr.addLease(warmpool.NewLeaseID(), testKey, mgr.AgentURL, 1)
	l.Labels = map[string]string{"a": "1"}
	mgr.put(l)
	sbx := "/sandboxes/" + l.ID

	resp, b := e2bCall(t, gw, http.MethodGet, sbx, testKey, "")
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
	d := decode[e2bcompat.SandboxDetail](t, b)
	assert.Equal(t, l.ID, d.SandboxID)
	assert.Equal(t, "default", d.TemplateID)
	assert.Equal(t, e2bcompat.StateRunning, d.State)
	assert.Equal(t, l.Labels, d.Metadata)
	assert.True(t, l.CreatedAt.Equal(d.StartedAt) && l.ExpiresAt.Equal(d.EndAt), "%s", b)
	assert.Equal(t, gw.envdToken(l), d.EnvdAccessToken)
	assert.Equal(t, "sbx.example.com", *d.Domain)
	assert.GreaterOrEqual(t, d.CPUCount, 1)
	assert.GreaterOrEqual(t, d.MemoryMB, 128)
	for _, f := range []string{"templateID", "sandboxID", "clientID", "startedAt", "endAt", "cpuCount", "memoryMB", "diskSizeMB", "state", "envdVersion"} {
		assert.Contains(t, decode[map[string]any](t, b), f, "SandboxDetail requires %s", f)
	}

	for path, want := range map[string]string{
		sbx + "/logs": `{"logs": [], "logEntries": []}`, "/v2" + sbx + "/logs": `{"logs": []}`, sbx + "/metrics": `[]`,
	} {
		resp, b := e2bCall(t, gw, http.MethodGet, path, testKey, "")
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", path, b)
		assert.JSONEq(t, want, string(b), path)
		resp, _ = e2bCall(t, gw, http.MethodGet, path, otherKey, "")
		assert.Equal(t, http.StatusNotFound, resp.StatusCode, path)
	}
	for _, op := range []string{"/pause", "/resume"} {
		resp, b := e2bCall(t, gw, http.MethodPost, sbx+op, testKey, `{}`)
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
		assert.Contains(t, e2bError(t, resp, b).Message, "does not")
	}

	resp, _ = e2bCall(t, gw, http.MethodDelete, sbx, testKey, "")
	require.Equal(t, http.StatusNoContent, resp.StatusCode)
	assert.Equal(t, warmpool.LeaseReleased, mgr.lease(l.ID).State)
	resp, b = e2bCall(t, gw, http.MethodDelete, sbx, testKey, "")
	assert.Equal(t, http.StatusNotFound, resp.StatusCode, "the SDK's kill answers False")
	assert.Equal(t, "gone", e2bError(t, resp, b).ErrorCode)
	resp, _ = e2bCall(t, gw, http.MethodGet, sbx, testKey, "")
	assert.Equal(t, http.StatusNotFound, resp.StatusCode)
}

func TestE2B_List(t *testing.T) {
	mgr := newFakeManager(refusedURL(t))
	var limits []int
	mgr.ListFn = func(_ context.Context, f warmpool.LeaseFilter) ([]warmpool.Lease, error) {
		limits = append(limits, f.Limit)
		assert.Equal(t, OwnerOf(testKey), f.Owner, "the caller's leases only, through the owner's index")
		assert.Equal(t, warmpool.LeaseActive, f.State)
		return mgr.listLeases(f), nil
	}
	gw := startGateway(t, mgr, nil)
	base := time.Now().Add(-time.Hour)
	var ids []string // newest first
	for i := range 5 {
		l := mgr.addLease(warmpool.NewLeaseID(), testKey, mgr.AgentURL, 1)
		l.CreatedAt = base.Add(time.Duration(i) * time.Minute)
		l.Labels = map[string]string{"job": "a b&c", "i": strconv.Itoa(i % 2)}
		mgr.put(l)
		ids = append([]string{l.ID}, ids...)
	}
	mgr.addLease(warmpool.NewLeaseID(), otherKey, mgr.AgentURL, 1)
	ended := mgr.addLease(warmpool.NewLeaseID(), testKey, mgr.AgentURL, 1)
	ended.State = warmpool.LeaseReleased
	mgr.put(ended)

	page := func(query string) ([]string, string) {
		t.Helper()
		resp, b := e2bCall(t, gw, http.MethodGet, "/v2/sandboxes"+query, testKey, "")
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", query, b)
		var out []string
		for _, s := range decode[[]e2bcompat.ListedSandbox](t, b) {
			assert.Equal(t, e2bcompat.StateRunning, s.State)
			assert.Equal(t, e2bcompat.EnvdVersion, s.EnvdVersion)
			out = append(out, s.SandboxID)
		}
		return out, resp.Header.Get(e2bcompat.HeaderNextToken)
	}
	all, next := page("")
	assert.Equal(t, ids, all, "the caller's running sandboxes, newest first")
	assert.Empty(t, next)

	// Pages of two, by X-Next-Token; each reads what it shows and one more.
	limits = nil
	var paged []string
	for q := "?limit=2"; ; {
		got, next := page(q)
		paged = append(paged, got...)
		if next == "" {
			break
		}
		q = "?limit=2&nextToken=" + url.QueryEscape(next)
	}
	assert.Equal(t, ids, paged)
	assert.Equal(t, []int{3, 5, 7}, limits)

	// Metadata as the SDK sends it: each key and value encoded, then the whole.
	md := url.Values{"metadata": {url.QueryEscape("job") + "=" + url.QueryEscape("a b&c") + "&i=1"}}.Encode()
	got, _ := page("?" + md)
	assert.Equal(t, []string{ids[1], ids[3]}, got)
	got, _ = page("?state=running,paused&startedAfter=" + url.QueryEscape(base.Add(150*time.Second).Format(time.RFC3339)))
	assert.Equal(t, ids[:2], got)
	got, _ = page("?state=paused")
	assert.Empty(t, got, "Quarry pauses none")

	for _, q := range []string{"?state=dead", "?limit=0", "?limit=101", "?nextToken=x", "?order=asc", "?startedAfter=yesterday", "?metadata=%zz"} {
		resp, b := e2bCall(t, gw, http.MethodGet, "/v2/sandboxes"+q, testKey, "")
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "%s: %s", q, b)
	}
}

// TestE2B_OpenAPIDeclaresTheStatuses: what E2B's routes answer is declared
// in openapi.json, a retryable 503 with Retry-After.
func TestE2B_OpenAPIDeclaresTheStatuses(t *testing.T) {
	doc := loadDoc(t)
	mgr := newFakeManager(refusedURL(t))
	gw := startFullGateway(t, mgr)
	live := mgr.addLease(warmpool.NewLeaseID(), testKey, mgr.AgentURL, 1)
	key := []string{e2bcompat.HeaderAPIKey, testKey}
	sbx := "/sandboxes/" + live.ID
	cases := []statusCase{
		{name: "create", method: "POST", url: "/sandboxes", hdr: key, body: `{"templateID": "base"}`, status: 201},
		{name: "create v2", method: "POST", url: "/v2/sandboxes", hdr: key, body: `{"templateID": "base"}`, status: 201},
		{name: "create bad", method: "POST", url: "/sandboxes", hdr: key, body: `{}`, status: 400},
		{name: "list", method: "GET", url: "/v2/sandboxes?limit=1", hdr: key, status: 200},
		{name: "list bad", method: "GET", url: "/v2/sandboxes?limit=0", hdr: key, status: 400},
		{name: "get", method: "GET", url: sbx, hdr: key, status: 200},
		{name: "get unknown", method: "GET", url: "/sandboxes/sbx-none", hdr: key, status: 404},
		{name: "connect", method: "POST", url: sbx + "/connect", hdr: key, body: `{"timeout": 10}`, status: 200},
		{name: "connect v2", method: "POST", url: "/v2" + sbx + "/connect", hdr: key, body: `{"timeout": 10}`, status: 200},
		{name: "timeout", method: "POST", url: sbx + "/timeout", hdr: key, body: `{"timeout": 600}`, status: 204},
		{name: "refresh", method: "POST", url: sbx + "/refreshes", hdr: key, status: 204},
		{name: "logs", method: "GET", url: sbx + "/logs", hdr: key, status: 200},
		{name: "logs v2", method: "GET", url: "/v2" + sbx + "/logs", hdr: key, status: 200},
		{name: "metrics", method: "GET", url: sbx + "/metrics", hdr: key, status: 200},
		{name: "fork agent down", method: "POST", url: sbx + "/fork", hdr: key, body: `{"count": 1}`, status: 502},
		{name: "fork bad count", method: "POST", url: sbx + "/fork", hdr: key, body: `{"count": 0}`, status: 400},
		{name: "snapshot agent down", method: "POST", url: sbx + "/snapshots", hdr: key, status: 502},
		{name: "snapshots", method: "GET", url: "/snapshots?limit=5", hdr: key, status: 200},
		{name: "delete unknown snapshot", method: "DELETE", url: "/templates/" + checkpoints.NewID(), hdr: key, status: 404},
		{name: "pause", method: "POST", url: sbx + "/pause", hdr: key, status: 400},
		{name: "resume", method: "POST", url: sbx + "/resume", hdr: key, status: 400},
		{name: "kill", method: "DELETE", url: sbx, hdr: key, status: 204},
		{name: "kill again", method: "DELETE", url: sbx, hdr: key, status: 404},
	}
	checkStatuses(t, gw, doc, cases)

	mgr.AcquireFn = func(context.Context, warmpool.AcquireRequest) (warmpool.Lease, bool, error) {
		return warmpool.Lease{}, false, warmpool.ErrNoCapacity
	}
	mgr.GetFn = func(context.Context, string, string) (warmpool.Lease, error) {
		return warmpool.Lease{}, warmpool.ErrUnavailable
	}
	checkStatuses(t, gw, doc, []statusCase{
		{name: "create no capacity", method: "POST", url: "/sandboxes", hdr: key, body: `{"templateID": "base"}`, status: 503},
		{name: "get store down", method: "GET", url: sbx, hdr: key, status: 503},
	})
}

// TestE2B_ForkAndSnapshots: E2B's fork and snapshots over checkpoints of
// the sandbox's work directory, with real agents.
func TestE2B_ForkAndSnapshots(t *testing.T) {
	agents := []*testAgent{startAgent(t), startAgent(t), startAgent(t)}
	e := startCkEnv(t, checkpoints.Config{})
	ckTree(t, e.agent.Workdir)
	want := snapshot(t, e.agent.Workdir)
	reset := e.acquireOn("sbx-e2b-", agents)

	// A fork of two: each its own sandbox with the files, then one past
	// the pool's room fails alone.
	resp, b := e2bCall(t, e.gw, http.MethodPost, "/sandboxes/sbx-1/fork", testKey, `{"count": 2, "timeout": 90}`)
	require.Equal(t, http.StatusCreated, resp.StatusCode, "%s", b)
	forks := decode[[]e2bcompat.ForkResult](t, b)
	require.Len(t, forks, 2)
	for i, f := range forks {
		require.NotNil(t, f.Sandbox, "%s", b)
		assert.Nil(t, f.Error)
		l := e.mgr.lease(f.Sandbox.SandboxID)
		assert.Equal(t, 90*time.Second, l.Duration)
		assert.Equal(t, e.gw.envdToken(l), f.Sandbox.EnvdAccessToken)
		assert.Equal(t, want, snapshot(t, agents[i].Workdir), "the fork has the source's files")
	}
	resp, b = e2bCall(t, e.gw, http.MethodPost, "/sandboxes/sbx-1/fork", testKey, `{"count": 2}`)
	require.Equal(t, http.StatusCreated, resp.StatusCode, "%s", b)
	forks = decode[[]e2bcompat.ForkResult](t, b)
	require.Len(t, forks, 2)
	assert.Equal(t, 1, countForks(forks, true))
	for _, f := range forks {
		if f.Error != nil {
			assert.Equal(t, http.StatusServiceUnavailable, f.Error.Code)
			assert.Equal(t, "no_capacity", f.Error.ErrorCode)
		}
	}
	for _, body := range []string{`{"count": 0}`, `{"count": 101}`, `{"timeout": -1}`} {
		resp, b = e2bCall(t, e.gw, http.MethodPost, "/sandboxes/sbx-1/fork", testKey, body)
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "%s: %s", body, b)
	}
	resp, _ = e2bCall(t, e.gw, http.MethodPost, "/sandboxes/sbx-none/fork", testKey, "")
	assert.Equal(t, http.StatusNotFound, resp.StatusCode)

	// A snapshot, listed, and a templateID that restores it.
	resp, b = e2bCall(t, e.gw, http.MethodPost, "/sandboxes/sbx-1/snapshots", testKey, `{"name": "mine"}`)
	require.Equal(t, http.StatusCreated, resp.StatusCode, "%s", b)
	snap := decode[e2bcompat.SnapshotInfo](t, b)
	assert.True(t, strings.HasPrefix(snap.SnapshotID, checkpoints.IDPrefix), snap.SnapshotID)
	assert.Equal(t, []string{"mine"}, snap.Names)
	for _, q := range []string{"", "?sandboxID=sbx-1", "?name=mine", "?name=" + snap.SnapshotID} {
		resp, b = e2bCall(t, e.gw, http.MethodGet, "/snapshots"+q, testKey, "")
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
		assert.Contains(t, decode[[]e2bcompat.SnapshotInfo](t, b), snap, q)
	}
	resp, b = e2bCall(t, e.gw, http.MethodGet, "/snapshots?sandboxID=sbx-other", testKey, "")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.JSONEq(t, `[]`, string(b))

	mutateTree(t, agents[0].Workdir)
	reset()
	resp, b = e2bCall(t, e.gw, http.MethodPost, "/sandboxes", testKey, `{"templateID": "`+snap.SnapshotID+`", "metadata": {"from": "snap"}}`)
	require.Equal(t, http.StatusCreated, resp.StatusCode, "%s", b)
	made := decode[e2bcompat.Sandbox](t, b)
	assert.Equal(t, snap.SnapshotID, made.TemplateID)
	assert.Equal(t, map[string]string{"from": "snap"}, e.mgr.lease(made.SandboxID).Labels)
	assert.Equal(t, want, snapshot(t, agents[0].Workdir), "the snapshot's files restored")

	// Deleted once; then it, and a template that is no snapshot, are 404.
	resp, _ = e2bCall(t, e.gw, http.MethodDelete, "/templates/"+snap.SnapshotID, testKey, "")
	assert.Equal(t, http.StatusNoContent, resp.StatusCode)
	for _, id := range []string{snap.SnapshotID, "base"} {
		resp, b = e2bCall(t, e.gw, http.MethodDelete, "/templates/"+id, testKey, "")
		assert.Equal(t, http.StatusNotFound, resp.StatusCode, "%s: %s", id, b)
	}
}

// countForks counts the forks that made a sandbox (ok) or failed.
func countForks(forks []e2bcompat.ForkResult, ok bool) int {
	n := 0
	for _, f := range forks {
		if (f.Sandbox != nil) == ok {
			n++
		}
	}
	return n
}

func TestE2B_ForkAndSnapshotsOffWithoutCheckpoints(t *testing.T) {
	mgr := newFakeManager(refusedURL(t))
	gw := startGateway(t, mgr, nil)
	l := mgr.addLease(warmpool.NewLeaseID(), testKey, mgr.AgentURL, 1)
	for _, op := range []struct{ method, path string }{
		{http.MethodPost, "/sandboxes/" + l.ID + "/fork"}, {http.MethodPost, "/sandboxes/" + l.ID + "/snapshots"},
		{http.MethodGet, "/snapshots"}, {http.MethodDelete, "/templates/" + checkpoints.NewID()},
	} {
		resp, b := e2bCall(t, gw, op.method, op.path, testKey, "")
		assert.Equal(t, http.StatusNotFound, resp.StatusCode, "%s %s: %s", op.method, op.path, b)
		assert.Contains(t, e2bError(t, resp, b).Message, "no checkpoint store")
	}
	// A checkpoint id is then taken for a pool's name.
	resp, _ := e2bCall(t, gw, http.MethodPost, "/sandboxes", testKey, `{"templateID": "`+checkpoints.NewID()+`"}`)
	assert.Equal(t, http.StatusCreated, resp.StatusCode)
}
