package execagent

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// filesReq calls /files with the query q; it returns the status and body.
func filesReq(t *testing.T, a *testAgent, method string, q url.Values, ct string, body io.Reader, hdr ...string) (int, []byte) {
	t.Helper()
	resp := envdReq(t, context.Background(), a, method, "/files?"+q.Encode(), ct, body, hdr...)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, b
}

// multipartBody builds a form with one "file" part per name (filename:
// the name as given, directories included) and a "note" field.
func multipartBody(t *testing.T, files map[string]string, order ...string) (string, *bytes.Buffer) {
	t.Helper()
	var b bytes.Buffer
	mw := multipart.NewWriter(&b)
	require.NoError(t, mw.WriteField("note", "not a file"))
	for _, name := range order {
		h := textproto.MIMEHeader{}
		h.Set("Content-Disposition", fmt.Sprintf(`form-data; name="file"; filename=%q`, name))
		h.Set("Content-Type", "application/octet-stream")
		pw, err := mw.CreatePart(h)
		require.NoError(t, err)
		_, err = pw.Write([]byte(files[name]))
		require.NoError(t, err)
	}
	require.NoError(t, mw.Close())
	return mw.FormDataContentType(), &b
}

func TestEnvd_Files_Download(t *testing.T) {
	a := newTestAgent(t, nil)
	w := a.cfg.Workdir
	require.NoError(t, os.WriteFile(filepath.Join(w, "f.bin"), []byte{0, 1, 2, 255}, 0o644))
	tests := []struct {
		name, path string
		wantStatus int
		wantBody   []byte
	}{
		{name: "relative", path: "f.bin", wantStatus: http.StatusOK, wantBody: []byte{0, 1, 2, 255}},
		{name: "absolute, a username", path: filepath.Join(w, "f.bin"), wantStatus: http.StatusOK, wantBody: []byte{0, 1, 2, 255}},
		{name: "~/", path: "~/f.bin", wantStatus: http.StatusOK, wantBody: []byte{0, 1, 2, 255}},
		{name: "missing", path: "nope", wantStatus: http.StatusNotFound},
		{name: "a directory", path: "", wantStatus: http.StatusBadRequest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, body := filesReq(t, a, http.MethodGet, url.Values{"path": {tt.path}, "username": {"user"}}, "", nil)
			require.Equal(t, tt.wantStatus, status, "%s", body)
			if tt.wantBody != nil {
				assert.Equal(t, tt.wantBody, body)
				return
			}
			var e envdHTTPError
			require.NoError(t, json.Unmarshal(body, &e), "envd's error shape: %s", body)
			assert.Equal(t, tt.wantStatus, e.Code)
			assert.NotEmpty(t, e.Message)
		})
	}
}

func TestEnvd_Files_Upload(t *testing.T) {
	a := newTestAgent(t, nil)
	w := a.cfg.Workdir
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, _ = zw.Write([]byte("zipped"))
	require.NoError(t, zw.Close())
	manyCT, many := multipartBody(t, map[string]string{"a.txt": "A", "d/e/b.txt": "B", filepath.Join(w, "abs.txt"): "C"},
		"a.txt", "d/e/b.txt", filepath.Join(w, "abs.txt"))
	oneCT, one := multipartBody(t, map[string]string{"ignored-name": "P"}, "ignored-name")
	dupCT, dup := multipartBody(t, map[string]string{"x": "1", "./x": "2"}, "x", "./x")
	tests := []struct {
		name      string
		q         url.Values
		ct        string
		body      io.Reader
		hdr       []string
		wantFiles map[string]string // relative to the workdir
	}{
		{name: "octet-stream", q: url.Values{"path": {"raw/r.txt"}}, ct: "application/octet-stream",
			body: bytes.NewReader([]byte("raw")), wantFiles: map[string]string{"raw/r.txt": "raw"}},
		{name: "octet-stream, gzip", q: url.Values{"path": {"z.txt"}}, ct: "application/octet-stream",
			body: bytes.NewReader(gz.Bytes()), hdr: []string{"Content-Encoding: gzip"}, wantFiles: map[string]string{"z.txt": "zipped"}},
		{name: "multipart, many files named by path", q: url.Values{"username": {"user"}}, ct: manyCT, body: many,
			wantFiles: map[string]string{"a.txt": "A", "d/e/b.txt": "B", "abs.txt": "C"}},
		{name: "multipart, one file at ?path=", q: url.Values{"path": {"p.txt"}}, ct: oneCT, body: one,
			wantFiles: map[string]string{"p.txt": "P"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, body := filesReq(t, a, http.MethodPost, tt.q, tt.ct, tt.body, tt.hdr...)
			require.Equal(t, http.StatusOK, status, "%s", body)
			var got []envdUploadEntry
			require.NoError(t, json.Unmarshal(body, &got))
			var paths []string
			for _, e := range got {
				assert.Equal(t, "file", e.Type)
				assert.Equal(t, filepath.Base(e.Path), e.Name)
				paths = append(paths, e.Path)
			}
			for rel, content := range tt.wantFiles {
				p := filepath.Join(w, rel)
				assert.Contains(t, paths, p)
				b, err := os.ReadFile(p)
				require.NoError(t, err)
				assert.Equal(t, content, string(b))
			}
			assert.Len(t, got, len(tt.wantFiles))
		})
	}
	refusals := []struct {
		name string
		q    url.Values
		ct   string
		body io.Reader
		hdr  []string
	}{
		{name: "octet-stream without a path", ct: "application/octet-stream", body: bytes.NewReader([]byte("x"))},
		{name: "a path twice", ct: dupCT, body: dup},
		{name: "another content type", q: url.Values{"path": {"x"}}, ct: "text/plain", body: bytes.NewReader([]byte("x"))},
		{name: "another encoding", q: url.Values{"path": {"x"}}, ct: "application/octet-stream", body: bytes.NewReader([]byte("x")), hdr: []string{"Content-Encoding: br"}},
		{name: "not gzip", q: url.Values{"path": {"x"}}, ct: "application/octet-stream", body: bytes.NewReader([]byte("x")), hdr: []string{"Content-Encoding: gzip"}},
		{name: "a directory", q: url.Values{"path": {"adir"}}, ct: "application/octet-stream", body: bytes.NewReader([]byte("x"))},
	}
	require.NoError(t, os.Mkdir(filepath.Join(w, "adir"), 0o755))
	for _, tt := range refusals {
		t.Run(tt.name, func(t *testing.T) {
			status, body := filesReq(t, a, http.MethodPost, tt.q, tt.ct, tt.body, tt.hdr...)
			assert.Equal(t, http.StatusBadRequest, status, "%s", body)
			var e envdHTTPError
			require.NoError(t, json.Unmarshal(body, &e))
			assert.Equal(t, http.StatusBadRequest, e.Code)
		})
	}
}

// Replacing a file keeps its mode (an executable stays one).
func TestEnvd_Files_UploadKeepsTheMode(t *testing.T) {
	a := newTestAgent(t, nil)
	p := filepath.Join(a.cfg.Workdir, "run.sh")
	require.NoError(t, os.WriteFile(p, []byte("old"), 0o755))
	require.NoError(t, os.Chmod(p, 0o755))
	status, body := filesReq(t, a, http.MethodPost, url.Values{"path": {"run.sh"}}, "application/octet-stream", bytes.NewReader([]byte("new")))
	require.Equal(t, http.StatusOK, status, "%s", body)
	fi, err := os.Stat(p)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o755), fi.Mode().Perm())
}

// A full disk is 507 in envd's shape, and the file is left as it was (the
// staged file's writer fails as write(2) does on a full disk: a small
// tmpfs needs privileges a plain `go test` does not have).
func TestEnvd_Files_UploadOnAFullDiskIs507(t *testing.T) {
	a := newTestAgent(t, nil)
	p := filepath.Join(a.cfg.Workdir, "f")
	require.NoError(t, os.WriteFile(p, []byte("before"), 0o644))
	left := int64(3)
	a.srv.stagedFile = func(f *os.File) io.Writer { return fullDisk{f: f, left: &left} }
	for _, up := range []struct {
		name string
		ct   string
		body io.Reader
	}{
		{name: "octet-stream", ct: "application/octet-stream", body: bytes.NewReader(bytes.Repeat([]byte("x"), 1<<20))},
		{name: "multipart", ct: "", body: nil},
	} {
		t.Run(up.name, func(t *testing.T) {
			left = 3
			q := url.Values{"path": {"f"}}
			ct, body := up.ct, up.body
			if body == nil {
				var b *bytes.Buffer
				ct, b = multipartBody(t, map[string]string{"f": "0123456789"}, "f")
				body, q = b, url.Values{}
			}
			status, out := filesReq(t, a, http.MethodPost, q, ct, body)
			assert.Equal(t, http.StatusInsufficientStorage, status, "%s", out)
			var e envdHTTPError
			require.NoError(t, json.Unmarshal(out, &e))
			assert.Equal(t, http.StatusInsufficientStorage, e.Code)
			assert.Contains(t, e.Message, "no space left on device")
			b, err := os.ReadFile(p)
			require.NoError(t, err)
			assert.Equal(t, "before", string(b), "the file is as it was")
		})
	}
}

// X-Metadata-* headers become the file's metadata (user.e2b.* xattrs),
// shown by the upload's answer and by Stat; a new upload replaces it.
// Where the file system has no user xattrs the metadata is dropped and the
// file kept, as envd does.
func TestEnvd_Files_UploadMetadata(t *testing.T) {
	a := newTestAgent(t, nil)
	probe := filepath.Join(a.cfg.Workdir, "probe")
	require.NoError(t, os.WriteFile(probe, nil, 0o644))
	xattrs := !errors.Is(unix.Setxattr(probe, "user.probe", []byte("1"), 0), unix.ENOTSUP)
	var want map[string]any
	if xattrs {
		want = map[string]any{"kind": "report", "owner": "me"}
	}
	status, body := filesReq(t, a, http.MethodPost, url.Values{"path": {"m.txt"}}, "application/octet-stream",
		bytes.NewReader([]byte("x")), "X-Metadata-Owner: me", "X-Metadata-Kind: report")
	require.Equal(t, http.StatusOK, status, "%s", body)
	var got []map[string]any
	require.NoError(t, json.Unmarshal(body, &got))
	require.Len(t, got, 1)
	assert.Equal(t, want, asMap(got[0]["metadata"]))
	e := rpcOK(t, a, "filesystem.Filesystem/Stat", `{"path":"m.txt"}`)["entry"].(map[string]any)
	assert.Equal(t, want, asMap(e["metadata"]))

	status, body = filesReq(t, a, http.MethodPost, url.Values{"path": {"m.txt"}}, "application/octet-stream", bytes.NewReader([]byte("y")))
	require.Equal(t, http.StatusOK, status, "%s", body)
	e = rpcOK(t, a, "filesystem.Filesystem/Stat", `{"path":"m.txt"}`)["entry"].(map[string]any)
	assert.Nil(t, e["metadata"], "an upload without metadata clears it")

	for _, bad := range []string{"X-Metadata-K: caf\u00e9", "X-Metadata-" + strings.Repeat("k", 250) + ": v",
		"X-Metadata-Big: " + strings.Repeat("v", 4097)} {
		status, body = filesReq(t, a, http.MethodPost, url.Values{"path": {"m.txt"}}, "application/octet-stream", bytes.NewReader([]byte("z")), bad)
		assert.Equal(t, http.StatusBadRequest, status, "%.40s: %s", bad, body)
	}
}

// asMap returns v as a JSON object, nil when it is none.
func asMap(v any) map[string]any {
	m, _ := v.(map[string]any)
	return m
}
