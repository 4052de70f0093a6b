package execagent

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

// An archive upload is extracted into a staging directory made in its
// target, then merged into the target: what the archive holds is checked
// against what the target holds (a directory in the way, a symlink where
// the archive has a directory, a mount point) before anything moves, and
// the moves are renames it journals and undoes when one fails. So an
// archive refused for any entry, or for the disk filling up, leaves the
// target as it was: the entries before the bad one no longer stay.
//
// Renames do not cross file systems: an archive with entries below a mount
// point inside the target (another file system than the target's) is
// refused before anything moves, its message naming the mount point to
// upload them into.

// upload is one PUT /v1/files/archive in progress.
type upload struct {
	s       *Server
	dir     string     // the target directory
	created []string   // the directories made for it, outermost first
	mtime   time.Time  // dir's mtime before the upload
	stage   string     // the staging directory, in dir
	dev     uint64     // the file system of stage (and of dir)
	x       *extractor // extracts into stage/new
	j       journal
	aside   int  // entries of the target moved into stage/old
	touched bool // an entry was moved into dir itself
}

// newUpload makes the target directory p (and its missing parents) and a
// staging directory in it.
func (s *Server) newUpload(p string) (*upload, error) {
	created, err := mkdirs(p)
	if err != nil {
		return nil, fsError("path", p, err)
	}
	u := &upload{s: s, dir: p, created: created}
	fail := func(err error) (*upload, error) {
		u.discard()
		return nil, fsError("path", p, err)
	}
	fi, err := os.Stat(p)
	if err != nil {
		return fail(err)
	}
	u.mtime = fi.ModTime()
	u.stage, u.x, err = newStage(p, extractor{dir: p, budget: s.cfg.MaxUploadBytes, listed: map[string]dirMeta{}})
	if err != nil {
		return fail(err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(u.stage, &st); err != nil {
		return fail(err)
	}
	u.dev = st.Dev
	return u, nil
}

// extract stages the archive read from body (a tar, or a tar.gz by its
// magic bytes).
func (u *upload) extract(body *bufio.Reader) error {
	limit := u.s.cfg.MaxUploadBytes
	var in io.Reader = body
	if agentapi.IsGzip(body) {
		zr, err := gzip.NewReader(body)
		if err != nil {
			return invalid("body", "invalid gzip stream: %s", err.Error())
		}
		defer zr.Close()
		in = zr
	}
	tr := tar.NewReader(in)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return uploadError(err, limit)
		}
		if err := u.x.entry(hdr, tr); errors.Is(err, errNoSpace) {
			return err
		} else if err != nil {
			return uploadError(err, limit)
		}
	}
}

// merge moves the staged entries into the target: it checks them all
// first, then moves them with journaled renames, undone when one fails.
func (u *upload) merge() error {
	neu := filepath.Join(u.stage, "new")
	if err := u.check(neu, u.dir, ""); err != nil {
		return err
	}
	err := u.move(neu, u.dir, "")
	if err == nil {
		return nil
	}
	if undoErr := u.j.rollback(); undoErr != nil {
		stage := u.stage
		u.s.log.Error("archive upload: undo failed", "err", err, "undo", undoErr, "staging", stage)
		u.stage = "" // kept: it holds what could not be put back
		return fmt.Errorf("extract archive into %q: %w; undoing it failed too (%s): entries not moved back are in %s", u.dir, err, undoErr.Error(), stage)
	}
	return fmt.Errorf("extract archive into %q: %w; the target was put back as it was", u.dir, err)
}

// check refuses the upload when a staged entry of from (named rel in the
// archive) cannot take the place of what is at the same name in to.
func (u *upload) check(from, to, rel string) error {
	ents, err := os.ReadDir(from)
	if err != nil {
		return fmt.Errorf("list %q: %w", from, err)
	}
	for _, e := range ents {
		name := path.Join(rel, e.Name())
		t := filepath.Join(to, e.Name())
		if t == u.stage {
			return invalid("body", "archive entry %q: the name of the upload's staging directory", name)
		}
		fi, err := os.Lstat(t)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return invalid("body", "archive entry %q: %s", name, err.Error())
		}
		_, listed := u.x.listed[name]
		switch {
		case !e.IsDir() && fi.IsDir():
			return invalid("body", "archive entry %q: a directory is in the way", name)
		case !e.IsDir():
			continue // replaced
		case fi.IsDir():
			if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Dev != u.dev {
				return invalid("body", "archive entry %q: %q is a mount point (another file system than %q): upload what goes below it with path=%q",
					name, t, u.dir, t)
			}
			if err := u.check(filepath.Join(from, e.Name()), t, name); err != nil {
				return err
			}
		case listed:
			return invalid("body", "archive entry %q: a file is in the way", name)
		default: // a directory the archive did not list, made for the entries below it
			below, why := u.firstBelow(filepath.Join(from, e.Name()), name), fmt.Sprintf("%q is not a directory", name)
			if fi.Mode()&fs.ModeSymlink != 0 {
				why = fmt.Sprintf("writes through the symlink %q", name)
			}
			return invalid("body", "archive entry %q: %s", below, why)
		}
	}
	return nil
}

// firstBelow names an archive entry below the staged directory dir (named
// rel): the directory was made for it.
func (u *upload) firstBelow(dir, rel string) string {
	for {
		ents, err := os.ReadDir(dir)
		if err != nil || len(ents) == 0 {
			return rel
		}
		dir, rel = filepath.Join(dir, ents[0].Name()), path.Join(rel, ents[0].Name())
		if !ents[0].IsDir() {
			return rel
		}
		if _, listed := u.x.listed[rel]; listed {
			return rel
		}
	}
}

// move moves the staged entries of from (named rel in the archive) into
// to: a new name is renamed in, a directory merges into the directory
// there (which takes the archive's mode when the archive lists it), and a
// file, symlink or hard link replaces what is there, moved aside into the
// staging directory so an undo can put it back.
func (u *upload) move(from, to, rel string) error {
	ents, err := os.ReadDir(from)
	if err != nil {
		return fmt.Errorf("list %q: %w", from, err)
	}
	for _, e := range ents {
		name := path.Join(rel, e.Name())
		s, t := filepath.Join(from, e.Name()), filepath.Join(to, e.Name())
		fi, err := os.Lstat(t)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			err = u.s.move(&u.j, s, t)
			u.touched = u.touched || to == u.dir
		case err != nil:
		case e.IsDir() && fi.IsDir():
			err = u.mergeDir(s, t, name, fi)
		default:
			aside := filepath.Join(u.stage, "old", strconv.Itoa(u.aside))
			u.aside++
			if err = u.s.move(&u.j, t, aside); err == nil {
				err = u.s.move(&u.j, s, t)
			}
			u.touched = u.touched || to == u.dir
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// mergeDir moves the staged directory s (named name in the archive) into
// the existing directory t (described by fi). When the archive lists it, t
// takes its mode, and, when nothing moved into it, its mtime (as an
// extraction in place leaves them).
func (u *upload) mergeDir(s, t, name string, fi fs.FileInfo) error {
	ents, err := os.ReadDir(s)
	if err != nil {
		return fmt.Errorf("list %q: %w", s, err)
	}
	if err := u.move(s, t, name); err != nil {
		return err
	}
	d, listed := u.x.listed[name]
	if !listed {
		return nil
	}
	was := fi.Mode() & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
	u.j.did(func() error { return errors.Join(os.Chmod(t, was), os.Chtimes(t, time.Time{}, fi.ModTime())) })
	if err := os.Chmod(t, d.mode); err != nil {
		return fmt.Errorf("set the mode of %q: %w", t, err)
	}
	if len(ents) == 0 && !d.mtime.IsZero() {
		if err := os.Chtimes(t, d.mtime, d.mtime); err != nil {
			return fmt.Errorf("set the mtime of %q: %w", t, err)
		}
	}
	return nil
}

// discard removes what an upload that did not happen made: its staging
// directory (unless an undo failed and it holds entries of the target), and
// the directories made for it; the target gets its mtime back.
func (u *upload) discard() {
	if u.x != nil {
		u.x.close()
	}
	if u.stage != "" {
		if err := removeTree(u.stage); err != nil {
			u.s.log.Warn("archive upload: remove staging", "path", u.stage, "err", err)
		} else if !u.mtime.IsZero() {
			_ = os.Chtimes(u.dir, time.Time{}, u.mtime)
		}
	}
	for i := len(u.created) - 1; i >= 0; i-- {
		_ = os.Remove(u.created[i]) // only when empty
	}
}

// cleanup removes the staging directory of an upload that happened: it
// holds what the archive replaced. The target gets its mtime back when no
// entry of its own changed.
func (u *upload) cleanup() {
	u.x.close()
	if err := removeTree(u.stage); err != nil {
		u.s.log.Warn("archive upload: remove the replaced entries", "path", u.stage, "err", err)
	} else if !u.touched {
		_ = os.Chtimes(u.dir, time.Time{}, u.mtime)
	}
}
