package execagent

import (
	"archive/tar"
	"bufio"
	"cmp"
	"compress/flate"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

func sortFileInfos(fis []agentapi.FileInfo) {
	slices.SortFunc(fis, func(a, b agentapi.FileInfo) int { return strings.Compare(a.Name, b.Name) })
}

// handleArchiveDownload answers GET /v1/files/archive?path=&gzip= with a tar
// (or tar.gz) of the directory (or of the single file). Names are relative
// to path; symlinks are stored as symlinks, never followed. A tree whose
// regular files add up to more than MaxReadBytes is refused with 413.
func (s *Server) handleArchiveDownload(w http.ResponseWriter, r *http.Request) error {
	p, err := s.queryPath(r)
	if err != nil {
		return err
	}
	gz, err := queryBool(r, "gzip")
	if err != nil {
		return err
	}
	root, err := os.Lstat(p)
	if err != nil {
		return fsError("path", p, err)
	}
	base := p
	if !root.IsDir() {
		base = filepath.Dir(p)
	}
	// First pass: size the tree, so an over-limit download is refused
	// before anything is sent.
	var total int64
	err = walkTree(p, root, func(_ string, fi fs.FileInfo) error {
		if fi.Mode().IsRegular() {
			total += fi.Size()
			if total > s.cfg.MaxReadBytes {
				return fmt.Errorf("%q holds more than %d bytes, the agent's download limit: %w", p, s.cfg.MaxReadBytes, errTooLarge)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	if gz {
		w.Header().Set("Content-Type", "application/gzip")
	} else {
		w.Header().Set("Content-Type", "application/x-tar")
	}
	w.WriteHeader(http.StatusOK)
	var out io.Writer = w
	var zw *gzip.Writer
	if gz {
		zw = gzip.NewWriter(w)
		out = zw
	}
	tw := tar.NewWriter(out)
	budget := s.cfg.MaxReadBytes
	err = walkTree(p, root, func(full string, fi fs.FileInfo) error {
		return addTarEntry(tw, base, full, fi, &budget)
	})
	if err == nil {
		err = tw.Close()
	}
	if err == nil && zw != nil {
		err = zw.Close()
	}
	if err != nil {
		// The status is sent: abort the connection so the client sees a
		// broken transfer rather than a short but valid archive.
		s.log.Warn("archive download aborted", "path", p, "err", err)
		panic(http.ErrAbortHandler)
	}
	return nil
}

// walkTree visits p (described by fi) and, when it is a directory, its
// descendants in lexical order without following symlinks, until visit
// returns an error. A visit of a directory that returns fs.SkipDir leaves
// its descendants out.
func walkTree(p string, fi fs.FileInfo, visit func(string, fs.FileInfo) error) error {
	if err := visit(p, fi); errors.Is(err, fs.SkipDir) && fi.IsDir() {
		return nil
	} else if err != nil {
		return err
	}
	if !fi.IsDir() {
		return nil
	}
	ents, err := os.ReadDir(p)
	if err != nil {
		return fsError("path", p, err)
	}
	for _, e := range ents {
		full := filepath.Join(p, e.Name())
		cfi, err := os.Lstat(full)
		if err != nil {
			continue // removed meanwhile
		}
		if err := walkTree(full, cfi, visit); err != nil {
			return err
		}
	}
	return nil
}

// addTarEntry writes one entry named relative to base.
func addTarEntry(tw *tar.Writer, base, full string, fi fs.FileInfo, budget *int64) error {
	rel, err := filepath.Rel(base, full)
	if err != nil {
		return fmt.Errorf("archive %q: %w", full, err)
	}
	if rel == "." {
		return nil // the directory itself
	}
	link := ""
	if fi.Mode()&fs.ModeSymlink != 0 {
		if link, err = os.Readlink(full); err != nil {
			return fmt.Errorf("archive %q: %w", full, err)
		}
	}
	if !fi.Mode().IsRegular() && !fi.IsDir() && fi.Mode()&fs.ModeSymlink == 0 {
		return nil // devices, fifos, sockets are left out
	}
	hdr, err := tar.FileInfoHeader(fi, link)
	if err != nil {
		return fmt.Errorf("archive %q: %w", full, err)
	}
	hdr.Name = filepath.ToSlash(rel)
	if fi.IsDir() {
		hdr.Name += "/"
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("archive %q: %w", full, err)
	}
	if !fi.Mode().IsRegular() {
		return nil
	}
	*budget -= hdr.Size
	if *budget < 0 {
		return fmt.Errorf("archive %q: over the download limit: %w", full, errTooLarge)
	}
	f, err := os.Open(full)
	if err != nil {
		return fmt.Errorf("archive %q: %w", full, err)
	}
	defer f.Close()
	if _, err := io.CopyN(tw, f, hdr.Size); err != nil {
		return fmt.Errorf("archive %q: %w", full, err)
	}
	return nil
}

// handleArchiveUpload answers PUT /v1/files/archive?path=: the body is a tar
// or a tar.gz (detected by its magic bytes), extracted into path (created)
// through a staging directory (upload.go): nothing of a refused archive
// lands. Entries that would land outside path — absolute names, ".."
// components, writes through a symlink — are refused with 400, as are
// device and fifo entries.
func (s *Server) handleArchiveUpload(w http.ResponseWriter, r *http.Request) error {
	p, err := s.queryPath(r)
	if err != nil {
		return err
	}
	u, err := s.newUpload(p)
	if err != nil {
		return err
	}
	body := bufio.NewReader(http.MaxBytesReader(w, r.Body, s.cfg.MaxUploadBytes))
	if err := u.extract(body); err != nil {
		u.discard()
		if errors.Is(err, errNoSpace) {
			return drained(body, err)
		}
		return err
	}
	if err := u.merge(); err != nil {
		u.discard()
		return err
	}
	u.cleanup()
	writeJSON(w, http.StatusOK, agentapi.WriteResult{Path: p, Bytes: u.x.bytes, Entries: u.x.entries})
	return nil
}

// uploadError classifies an error of an archive upload.
func uploadError(err error, limit int64) error {
	var mbe *http.MaxBytesError
	var br *badRequestError
	switch {
	case errors.As(err, &mbe):
		return fmt.Errorf("archive is over the upload limit of %d bytes: %w", limit, errTooLarge)
	case errors.As(err, &br), errors.Is(err, errTooLarge):
		return err
	case errors.Is(err, tar.ErrHeader), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, gzip.ErrHeader), errors.Is(err, gzip.ErrChecksum),
		errors.As(err, new(flate.CorruptInputError)):
		return invalid("body", "not a valid tar or tar.gz archive: %s", err.Error())
	case errors.Is(err, syscall.ENAMETOOLONG):
		return invalid("body", "an archive entry's name is too long (a name is at most %d bytes, a path %d): %s", maxNameBytes, maxPathBytes, err.Error())
	}
	return err
}

// tarBlock is the size of a tar block.
const tarBlock = 512

// extractor extracts tar entries below root.
type extractor struct {
	root    *os.Root
	dir     string // root's path, for messages
	budget  int64  // extracted bytes left
	bytes   int64
	entries int
	rooted  int // entries that took the os.Root path, not the fast one
	// exact (a restore) keeps every directory's mode and mtime in dirs,
	// for finish: extracting into a directory changes its mtime, and one
	// without write permission could not take its entries.
	exact bool
	dirs  []dirMeta
	// writer, when set, is what a regular file's bytes are written to
	// (Server.stagedFile); nil: the file.
	writer func(f *os.File) io.Writer
	// open is the path of directories this extraction made that the
	// archive is in, open, the root (".") first: the fast path
	// (extract_fast.go). Empty: none.
	open []madeDir
	// listed, when set, collects the directories the archive lists, by
	// name, with the mode an extraction that is not exact gives them
	// (mode|0700): an upload gives them to the directories it merges into.
	listed map[string]dirMeta
	// keep, when set (a restore), keeps the live files whose bytes are
	// the archive's (extract_keep.go).
	keep *keeper
}

// listDir records directory entry d: for finish (exact) and a merge
// (listed).
func (x *extractor) listDir(d dirMeta) {
	if x.exact {
		x.dirs = append(x.dirs, d)
	}
	if x.listed != nil {
		x.listed[d.name] = dirMeta{name: d.name, mode: d.mode | 0o700, mtime: d.mtime}
	}
}

// dirMeta is a directory's mode and mtime from its archive entry.
type dirMeta struct {
	name  string
	mode  fs.FileMode
	mtime time.Time
	// f and parent: the directory and its parent, open, when the fast
	// path made it (extract_fast.go); nil: set them through the root.
	f, parent *os.File
}

// finish gives the directories extracted exactly their archive's modes
// and mtimes, deepest first (an archive lists a directory before its
// entries). A directory listed more than once gets its last listing's
// mode and mtime (as with every other entry, the later one wins), set
// where it was first listed, after everything below it.
func (x *extractor) finish() error {
	first := make(map[string]int, len(x.dirs))
	last := make(map[string]int, len(x.dirs))
	for i, d := range x.dirs {
		if _, ok := first[d.name]; !ok {
			first[d.name] = i
		}
		last[d.name] = i
	}
	for i := len(x.dirs) - 1; i >= 0; i-- {
		d := x.dirs[i]
		if first[d.name] != i || x.keep.grafted(d.name) { // a graft has the archive's mode and mtime
			continue
		}
		v := x.dirs[last[d.name]]
		if d.f != nil {
			if err := d.f.Chmod(v.mode); err != nil {
				return fmt.Errorf("set the mode of %q: %w", filepath.Join(x.dir, d.name), err)
			}
			if err := setTimes(int(d.parent.Fd()), path.Base(d.name), &tar.Header{ModTime: v.mtime}); err != nil {
				return fmt.Errorf("set the mtime of %q: %w", filepath.Join(x.dir, d.name), err)
			}
			continue
		}
		if err := x.root.Chmod(d.name, v.mode); err != nil {
			return fmt.Errorf("set the mode of %q: %w", filepath.Join(x.dir, d.name), err)
		}
		if err := x.root.Chtimes(d.name, v.mtime, v.mtime); err != nil {
			return fmt.Errorf("set the mtime of %q: %w", filepath.Join(x.dir, d.name), err)
		}
	}
	return nil
}

// entryName validates a tar entry name and returns it cleaned and relative.
func entryName(name string) (string, error) {
	clean, why := cleanName(name)
	if why != "" {
		return "", invalid("body", "archive entry %q: %s", name, why)
	}
	return clean, nil
}

// linkTarget validates the target of hard link entry hdr (a name in the
// archive, as an entry's) and returns it cleaned and relative. A refusal
// names the entry and its target.
func linkTarget(hdr *tar.Header) (string, error) {
	clean, why := cleanName(hdr.Linkname)
	if why != "" {
		return "", invalid("body", "archive entry %q: hard link to %q: %s", hdr.Name, hdr.Linkname, why)
	}
	return clean, nil
}

// cleanName returns name cleaned and relative, or why it is refused.
func cleanName(name string) (string, string) {
	if name == "" || strings.ContainsRune(name, 0) {
		return "", "invalid name"
	}
	if strings.HasPrefix(name, "/") || filepath.IsAbs(name) {
		return "", "absolute paths are refused"
	}
	for _, part := range strings.Split(name, "/") {
		if part == ".." {
			return "", "\"..\" escapes the target directory"
		}
	}
	return path.Clean(name), ""
}

// checkParents refuses entry hdr (named name, cleaned) when the existing
// parents of name include a symlink (a write through it could land
// anywhere) or a non-directory.
func (x *extractor) checkParents(hdr *tar.Header, name string) error {
	if why := x.parentsProblem(name); why != "" {
		return invalid("body", "archive entry %q: %s", hdr.Name, why)
	}
	return nil
}

// parentsProblem says why the existing parents of name (cleaned) may not
// be written below, or returns "".
func (x *extractor) parentsProblem(name string) string {
	dir := path.Dir(name)
	if dir == "." {
		return ""
	}
	parts := strings.Split(dir, "/")
	for i := range parts {
		prefix := strings.Join(parts[:i+1], "/")
		fi, err := x.root.Lstat(prefix)
		if errors.Is(err, fs.ErrNotExist) {
			return "" // created below, as a real directory
		}
		if err != nil {
			return err.Error()
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			return fmt.Sprintf("writes through the symlink %q", prefix)
		}
		if !fi.IsDir() {
			return fmt.Sprintf("%q is not a directory", prefix)
		}
	}
	return ""
}

// replace removes an existing non-directory at name, so a new entry never
// writes through an old symlink.
func (x *extractor) replace(orig, name string) error {
	fi, err := x.root.Lstat(name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return invalid("body", "archive entry %q: %s", orig, err.Error())
	}
	if fi.IsDir() {
		return invalid("body", "archive entry %q: a directory is in the way", orig)
	}
	if err := x.root.Remove(name); err != nil {
		return invalid("body", "archive entry %q: %s", orig, err.Error())
	}
	return nil
}

func (x *extractor) entry(hdr *tar.Header, body io.Reader) error {
	name, err := entryName(hdr.Name)
	if err != nil {
		return err
	}
	if name == "." {
		return nil
	}
	if done, err := x.fastEntry(hdr, name, body); done || err != nil {
		return err
	}
	x.rooted++
	if err := x.checkParents(hdr, name); err != nil {
		return err
	}
	fail := func(err error) error {
		if full := diskFull(filepath.Join(x.dir, name), err); full != nil {
			return full
		}
		return invalid("body", "archive entry %q: %s", hdr.Name, err.Error())
	}
	if dir := path.Dir(name); dir != "." {
		if err := x.root.MkdirAll(dir, 0o755); err != nil {
			return fail(err)
		}
	}
	mode := unixMode(uint32(hdr.Mode) & 0o7777)
	switch hdr.Typeflag {
	case tar.TypeDir:
		fi, err := x.root.Lstat(name)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			if err := x.root.Mkdir(name, 0o755); err != nil {
				return fail(err)
			}
		case err != nil:
			return fail(err)
		case !fi.IsDir():
			return invalid("body", "archive entry %q: a file is in the way", hdr.Name)
		}
		if err := x.root.Chmod(name, mode|0o700); err != nil { // stay writable for later entries
			return fail(err)
		}
		x.listDir(dirMeta{name: name, mode: mode, mtime: hdr.ModTime})
	case tar.TypeReg:
		if hdr.Size > x.budget {
			return fmt.Errorf("archive extracts to more than the upload limit: %w", errTooLarge)
		}
		if err := x.replace(hdr.Name, name); err != nil {
			return err
		}
		f, err := x.root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return fail(err)
		}
		var w io.Writer = f
		if x.writer != nil {
			w = x.writer(f)
		}
		n, err := io.CopyN(w, body, hdr.Size)
		cerr := f.Close()
		x.budget -= n
		x.bytes += n
		if full := diskFull(filepath.Join(x.dir, name), cmp.Or(err, cerr)); full != nil {
			return full
		}
		if err != nil {
			return uploadError(err, 0)
		}
		if cerr != nil {
			return fail(cerr)
		}
		if err := x.root.Chmod(name, mode); err != nil {
			return fail(err)
		}
	case tar.TypeSymlink:
		if err := x.replace(hdr.Name, name); err != nil {
			return err
		}
		if err := x.root.Symlink(hdr.Linkname, name); err != nil {
			return fail(err)
		}
	case tar.TypeLink:
		target, err := linkTarget(hdr)
		if err != nil {
			return err
		}
		if why := x.parentsProblem(target); why != "" {
			return invalid("body", "archive entry %q: hard link to %q: %s", hdr.Name, hdr.Linkname, why)
		}
		if fi, err := x.root.Lstat(target); err != nil || !fi.Mode().IsRegular() {
			return invalid("body", "archive entry %q: hard link to %q: not a regular file of the archive", hdr.Name, hdr.Linkname)
		}
		if err := x.replace(hdr.Name, name); err != nil {
			return err
		}
		if err := x.root.Link(target, name); err != nil {
			return fail(err)
		}
	case tar.TypeXGlobalHeader, tar.TypeXHeader, tar.TypeGNULongName, tar.TypeGNULongLink:
		return nil
	default:
		return invalid("body", "archive entry %q: type %q (device, fifo, ...) is not supported", hdr.Name, string(hdr.Typeflag))
	}
	if hdr.Typeflag != tar.TypeSymlink && !hdr.ModTime.IsZero() {
		_ = x.root.Chtimes(name, hdr.ModTime, hdr.ModTime)
	}
	x.entries++
	return nil
}
