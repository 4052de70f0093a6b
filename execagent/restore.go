package execagent

import (
	"archive/tar"
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/klauspost/compress/flate"
	"github.com/klauspost/compress/gzip"
	"golang.org/x/sys/unix"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

// restoreUnit is one root of a restore: where it is staged and how it is
// swapped in.
type restoreUnit struct {
	root string // absolute path
	name string // the root's name in the archive: root without its leading "/"
	// inPlace: the root is a directory now and in the archive, so its
	// entries are swapped and the root itself stays (it may be a mount
	// point). Otherwise the root is staged beside itself and swapped whole.
	inPlace bool
	stage   string     // the staging directory: in the root (inPlace) or in its parent
	x       *extractor // extracts into stage/new
	rootHdr *tar.Header
	// rootMTime is an inPlace root's mtime before its staging directory
	// was made in it: making and removing that directory changes it.
	rootMTime time.Time
	created   []string // directories made to stage beside, outermost first
	// kept: an undo failed and the staging directory holds old entries.
	kept bool
}

// restore is one PUT /v1/checkpoint in progress.
type restore struct {
	s     *Server
	units []*restoreUnit
	files int
	bytes int64
	// rooted: entries that took the os.Root path (extract_fast.go), and
	// kept: live files kept (extract_keep.go), logged.
	rooted, kept int
}

// handleRestore answers PUT /v1/checkpoint?sha256= (docs/ARCHITECTURE.md,
// "Checkpoints: the agent's side") with Restore, the body bounded by
// MaxUploadBytes.
func (s *Server) handleRestore(w http.ResponseWriter, r *http.Request) error {
	want, err := querySHA256(r)
	if err != nil {
		return err
	}
	body := http.MaxBytesReader(w, r.Body, s.cfg.MaxUploadBytes)
	var vouch func() string // the sender's check stands for ours (agentapi.TrailerVouchedSHA256)
	if _, ok := r.Trailer[http.CanonicalHeaderKey(agentapi.TrailerVouchedSHA256)]; ok {
		vouch = func() string { return r.Trailer.Get(agentapi.TrailerVouchedSHA256) }
	}
	res, err := s.restore(body, want, vouch)
	if err != nil {
		return drained(body, err)
	}
	writeJSON(w, http.StatusOK, res)
	return nil
}

// Restore restores the checkpoint archive read from body, whose SHA-256 is
// want (lower-case hex): it stages every root, checks the body's hash, then
// swaps the roots in with renames that are undone if one fails. A failure
// before the swap leaves the sandbox as it was. It reads body to its end.
// The agent's HTTP restore and its one-shot
// form (execagent -restore, which unpacks a copy-on-write layer) are this;
// an HTTP body whose sender vouches for its SHA-256 (the trailer
// agentapi.TrailerVouchedSHA256) is not hashed again.
func (s *Server) Restore(body io.Reader, want string) (agentapi.RestoreResult, error) {
	return s.restore(body, want, nil)
}

// restore is Restore; with vouch, the body is not hashed here: vouch,
// called once the body has ended, returns the SHA-256 its sender checked
// the bytes against (agentapi.TrailerVouchedSHA256), which must be want.
func (s *Server) restore(body io.Reader, want string, vouch func() string) (agentapi.RestoreResult, error) {
	start := time.Now()
	if !s.ckMu.TryLock() {
		return agentapi.RestoreResult{}, fmt.Errorf("another restore or a checkpoint is running in this sandbox: %w", errBusy)
	}
	defer s.ckMu.Unlock()
	var (
		in   *bufio.Reader
		pipe *hashPipe
	)
	if vouch == nil {
		pipe = newHashPipe(body)
		// A small buffer: for gzip's magic bytes; reads of a block or more
		// go past it, straight from the pipe's chunks.
		in = bufio.NewReaderSize(pipe, tarBlock)
	} else {
		in = bufio.NewReaderSize(body, hashPipeChunk)
	}
	rs := &restore{s: s}
	err := rs.stage(in)
	if err == nil {
		if _, err = io.Copy(io.Discard, in); err != nil {
			err = restoreError(err, s.cfg.MaxUploadBytes)
		}
	}
	if pipe != nil {
		// Sum closes the pipe: the body is its caller's again, whatever err.
		if got := hex.EncodeToString(pipe.Sum()); err == nil && got != want {
			err = invalid("sha256", "the body hashes to %s, not %s: it is another archive, or it was damaged on its way; nothing was changed", got, want)
		}
	} else if err == nil {
		if got := vouch(); got != want {
			err = invalid("sha256", "the sender vouched for %q (%s), not %s: it did not check the body, or the body failed its check; nothing was changed", got, agentapi.TrailerVouchedSHA256, want)
		}
	}
	if err != nil {
		rs.discard()
		return agentapi.RestoreResult{}, err
	}
	if err := rs.swap(); err != nil {
		rs.discard()
		return agentapi.RestoreResult{}, err
	}
	rs.cleanup()
	res := agentapi.RestoreResult{Files: rs.files, Bytes: rs.bytes, DurationMS: time.Since(start).Milliseconds()}
	s.log.Info("restore", "roots", len(rs.units), "files", res.Files, "bytes", res.Bytes, "rooted", rs.rooted, "kept", rs.kept, "duration_ms", res.DurationMS)
	return res, nil
}

// querySHA256 parses the sha256 query parameter: 64 hex digits, returned
// in lower case.
func querySHA256(r *http.Request) (string, error) {
	v := r.URL.Query().Get("sha256")
	if b, err := hex.DecodeString(v); err != nil || len(b) != sha256.Size {
		return "", invalid("sha256", "must be the archive's SHA-256 as 64 hex digits, got %q", v)
	}
	return strings.ToLower(v), nil
}

// restoreError classifies an error of reading a checkpoint archive.
func restoreError(err error, limit int64) error {
	var corrupt flate.CorruptInputError
	if errors.Is(err, gzip.ErrChecksum) || errors.Is(err, gzip.ErrHeader) || errors.As(err, &corrupt) {
		return invalid("body", "not a valid checkpoint archive (%s or %s): %s; nothing was changed", agentapi.FormatTar, agentapi.FormatTarGzip, err.Error())
	}
	return uploadError(err, limit)
}

// stage extracts the archive read from in (a tar, or a tar.gz by its
// magic bytes: agentapi.FormatTar, FormatTarGzip) into the roots' staging
// directories, reading a gzip stream to its end (its CRC checked).
func (rs *restore) stage(in *bufio.Reader) error {
	limit := rs.s.cfg.MaxUploadBytes
	var src io.Reader = in
	var zr *gzip.Reader
	if agentapi.IsGzip(in) {
		var err error
		if zr, err = gzip.NewReader(in); err != nil {
			return restoreError(err, limit)
		}
		src = zr
	}
	tr := tar.NewReader(src)
	if err := rs.readRoots(tr); err != nil {
		return err
	}
	budget := limit
	var cur *restoreUnit
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return restoreError(err, limit)
		}
		if hdr.Typeflag == tar.TypeXGlobalHeader {
			continue
		}
		name, err := entryName(hdr.Name)
		if err != nil {
			return err
		}
		u := cur
		if u == nil || !inside(name, u.name) {
			if u = rs.unitOf(name); u == nil {
				return invalid("body", "archive entry %q is below none of the archive's roots", hdr.Name)
			}
			if u.x != nil {
				return invalid("body", "archive entry %q: the entries of %q are not together", hdr.Name, u.root)
			}
			if name != u.name {
				return invalid("body", "archive entry %q comes before the entry of its root %q", hdr.Name, u.root)
			}
			if cur != nil {
				budget = cur.x.budget
			}
			cur = u
			if err := rs.open(u, hdr, budget); err != nil {
				return err
			}
			if u.inPlace {
				continue // the root's mode and mtime are set after the swap
			}
		}
		if hdr.Typeflag == tar.TypeLink {
			target, err := linkTarget(hdr)
			if err != nil {
				return err
			}
			if !inside(target, u.name) {
				return invalid("body", "archive entry %q: hard link to %q, outside its root", hdr.Name, hdr.Linkname)
			}
			if hdr.Linkname, err = u.stagedName(target); err != nil {
				return err
			}
		}
		if hdr.Name, err = u.stagedName(name); err != nil {
			return err
		}
		if err := u.x.entry(hdr, tr); err != nil {
			return err
		}
	}
	if zr != nil {
		if _, err := io.Copy(io.Discard, zr); err != nil {
			return restoreError(err, limit)
		}
	}
	for _, u := range rs.units {
		if u.x == nil {
			return invalid("body", "the archive has no entry for its root %q", u.root)
		}
		if err := u.x.leave(""); err != nil { // settles every directory's graft
			return err
		}
		rs.files += u.x.entries
		rs.bytes += u.x.bytes
		rs.rooted += u.x.rooted
		if u.x.keep != nil {
			rs.kept += u.x.keep.kept
		}
		if u.inPlace {
			rs.files++
		}
	}
	return nil
}

// readRoots reads the archive's first entry, the roots header.
func (rs *restore) readRoots(tr *tar.Reader) error {
	hdr, err := tr.Next()
	if err != nil {
		return restoreError(err, rs.s.cfg.MaxUploadBytes)
	}
	list, ok := hdr.PAXRecords[agentapi.PAXRoots]
	if hdr.Typeflag != tar.TypeXGlobalHeader || !ok {
		return invalid("body", "not a checkpoint archive: its first entry is not a global header with %s", agentapi.PAXRoots)
	}
	var roots []string
	if err := json.Unmarshal([]byte(list), &roots); err != nil || len(roots) == 0 {
		return invalid("body", "the archive's %s is not a list of paths: %q", agentapi.PAXRoots, list)
	}
	if err := checkRoots(roots); err != nil {
		return invalid("body", "the archive's roots: %s", err.Error())
	}
	targets := make([]string, len(roots))
	for i, root := range roots {
		targets[i] = rebase(root, hdr.PAXRecords[agentapi.PAXWorkdir], rs.s.cfg.Workdir)
	}
	if err := checkRoots(targets); err != nil {
		return invalid("body", "the archive's roots, moved to this work dir: %s", err.Error())
	}
	for i, root := range roots {
		rs.units = append(rs.units, &restoreUnit{root: targets[i], name: root[1:]})
	}
	return nil
}

// rebase returns where root, taken by an agent whose work dir was from,
// is restored by one whose work dir is to: below to when it was at or
// below from (agentapi.PAXWorkdir), else where it was.
func rebase(root, from, to string) string {
	if from == "" || from == to || !filepath.IsAbs(from) || filepath.Clean(from) != from || !inside(root, from) {
		return root
	}
	return filepath.Join(to, root[len(from):])
}

// unitOf returns the unit whose root name is, or holds, name (nil: none).
func (rs *restore) unitOf(name string) *restoreUnit {
	for _, u := range rs.units {
		if inside(name, u.name) {
			return u
		}
	}
	return nil
}

// stagedName maps an archive name below u's root to its name in
// stage/new.
func (u *restoreUnit) stagedName(name string) (string, error) {
	rel := strings.TrimPrefix(strings.TrimPrefix(name, u.name), "/")
	if !u.inPlace {
		return path.Join(filepath.Base(u.root), rel), nil
	}
	if rel == "" {
		return "", invalid("body", "archive entry %q: its root's entry twice", name)
	}
	return rel, nil
}

// open prepares u's staging directory when its root's entry hdr arrives,
// and stages that entry when the root is staged beside.
func (rs *restore) open(u *restoreUnit, hdr *tar.Header, budget int64) error {
	fi, err := os.Lstat(u.root)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fsError("path", u.root, err)
	}
	u.inPlace = err == nil && fi.IsDir() && hdr.Typeflag == tar.TypeDir
	dir := u.root
	if u.inPlace {
		u.rootMTime = fi.ModTime()
	} else {
		dir = filepath.Dir(u.root)
		if u.created, err = mkdirs(dir); err != nil {
			return fsError("path", dir, err)
		}
	}
	u.stage, u.x, err = newStage(dir, extractor{dir: dir, budget: budget, exact: true, writer: rs.s.stagedFile, keep: newKeeper()})
	if err != nil {
		return fsError("path", u.root, err)
	}
	if u.inPlace {
		u.rootHdr = hdr
	}
	return nil
}

// newStage makes a staging directory in dir, with new/ (what x, which it
// returns, extracts into: its fast path starts there) and old/ (what the
// swap moves out). An x that keeps live files finds them in dir, opened
// without following a symlink. It returns the directory ("" when it made
// none) when it fails too, for the caller to remove.
func newStage(dir string, x extractor) (string, *extractor, error) {
	stage, err := os.MkdirTemp(dir, stagingPrefix+"*")
	if err != nil {
		return "", nil, err
	}
	for _, sub := range []string{"new", "old"} {
		if err := os.Mkdir(filepath.Join(stage, sub), 0o700); err != nil {
			return stage, nil, err
		}
	}
	neu := filepath.Join(stage, "new")
	if x.root, err = os.OpenRoot(neu); err != nil {
		return stage, nil, err
	}
	top, err := os.OpenFile(neu, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		_ = x.root.Close()
		return stage, nil, err
	}
	var live *os.File
	if x.keep != nil {
		// dir's own path is what every step of the restore follows; a
		// dir that is a symlink (/tmp to /private/tmp) has no twin, and
		// nothing below it is kept.
		if live, err = os.OpenFile(dir, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW, 0); err != nil {
			live = nil
		}
	}
	x.fresh(top, live)
	return stage, &x, nil
}

// mkdirs creates dir and its missing parents (0755) and returns those it
// created, outermost first.
func mkdirs(dir string) ([]string, error) {
	var missing []string
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Lstat(d); err == nil || d == filepath.Dir(d) {
			break
		}
		missing = append(missing, d)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	for i, j := 0, len(missing)-1; i < j; i, j = i+1, j-1 {
		missing[i], missing[j] = missing[j], missing[i]
	}
	return missing, nil
}

// journal records the changes of a swap as the steps that undo them.
type journal struct{ undo []func() error }

// did records undo, the step that undoes a change just made.
func (j *journal) did(undo func() error) { j.undo = append(j.undo, undo) }

// rollback undoes every recorded change, the last first, and returns what
// failed.
func (j *journal) rollback() error {
	var err error
	for i := len(j.undo) - 1; i >= 0; i-- {
		err = errors.Join(err, j.undo[i]())
	}
	j.undo = nil
	return err
}

// move renames from to to (moveEntry) and journals it.
func (s *Server) move(j *journal, from, to string) error {
	if err := s.moveEntry(from, to); err != nil {
		return err
	}
	j.did(func() error { return s.moveEntry(to, from) })
	return nil
}

// swap moves every root's staged entries in and its old ones out, with
// renames it journals; when one fails it undoes the journal in reverse and
// returns the failure.
func (rs *restore) swap() error {
	var j journal
	mv := func(from, to string) error { return rs.s.move(&j, from, to) }
	opened := map[string]bool{} // live directories openUp made writable
	err := func() error {
		for _, u := range rs.units {
			if err := rs.graft(u, &j, opened); err != nil {
				return err
			}
			if err := u.x.finish(); err != nil {
				return err
			}
		}
		for _, u := range rs.units {
			old, neu := filepath.Join(u.stage, "old"), filepath.Join(u.stage, "new")
			if !u.inPlace {
				base := filepath.Base(u.root)
				if _, err := os.Lstat(u.root); err == nil {
					if err := mv(u.root, filepath.Join(old, base)); err != nil {
						return err
					}
				}
				if err := mv(filepath.Join(neu, base), u.root); err != nil {
					return err
				}
				continue
			}
			if err := openUp(&j, u.root, opened); err != nil { // its entries move out and in
				return err
			}
			if err := rs.moveAll(u.root, old, filepath.Base(u.stage), mv); err != nil {
				return err
			}
			if err := rs.moveAll(neu, u.root, "", mv); err != nil {
				return err
			}
			mode := unixMode(uint32(u.rootHdr.Mode) & 0o7777)
			if err := os.Chmod(u.root, mode); err != nil {
				return fmt.Errorf("restore %q: set its mode: %w", u.root, err)
			}
			if err := os.Chtimes(u.root, u.rootHdr.ModTime, u.rootHdr.ModTime); err != nil {
				return fmt.Errorf("restore %q: set its mtime: %w", u.root, err)
			}
		}
		return nil
	}()
	if err == nil {
		return nil
	}
	if undoErr := j.rollback(); undoErr != nil {
		var stages []string
		for _, u := range rs.units {
			if u.stage != "" {
				u.kept = true
				stages = append(stages, u.stage)
			}
		}
		rs.s.log.Error("restore: undo failed", "err", err, "undo", undoErr, "staging", stages)
		return fmt.Errorf("restore: %w; undoing it failed too (%s): entries not moved back are in %s", err, undoErr.Error(), strings.Join(stages, ", "))
	}
	return fmt.Errorf("restore: %w; every root was put back as it was", err)
}

// graft moves u's grafted directories (extract_keep.go) from the live
// tree into the staged one, in place of the empty directories staged for
// them, each once it and every directory in it are checked to be the ones
// left; the renames, and the changes to their live parents, are
// journaled (openUp, once per directory: opened).
func (rs *restore) graft(u *restoreUnit, j *journal, opened map[string]bool) error {
	if u.x.keep == nil {
		return nil
	}
	for _, g := range u.x.keep.grafts {
		live, staged := filepath.Join(u.x.dir, g.name), filepath.Join(u.stage, "new", g.name)
		if err := sameDirs(u.x.dir, u.x.keep.dev, g); err != nil {
			return err
		}
		if err := removeTree(staged); err != nil {
			return fmt.Errorf("restore: remove the staged %q: %w", staged, err)
		}
		if err := openUp(j, filepath.Dir(live), opened); err != nil {
			return err
		}
		if err := rs.s.move(j, live, staged); err != nil {
			return err
		}
	}
	return nil
}

// sameDirs checks that the live directories of g and of every directory
// grafted into it, below dir on the device dev, are the ones left: a
// directory an entry was added to, removed from or renamed in since has
// another ctime.
func sameDirs(dir string, dev uint64, g *keptDir) error {
	p := filepath.Join(dir, g.name)
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil || st.Dev != dev || st.Ino != g.ino || st.Ctim != g.ctime {
		return fmt.Errorf("%s %w", p, errChangedWhileRestored)
	}
	for _, c := range g.children {
		if err := sameDirs(dir, dev, c); err != nil {
			return err
		}
	}
	return nil
}

// openUp gives the owner every permission on the live directory dir, for
// entries to move out of it and into it (a directory root, a graft's
// parent), once (opened), journaling its mode and times first: a failed
// swap gives them back.
func openUp(j *journal, dir string, opened map[string]bool) error {
	if opened[dir] {
		return nil
	}
	opened[dir] = true
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return fmt.Errorf("restore %q: %w", dir, err)
	}
	mode := unixMode(st.Mode & 0o7777)
	atime, mtime := time.Unix(st.Atim.Unix()), time.Unix(st.Mtim.Unix())
	j.did(func() error { return errors.Join(os.Chmod(dir, mode), os.Chtimes(dir, atime, mtime)) })
	if mode&0o700 != 0o700 {
		if err := os.Chmod(dir, mode|0o700); err != nil {
			return fmt.Errorf("restore %q: make it writable: %w", dir, err)
		}
	}
	return nil
}

// moveAll moves every entry of dir but skip into to with mv.
func (rs *restore) moveAll(dir, to, skip string, mv func(from, to string) error) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("list %q: %w", dir, err)
	}
	for _, e := range ents {
		if e.Name() == skip {
			continue
		}
		if err := mv(filepath.Join(dir, e.Name()), filepath.Join(to, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// moveEntry renames from to to. A directory without owner write
// permission cannot move to another parent (its ".." changes) unless the
// agent is root: it is made writable for the rename, then given its mode
// back.
func (s *Server) moveEntry(from, to string) error {
	fi, err := os.Lstat(from)
	if err != nil {
		return fmt.Errorf("move %q: %w", from, err)
	}
	locked := fi.IsDir() && fi.Mode().Perm()&0o200 == 0
	if locked {
		if err := os.Chmod(from, fi.Mode()|0o200); err != nil {
			return fmt.Errorf("move %q: make it writable: %w", from, err)
		}
	}
	if err := s.rename(from, to); err != nil {
		if locked {
			_ = os.Chmod(from, fi.Mode())
		}
		return fmt.Errorf("move %q to %q: %w", from, to, err)
	}
	if locked {
		if err := os.Chmod(to, fi.Mode()); err != nil {
			return fmt.Errorf("move %q: give it back its mode: %w", to, err)
		}
	}
	return nil
}

// discard removes what a restore that did not happen staged (and the
// directories it created to stage beside), but a staging directory that
// holds entries an undo could not put back.
func (rs *restore) discard() {
	for i := len(rs.units) - 1; i >= 0; i-- {
		u := rs.units[i]
		if u.x != nil {
			if err := u.x.undoKept(); err != nil {
				rs.s.log.Error("restore: give kept files their modes and times back", "root", u.root, "err", err)
			}
			u.x.close()
		}
		if u.stage == "" || u.kept {
			continue
		}
		if err := removeTree(u.stage); err != nil {
			rs.s.log.Warn("restore: remove staging", "path", u.stage, "err", err)
		} else if u.inPlace {
			rs.setRootMTime(u, u.rootMTime)
		}
		for j := len(u.created) - 1; j >= 0; j-- {
			_ = os.Remove(u.created[j]) // only when empty: another root may use it
		}
	}
}

// cleanup removes the staging directories of a restore that happened:
// they hold the old entries.
func (rs *restore) cleanup() {
	for _, u := range rs.units {
		u.x.close()
		if err := removeTree(u.stage); err != nil {
			rs.s.log.Warn("restore: remove the old entries", "path", u.stage, "err", err)
		} else if u.inPlace {
			rs.setRootMTime(u, u.rootHdr.ModTime)
		}
	}
}

// setRootMTime gives an inPlace root mtime again once its staging
// directory is gone (its atime is left alone); a failure is logged: the
// root's entries are right, only its mtime is not.
func (rs *restore) setRootMTime(u *restoreUnit, mtime time.Time) {
	if err := os.Chtimes(u.root, time.Time{}, mtime); err != nil {
		rs.s.log.Warn("restore: set the root's mtime", "path", u.root, "err", err)
	}
}

// removeTree removes p and everything below it, making directories
// writable where a missing permission stops the removal.
func removeTree(p string) error {
	if err := os.RemoveAll(p); err == nil || !errors.Is(err, fs.ErrPermission) {
		return err
	}
	_ = filepath.WalkDir(p, func(q string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			_ = os.Chmod(q, 0o700)
		}
		return nil
	})
	return os.RemoveAll(p)
}
