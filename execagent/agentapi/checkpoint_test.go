package agentapi

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Checkpoint sends the paths, excludes and level as query parameters and
// reads the archive's description from the headers; an answer without
// them is an error, not a zero count.
func TestClient_Checkpoint_QueryAndHeaders(t *testing.T) {
	var query map[string][]string
	headers := http.Header{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		assert.Equal(t, RouteCheckpoint, r.URL.Path)
		query = r.URL.Query()
		for k, v := range headers {
			w.Header()[k] = v
		}
		_, _ = io.WriteString(w, "archive")
	}))
	t.Cleanup(srv.Close)
	c := New(srv.URL, "tok", nil)

	headers.Set(HeaderFormat, FormatTarGzip)
	headers.Set(HeaderFiles, "12")
	headers.Set(HeaderSkipped, "1")
	headers.Set(HeaderBytes, "3456")
	headers.Set(HeaderRoots, `["/a","/w/b"]`)
	rc, info, err := c.CheckpointLevel(context.Background(), []string{"/a", "b"}, []string{"*.pyc"}, CompressionNone)
	require.NoError(t, err)
	b, err := io.ReadAll(rc)
	require.NoError(t, err)
	require.NoError(t, rc.Close())
	assert.Equal(t, "archive", string(b))
	assert.Equal(t, CheckpointInfo{Format: FormatTarGzip, Files: 12, Skipped: 1, Bytes: 3456, Roots: []string{"/a", "/w/b"}}, info)
	assert.Equal(t, map[string][]string{"path": {"/a", "b"}, "exclude": {"*.pyc"}, "compression": {CompressionNone}}, query)

	_, _, err = c.Checkpoint(context.Background(), nil, nil)
	require.NoError(t, err)
	assert.Empty(t, query, "no paths: the agent's work dir, at its default level")

	headers.Del(HeaderFiles)
	_, _, err = c.Checkpoint(context.Background(), nil, nil)
	assert.ErrorContains(t, err, HeaderFiles)
	headers.Set(HeaderFiles, "1")
	headers.Set(HeaderFormat, "tar+zstd")
	_, _, err = c.Checkpoint(context.Background(), nil, nil)
	assert.ErrorContains(t, err, `"tar+zstd"`)
	headers.Set(HeaderFormat, FormatTarGzip)
	for _, bad := range []string{"", "[]", "/a"} {
		headers.Set(HeaderRoots, bad)
		_, _, err = c.Checkpoint(context.Background(), nil, nil)
		assert.ErrorContains(t, err, HeaderRoots, "roots %q", bad)
	}
}
