package execagent

import (
	"compress/gzip"
	"errors"
	"io"
	"io/fs"
	"mime"
	"mime/multipart"
	"net/http"
	"os"
	"path/filepath"
	"strings"
)

// envd's /files routes: GET downloads a file, POST uploads one (a raw
// application/octet-stream body, path in ?path=) or many (multipart
// form-data, each "file" part's filename its path). ?username= is accepted
// and ignored: files are the agent's user's (docs/E2B.md). Signed URLs
// (?signature=) are the gateway's to check. Errors are envd's
// {"code": <status>, "message"} (writeEnvdFilesError).

// envdMaxUploadParts bounds the parts of one multipart upload.
const envdMaxUploadParts = 10000

// handleEnvdDownload answers GET /files?path=: the file's bytes (serveFile:
// missing is 404, a directory 400, a file over MaxReadBytes 413). Served as
// identity whatever Accept-Encoding asks.
func (s *Server) handleEnvdDownload(w http.ResponseWriter, r *http.Request) error {
	p, err := s.envdPath("path", r.URL.Query().Get("path"))
	if err != nil {
		return err
	}
	return s.serveFile(w, p, 0, -1)
}

// handleEnvdUpload answers POST /files: each file is written as writeFile
// writes (a temporary file renamed over it, parents created, a full disk
// 507), keeping the mode of a file it replaces (0644 for a new one).
// Content-Encoding: gzip is decompressed within the same MaxUploadBytes.
// X-Metadata-<key> headers are every file's metadata (envd_meta.go). The
// answer is envd's [{"path", "name", "type": "file", "metadata"}].
func (s *Server) handleEnvdUpload(w http.ResponseWriter, r *http.Request) error {
	raw := http.MaxBytesReader(w, r.Body, s.cfg.MaxUploadBytes)
	entries, err := s.envdUpload(w, r, raw)
	if err != nil {
		return drained(raw, err)
	}
	writeJSON(w, http.StatusOK, entries)
	return nil
}

func (s *Server) envdUpload(w http.ResponseWriter, r *http.Request, raw io.ReadCloser) ([]envdUploadEntry, error) {
	md, err := uploadMetadata(r.Header)
	if err != nil {
		return nil, err
	}
	body := io.Reader(raw)
	switch enc := r.Header.Get("Content-Encoding"); enc {
	case "", "identity":
	case "gzip":
		zr, err := gzip.NewReader(raw)
		if err != nil {
			return nil, invalid("Content-Encoding", "the body is not gzip: %s", err.Error())
		}
		defer zr.Close()
		body = http.MaxBytesReader(w, io.NopCloser(zr), s.cfg.MaxUploadBytes)
	default:
		return nil, invalid("Content-Encoding", "%q is not served (gzip or identity)", enc)
	}
	path := r.URL.Query().Get("path")
	ct := r.Header.Get("Content-Type")
	mt, params, _ := mime.ParseMediaType(ct)
	switch {
	case mt == "application/octet-stream":
		if path == "" {
			return nil, invalid("path", "required with an application/octet-stream body")
		}
		e, err := s.uploadFile(path, body, md)
		if err != nil {
			return nil, err
		}
		return []envdUploadEntry{e}, nil
	case strings.HasPrefix(mt, "multipart/"):
		return s.uploadParts(path, multipart.NewReader(body, params["boundary"]), md)
	default:
		return nil, invalid("Content-Type", "%q: upload multipart/form-data or application/octet-stream", ct)
	}
}

// uploadParts writes the "file" parts of a multipart body: each to path
// when it is set (so one part only), else to its filename, each with the
// metadata md. One upload writes a path once.
func (s *Server) uploadParts(path string, mr *multipart.Reader, md map[string]string) ([]envdUploadEntry, error) {
	out := []envdUploadEntry{}
	seen := map[string]bool{}
	for range envdMaxUploadParts {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				return nil, err
			}
			return nil, invalid("body", "not a multipart body: %s", err.Error())
		}
		if part.FormName() != "file" {
			_ = part.Close()
			continue
		}
		name := path
		if name == "" {
			name = partPath(part)
		}
		if name == "" {
			_ = part.Close()
			return nil, invalid("file", "a part has no filename (the file's path) and there is no ?path=")
		}
		e, err := s.uploadFileOnce(name, part, md, seen)
		_ = part.Close()
		if err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return nil, invalid("body", "more than %d parts in one upload", envdMaxUploadParts)
}

// partPath is the filename of a part as sent: Go's Part.FileName keeps only
// its last element, and E2B's clients send the file's path there.
func partPath(part *multipart.Part) string {
	_, params, err := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
	if err != nil {
		return ""
	}
	return params["filename"]
}

// uploadFileOnce is uploadFile of a path not written before in this
// upload (seen).
func (s *Server) uploadFileOnce(name string, body io.Reader, md map[string]string, seen map[string]bool) (envdUploadEntry, error) {
	p, err := s.envdPath("path", name)
	if err != nil {
		return envdUploadEntry{}, err
	}
	if seen[p] {
		return envdUploadEntry{}, invalid("path", "%q: one upload writes a path once", p)
	}
	seen[p] = true
	return s.uploadFile(p, body, md)
}

// uploadFile writes body to name (envdPath), keeping the mode of the file
// it replaces, with the metadata md (envd_meta.go); the answer carries the
// metadata the file kept.
func (s *Server) uploadFile(name string, body io.Reader, md map[string]string) (envdUploadEntry, error) {
	p, err := s.envdPath("path", name)
	if err != nil {
		return envdUploadEntry{}, err
	}
	mode := fs.FileMode(0o644)
	if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
		mode = fi.Mode() & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
	}
	if _, err := s.writeFile(p, mode, false, body); err != nil {
		return envdUploadEntry{}, err
	}
	if err := writeMetadata(p, md); err != nil {
		return envdUploadEntry{}, err
	}
	return envdUploadEntry{Path: p, Name: filepath.Base(p), Type: "file", Metadata: readMetadata(p)}, nil
}
