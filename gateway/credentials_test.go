package gateway

import (
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRoutes_EveryRouteHasACredential: every route the gateway registers
// names its credential, the one openapi.json declares for its operation,
// and the middleware that checks it exists.
func TestRoutes_EveryRouteHasACredential(t *testing.T) {
	gw := startFullGateway(t, newFakeManager(""))
	doc := loadDoc(t)
	declared := map[string]string{} // "METHOD /path" → its security, as credential.String names it
	for _, o := range doc.ops(t) {
		sec := o.auth()
		if o.Security != nil && len(*o.Security) == 2 {
			sec = "apiKey|previewToken"
		}
		if sec == "" {
			sec = "none"
		}
		declared[o.Method+" "+o.Path] = sec
	}
	param := regexp.MustCompile(`:(\w+)`)
	all := gw.allRoutes()
	require.NotEmpty(t, all)
	for _, rt := range all {
		key := rt.method + " " + param.ReplaceAllString(rt.path, "{$1}")
		if _, ok := declared[key]; !ok && strings.HasSuffix(key, "*") {
			key = strings.TrimSuffix(key, "*") + "{path}" // how the port routes are documented
		}
		if !assert.NotZero(t, rt.cred, "%s has no credential", key) {
			continue
		}
		assert.NotPanics(t, func() { gw.admit(rt.cred) }, key)
		if want, ok := declared[key]; assert.True(t, ok, "%s is not in openapi.json", key) {
			assert.Equal(t, want, rt.cred.String(), "%s: the credential openapi.json declares", key)
		}
	}
	assert.Panics(t, func() { gw.admit(0) }, "a route without a credential is a programming error")
}

// TestRoutes_CredentialCheckedBeforeHandler: a route whose credential is
// missing answers 401 before its handler reads anything (a bad id would
// otherwise be a 400, an unknown sandbox a 404).
func TestRoutes_CredentialCheckedBeforeHandler(t *testing.T) {
	gw := startFullGateway(t, newFakeManager(""))
	for _, tc := range []struct{ name, method, path string }{
		{"api key", http.MethodGet, "/v1/sandboxes/bad%20id"},
		{"api key or websocket", http.MethodGet, "/v1/sandboxes/bad%20id/pty"},
		{"relay token", http.MethodGet, "/v1/sandboxes/sbx-1/model/v1/models"},
		{"preview token or api key", http.MethodGet, "/v1/sandboxes/sbx-1/ports/8000/"},
		{"rock", http.MethodGet, "/apis/envs/sandbox/v1/sandboxes/bad%20id/proxy/port/8000/"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := call(t, tc.method, gw.URL+tc.path, "", nil)
			assert.Equal(t, http.StatusUnauthorized, resp.StatusCode, "%s", body)
		})
	}
}

func TestBearerToken(t *testing.T) {
	for _, tc := range []struct {
		name, in, tok string
		ok            bool
	}{
		{"bearer", "Bearer k1", "k1", true},
		{"case-insensitive scheme", "bEARER k1", "k1", true},
		{"trimmed", "Bearer   k1  ", "k1", true},
		{"empty token", "Bearer ", "", true},
		{"basic", "Basic azE6", "", false},
		{"no scheme", "k1", "", false},
		{"empty", "", "", false},
		{"prefix only", "Bear", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tok, ok := bearerToken([]byte(tc.in))
			assert.Equal(t, tc.ok, ok)
			assert.Equal(t, tc.tok, string(tok))
		})
	}
}
