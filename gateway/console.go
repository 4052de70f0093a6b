package gateway

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"mime"
	"net/http"
	"path"
	"strings"

	"github.com/gofiber/fiber/v2"

	"github.com/quarryhq/quarry/errclass"
	"github.com/quarryhq/quarry/execagent/agentapi"
)

// consoleCSP is the console's Content-Security-Policy: its own origin for
// scripts, styles, images (and data: images), and API calls and the PTY
// WebSocket; no inline script or style, no framing, no <base>, no form
// posts. xterm.js's injected <style> elements go through a shim in app.js
// (constructable stylesheets), so no 'unsafe-inline', hash or nonce is
// needed (docs/CONSOLE.md, "Content-Security-Policy").
const consoleCSP = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"

// consoleFile is one embedded file of the console, ready to send.
type consoleFile struct {
	body  []byte
	gzip  []byte // body gzipped; nil when that is not smaller
	ctype string
	etag  string
}

// console serves the web console's embedded files (gateway/ui) at /ui. It
// is read-only after newConsole and safe for concurrent use.
type console struct {
	files map[string]consoleFile // by path below /ui/, "index.html" for /ui
}

// newConsole reads every file of fsys into memory (a few hundred KiB), with
// its content type, ETag and gzipped form.
func newConsole(fsys fs.FS) (*console, error) {
	c := &console{files: make(map[string]consoleFile)}
	err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		body, err := fs.ReadFile(fsys, p)
		if err != nil {
			return fmt.Errorf("read %s: %w", p, err)
		}
		sum := sha256.Sum256(body)
		f := consoleFile{body: body, ctype: consoleType(p), etag: `"` + hex.EncodeToString(sum[:12]) + `"`}
		var zb bytes.Buffer
		zw, err := gzip.NewWriterLevel(&zb, gzip.BestCompression)
		if err != nil {
			return fmt.Errorf("gzip %s: %w", p, err)
		}
		if _, err := zw.Write(body); err != nil {
			return fmt.Errorf("gzip %s: %w", p, err)
		}
		if err := zw.Close(); err != nil {
			return fmt.Errorf("gzip %s: %w", p, err)
		}
		if zb.Len() < len(body) {
			f.gzip = zb.Bytes()
		}
		c.files[p] = f
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("console files: %w", err)
	}
	if _, ok := c.files["index.html"]; !ok {
		return nil, fmt.Errorf("console files: no index.html")
	}
	return c, nil
}

// consoleType is the Content-Type of a console file, by its extension.
func consoleType(p string) string {
	switch ext := path.Ext(p); ext {
	case ".html":
		return "text/html; charset=utf-8"
	case ".js", ".mjs":
		return "text/javascript; charset=utf-8"
	case ".css":
		return "text/css; charset=utf-8"
	case ".md", "":
		return "text/plain; charset=utf-8" // README.md, LICENSE
	default:
		if t := mime.TypeByExtension(ext); t != "" {
			return t
		}
		return "application/octet-stream"
	}
}

// serveConsole handles GET /ui, /ui/{file} and /ui/vendor/{pkg}/{file}: the
// console's files, without authentication (they hold no data: every call
// the page makes carries the API key). /ui and /ui/ are index.html; a path
// that is not an embedded file is 404. Parameters are whole segments, so no
// path can climb out of the embedded tree. Every answer carries the console's CSP, nosniff
// and no-referrer; files are revalidated by ETag (Cache-Control no-cache),
// since their names carry no version.
func (g *Gateway) serveConsole(c *fiber.Ctx) error {
	name := c.Params("file")
	switch pkg := c.Params("pkg"); {
	case pkg != "":
		name = "vendor/" + pkg + "/" + name
	case name == "":
		name = "index.html"
	}
	f, ok := g.ui.files[name]
	if !ok {
		return errclass.New(http.StatusNotFound, agentapi.CodeNotFound, fmt.Sprintf("the console has no file %q", name))
	}
	h := &c.Response().Header
	h.Set("Content-Security-Policy", consoleCSP)
	h.Set(fiber.HeaderXContentTypeOptions, "nosniff")
	h.Set(fiber.HeaderReferrerPolicy, "no-referrer")
	h.Set(fiber.HeaderXFrameOptions, "DENY")
	h.Set(fiber.HeaderCacheControl, "no-cache")
	h.Set(fiber.HeaderETag, f.etag)
	h.Set(fiber.HeaderVary, fiber.HeaderAcceptEncoding)
	h.Set(fiber.HeaderContentType, f.ctype)
	if inm := c.Get(fiber.HeaderIfNoneMatch); inm != "" && etagMatches(inm, f.etag) {
		return c.SendStatus(http.StatusNotModified)
	}
	if f.gzip != nil && acceptsGzip(c.Get(fiber.HeaderAcceptEncoding)) {
		h.Set(fiber.HeaderContentEncoding, "gzip")
		return c.Send(f.gzip)
	}
	return c.Send(f.body)
}

// etagMatches reports whether an If-None-Match header names etag (or is *).
func etagMatches(header, etag string) bool {
	for _, t := range strings.Split(header, ",") {
		t = strings.TrimPrefix(strings.TrimSpace(t), "W/")
		if t == etag || t == "*" {
			return true
		}
	}
	return false
}

// acceptsGzip reports whether an Accept-Encoding header allows gzip.
func acceptsGzip(header string) bool {
	for _, part := range strings.Split(header, ",") {
		coding, params, _ := strings.Cut(strings.TrimSpace(part), ";")
		if strings.EqualFold(strings.TrimSpace(coding), "gzip") {
			return strings.ReplaceAll(strings.TrimSpace(params), " ", "") != "q=0"
		}
	}
	return false
}
