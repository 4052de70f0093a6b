package gateway

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/e2bcompat"
	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/warmpool"
)

// envdSeen is what the test's envd routes received.
type envdSeen struct {
	Method, Path, Query, Body string
	Header                    http.Header
}

// envdSetup is a gateway over a real agent whose envd routes (/health,
// /files, the Connect procedures) are served by the test, as the agent will
// serve them: each checks the gateway's agent credentials and records the
// call. /process.Process/Start streams two frames, the second only once the
// test has read the first (release).
type envdSetup struct {
	gw      *testGateway
	mgr     *fakeManager
	lease   warmpool.Lease
	token   string
	release chan struct{}

	mu   sync.Mutex
	seen []envdSeen
}

func newEnvdSetup(t *testing.T) *envdSetup {
	t.Helper()
	s := &envdSetup{release: make(chan struct{})}
	ag := startAgentWrapped(t, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if strings.HasPrefix(r.URL.Path, "/v1/") {
				h.ServeHTTP(w, r)
				return
			}
			if r.Header.Get("Authorization") != "Bearer "+agentToken || r.Header.Get(agentapi.HeaderGeneration) != strconv.FormatInt(s.lease.Generation, 10) {
				http.Error(w, `{"error": {"code": "unauthorized", "message": "bad agent credentials"}}`, http.StatusUnauthorized)
				return
			}
			b, _ := io.ReadAll(r.Body)
			s.mu.Lock()
			s.seen = append(s.seen, envdSeen{Method: r.Method, Path: r.URL.EscapedPath(), Query: r.URL.RawQuery, Body: string(b), Header: r.Header.Clone()})
			s.mu.Unlock()
			switch r.URL.Path {
			case "/health":
				w.WriteHeader(http.StatusNoContent)
			case "/process.Process/Start":
				w.Header().Set("Content-Type", "application/connect+json")
				_, _ = w.Write(connectFrame(0, `{"event":{"start":{"pid":7}}}`))
				w.(http.Flusher).Flush()
				select {
				case <-s.release:
				case <-r.Context().Done():
					return
				case <-time.After(testDeadline):
					return
				}
				_, _ = w.Write(connectFrame(2, `{}`))
			default:
				w.Header().Set("Content-Type", "application/json")
				_, _ = w.Write([]byte(`{"ok": true}`))
			}
		})
	})
	s.mgr = newFakeManager(ag.URL)
	s.gw = startGateway(t, s.mgr, nil)
	s.lease = s.mgr.addLease(warmpool.NewLeaseID(), testKey, ag.URL, 3)
	s.token = s.gw.envdToken(s.lease)
	return s
}

// last returns the last call the envd routes received.
func (s *envdSetup) last(t *testing.T) envdSeen {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	require.NotEmpty(t, s.seen, "the agent got no envd call")
	return s.seen[len(s.seen)-1]
}

func (s *envdSetup) calls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.seen)
}

// connectFrame is one Connect streaming frame.
func connectFrame(flags byte, msg string) []byte {
	b := []byte{flags, 0, 0, 0, 0}
	b[1], b[2], b[3], b[4] = byte(len(msg)>>24), byte(len(msg)>>16), byte(len(msg)>>8), byte(len(msg))
	return append(b, msg...)
}

// envdCall sends a request routed by E2B's headers in hdr (or, with host
// set, by the Host).
func envdCall(t *testing.T, gw *testGateway, method, path, host string, body io.Reader, hdr ...string) (*http.Response, []byte) {
	t.Helper()
	if host != "" {
		hdr = append(hdr, "Host", host)
	}
	return call(t, method, gw.URL+path, "", body, hdr...)
}

// routed returns the routing headers of sandbox id and port.
func routed(id string, port int) []string {
	return []string{e2bcompat.HeaderSandboxID, id, e2bcompat.HeaderSandboxPort, strconv.Itoa(port)}
}

func TestE2BRoute_EnvdForwardedUnchanged(t *testing.T) {
	s := newEnvdSetup(t)
	user := base64.StdEncoding.EncodeToString([]byte("root:"))
	hdr := append(routed(s.lease.ID, e2bcompat.EnvdPort),
		e2bcompat.HeaderAccessToken, s.token, "Authorization", "Basic "+user,
		"Connect-Protocol-Version", "1", headerEnvdUser, "spoofed", "Content-Type", "application/json")
	resp, b := envdCall(t, s.gw, http.MethodPost, "/filesystem.Filesystem/Stat?x=1&y=a%2Fb", "", strings.NewReader(`{"path": "/tmp"}`), hdr...)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
	assert.JSONEq(t, `{"ok": true}`, string(b))
	got := s.last(t)
	assert.Equal(t, http.MethodPost, got.Method)
	assert.Equal(t, "/filesystem.Filesystem/Stat", got.Path)
	assert.Equal(t, "x=1&y=a%2Fb", got.Query)
	assert.Equal(t, `{"path": "/tmp"}`, got.Body)
	assert.Equal(t, "1", got.Header.Get("Connect-Protocol-Version"))
	assert.Equal(t, "root", got.Header.Get(headerEnvdUser), "the Basic user, not the client's own header")
	assert.Empty(t, got.Header.Get(e2bcompat.HeaderAccessToken))
	resp, _ = envdCall(t, s.gw, http.MethodGet, "/a%2Fb/c", "", nil, append(routed(s.lease.ID, e2bcompat.EnvdPort), e2bcompat.HeaderAccessToken, s.token)...)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "/a%2Fb/c", s.last(t).Path, "the path as sent, escapes kept")

	// By host, on any method; a user of none sends no user header.
	resp, _ = envdCall(t, s.gw, http.MethodGet, "/health", fmt.Sprintf("%d-%s.e2b.test", e2bcompat.EnvdPort, s.lease.ID), nil,
		e2bcompat.HeaderAccessToken, s.token)
	assert.Equal(t, http.StatusNoContent, resp.StatusCode)
	assert.Equal(t, "/health", s.last(t).Path)
	assert.Empty(t, s.last(t).Header.Get(headerEnvdUser))
	assert.Equal(t, `e2b:envd`, metricsPathLabel(t, s.gw, metricsEnvd))
}

// metricsPathLabel checks that the gateway counted requests under label.
func metricsPathLabel(t *testing.T, gw *testGateway, label string) string {
	t.Helper()
	mfs, err := gw.Reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetValue() == label {
					return label
				}
			}
		}
	}
	return ""
}

// TestE2BRoute_StreamsWithoutBuffering: the agent's Connect stream reaches
// the client frame by frame, over chunked HTTP/1.1: the agent writes its
// second frame only after the client has read the first.
func TestE2BRoute_StreamsWithoutBuffering(t *testing.T) {
	s := newEnvdSetup(t)
	req, err := http.NewRequest(http.MethodPost, s.gw.URL+"/process.Process/Start", strings.NewReader(connectFrameString(`{"process":{"cmd":"/bin/bash"}}`)))
	require.NoError(t, err)
	for i, hdr := 0, append(routed(s.lease.ID, e2bcompat.EnvdPort), e2bcompat.HeaderAccessToken, s.token, "Content-Type", "application/connect+json"); i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := httpClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "application/connect+json", resp.Header.Get("Content-Type"))
	assert.Equal(t, []string{"chunked"}, resp.TransferEncoding)

	first := connectFrame(0, `{"event":{"start":{"pid":7}}}`)
	got := make([]byte, len(first))
	read := make(chan error, 1)
	go func() { _, err := io.ReadFull(resp.Body, got); read <- err }()
	select {
	case err := <-read:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		close(s.release)
		t.Fatal("the first frame was held back: the stream is buffered")
	}
	assert.Equal(t, first, got)
	close(s.release)
	rest, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	assert.Equal(t, connectFrame(2, `{}`), rest)
}

func connectFrameString(msg string) string { return string(connectFrame(0, msg)) }

// TestE2BRoute_HeaderRoutedNeverReachesQuarry: with E2B's headers, Quarry's
// own paths (and the agent's) are the sandbox's, never the gateway's.
func TestE2BRoute_HeaderRoutedNeverReachesQuarry(t *testing.T) {
	s := newEnvdSetup(t)
	// Quarry's list, with Quarry's key but no access token: refused as
	// the data plane refuses, not listed.
	resp, b := envdCall(t, s.gw, http.MethodGet, "/v1/sandboxes", "", nil, append(routed(s.lease.ID, e2bcompat.EnvdPort), "Authorization", "Bearer "+testKey)...)
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode, "%s", b)
	assert.NotContains(t, string(b), "sandboxes\":")
	// With the token, the agent's own API is refused on envd's port.
	resp, b = envdCall(t, s.gw, http.MethodGet, "/v1/sandboxes", "", nil, append(routed(s.lease.ID, e2bcompat.EnvdPort), e2bcompat.HeaderAccessToken, s.token)...)
	assert.Equal(t, http.StatusForbidden, resp.StatusCode, "%s", b)
	assert.Contains(t, string(b), "not served on envd's port")
	// Any other path goes to the sandbox: /healthz is not the gateway's.
	resp, _ = envdCall(t, s.gw, http.MethodGet, "/healthz", "", nil, append(routed(s.lease.ID, e2bcompat.EnvdPort), e2bcompat.HeaderAccessToken, s.token)...)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "/healthz", s.last(t).Path, "the sandbox's /healthz")
	// A bad routing header is a 400 of the data plane, not a Quarry route.
	resp, b = envdCall(t, s.gw, http.MethodGet, "/healthz", "", nil, e2bcompat.HeaderSandboxID, s.lease.ID, e2bcompat.HeaderSandboxPort, "70000")
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	assert.Contains(t, string(b), e2bcompat.HeaderSandboxPort)
	// A Host that does not parse as {port}-{id} is the gateway's.
	for _, host := range []string{"api.e2b.test", "8000x-" + s.lease.ID + ".e2b.test", "49983-" + strings.Repeat("a", 58) + ".e2b.test"} {
		resp, b = envdCall(t, s.gw, http.MethodGet, "/healthz", host, nil)
		assert.Equal(t, http.StatusOK, resp.StatusCode, host)
		assert.JSONEq(t, `{"status": "ok"}`, string(b), host)
	}
}

func TestE2BRoute_AccessToken(t *testing.T) {
	s := newEnvdSetup(t)
	other := s.mgr.addLease(warmpool.NewLeaseID(), testKey, s.lease.AgentURL, 3)
	old := s.lease
	old.CreatedAt = time.Now().Add(-envdTokenLifetime - time.Minute)
	forgedClaims := envdClaims{Sandbox: s.lease.ID, Generation: 3, Owner: OwnerOf(testKey), Expires: time.Now().Add(time.Hour).Unix()}
	payload, _, _ := strings.Cut(s.token, ".")
	_, otherSig, _ := strings.Cut(s.gw.envdToken(other), ".")
	stale := s.lease
	stale.Generation = 2
	ended := s.mgr.addLease(warmpool.NewLeaseID(), testKey, s.lease.AgentURL, 3)
	endedToken := s.gw.envdToken(ended)
	ended.State = warmpool.LeaseReleased
	s.mgr.put(ended)
	for _, tc := range []struct {
		name, id, token string
		status          int
		msg             string
	}{
		{name: "valid", id: s.lease.ID, token: s.token, status: 204},
		{name: "none", id: s.lease.ID, status: 401, msg: "missing access token"},
		{name: "forged", id: s.lease.ID, token: newTokenSigner(strings.Repeat("x", 32)).seal(envdDomain, forgedClaims), status: 401, msg: "signature does not match"},
		{name: "another's signature", id: s.lease.ID, token: payload + "." + otherSig, status: 401, msg: "signature does not match"},
		{name: "a preview token", id: s.lease.ID, token: s.gw.preview.sign(previewClaims{Sandbox: s.lease.ID, Port: e2bcompat.EnvdPort, Generation: 3, Owner: OwnerOf(testKey), Expires: time.Now().Add(time.Hour).Unix()}), status: 401, msg: "signature does not match"},
		{name: "an API key", id: s.lease.ID, token: testKey, status: 401, msg: "malformed"},
		{name: "expired", id: s.lease.ID, token: s.gw.envdToken(old), status: 401, msg: "expired"},
		{name: "another lease's", id: s.lease.ID, token: s.gw.envdToken(other), status: 401, msg: "another sandbox"},
		{name: "another generation", id: s.lease.ID, token: s.gw.envdToken(stale), status: 401, msg: "earlier lease"},
		{name: "ended lease", id: ended.ID, token: endedToken, status: 502, msg: "released"},
		{name: "unknown sandbox", id: "sbx-none", token: s.gw.envdToken(warmpool.Lease{ID: "sbx-none", Owner: OwnerOf(testKey), CreatedAt: time.Now()}), status: 502, msg: "not found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hdr := routed(tc.id, e2bcompat.EnvdPort)
			if tc.token != "" {
				hdr = append(hdr, e2bcompat.HeaderAccessToken, tc.token)
			}
			before := s.calls()
			resp, b := envdCall(t, s.gw, http.MethodGet, "/health", "", nil, hdr...)
			assert.Equal(t, tc.status, resp.StatusCode, "%s", b)
			if tc.msg == "" {
				return
			}
			var e e2bcompat.Error
			require.NoError(t, json.Unmarshal(b, &e), "%s", b)
			assert.Equal(t, tc.status, e.Code)
			assert.Contains(t, e.Message, tc.msg)
			assert.Equal(t, before, s.calls(), "refused before the agent")
		})
	}
	// A Connect call refused gets Connect's error.
	resp, b := envdCall(t, s.gw, http.MethodPost, "/process.Process/List", "", strings.NewReader(`{}`), append(routed(s.lease.ID, e2bcompat.EnvdPort), "Content-Type", "application/json")...)
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	assert.Contains(t, string(b), `"code":"unauthenticated"`)
}

func TestE2BRoute_SignedFileURLs(t *testing.T) {
	s := newEnvdSetup(t)
	host := fmt.Sprintf("%d-%s.e2b.test", e2bcompat.EnvdPort, s.lease.ID)
	fileURL := func(op, path, user string, exp int64, sig string) string {
		q := url.Values{"path": {path}}
		if user != "" {
			q.Set("username", user)
		}
		if sig == "" {
			sig = e2bcompat.FileSignature(path, op, user, s.token, exp)
		}
		q.Set("signature", sig)
		if exp != 0 {
			q.Set("signature_expiration", strconv.FormatInt(exp, 10))
		}
		return "/files?" + q.Encode()
	}
	later := time.Now().Add(time.Hour).Unix()
	for _, tc := range []struct {
		name, method, url string
		status            int
	}{
		{name: "download", method: http.MethodGet, url: fileURL(e2bcompat.OpRead, "/home/user/a b.txt", "", 0, ""), status: 200},
		{name: "download as a user, until later", method: http.MethodGet, url: fileURL(e2bcompat.OpRead, "a.txt", "root", later, ""), status: 200},
		{name: "upload", method: http.MethodPost, url: fileURL(e2bcompat.OpWrite, "a.txt", "", 0, ""), status: 200},
		{name: "a read signature does not upload", method: http.MethodPost, url: fileURL(e2bcompat.OpRead, "a.txt", "", 0, ""), status: 401},
		{name: "another path", method: http.MethodGet, url: strings.Replace(fileURL(e2bcompat.OpRead, "a.txt", "", 0, ""), "a.txt", "b.txt", 1), status: 401},
		{name: "expired", method: http.MethodGet, url: fileURL(e2bcompat.OpRead, "a.txt", "", time.Now().Add(-time.Second).Unix(), ""), status: 401},
		{name: "expiration changed", method: http.MethodGet, url: strings.Replace(fileURL(e2bcompat.OpRead, "a.txt", "", later, ""), strconv.FormatInt(later, 10), strconv.FormatInt(later+60, 10), 1), status: 401},
		{name: "forged", method: http.MethodGet, url: fileURL(e2bcompat.OpRead, "a.txt", "", 0, "v1_AAAA"), status: 401},
		{name: "not on another path", method: http.MethodGet, url: strings.Replace(fileURL(e2bcompat.OpRead, "a.txt", "", 0, ""), "/files", "/health", 1), status: 401},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := s.calls()
			resp, b := envdCall(t, s.gw, tc.method, tc.url, host, strings.NewReader("x"))
			assert.Equal(t, tc.status, resp.StatusCode, "%s", b)
			if tc.status == 200 {
				u, _ := url.Parse(tc.url)
				assert.Equal(t, u.RawQuery, s.last(t).Query, "the query passes unchanged")
			} else {
				assert.Equal(t, before, s.calls(), "refused before the agent")
			}
		})
	}
	// A signature of another lease's token does not open this one.
	other := s.mgr.addLease(warmpool.NewLeaseID(), testKey, s.lease.AgentURL, 3)
	sig := e2bcompat.FileSignature("a.txt", e2bcompat.OpRead, "", s.gw.envdToken(other), 0)
	resp, _ := envdCall(t, s.gw, http.MethodGet, "/files?path=a.txt&signature="+url.QueryEscape(sig), host, nil)
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)
}

func TestE2BRoute_UserPorts(t *testing.T) {
	s := newPortSetup(t)
	token := s.gw.envdToken(s.lease)
	host := fmt.Sprintf("%d-%s.e2b.test", s.port, s.lease.ID)
	// The access token, the routing headers: the program sees neither.
	resp, b := envdCall(t, s.gw, http.MethodPost, "/echo/a?x=1", "", strings.NewReader("body"),
		append(routed(s.lease.ID, s.port), e2bcompat.HeaderAccessToken, token, "X-App", "kept")...)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
	var e echoed
	require.NoError(t, json.Unmarshal(b, &e))
	assert.Equal(t, "/echo/a", e.Path)
	assert.Equal(t, "x=1", e.Query)
	assert.Equal(t, "body", e.Body)
	assert.Equal(t, []string{"kept"}, e.Headers["X-App"])
	for _, h := range []string{e2bcompat.HeaderAccessToken, e2bcompat.HeaderSandboxID, e2bcompat.HeaderSandboxPort, "Authorization"} {
		assert.NotContains(t, e.Headers, h)
	}
	assert.Equal(t, metricsPort, metricsPathLabel(t, s.gw, metricsPort))

	// The API key, by host.
	resp, b = envdCall(t, s.gw, http.MethodGet, "/echo/k", host, nil, "Authorization", "Bearer "+testKey)
	assert.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
	// Another owner's key does not reach it (the sandbox is not found: 502).
	resp, _ = envdCall(t, s.gw, http.MethodGet, "/echo/k", host, nil, "Authorization", "Bearer "+otherKey)
	assert.Equal(t, http.StatusBadGateway, resp.StatusCode)
	// Nothing: 401.
	resp, b = envdCall(t, s.gw, http.MethodGet, "/echo/k", host, nil)
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	assert.Contains(t, string(b), "preview token")

	// A preview token in the query of a host-routed call: served, and kept
	// in a cookie for the host's every path.
	pv := s.gw.preview.sign(previewClaims{Sandbox: s.lease.ID, Port: s.port, Generation: s.lease.Generation, Owner: s.lease.Owner, Expires: time.Now().Add(time.Hour).Unix()})
	resp, b = envdCall(t, s.gw, http.MethodGet, "/echo/p?"+previewParam+"="+pv+"&y=2", host, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
	require.NoError(t, json.Unmarshal(b, &e))
	assert.Equal(t, "y=2", e.Query, "the preview token is Quarry's")
	var cookie *http.Cookie
	for _, ck := range resp.Cookies() {
		if ck.Name == previewParam {
			cookie = ck
		}
	}
	require.NotNil(t, cookie, "the preview cookie: %v", resp.Header.Values("Set-Cookie"))
	assert.Equal(t, "/", cookie.Path)
	assert.True(t, cookie.HttpOnly)
	resp, _ = envdCall(t, s.gw, http.MethodGet, "/echo/next", host, nil, "Cookie", previewParam+"="+pv)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	// The preview token of another port is refused.
	resp, _ = envdCall(t, s.gw, http.MethodGet, "/echo/p?"+previewParam+"="+pv, fmt.Sprintf("%d-%s.e2b.test", s.port+1, s.lease.ID), nil)
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)
}
