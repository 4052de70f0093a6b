package gateway

import (
	"bytes"
	"compress/gzip"
	"io"
	"io/fs"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/gateway/ui"
)

// TestConsole_ServesEmbeddedFiles: every embedded file is served at its
// path below /ui without a key, with its type, the strict CSP and the other
// security headers; /ui and /ui/ are index.html.
func TestConsole_ServesEmbeddedFiles(t *testing.T) {
	gw := startGateway(t, newFakeManager(""), nil)
	index, err := fs.ReadFile(ui.Files(), "index.html")
	require.NoError(t, err)

	tests := []struct {
		name, path, file, ctype string
	}{
		{name: "ui is the index", path: "/ui", file: "index.html", ctype: "text/html; charset=utf-8"},
		{name: "ui slash is the index", path: "/ui/", file: "index.html", ctype: "text/html; charset=utf-8"},
		{name: "index by name", path: "/ui/index.html", file: "index.html", ctype: "text/html; charset=utf-8"},
		{name: "app", path: "/ui/app.js", file: "app.js", ctype: "text/javascript; charset=utf-8"},
		{name: "style", path: "/ui/style.css", file: "style.css", ctype: "text/css; charset=utf-8"},
		{name: "xterm", path: "/ui/vendor/xterm/xterm.mjs", file: "vendor/xterm/xterm.mjs", ctype: "text/javascript; charset=utf-8"},
		{name: "xterm css", path: "/ui/vendor/xterm/xterm.css", file: "vendor/xterm/xterm.css", ctype: "text/css; charset=utf-8"},
		{name: "fit addon", path: "/ui/vendor/xterm/addon-fit.mjs", file: "vendor/xterm/addon-fit.mjs", ctype: "text/javascript; charset=utf-8"},
		{name: "licence", path: "/ui/vendor/xterm/LICENSE", file: "vendor/xterm/LICENSE", ctype: "text/plain; charset=utf-8"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			want, err := fs.ReadFile(ui.Files(), tc.file)
			require.NoError(t, err)
			resp, body := call(t, http.MethodGet, gw.URL+tc.path, "", nil)
			require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
			assert.Equal(t, want, body, "the embedded bytes")
			assert.Equal(t, tc.ctype, resp.Header.Get("Content-Type"))
			assert.Equal(t, consoleCSP, resp.Header.Get("Content-Security-Policy"))
			assert.Equal(t, "nosniff", resp.Header.Get("X-Content-Type-Options"))
			assert.Equal(t, "no-referrer", resp.Header.Get("Referrer-Policy"))
			assert.Equal(t, "DENY", resp.Header.Get("X-Frame-Options"))
			assert.Equal(t, "no-cache", resp.Header.Get("Cache-Control"))
			assert.NotEmpty(t, resp.Header.Get("ETag"))
		})
	}
	assert.Contains(t, string(index), `src="/ui/app.js"`)
}

// TestConsole_CSPIsStrict pins the policy the issue asks for and checks that
// index.html needs nothing it forbids: no inline script or style, nothing
// from another origin.
func TestConsole_CSPIsStrict(t *testing.T) {
	for _, d := range []string{"default-src 'self'", "script-src 'self'", "style-src 'self'", "img-src 'self' data:",
		"connect-src 'self'", "frame-ancestors 'none'", "base-uri 'none'", "form-action 'none'"} {
		assert.Contains(t, strings.Split(consoleCSP, "; "), d)
	}
	assert.NotContains(t, consoleCSP, "unsafe")
	index, err := fs.ReadFile(ui.Files(), "index.html")
	require.NoError(t, err)
	page := string(index)
	assert.NotRegexp(t, regexp.MustCompile(`<script(?:\s[^>]*)?>[^<]+</script>`), page, "no inline script")
	assert.NotContains(t, page, "<style", "no inline style element")
	assert.NotRegexp(t, regexp.MustCompile(`\sstyle=`), page, "no style attribute")
	assert.NotRegexp(t, regexp.MustCompile(`\son[a-z]+=`), page, "no inline event handler")
	assert.NotRegexp(t, regexp.MustCompile(`(?:src|href)="(?:https?:)?//`), page, "nothing from another origin")
}

// TestConsole_UnknownFileIs404: a path that is not an embedded file is 404
// in the API's error shape, however it is spelled; a climb out of the tree
// matches no file.
func TestConsole_UnknownFileIs404(t *testing.T) {
	gw := startGateway(t, newFakeManager(""), nil)
	for _, path := range []string{"/ui/nothing.js", "/ui/vendor/xterm/nothing.mjs", "/ui/vendor/other/xterm.mjs",
		"/ui/vendor/README.md", "/ui/ui.go", "/ui/..%2fconsole.go", "/ui/vendor/..%2f..%2fgateway.go"} {
		t.Run(path, func(t *testing.T) {
			resp, body := call(t, http.MethodGet, gw.URL+path, "", nil)
			require.Equal(t, http.StatusNotFound, resp.StatusCode, "%s", body)
			assert.Equal(t, "not_found", decodeError(t, body).Code)
		})
	}
	resp, body := call(t, http.MethodPost, gw.URL+"/ui/app.js", "", nil)
	assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode, "%s", body)
	assert.Equal(t, "GET", resp.Header.Get("Allow"))
}

// TestConsole_RevalidatesAndGzips: an If-None-Match with the file's ETag is
// 304 without a body; a client that accepts gzip gets the file gzipped.
func TestConsole_RevalidatesAndGzips(t *testing.T) {
	gw := startGateway(t, newFakeManager(""), nil)
	want, err := fs.ReadFile(ui.Files(), "vendor/xterm/xterm.mjs")
	require.NoError(t, err)
	resp, _ := call(t, http.MethodGet, gw.URL+"/ui/vendor/xterm/xterm.mjs", "", nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	etag := resp.Header.Get("ETag")
	require.NotEmpty(t, etag)

	resp, body := call(t, http.MethodGet, gw.URL+"/ui/vendor/xterm/xterm.mjs", "", nil, "If-None-Match", etag)
	assert.Equal(t, http.StatusNotModified, resp.StatusCode)
	assert.Empty(t, body)
	resp, _ = call(t, http.MethodGet, gw.URL+"/ui/app.js", "", nil, "If-None-Match", etag)
	assert.Equal(t, http.StatusOK, resp.StatusCode, "another file's ETag does not match")

	resp, body = call(t, http.MethodGet, gw.URL+"/ui/vendor/xterm/xterm.mjs", "", nil, "Accept-Encoding", "gzip")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "gzip", resp.Header.Get("Content-Encoding"))
	assert.Less(t, len(body), len(want)/2)
	zr, err := gzip.NewReader(bytes.NewReader(body))
	require.NoError(t, err)
	got, err := io.ReadAll(zr)
	require.NoError(t, err)
	assert.Equal(t, want, got)

	resp, body = call(t, http.MethodGet, gw.URL+"/ui/vendor/xterm/xterm.mjs", "", nil, "Accept-Encoding", "gzip;q=0")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Empty(t, resp.Header.Get("Content-Encoding"))
	assert.Equal(t, want, body)
}

// TestConsole_FilesAreSelfContained: every file the page loads is embedded:
// index.html's links and app.js's imports name files the console serves.
func TestConsole_FilesAreSelfContained(t *testing.T) {
	c, err := newConsole(ui.Files())
	require.NoError(t, err)
	index := string(c.files["index.html"].body)
	for _, m := range regexp.MustCompile(`(?:src|href)="/ui/([^"]+)"`).FindAllStringSubmatch(index, -1) {
		assert.Contains(t, c.files, m[1], "index.html loads %s", m[1])
	}
	app := string(c.files["app.js"].body)
	imports := regexp.MustCompile(`import\('\./([^']+)'\)`).FindAllStringSubmatch(app, -1)
	require.NotEmpty(t, imports)
	for _, m := range imports {
		assert.Contains(t, c.files, m[1], "app.js imports %s", m[1])
	}
	for _, bad := range []string{"localStorage.", ".innerHTML", ".outerHTML", "insertAdjacentHTML", "document.cookie", "eval("} {
		assert.False(t, strings.Contains(app, bad), "app.js uses %s: the key stays in sessionStorage, nodes are built, never parsed", bad)
	}
}
