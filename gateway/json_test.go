package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/gofiber/fiber/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/e2bcompat"
	"github.com/quarryhq/quarry/rockcompat"
)

// rawBodyRoutes take a body that is not JSON (uploads, a program's own
// port, ROCK's multipart upload and proxies) or none (env close).
var rawBodyRoutes = map[string]bool{
	"/v1/sandboxes/:id/env/close":                true,
	"/v1/images/build":                           true, // a tar of the build's context
	"/v1/sandboxes/:id/files":                    true,
	"/v1/sandboxes/:id/files/archive":            true,
	"/v1/sandboxes/:id/processes/:pid/stdin":     true,
	"/v1/sandboxes/:id/ports/:port/*":            true,
	rockcompat.Prefix + "/upload":                true,
	rockcompat.Prefix + "/sandboxes/:id/proxy/*": true,
	rockcompat.Prefix + "/sandboxes/:id/vnc/*":   true,
}

// Every route that takes a JSON body answers a malformed one with the one
// message, "body: malformed JSON at byte N: …", whichever code reads it:
// the gateway's own routes, the proxied agent calls (the real agent's words
// differ: the gateway answers first), the model relay's both sides, and
// ROCK's, GEM's and E2B's routes in their own shapes.
func TestMalformedJSON_OneMessageOnEveryRoute(t *testing.T) {
	agent := startAgent(t)
	mgr := newFakeManager(agent.URL)
	mgr.addLease("sbx-1", testKey, agent.URL, 1)
	gw := startFullGateway(t, mgr)
	e := &relayEnv{testGateway: gw.testGateway, mgr: mgr, svc: gw.relay}
	token := gw.relay.LeaseEnv("sbx-1", "")["OPENAI_API_KEY"]
	pending := agentCall(context.Background(), e.relayURL("sbx-1", "chat/completions"), token, []byte(`{"stream":false}`))
	rid := e.claim(t, testKey, 1, "")[0].ID
	t.Cleanup(func() {
		e.respond(t, testKey, rid, "", "application/json", []byte(`{"choices": []}`))
		<-pending
	})

	var routes []fiber.Route
	for _, r := range gw.App().GetRoutes(true) {
		if (r.Method == fiber.MethodPost || r.Method == fiber.MethodPut || r.Method == fiber.MethodPatch) && !rawBodyRoutes[r.Path] {
			routes = append(routes, r)
		}
	}
	require.Greater(t, len(routes), 30, "the routes that take JSON")
	params := map[string]string{":id": "sbx-1", ":sid": "s1", ":pid": "p1", ":rid": rid, ":port": "8000"}
	for _, body := range []string{`{"command": "true",`, `{"command" "true"}`, `nope`, `{"a": 1}}`} {
		var syn *json.SyntaxError
		require.True(t, errors.As(json.Unmarshal([]byte(body), new(json.RawMessage)), &syn), body)
		want := fmt.Sprintf("body: malformed JSON at byte %d: %s", syn.Offset, syn.Error())
		for _, r := range routes {
			path := fiberParam.ReplaceAllStringFunc(r.Path, func(p string) string { return params[p] })
			key, hdr := testKey, []string{"Content-Type", "application/json"}
			e2b := !strings.HasPrefix(path, "/v1/") && !strings.HasPrefix(path, "/apis/")
			switch {
			case strings.Contains(path, "/model/v1/"):
				key = token
			case e2b:
				key, hdr = "", append(hdr, e2bcompat.HeaderAPIKey, testKey)
			}
			resp, b := call(t, r.Method, gw.URL+path, key, strings.NewReader(body), hdr...)
			var got string
			switch {
			case e2b:
				assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "%s %s: %s", r.Method, path, b)
				got = decode[e2bcompat.Error](t, b).Message
			case strings.HasPrefix(path, rockcompat.Prefix):
				got = decode[struct {
					Error string `json:"error"`
				}](t, b).Error
			case strings.HasPrefix(path, rockcompat.GemPrefix):
				assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "%s %s: %s", r.Method, path, b)
				got = decode[map[string]string](t, b)["detail"]
			default:
				assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "%s %s: %s", r.Method, path, b)
				got = decodeError(t, b).Message
			}
			assert.Equal(t, want, got, "%s %s with %s", r.Method, path, body)
		}
	}
}
