package execagent

import (
	"archive/tar"
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/klauspost/compress/gzip"
	"golang.org/x/sys/unix"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

// stagingPrefix starts the name of a restore's or an archive upload's
// staging directory. A checkpoint leaves such entries at the top of a root
// out (a restore or an upload the agent did not finish, its process
// killed), and a restore moves them out with the root's other entries.
const stagingPrefix = ".quarry-restore-"

// copyBufSize is the size of the buffer files are copied through.
const copyBufSize = 256 << 10

// compressionLevel maps the compression query parameter to a gzip level.
func compressionLevel(name string) (int, bool) {
	switch name {
	case "", agentapi.CompressionFast:
		return gzip.HuffmanOnly, true
	case agentapi.CompressionNone:
		return gzip.NoCompression, true
	case agentapi.CompressionSmall:
		return gzip.BestSpeed, true
	}
	return 0, false
}

// ckEntry is one entry a checkpoint will archive, as its walk saw it:
// kept small, since a checkpoint holds one per entry until it is sent.
type ckEntry struct {
	full  string      // absolute path in the sandbox
	link  string      // a symlink's target
	size  int64       // a regular file's size when walked
	mtime int64       // Unix seconds
	mode  fs.FileMode // kind and permissions
}

// ckWalk is what the walk of a checkpoint's roots found.
type ckWalk struct {
	entries []ckEntry
	skipped int   // devices, sockets, fifos left out
	bytes   int64 // regular files' bytes
}

// handleCheckpoint answers GET /v1/checkpoint?path=&exclude=&compression=
// with a checkpoint archive (docs/ARCHITECTURE.md, "Checkpoints: the
// agent's side"). It walks first, so that every refusal (404, 403, 413) is
// answered before the status, then streams; a failure while streaming
// aborts the connection.
func (s *Server) handleCheckpoint(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	roots, err := s.checkpointRoots(q["path"])
	if err != nil {
		return err
	}
	ex, err := parseExcludes(q["exclude"])
	if err != nil {
		return err
	}
	name := q.Get("compression")
	level, ok := compressionLevel(name)
	if !ok {
		return invalid("compression", "must be %s, %s or %s, got %q", agentapi.CompressionFast, agentapi.CompressionNone, agentapi.CompressionSmall, name)
	}
	if !s.ckMu.TryRLock() {
		return fmt.Errorf("a restore is running in this sandbox; take the checkpoint when it is done: %w", errBusy)
	}
	defer s.ckMu.RUnlock()
	walk, err := s.walkCheckpoint(r, roots, ex)
	if err != nil {
		return err
	}
	h := w.Header()
	format := agentapi.FormatOf(name)
	h.Set("Content-Type", agentapi.ContentType(format))
	h.Set(agentapi.HeaderFormat, format)
	h.Set(agentapi.HeaderFiles, strconv.Itoa(len(walk.entries)))
	h.Set(agentapi.HeaderSkipped, strconv.Itoa(walk.skipped))
	h.Set(agentapi.HeaderBytes, strconv.FormatInt(walk.bytes, 10))
	list, err := json.Marshal(roots) // valid UTF-8 (checkpointRoots); control characters escaped
	if err != nil {
		return fmt.Errorf("encode roots: %w", err)
	}
	h.Set(agentapi.HeaderRoots, string(list))
	w.WriteHeader(http.StatusOK)
	if err := s.writeCheckpoint(w, roots, walk.entries, format, level); err != nil {
		// The status is sent: abort the connection so the caller sees a
		// broken transfer rather than a short but valid archive.
		s.log.Warn("checkpoint aborted", "roots", roots, "err", err)
		panic(http.ErrAbortHandler)
	}
	return nil
}

// checkpointRoots resolves the roots of a checkpoint (none: the work dir)
// and checks them: each exists, none is "/" or inside another, and each is
// valid UTF-8 (the roots header is JSON).
func (s *Server) checkpointRoots(paths []string) ([]string, error) {
	if len(paths) == 0 {
		paths = []string{s.cfg.Workdir}
	}
	roots := make([]string, 0, len(paths))
	for _, p := range paths {
		root, err := s.resolvePath("path", p)
		if err != nil {
			return nil, err
		}
		if !utf8.ValidString(root) {
			return nil, invalid("path", "%q is not valid UTF-8", root)
		}
		if root == "/" {
			return nil, invalid("path", "the root of the file system cannot be checkpointed; name the directories to keep")
		}
		if _, err := os.Lstat(root); err != nil {
			return nil, fsError("path", root, err)
		}
		roots = append(roots, root)
	}
	if err := checkRoots(roots); err != nil {
		return nil, invalid("path", "%s", err.Error())
	}
	return roots, nil
}

// checkRoots refuses a root that is not absolute and clean, is "/", or
// lies inside (or is) another.
func checkRoots(roots []string) error {
	for i, a := range roots {
		if !filepath.IsAbs(a) || filepath.Clean(a) != a || a == "/" {
			return fmt.Errorf("%q is not an absolute, clean path below /", a)
		}
		for _, b := range roots[:i] {
			if inside(a, b) || inside(b, a) {
				return fmt.Errorf("%q and %q overlap: name each tree once", b, a)
			}
		}
	}
	return nil
}

// inside reports whether p is dir or lies below it.
func inside(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, dir+"/")
}

// walkCheckpoint walks the roots in order and lists what the checkpoint
// will archive, checking the limits and that every file is readable.
func (s *Server) walkCheckpoint(r *http.Request, roots []string, ex excludes) (ckWalk, error) {
	var walk ckWalk
	for _, root := range roots {
		fi, err := os.Lstat(root)
		if err != nil {
			return walk, fsError("path", root, err)
		}
		err = walkTree(root, fi, func(full string, fi fs.FileInfo) error {
			if err := r.Context().Err(); err != nil {
				return err
			}
			if full != root {
				rel := full[len(root)+1:]
				if (fi.IsDir() && strings.HasPrefix(rel, stagingPrefix) && !strings.Contains(rel, "/")) || ex.match(rel) {
					if fi.IsDir() {
						return fs.SkipDir
					}
					return nil
				}
			}
			e := ckEntry{full: full, mode: fi.Mode(), mtime: fi.ModTime().Unix()}
			switch {
			case fi.Mode().IsRegular():
				if err := unix.Access(full, unix.R_OK); err != nil {
					return fsError("path", full, err)
				}
				e.size = fi.Size()
				walk.bytes += e.size
				if walk.bytes > s.cfg.MaxReadBytes {
					return fmt.Errorf("the checkpoint's files hold more than %d bytes, the agent's download limit (QUARRY_AGENT_MAX_READ_BYTES): exclude some: %w",
						s.cfg.MaxReadBytes, errTooLarge)
				}
			case fi.Mode()&fs.ModeSymlink != 0:
				if e.link, err = os.Readlink(full); err != nil {
					return fsError("path", full, err)
				}
			case !fi.IsDir():
				walk.skipped++
				return nil
			}
			if len(walk.entries) == s.cfg.MaxCheckpointEntries {
				return fmt.Errorf("the checkpoint holds more than %d entries, the agent's limit (QUARRY_AGENT_MAX_CHECKPOINT_ENTRIES): exclude some: %w",
					s.cfg.MaxCheckpointEntries, errTooLarge)
			}
			walk.entries = append(walk.entries, e)
			return nil
		})
		if err != nil {
			return walk, err
		}
	}
	return walk, nil
}

// writeCheckpoint streams the archive of entries to w, in format (gzip at
// level for agentapi.FormatTarGzip).
func (s *Server) writeCheckpoint(w io.Writer, roots []string, entries []ckEntry, format string, level int) error {
	bw := bufio.NewWriterSize(w, 64<<10)
	var out io.Writer = bw
	var zw *gzip.Writer
	if format == agentapi.FormatTarGzip {
		var err error
		if zw, err = gzip.NewWriterLevel(bw, level); err != nil {
			return fmt.Errorf("start gzip: %w", err)
		}
		out = zw
	}
	tw := tar.NewWriter(out)
	list, err := json.Marshal(roots)
	if err != nil {
		return fmt.Errorf("encode roots: %w", err)
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeXGlobalHeader, PAXRecords: map[string]string{
		agentapi.PAXRoots: string(list), agentapi.PAXWorkdir: s.cfg.Workdir,
	}}); err != nil {
		return fmt.Errorf("write roots header: %w", err)
	}
	buf := make([]byte, copyBufSize)
	for _, e := range entries {
		if err := s.writeEntry(tw, e, buf); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("end tar: %w", err)
	}
	if zw != nil {
		if err := zw.Close(); err != nil {
			return fmt.Errorf("end gzip: %w", err)
		}
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("send: %w", err)
	}
	return nil
}

// writeEntry writes one walked entry. A regular file that shrank or
// vanished since the walk is padded with zeros to its walked size (the
// archive stays valid and its count right); one that grew is cut there.
func (s *Server) writeEntry(tw *tar.Writer, e ckEntry, buf []byte) error {
	hdr := &tar.Header{
		Name:    e.full[1:],
		Mode:    int64(agentapi.ModeBits(e.mode)),
		ModTime: time.Unix(e.mtime, 0),
	}
	switch {
	case e.mode.IsDir():
		hdr.Typeflag, hdr.Name = tar.TypeDir, hdr.Name+"/"
	case e.mode&fs.ModeSymlink != 0:
		hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, e.link
	default:
		hdr.Typeflag, hdr.Size = tar.TypeReg, e.size
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("archive %q: %w", e.full, err)
	}
	if hdr.Typeflag != tar.TypeReg || e.size == 0 {
		return nil
	}
	n, err := copyFile(tw, e.full, e.size, buf)
	if err != nil {
		return fmt.Errorf("archive %q: %w", e.full, err)
	}
	if n < e.size {
		s.log.Warn("checkpoint: a file shrank or vanished while it was archived; padded with zeros", "path", e.full, "walked", e.size, "read", n)
		clear(buf)
		for n < e.size {
			m, err := tw.Write(buf[:min(int64(len(buf)), e.size-n)])
			n += int64(m)
			if err != nil {
				return fmt.Errorf("archive %q: %w", e.full, err)
			}
		}
	}
	return nil
}

// copyFile copies at most size bytes of the file at p to w through buf
// (not io.Copy: tar.Writer's ReadFrom would allocate a buffer per file)
// and returns how many it copied. A file that is gone copies 0 bytes and
// no error; so does the rest of one that shrank, and so does a name that
// became a symlink since the walk (O_NOFOLLOW: the archive never holds
// what a link put there points to). The file is read with plain system
// calls, not an *os.File: one open, reads and a close per file, without
// the runtime's poller registration (a third of the calls per small file).
func copyFile(w io.Writer, p string, size int64, buf []byte) (int64, error) {
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ELOOP) {
		return 0, nil
	}
	if err != nil {
		return 0, &fs.PathError{Op: "open", Path: p, Err: err}
	}
	defer unix.Close(fd)
	var n int64
	for n < size {
		m, err := unix.Read(fd, buf[:min(int64(len(buf)), size-n)])
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return n, &fs.PathError{Op: "read", Path: p, Err: err}
		}
		if m == 0 {
			return n, nil
		}
		if _, werr := w.Write(buf[:m]); werr != nil {
			return n, werr
		}
		n += int64(m)
	}
	return n, nil
}

// excludes are a checkpoint's exclude patterns (docs/ARCHITECTURE.md):
// base patterns match an entry's last element at any depth, anchored ones
// its whole path relative to the root, element by element, "**" matching
// any number of elements.
type excludes struct {
	base     []string
	anchored [][]string
}

// parseExcludes checks and sorts the exclude patterns; a bad one is 400
// naming it.
func parseExcludes(patterns []string) (excludes, error) {
	var ex excludes
	for _, p := range patterns {
		bad := func(why string) error { return invalid("exclude", "%q: %s", p, why) }
		clean := strings.TrimSuffix(p, "/")
		switch {
		case clean == "":
			return ex, bad("an empty pattern")
		case strings.HasPrefix(clean, "/"):
			return ex, bad("patterns are relative to each path checkpointed (\"node_modules\", \"build/*.o\"), not absolute")
		case strings.ContainsRune(clean, 0):
			return ex, bad("contains a NUL byte")
		}
		elems := strings.Split(clean, "/")
		for _, el := range elems {
			if el == "" || el == "." || el == ".." {
				return ex, bad(fmt.Sprintf("the element %q: write each element out", el))
			}
			if _, err := path.Match(el, ""); err != nil {
				return ex, bad("not a valid pattern (path.Match: *, ?, [a-z], \\ escapes; ** for any number of elements)")
			}
		}
		if len(elems) == 1 {
			ex.base = append(ex.base, clean)
		} else {
			ex.anchored = append(ex.anchored, elems)
		}
	}
	return ex, nil
}

// match reports whether rel (relative to a root, "/"-separated, not ".")
// is excluded.
func (ex excludes) match(rel string) bool {
	if len(ex.base) == 0 && len(ex.anchored) == 0 {
		return false
	}
	last := rel[strings.LastIndexByte(rel, '/')+1:]
	for _, p := range ex.base {
		if ok, _ := path.Match(p, last); ok {
			return true
		}
	}
	if len(ex.anchored) == 0 {
		return false
	}
	elems := strings.Split(rel, "/")
	for _, p := range ex.anchored {
		if matchElems(p, elems) {
			return true
		}
	}
	return false
}

// matchElems matches path elements against pattern elements, "**"
// matching zero or more elements.
func matchElems(pat, elems []string) bool {
	for len(pat) > 0 {
		if pat[0] == "**" {
			for i := len(elems); i >= 0; i-- {
				if matchElems(pat[1:], elems[i:]) {
					return true
				}
			}
			return false
		}
		if len(elems) == 0 {
			return false
		}
		if ok, _ := path.Match(pat[0], elems[0]); !ok {
			return false
		}
		pat, elems = pat[1:], elems[1:]
	}
	return len(elems) == 0
}
