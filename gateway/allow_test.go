package gateway

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gofiber/fiber/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestAllowTable_AgreesWithFiber holds the table against fiber's own
// answer (its per-request scan of every method's routes, with the Allow
// header it builds) on an app with the gateway's routes: for every path,
// cased and slashed variants, longer, shorter and empty-segment paths, and
// every method, a 405 of fiber's is a table hit with the same Allow, and a
// 404 of fiber's is a miss.
func TestAllowTable_AgreesWithFiber(t *testing.T) {
	gw := startGateway(t, newFakeManager(""), nil) // every route is registered, services or not
	routes := gw.App().GetRoutes(true)
	table, err := newAllowTable(gw.App().Config().RequestMethods, routes)
	require.NoError(t, err)

	bare := fiber.New() // fiber's defaults, as the gateway's app: case-insensitive, not strict
	for _, r := range routes {
		bare.Add(r.Method, r.Path, func(c *fiber.Ctx) error { return c.SendStatus(http.StatusOK) })
	}
	var paths []string
	for _, r := range routes {
		p := fiberParam.ReplaceAllString(r.Path, "x1")
		paths = append(paths, p, strings.ToUpper(p), p+"/", p+"//", p+"/x", p[:strings.LastIndexByte(p, '/')],
			strings.Replace(p, "/x1", "/", 1))
	}
	paths = append(paths, "/", "/v1", "/apis", "/apis/envs/sandbox/v1", "/nothing")
	hits, misses := 0, 0
	for _, p := range paths {
		for _, m := range []string{"GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH"} {
			resp, err := bare.Test(httptest.NewRequest(m, "http://quarry.test"+p, nil), -1)
			require.NoError(t, err)
			_ = resp.Body.Close()
			allow, ok := table.lookup(p)
			switch resp.StatusCode {
			case http.StatusOK:
				assert.True(t, ok, "%s %s is served, so the table knows its path", m, p)
				assert.Contains(t, strings.Split(allow, ", "), m, "%s %s", m, p)
			case http.StatusMethodNotAllowed:
				hits++
				assert.True(t, ok, "%s %s", m, p)
				assert.Equal(t, resp.Header.Get(fiber.HeaderAllow), allow, "%s %s", m, p)
			case http.StatusNotFound:
				misses++
				assert.False(t, ok, "%s %s: fiber finds no route, the table found %q", m, p, allow)
			default:
				t.Errorf("%s %s: fiber answered %d", m, p, resp.StatusCode)
			}
		}
	}
	assert.Positive(t, hits)
	assert.Positive(t, misses)
}

func TestAllowTable_UnionOfTemplatesAndRefusals(t *testing.T) {
	methods := fiber.DefaultMethods
	table, err := newAllowTable(methods, []fiber.Route{
		{Method: "GET", Path: "/v1/things/:id"},
		{Method: "DELETE", Path: "/v1/things/:id"},
		{Method: "POST", Path: "/v1/things/special"},
		{Method: "PUT", Path: "/v1/Things"},
	})
	require.NoError(t, err)
	tests := []struct {
		name  string
		path  string
		allow string
		ok    bool
	}{
		{name: "param", path: "/v1/things/abc", allow: "GET, DELETE", ok: true},
		{name: "literal and param both match", path: "/v1/things/special", allow: "GET, POST, DELETE", ok: true},
		{name: "case and trailing slashes", path: "/V1/THINGS//", allow: "PUT", ok: true},
		{name: "empty param", path: "/v1/things//x", ok: false},
		{name: "too long", path: "/v1/things/abc/def", ok: false},
		{name: "root", path: "/", ok: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			allow, ok := table.lookup(tt.path)
			assert.Equal(t, tt.ok, ok)
			assert.Equal(t, tt.allow, allow)
		})
	}

	wild, err := newAllowTable(methods, []fiber.Route{{Method: "GET", Path: "/v1/things/:id/*"}, {Method: "POST", Path: "/v1/things/:id/x"}})
	require.NoError(t, err, "a final wildcard is modelled")
	for path, want := range map[string]string{"/v1/things/a": "GET", "/v1/things/a/": "GET", "/v1/things/a/b/c": "GET", "/v1/things/a/x": "GET, POST"} {
		allow, ok := wild.lookup(path)
		assert.True(t, ok, path)
		assert.Equal(t, want, allow, path)
	}
	for _, path := range []string{"/v1/*/x", "/v1/:id?", "/v1/file.:ext", "/v1/:a-:b", "/v1/+"} {
		_, err := newAllowTable(methods, []fiber.Route{{Method: "GET", Path: path}})
		assert.Error(t, err, "%s is not modelled: refused at start-up", path)
	}
	_, err = newAllowTable([]string{"GET"}, []fiber.Route{{Method: "POST", Path: "/x"}})
	assert.Error(t, err)
}

// BenchmarkAllowTable_Lookup: a 405's lookup costs the path's segments.
func BenchmarkAllowTable_Lookup(b *testing.B) {
	gw := startGateway(b, newFakeManager(""), nil)
	table, err := newAllowTable(gw.App().Config().RequestMethods, gw.App().GetRoutes(true))
	require.NoError(b, err)
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := table.lookup("/v1/sandboxes/sbx-1/processes/p1/output"); !ok {
			b.Fatal("no match")
		}
	}
}

// An unknown path outside /v1 is most likely a client of another API (E2B's
// SDK reads "code" and "message" of an error's body: a KeyError on Quarry's
// shape alone), calling a route of it the gateway does not serve. Its 404
// keeps Quarry's shape, adds E2B's fields and says where Quarry's API is and
// what of E2B's is served; an unknown path under /v1 answers as before.
func TestNotMatched_OutsideV1SaysWhereTheAPIIs(t *testing.T) {
	gw := startGateway(t, newFakeManager(""), nil)
	for _, tc := range []struct {
		name, method, path string
	}{
		{name: "E2B's template build", method: http.MethodPost, path: "/v3/templates"},
		{name: "E2B's network update", method: http.MethodPut, path: "/sandboxes/abc/network"},
		{name: "E2B's templates", method: http.MethodGet, path: "/templates"},
		{name: "root", method: http.MethodGet, path: "/"},
		{name: "a v1 look-alike", method: http.MethodGet, path: "/v1x/sandboxes"},
		{name: "v3", method: http.MethodPost, path: "/v3/sandboxes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := call(t, tc.method, gw.URL+tc.path, "", strings.NewReader(`{"templateID": "base"}`),
				"Content-Type", "application/json")
			require.Equal(t, http.StatusNotFound, resp.StatusCode, "%s", body)
			assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
			qe := decodeError(t, body)
			assert.Equal(t, "not_found", qe.Code)
			var e2b struct {
				Code    *int    `json:"code"`
				Message *string `json:"message"`
			}
			require.NoError(t, json.Unmarshal(body, &e2b), "%s", body)
			require.NotNil(t, e2b.Code, "a top-level int code: %s", body)
			require.NotNil(t, e2b.Message, "a top-level message: %s", body)
			assert.Equal(t, http.StatusNotFound, *e2b.Code)
			assert.Equal(t, qe.Message, *e2b.Message)
			for _, want := range []string{tc.method + " " + tc.path, "/v1/", "POST /v1/sandboxes", "/openapi.json", "docs/API.md", "docs/E2B.md"} {
				assert.Contains(t, qe.Message, want)
			}
		})
	}
	for _, path := range []string{"/v1/nothing", "/V1/sandboxes/sbx-1/teleport", "/v1"} {
		resp, body := call(t, http.MethodPost, gw.URL+path, testKey, nil)
		require.Equal(t, http.StatusNotFound, resp.StatusCode, "%s: %s", path, body)
		assert.JSONEq(t, `{"error": {"code": "not_found", "message": "Cannot POST `+path+`"}}`, string(body), path)
	}
}
