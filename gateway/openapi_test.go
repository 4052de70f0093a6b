package gateway

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/api"
	"github.com/quarryhq/quarry/checkpoints"
	"github.com/quarryhq/quarry/checkpoints/filestore"
	"github.com/quarryhq/quarry/e2bcompat"
	"github.com/quarryhq/quarry/envs"
	"github.com/quarryhq/quarry/modelservice"
	"github.com/quarryhq/quarry/warmpool"
)

var fiberParam = regexp.MustCompile(`:([A-Za-z]+)`)

// apiDoc is what the tests read of openapi.json.
type apiDoc struct {
	OpenAPI    string                                `json:"openapi"`
	Paths      map[string]map[string]json.RawMessage `json:"paths"`
	Components struct {
		Responses map[string]struct {
			Headers map[string]json.RawMessage `json:"headers"`
		} `json:"responses"`
	} `json:"components"`
}

// apiOp is one documented operation.
type apiOp struct {
	Method, Path string
	// Security is the operation's own security; nil: the document's
	// (apiKey).
	Security  *[]map[string][]string
	Responses map[string]struct {
		Ref     string                     `json:"$ref"`
		Headers map[string]json.RawMessage `json:"headers"`
	}
}

// auth says how the operation authenticates: "apiKey", "relayToken" or "".
func (o apiOp) auth() string {
	if o.Security == nil {
		return "apiKey"
	}
	for _, req := range *o.Security {
		for name := range req {
			return name
		}
	}
	return ""
}

// declares reports whether the operation lists status itself ("default"
// does not count).
func (o apiOp) declares(status int) bool {
	_, ok := o.Responses[strconv.Itoa(status)]
	return ok
}

// headers returns the headers the operation's answer of status declares,
// through a $ref to components.responses.
func (o apiOp) headers(doc apiDoc, status int) map[string]json.RawMessage {
	r := o.Responses[strconv.Itoa(status)]
	if name, ok := strings.CutPrefix(r.Ref, "#/components/responses/"); ok {
		return doc.Components.Responses[name].Headers
	}
	return r.Headers
}

func loadDoc(t *testing.T) apiDoc {
	t.Helper()
	var doc apiDoc
	require.NoError(t, json.Unmarshal(openAPI, &doc))
	return doc
}

// ops returns every documented operation, sorted by path and method.
func (doc apiDoc) ops(t *testing.T) []apiOp {
	t.Helper()
	var out []apiOp
	for path, item := range doc.Paths {
		for method, raw := range item {
			if method == "parameters" {
				continue
			}
			o := apiOp{Method: strings.ToUpper(method), Path: path}
			require.NoError(t, json.Unmarshal(raw, &o), "%s %s", method, path)
			out = append(out, o)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		return out[i].Path+" "+out[i].Method < out[j].Path+" "+out[j].Method
	})
	return out
}

// opFor returns the documented operation that serves method and url: the
// one whose path template matches url's path, a literal segment before a
// {param} one.
func (doc apiDoc) opFor(t *testing.T, method, url string) apiOp {
	t.Helper()
	path, _, _ := strings.Cut(url, "?")
	segs := strings.Split(path, "/")
	var best *apiOp
	bestParams := 0
	for _, o := range doc.ops(t) {
		tmpl := strings.Split(o.Path, "/")
		if o.Method != method || len(tmpl) != len(segs) {
			continue
		}
		params, match := 0, true
		for i, seg := range tmpl {
			switch {
			case strings.HasPrefix(seg, "{"):
				params++
			case seg != segs[i]:
				match = false
			}
		}
		if match && (best == nil || params < bestParams) {
			best, bestParams = &o, params
		}
	}
	require.NotNil(t, best, "%s %s is not documented", method, url)
	return *best
}

// methods returns the documented methods of path in fiber's order (the
// order of the gateway's Allow header).
func (doc apiDoc) methods(path string) []string {
	var out []string
	for _, m := range []string{"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"} {
		if _, ok := doc.Paths[path][strings.ToLower(m)]; ok {
			out = append(out, m)
		}
	}
	return out
}

// fullGateway is a gateway with every optional service: the model relay
// (memory broker), the env API and ROCK's routes (with an image table). Its
// leases' agent URL refuses connections.
type fullGateway struct {
	*testGateway
	mgr   *fakeManager
	relay *modelservice.Service
}

func startFullGateway(t *testing.T, mgr *fakeManager) *fullGateway {
	t.Helper()
	relay := newRelayService(t, mgr, nil, modelservice.Config{})
	reg, err := envs.NewRegistry([]envs.Spec{{ID: "game", Pool: "default", Command: []string{"true"}}})
	require.NoError(t, err)
	store, err := filestore.Open(filestore.Config{Dir: t.TempDir(), NoSync: true})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, store.Close()) })
	gw := startGatewayDeps(t, mgr, nil, Deps{Model: relay, Envs: reg, RockImages: map[string]string{"rock-image": "default"}, Checkpoints: store})
	return &fullGateway{testGateway: gw, mgr: mgr, relay: relay}
}

// samplePath fills path's parameters: id with id, the others with
// well-formed values (over[name] when given).
func samplePath(path, id string, over map[string]string) string {
	vals := map[string]string{"id": id, "sid": "s1", "pid": "p1", "rid": "mrq-" + strings.Repeat("0", 32), "port": "8000"}
	for k, v := range over {
		vals[k] = v
	}
	for k, v := range vals {
		path = strings.ReplaceAll(path, "{"+k+"}", v)
	}
	return path
}

// TestOpenAPI_MatchesRoutes keeps openapi.json true: every route a gateway
// with every optional service registers is documented, every documented
// operation is served, and every $ref resolves.
func TestOpenAPI_MatchesRoutes(t *testing.T) {
	gw := startFullGateway(t, newFakeManager(""))
	resp, body := call(t, http.MethodGet, gw.URL+"/openapi.json", "", nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Contains(t, resp.Header.Get("Content-Type"), "application/json")
	assert.Equal(t, openAPI, body, "the embedded document is served")

	var doc struct {
		OpenAPI string                                `json:"openapi"`
		Paths   map[string]map[string]json.RawMessage `json:"paths"`
	}
	require.NoError(t, json.Unmarshal(body, &doc))
	assert.True(t, strings.HasPrefix(doc.OpenAPI, "3."), "an OpenAPI 3 document")

	var documented []string
	for path, item := range doc.Paths {
		for method := range item {
			if method == "parameters" {
				continue
			}
			documented = append(documented, strings.ToUpper(method)+" "+path)
		}
	}
	var served []string
	for _, r := range gw.App().GetRoutes(true) {
		path := fiberParam.ReplaceAllString(r.Path, "{$1}")
		if (r.Method == http.MethodHead && !slices.Contains(documented, "HEAD "+path)) || r.Path == "/" {
			continue // fiber's automatic HEAD routes (the port proxies register theirs); the root middleware
		}
		served = append(served, r.Method+" "+path)
	}
	sort.Strings(documented)
	sort.Strings(served)
	assert.Equal(t, served, documented)
	assert.Len(t, served, len(gw.routeTable())+len(gw.rock.Routes())+len(gw.rock.GemRoutes(nil))+len(gw.rockPortRoutes())+len(gw.e2b.Routes()))

	// Every $ref points at something in the document.
	var raw map[string]any
	require.NoError(t, json.Unmarshal(body, &raw))
	refs := regexp.MustCompile(`"\$ref":\s*"#/([^"]+)"`).FindAllStringSubmatch(string(body), -1)
	require.NotEmpty(t, refs)
	for _, m := range refs {
		var node any = raw
		for _, part := range strings.Split(m[1], "/") {
			obj, ok := node.(map[string]any)
			require.True(t, ok, "ref %s", m[1])
			node, ok = obj[part]
			require.True(t, ok, "ref %s does not resolve", m[1])
		}
	}
}

// TestOpenAPI_405CarriesAllow calls every documented path with every method
// it does not list: each answers 405 method_not_allowed with an Allow header
// naming exactly the documented methods, as the document's
// MethodNotAllowed response says.
func TestOpenAPI_405CarriesAllow(t *testing.T) {
	doc := loadDoc(t)
	require.Contains(t, doc.Components.Responses, "MethodNotAllowed")
	assert.Contains(t, doc.Components.Responses["MethodNotAllowed"].Headers, "Allow")

	gw := startFullGateway(t, newFakeManager(""))
	tried := 0
	for path := range doc.Paths {
		allowed := doc.methods(path)
		require.NotEmpty(t, allowed, path)
		if path == "/v1/sandboxes/{id}/ports/{port}/url" {
			continue // its other methods are the port proxy's (.../ports/{port}/*)
		}
		url := gw.URL + samplePath(path, "sbx-1", nil)
		for _, m := range []string{"GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "TRACE", "PATCH"} {
			if slices.Contains(allowed, m) {
				continue
			}
			tried++
			resp, body := call(t, m, url, testKey, nil)
			require.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode, "%s %s: %s", m, path, body)
			assert.Equal(t, strings.Join(allowed, ", "), resp.Header.Get("Allow"), "%s %s", m, path)
			if m != http.MethodHead {
				assert.Equal(t, api.CodeMethodNotAllowed, decodeError(t, body).Code, "%s %s", m, path)
			}
		}
	}
	assert.Greater(t, tried, 2*len(doc.Paths))

	// The same path in another case or with a trailing slash is the same
	// resource, as fiber routes it; an unknown path is 404 without Allow.
	resp, _ := call(t, http.MethodPatch, gw.URL+"/V1/Sandboxes/sbx-1/", testKey, nil)
	assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
	assert.Equal(t, "GET, DELETE", resp.Header.Get("Allow"))
	for _, path := range []string{"/v1/nothing", "/v1/sandboxes/sbx-1/teleport", "/v1/sandboxes//exec", "/"} {
		resp, body := call(t, http.MethodPatch, gw.URL+path, testKey, nil)
		assert.Equal(t, http.StatusNotFound, resp.StatusCode, path)
		assert.Empty(t, resp.Header.Get("Allow"), path)
		assert.Equal(t, "not_found", decodeError(t, body).Code, path)
	}
}

// statusCase is one call and the status it must answer, which the
// document must declare for the operation.
type statusCase struct {
	name   string
	method string
	url    string // what is called: a path with its query
	key    string // bearer credential ("": none)
	body   string
	hdr    []string
	status int
}

// checkStatuses runs cases on gw and checks each status against the
// document.
func checkStatuses(t *testing.T, gw *fullGateway, doc apiDoc, cases []statusCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := doc.opFor(t, tc.method, tc.url)
			var body io.Reader
			hdr := slices.Clone(tc.hdr)
			if tc.body != "" {
				body = strings.NewReader(tc.body)
				hdr = append(hdr, "Content-Type", "application/json")
			}
			resp, got := call(t, tc.method, gw.URL+tc.url, tc.key, body, hdr...)
			assert.Equal(t, tc.status, resp.StatusCode, "%s %s: %s", tc.method, tc.url, got)
			assert.True(t, o.declares(resp.StatusCode), "%s %s answered %d, which openapi.json does not declare: %s",
				o.Method, o.Path, resp.StatusCode, got)
			if resp.StatusCode == http.StatusServiceUnavailable {
				assert.NotEmpty(t, resp.Header.Get("Retry-After"), "a 503 carries Retry-After")
				assert.Contains(t, o.headers(doc, http.StatusServiceUnavailable), "Retry-After", "%s %s", o.Method, o.Path)
			}
		})
	}
}

// sweep builds one case per documented operation that keep selects, with
// the path's parameters filled by samplePath(id, over) and the credential
// of the operation's security.
func sweep(t *testing.T, gw *fullGateway, doc apiDoc, name, id string, over map[string]string,
	keep func(o apiOp) (status int, ok bool)) []statusCase {
	t.Helper()
	var cases []statusCase
	for _, o := range doc.ops(t) {
		status, ok := keep(o)
		if !ok {
			continue
		}
		tc := statusCase{name: name + " " + o.Method + " " + o.Path, method: o.Method,
			url: samplePath(o.Path, id, over), status: status}
		switch o.auth() {
		case "apiKey":
			tc.key = testKey
		case "relayToken":
			tc.key = gw.relay.LeaseEnv(id, "")["OPENAI_API_KEY"]
		case "e2bApiKey":
			tc.hdr = []string{e2bcompat.HeaderAPIKey, testKey}
		}
		switch {
		case strings.HasSuffix(o.Path, "/env/step"):
			tc.body = `{"action": 1}` // a step without an action is refused before the lease is read
		case strings.HasSuffix(o.Path, "/restore"):
			tc.body = `{"checkpoint": "` + checkpoints.NewID() + `"}` // as is a restore without a checkpoint
		case strings.HasSuffix(o.Path, "/fork"):
			tc.body = `{"count": 2}` // and a fork without a count
		}
		cases = append(cases, tc)
	}
	require.NotEmpty(t, cases, name)
	return cases
}

func inSandbox(o apiOp) bool { return strings.HasPrefix(o.Path, "/v1/sandboxes/{id}") }

// TestOpenAPI_DeclaresWhatTheServerAnswers calls every operation into a
// sandbox in the ways that end early (ended lease, unknown sandbox, bad
// path parameter, no credentials, store down) and samples bad queries: each
// answers the status it must, and openapi.json declares that status for the
// operation.
func TestOpenAPI_DeclaresWhatTheServerAnswers(t *testing.T) {
	doc := loadDoc(t)
	mgr := newFakeManager("")
	gw := startFullGateway(t, mgr)
	agentURL := refusedURL(t)
	mgr.addLease("sbx-live", testKey, agentURL, 1)
	ended := mgr.addLease("sbx-ended", testKey, agentURL, 1)
	ended.State, ended.Reason = warmpool.LeaseReleased, "released by its owner"
	mgr.put(ended)

	t.Run("ended lease is 410", func(t *testing.T) {
		checkStatuses(t, gw, doc, sweep(t, gw, doc, "ended", "sbx-ended", nil, func(o apiOp) (int, bool) {
			switch {
			case !inSandbox(o):
				return 0, false
			case o.Method == http.MethodGet && (o.Path == "/v1/sandboxes/{id}" || o.Path == "/v1/sandboxes/{id}/model/transcript"):
				return http.StatusOK, true // these read a sandbox in any state
			}
			return http.StatusGone, true
		}))
	})
	t.Run("unknown sandbox is 404", func(t *testing.T) {
		checkStatuses(t, gw, doc, sweep(t, gw, doc, "unknown", "sbx-none", nil, func(o apiOp) (int, bool) {
			return http.StatusNotFound, inSandbox(o)
		}))
	})
	t.Run("bad path parameter is 400", func(t *testing.T) {
		for _, param := range []string{"id", "sid", "pid", "rid"} {
			over := map[string]string{param: ".bad"}
			id := "sbx-live"
			if param == "id" {
				id = ".bad"
			}
			checkStatuses(t, gw, doc, sweep(t, gw, doc, param, id, over, func(o apiOp) (int, bool) {
				return http.StatusBadRequest, strings.Contains(o.Path, "{"+param+"}")
			}))
		}
		checkStatuses(t, gw, doc, sweep(t, gw, doc, "rid not mrq", "sbx-live", map[string]string{"rid": "sbx-live"}, func(o apiOp) (int, bool) {
			return http.StatusBadRequest, strings.Contains(o.Path, "{rid}")
		}))
	})
	t.Run("no credentials is 401", func(t *testing.T) {
		cases := sweep(t, gw, doc, "anonymous", "sbx-live", nil, func(o apiOp) (int, bool) {
			return http.StatusUnauthorized, o.auth() != ""
		})
		for i := range cases {
			cases[i].key, cases[i].hdr = "", nil
		}
		checkStatuses(t, gw, doc, cases)
		resp, body := call(t, http.MethodPost, gw.URL+"/apis/envs/sandbox/v1/execute", "", strings.NewReader(`{}`))
		require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
		assert.JSONEq(t, `"Failed"`, string(decode[map[string]json.RawMessage](t, body)["status"]), "ROCK's 401 is its envelope")
	})

	rid := "mrq-" + strings.Repeat("0", 32)
	rockEnded := mgr.addLease(warmpool.NewLeaseID(), testKey, agentURL, 1)
	rockEnded.State = warmpool.LeaseExpired
	mgr.put(rockEnded)
	rockBody := `{"sandbox_id": "` + rockEnded.ID + `", "command": "true", "path": "/etc/hostname"}`
	checkStatuses(t, gw, doc, []statusCase{
		{name: "list bad state", method: "GET", url: "/v1/sandboxes?state=zombie", key: testKey, status: 400},
		{name: "list limit 0", method: "GET", url: "/v1/sandboxes?limit=0", key: testKey, status: 400},
		{name: "list limit 1001", method: "GET", url: "/v1/sandboxes?limit=1001", key: testKey, status: 400},
		{name: "list limit 1000", method: "GET", url: "/v1/sandboxes?limit=1000", key: testKey, status: 200},
		{name: "list label without =", method: "GET", url: "/v1/sandboxes?label=novalue", key: testKey, status: 400},
		{name: "list labels", method: "GET", url: "/v1/sandboxes?label=a=1&label=b=x=y", key: testKey, status: 200},
		{name: "list bad pool", method: "GET", url: "/v1/sandboxes?pool=-x", key: testKey, status: 400},
		{name: "create unknown field", method: "POST", url: "/v1/sandboxes", key: testKey, body: `{"image": "x"}`, status: 400},
		{name: "create bad idempotency key", method: "POST", url: "/v1/sandboxes", key: testKey, hdr: []string{"Idempotency-Key", strings.Repeat("k", 256)}, status: 400},
		{name: "create", method: "POST", url: "/v1/sandboxes", key: testKey, body: `{}`, status: 201},
		{name: "heartbeat with fields", method: "POST", url: "/v1/sandboxes/sbx-live/heartbeat", key: testKey, body: `{"lease_seconds": 5}`, status: 400},
		{name: "claim wait_ms -1", method: "GET", url: "/v1/model/requests?wait_ms=-1", key: testKey, status: 400},
		{name: "claim max 0", method: "GET", url: "/v1/model/requests?max=0", key: testKey, status: 400},
		{name: "claim max over the config", method: "GET", url: "/v1/model/requests?max=1001", key: testKey, status: 400},
		{name: "claim bad label", method: "GET", url: "/v1/model/requests?label=%3Dx", key: testKey, status: 400},
		{name: "claim none waiting", method: "GET", url: "/v1/model/requests?max=2&pool=default&label=a=1", key: testKey, status: 200},
		{name: "transcript limit 0", method: "GET", url: "/v1/sandboxes/sbx-live/model/transcript?limit=0", key: testKey, status: 400},
		{name: "transcript bad after", method: "GET", url: "/v1/sandboxes/sbx-live/model/transcript?after=sbx-1", key: testKey, status: 400},
		{name: "respond status not a number", method: "POST", url: "/v1/model/requests/" + rid + "/response?status=ok", key: testKey, body: `{}`, status: 400},
		{name: "respond status 302", method: "POST", url: "/v1/model/requests/" + rid + "/response?status=302", key: testKey, body: `{}`, status: 400},
		{name: "respond unknown request", method: "POST", url: "/v1/model/requests/" + rid + "/response?status=500", key: testKey, body: `{}`, status: 404},
		{name: "make unknown env", method: "POST", url: "/v1/envs", key: testKey, body: `{"env_id": "nope"}`, status: 400},
		{name: "step without action", method: "POST", url: "/v1/sandboxes/sbx-live/env/step", key: testKey, body: `{}`, status: 400},
		{name: "reset of a sandbox that is no env", method: "POST", url: "/v1/sandboxes/sbx-live/env/reset", key: testKey, status: 409},
		{name: "agent down", method: "GET", url: "/v1/sandboxes/sbx-live/sessions", key: testKey, status: 502},
		{name: "checkpoint agent down", method: "POST", url: "/v1/sandboxes/sbx-live/checkpoints", key: testKey, body: `{}`, status: 502},
		{name: "checkpoint bad label", method: "POST", url: "/v1/sandboxes/sbx-live/checkpoints", key: testKey, body: `{"labels": {"a=b": "c"}}`, status: 400},
		{name: "restore without checkpoint", method: "POST", url: "/v1/sandboxes/sbx-live/restore", key: testKey, body: `{}`, status: 400},
		{name: "restore unknown checkpoint", method: "POST", url: "/v1/sandboxes/sbx-live/restore", key: testKey, body: `{"checkpoint": "ckp-x"}`, status: 404},
		{name: "fork count 0", method: "POST", url: "/v1/sandboxes/sbx-live/fork", key: testKey, body: `{"count": 0}`, status: 400},
		{name: "fork count 101", method: "POST", url: "/v1/sandboxes/sbx-live/fork", key: testKey, body: `{"count": 101}`, status: 400},
		{name: "fork agent down", method: "POST", url: "/v1/sandboxes/sbx-live/fork", key: testKey, body: `{"count": 1}`, status: 502},
		{name: "checkpoints", method: "GET", url: "/v1/checkpoints?label=a=1&limit=5", key: testKey, status: 200},
		{name: "checkpoints limit 0", method: "GET", url: "/v1/checkpoints?limit=0", key: testKey, status: 400},
		{name: "checkpoints limit 1001", method: "GET", url: "/v1/checkpoints?limit=1001", key: testKey, status: 400},
		{name: "checkpoints bad label", method: "GET", url: "/v1/checkpoints?label=novalue", key: testKey, status: 400},
		{name: "checkpoint unknown", method: "GET", url: "/v1/checkpoints/" + checkpoints.NewID(), key: testKey, status: 404},
		{name: "checkpoint bad id", method: "GET", url: "/v1/checkpoints/.x", key: testKey, status: 400},
		{name: "checkpoint delete unknown", method: "DELETE", url: "/v1/checkpoints/" + checkpoints.NewID(), key: testKey, status: 204},
		{name: "create from unknown checkpoint", method: "POST", url: "/v1/sandboxes", key: testKey, body: `{"from_checkpoint": "` + checkpoints.NewID() + `"}`, status: 404},
		{name: "make env from unknown checkpoint", method: "POST", url: "/v1/envs", key: testKey, body: `{"env_id": "game", "from_checkpoint": "` + checkpoints.NewID() + `"}`, status: 404},

		// ROCK answers its failures as HTTP 200 (status Failed), except read_file.
		{name: "rock get_status bad id", method: "GET", url: "/apis/envs/sandbox/v1/get_status?sandbox_id=a%20b", key: testKey, status: 200},
		{name: "rock execute ended", method: "POST", url: "/apis/envs/sandbox/v1/execute", key: testKey, body: rockBody, status: 200},
		{name: "rock read_file ended", method: "POST", url: "/apis/envs/sandbox/v1/read_file", key: testKey, body: rockBody, status: 410},
		{name: "rock read_file no body", method: "POST", url: "/apis/envs/sandbox/v1/read_file", key: testKey, status: 400},
		{name: "gem make without env_id", method: "POST", url: "/apis/v1/envs/gem/make", key: testKey, body: `{}`, status: 400},
		{name: "gem step ended", method: "POST", url: "/apis/v1/envs/gem/step", key: testKey, body: `{"sandbox_id": "sbx-ended", "action": 1}`, status: 410},
	})

	// ROCK's failure at HTTP 200 is the envelope the document describes.
	resp, body := call(t, http.MethodPost, gw.URL+"/apis/envs/sandbox/v1/execute", testKey, strings.NewReader(rockBody))
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var env struct {
		Status string `json:"status"`
		Result struct {
			Code int `json:"code"`
		} `json:"result"`
	}
	require.NoError(t, json.Unmarshal(body, &env))
	assert.Equal(t, "Failed", env.Status)
	assert.Equal(t, 4000, env.Result.Code)
}

// TestOpenAPI_StoreDownIs503WithRetryAfter: with the lease store down,
// every operation that reads it answers 503 with Retry-After, declared (with
// the header) in the document.
func TestOpenAPI_StoreDownIs503WithRetryAfter(t *testing.T) {
	doc := loadDoc(t)
	mgr := newFakeManager("")
	down := func() error { return warmpool.ErrUnavailable }
	mgr.AcquireFn = func(context.Context, warmpool.AcquireRequest) (warmpool.Lease, bool, error) {
		return warmpool.Lease{}, false, down()
	}
	mgr.GetFn = func(context.Context, string, string) (warmpool.Lease, error) { return warmpool.Lease{}, down() }
	mgr.HeartbeatFn = mgr.GetFn
	mgr.ReleaseFn = mgr.GetFn
	mgr.ListFn = func(context.Context, warmpool.LeaseFilter) ([]warmpool.Lease, error) { return nil, down() }
	mgr.PoolsFn = func(context.Context) ([]warmpool.PoolStatus, error) { return nil, down() }
	gw := startFullGateway(t, mgr)
	cases := sweep(t, gw, doc, "store down", "sbx-1", nil, func(o apiOp) (int, bool) {
		// The relay's sandbox side reads leases through the relay, not the manager.
		return http.StatusServiceUnavailable, inSandbox(o) && o.auth() == "apiKey"
	})
	cases = append(cases,
		statusCase{name: "readyz", method: "GET", url: "/readyz", status: 503},
		statusCase{name: "pools", method: "GET", url: "/v1/pools", key: testKey, status: 503},
		statusCase{name: "list", method: "GET", url: "/v1/sandboxes", key: testKey, status: 503},
		statusCase{name: "create", method: "POST", url: "/v1/sandboxes", key: testKey, status: 503},
		statusCase{name: "make env", method: "POST", url: "/v1/envs", key: testKey, body: `{"env_id": "game"}`, status: 503},
	)
	checkStatuses(t, gw, doc, cases)
}

// TestOpenAPI_ErrorCodesAreAPIs holds the Error schema's code enum to
// api.Codes(), every code Quarry's API answers: a code added in Go and
// not here (or the other way) fails.
func TestOpenAPI_ErrorCodesAreAPIs(t *testing.T) {
	var doc struct {
		Components struct {
			Schemas struct {
				Error struct {
					Properties struct {
						Error struct {
							Properties struct {
								Code struct {
									Enum []string `json:"enum"`
								} `json:"code"`
							} `json:"properties"`
						} `json:"error"`
					} `json:"properties"`
				} `json:"Error"`
			} `json:"schemas"`
		} `json:"components"`
	}
	require.NoError(t, json.Unmarshal(openAPI, &doc))
	assert.ElementsMatch(t, api.Codes(), doc.Components.Schemas.Error.Properties.Error.Properties.Code.Enum,
		"gateway/openapi.json's Error.code enum against api.Codes()")
}
