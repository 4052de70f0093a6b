package gateway

import (
	"encoding/json"
	"net/http"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var fiberParam = regexp.MustCompile(`:([A-Za-z]+)`)

// TestOpenAPI_MatchesRoutes keeps openapi.json true: every registered route
// is documented, every documented operation is served, and every $ref
// resolves.
func TestOpenAPI_MatchesRoutes(t *testing.T) {
	gw := startGateway(t, newFakeManager(""), nil)
	resp, body := call(t, http.MethodGet, gw.URL+"/openapi.json", "", nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Contains(t, resp.Header.Get("Content-Type"), "application/json")

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
		if r.Method == http.MethodHead || r.Path == "/" {
			continue // fiber's automatic HEAD routes; the root middleware
		}
		served = append(served, r.Method+" "+fiberParam.ReplaceAllString(r.Path, "{$1}"))
	}
	sort.Strings(documented)
	sort.Strings(served)
	assert.Equal(t, served, documented)

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
