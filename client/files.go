package client

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"strconv"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

// filesCall is a call to /v1/sandboxes/{id}/files[/sub]?path=p plus extra
// query parameters; an empty p is refused.
func filesCall(method, id, sub, p string, extra url.Values) call {
	segs := []string{"files"}
	if sub != "" {
		segs = append(segs, sub)
	}
	r := sandboxRoute(id, segs...)
	if r.err == nil && p == "" {
		r.err = errors.New("path: must not be empty")
	}
	q := url.Values{"path": {p}}
	for k, v := range extra {
		q[k] = v
	}
	return call{method: method, route: r, query: q}
}

// ReadFile streams the file at path p (GET /v1/sandboxes/{id}/files) from
// offset; length 0 reads to the end. The caller must close the reader.
// A missing file fails with IsNotFound.
func (c *Client) ReadFile(ctx context.Context, id, p string, offset, length int64) (io.ReadCloser, error) {
	extra := url.Values{}
	if offset > 0 {
		extra.Set("offset", strconv.FormatInt(offset, 10))
	}
	if length > 0 {
		extra.Set("length", strconv.FormatInt(length, 10))
	}
	return c.openBody(ctx, filesCall(http.MethodGet, id, "", p, extra))
}

// WriteFile streams r into the file at path p, creating its parents; mode
// (permission bits, setuid, setgid, sticky) 0 means the agent's default. A body over the gateway's limit fails with
// IsTooLarge.
func (c *Client) WriteFile(ctx context.Context, id, p string, mode fs.FileMode, r io.Reader) (agentapi.WriteResult, error) {
	return c.writeFile(ctx, id, p, mode, r, url.Values{})
}

// writeFile is PUT /v1/sandboxes/{id}/files with the extra query.
func (c *Client) writeFile(ctx context.Context, id, p string, mode fs.FileMode, r io.Reader, extra url.Values) (agentapi.WriteResult, error) {
	if mode != 0 {
		extra.Set("mode", agentapi.FormatMode(mode))
	}
	cl := filesCall(http.MethodPut, id, "", p, extra)
	cl.body = r
	var res agentapi.WriteResult
	err := c.do(ctx, cl, &res)
	return res, err
}

// CreateFile is WriteFile for a file that must not exist yet: when it does,
// nothing is written and the call fails with IsConflict. Of callers racing
// to create one path, exactly one succeeds.
func (c *Client) CreateFile(ctx context.Context, id, p string, mode fs.FileMode, r io.Reader) (agentapi.WriteResult, error) {
	return c.writeFile(ctx, id, p, mode, r, url.Values{"exclusive": {"true"}})
}

// DeleteFile removes the file, symlink (not its target) or empty directory
// at path p; a missing one fails with IsNotFound.
func (c *Client) DeleteFile(ctx context.Context, id, p string) error {
	return c.do(ctx, filesCall(http.MethodDelete, id, "", p, nil), nil)
}

// Stat describes the file system entry at path p; a missing one fails with
// IsNotFound.
func (c *Client) Stat(ctx context.Context, id, p string) (agentapi.FileInfo, error) {
	var fi agentapi.FileInfo
	err := c.do(ctx, filesCall(http.MethodGet, id, "stat", p, nil), &fi)
	return fi, err
}

// ListDir lists the directory at path p.
func (c *Client) ListDir(ctx context.Context, id, p string) (agentapi.FileList, error) {
	var l agentapi.FileList
	err := c.do(ctx, filesCall(http.MethodGet, id, "list", p, nil), &l)
	return l, err
}

// UploadArchive streams a tar (or tar.gz) from r and extracts it into the
// directory at path p (PUT /v1/sandboxes/{id}/files/archive).
func (c *Client) UploadArchive(ctx context.Context, id, p string, r io.Reader) (agentapi.WriteResult, error) {
	cl := filesCall(http.MethodPut, id, "archive", p, nil)
	cl.body = r
	var res agentapi.WriteResult
	err := c.do(ctx, cl, &res)
	return res, err
}

// DownloadArchive streams a tar (tar.gz with gzip) of the directory at path
// p. The caller must close the reader.
func (c *Client) DownloadArchive(ctx context.Context, id, p string, gzip bool) (io.ReadCloser, error) {
	var extra url.Values
	if gzip {
		extra = url.Values{"gzip": {"true"}}
	}
	return c.openBody(ctx, filesCall(http.MethodGet, id, "archive", p, extra))
}

// openBody sends cl asking for raw bytes and returns the answer's body.
func (c *Client) openBody(ctx context.Context, cl call) (io.ReadCloser, error) {
	cl.accept = "application/octet-stream"
	resp, err := c.send(ctx, cl)
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}
