package execagent

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

// maxSpecialRead bounds a read of a file whose size stat cannot tell
// (character devices, /proc files).
const maxSpecialRead = 16 << 20

// queryInt64 parses a non-negative integer query parameter (absent: def).
func queryInt64(r *http.Request, name string, def int64) (int64, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return 0, invalid(name, "must be a non-negative integer, got %q", v)
	}
	return n, nil
}

// queryBool parses a boolean query parameter (absent: false).
func queryBool(r *http.Request, name string) (bool, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, invalid(name, "must be true or false, got %q", v)
	}
	return b, nil
}

// queryPath resolves the "path" query parameter against the workdir.
func (s *Server) queryPath(r *http.Request) (string, error) {
	return s.resolvePath("path", r.URL.Query().Get("path"))
}

// resolvePath resolves p (field names it in errors) against the workdir.
func (s *Server) resolvePath(field, p string) (string, error) {
	if p == "" {
		return "", invalid(field, "required")
	}
	if strings.ContainsRune(p, 0) {
		return "", invalid(field, "contains a NUL byte")
	}
	if !filepath.IsAbs(p) {
		p = filepath.Join(s.cfg.Workdir, p)
	}
	return filepath.Clean(p), nil
}

// uploadTempPrefix begins the name of the temporary file a write stages
// beside its target (writeFile); envd's watchers do not report them.
const uploadTempPrefix = ".quarry-upload-"

// Linux limits of file names (NAME_MAX) and paths (PATH_MAX, without the NUL).
const (
	maxNameBytes = 255
	maxPathBytes = 4095
)

// fsError turns a file system error about p into one a person can act on:
// not found is 404, permission is 403, a wrong kind of file is 400, a full
// disk is 507 (diskFull).
func fsError(field, p string, err error) error {
	if full := diskFull(p, err); full != nil {
		return full
	}
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return statusError(errNotFound, http.StatusNotFound, agentapi.CodeNotFound, "%s %q: no such file or directory", field, p)
	case errors.Is(err, fs.ErrPermission):
		return statusError(err, http.StatusForbidden, agentapi.CodeForbidden, "%s %q: permission denied", field, p)
	case errors.Is(err, syscall.ENOTDIR):
		return invalid(field, "%q: a parent is not a directory", p)
	case errors.Is(err, syscall.EISDIR):
		return invalid(field, "%q is a directory", p)
	case errors.Is(err, syscall.ENAMETOOLONG):
		return invalid(field, "%q is too long: a name in it is over %d bytes or the whole path over %d bytes", p, maxNameBytes, maxPathBytes)
	}
	return fmt.Errorf("%s %q: %w", field, p, err)
}

// openPath opens p for reading. FIFOs and sockets are refused (opening a
// FIFO would wait for a writer).
func openPath(p string) (*os.File, fs.FileInfo, error) {
	if fi, err := os.Stat(p); err != nil {
		return nil, nil, fsError("path", p, err)
	} else if fi.Mode()&(fs.ModeNamedPipe|fs.ModeSocket) != 0 {
		return nil, nil, invalid("path", "%q is a fifo or a socket", p)
	}
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, nil, fsError("path", p, err)
	}
	fi, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return nil, nil, fsError("path", p, err)
	}
	return f, fi, nil
}

// handleFileRead answers GET /v1/files?path=&offset=&length= with the raw
// bytes. A read larger than MaxReadBytes is refused with 413.
func (s *Server) handleFileRead(w http.ResponseWriter, r *http.Request) error {
	p, err := s.queryPath(r)
	if err != nil {
		return err
	}
	off, err := queryInt64(r, "offset", 0)
	if err != nil {
		return err
	}
	length, err := queryInt64(r, "length", -1)
	if err != nil {
		return err
	}
	return s.serveFile(w, p, off, length)
}

// serveFile answers the bytes of the file p from off, at most length
// (-1: to the end), as application/octet-stream. A directory is 400, a
// read over MaxReadBytes 413.
func (s *Server) serveFile(w http.ResponseWriter, p string, off, length int64) error {
	f, fi, err := openPath(p)
	if err != nil {
		return err
	}
	defer f.Close()
	if fi.IsDir() {
		return invalid("path", "%q is a directory: list it with the files/list route, or download it with files/archive", p)
	}
	if fi.Mode().IsRegular() && fi.Size() > 0 {
		n := max(fi.Size()-off, 0)
		if length >= 0 {
			n = min(n, length)
		}
		if n > s.cfg.MaxReadBytes {
			return fmt.Errorf("%q: reading %d bytes is over the agent's read limit of %d bytes; read it in ranges with offset and length: %w",
				p, n, s.cfg.MaxReadBytes, errTooLarge)
		}
		if _, err := f.Seek(off, io.SeekStart); err != nil {
			return fsError("path", p, err)
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
		w.WriteHeader(http.StatusOK)
		_, _ = io.CopyN(w, f, n) // a short copy (the file shrank) ends the response early
		return nil
	}
	// Size unknown (device, /proc file): read into memory, bounded.
	limit := min(s.cfg.MaxReadBytes, maxSpecialRead)
	if length >= 0 {
		if length > limit {
			return fmt.Errorf("%q: reading %d bytes of a special file is over the limit of %d bytes: %w", p, length, limit, errTooLarge)
		}
		limit = length
	}
	if off > 0 {
		if _, err := io.CopyN(io.Discard, f, off); err != nil && !errors.Is(err, io.EOF) {
			return fsError("path", p, err)
		}
	}
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return fsError("path", p, err)
	}
	if int64(len(b)) > limit {
		if length >= 0 {
			b = b[:limit]
		} else {
			return fmt.Errorf("%q: a special file longer than %d bytes; read it with offset and length: %w", p, limit, errTooLarge)
		}
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b)
	return nil
}

// parseMode parses an octal permission query parameter (absent: def).
func parseMode(r *http.Request, def fs.FileMode) (fs.FileMode, error) {
	v := r.URL.Query().Get("mode")
	if v == "" {
		return def, nil
	}
	m, err := strconv.ParseUint(v, 8, 32)
	if err != nil || m > 0o7777 {
		return 0, invalid("mode", "must be an octal permission such as 0644, got %q", v)
	}
	return unixMode(uint32(m)), nil
}

// unixMode converts permission bits with setuid/setgid/sticky to an fs.FileMode.
func unixMode(m uint32) fs.FileMode {
	mode := fs.FileMode(m & 0o777)
	if m&0o4000 != 0 {
		mode |= fs.ModeSetuid
	}
	if m&0o2000 != 0 {
		mode |= fs.ModeSetgid
	}
	if m&0o1000 != 0 {
		mode |= fs.ModeSticky
	}
	return mode
}

// handleFileWrite answers PUT /v1/files?path=&mode=&exclusive=: the raw
// body replaces the file atomically (temporary file and rename), parents
// are created. With exclusive=true the file must not exist yet (409 if it
// does); it appears whole, and of writers racing for one path exactly one
// succeeds.
func (s *Server) handleFileWrite(w http.ResponseWriter, r *http.Request) error {
	p, err := s.queryPath(r)
	if err != nil {
		return err
	}
	mode, err := parseMode(r, 0o644)
	if err != nil {
		return err
	}
	exclusive, err := queryBool(r, "exclusive")
	if err != nil {
		return err
	}
	body := http.MaxBytesReader(w, r.Body, s.cfg.MaxUploadBytes)
	n, err := s.writeFile(p, mode, exclusive, body)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, agentapi.WriteResult{Path: p, Bytes: n})
	return nil
}

// writeFile replaces the file p with body atomically (a temporary file
// beside it, renamed), creating its parents; with exclusive, p must not
// exist (409), and of writers racing for one path exactly one succeeds.
// body ending in *http.MaxBytesError is 413; a full disk is 507, answered
// after the rest of body was read (drained). It returns the bytes written.
func (s *Server) writeFile(p string, mode fs.FileMode, exclusive bool, body io.Reader) (int64, error) {
	if _, err := os.Lstat(p); err == nil && exclusive {
		return 0, fmt.Errorf("%q already exists: %w", p, errConflict)
	}
	if fi, err := os.Stat(p); err == nil && fi.IsDir() {
		return 0, invalid("path", "%q is a directory", p)
	}
	dir := filepath.Dir(p)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return 0, fsError("path", p, err)
	}
	tmp, err := os.CreateTemp(dir, uploadTempPrefix+"*")
	if err != nil {
		return 0, fsError("path", p, err)
	}
	committed := false
	defer func() {
		if !committed {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()
	n, err := io.Copy(s.stagedFile(tmp), body)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return n, fmt.Errorf("file is over the upload limit of %d bytes: %w", s.cfg.MaxUploadBytes, errTooLarge)
		}
		if full := diskFull(p, err); full != nil {
			return n, drained(body, full)
		}
		return n, fmt.Errorf("write %q: %w", p, err)
	}
	if err := tmp.Chmod(mode); err != nil {
		return n, fsError("path", p, err)
	}
	if err := tmp.Close(); err != nil {
		if full := diskFull(p, err); full != nil {
			return n, full
		}
		return n, fmt.Errorf("write %q: %w", p, err)
	}
	if exclusive {
		err = os.Link(tmp.Name(), p)
		_ = os.Remove(tmp.Name())
		committed = true
		if errors.Is(err, fs.ErrExist) {
			return n, fmt.Errorf("%q already exists: %w", p, errConflict)
		}
		if err != nil {
			return n, fsError("path", p, err)
		}
		return n, nil
	}
	if err := os.Rename(tmp.Name(), p); err != nil {
		return n, fsError("path", p, err)
	}
	committed = true
	return n, nil
}

// handleFileDelete answers DELETE /v1/files?path=: removes a file, a
// symlink (not its target) or an empty directory; 404 when nothing is
// there.
func (s *Server) handleFileDelete(w http.ResponseWriter, r *http.Request) error {
	p, err := s.queryPath(r)
	if err != nil {
		return err
	}
	if err := os.Remove(p); err != nil {
		if errors.Is(err, syscall.ENOTEMPTY) || errors.Is(err, syscall.EEXIST) {
			return invalid("path", "%q is a directory that is not empty", p)
		}
		return fsError("path", p, err)
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// fileInfo describes an entry without following a final symlink.
func fileInfo(p string, fi fs.FileInfo) agentapi.FileInfo {
	out := agentapi.FileInfo{
		Name: fi.Name(), Path: p, Size: fi.Size(), Mode: agentapi.FormatMode(fi.Mode()),
		IsDir: fi.IsDir(), ModTime: fi.ModTime().UTC(),
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		out.Symlink, _ = os.Readlink(p)
	}
	return out
}

// handleFileStat answers GET /v1/files/stat?path=.
func (s *Server) handleFileStat(w http.ResponseWriter, r *http.Request) error {
	p, err := s.queryPath(r)
	if err != nil {
		return err
	}
	fi, err := os.Lstat(p)
	if err != nil {
		return fsError("path", p, err)
	}
	writeJSON(w, http.StatusOK, fileInfo(p, fi))
	return nil
}

// handleFileList answers GET /v1/files/list?path= with the directory's
// entries sorted by name; more than MaxListEntries is refused with 413.
func (s *Server) handleFileList(w http.ResponseWriter, r *http.Request) error {
	p, err := s.queryPath(r)
	if err != nil {
		return err
	}
	f, fi, err := openPath(p)
	if err != nil {
		return err
	}
	defer f.Close()
	if !fi.IsDir() {
		return invalid("path", "%q is not a directory", p)
	}
	ents, err := f.ReadDir(s.cfg.MaxListEntries + 1)
	if err != nil && !errors.Is(err, io.EOF) {
		return fsError("path", p, err)
	}
	if len(ents) > s.cfg.MaxListEntries {
		return fmt.Errorf("%q has more than %d entries: %w", p, s.cfg.MaxListEntries, errTooLarge)
	}
	out := agentapi.FileList{Path: p, Entries: make([]agentapi.FileInfo, 0, len(ents))}
	for _, e := range ents {
		fi, err := e.Info()
		if err != nil {
			continue // removed meanwhile
		}
		out.Entries = append(out.Entries, fileInfo(filepath.Join(p, e.Name()), fi))
	}
	sortFileInfos(out.Entries)
	writeJSON(w, http.StatusOK, out)
	return nil
}
