package execagent

import (
	"archive/tar"
	"cmp"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// maxMadeDirs bounds the directories an extraction keeps open for its fast
// path: the depth of the directory it is in (it closes those the archive
// has left, below); past it, entries below new directories take the
// os.Root path.
const maxMadeDirs = 1024

// A restore stages into a directory it has just made, so most of its
// entries can skip what os.Root does for every call (resolving the name
// one component at a time with openat, then an lstat of every parent and
// of the name itself): a directory this extraction made is kept open, and
// an entry directly below one is created relative to it with one openat
// (O_EXCL|O_NOFOLLOW) and given its mode and mtime through its own file
// descriptor. Such a parent is a real directory: it was made by mkdirat
// below another made directory, and an archive entry never replaces a
// directory (extractor.replace refuses). Anything else — an existing
// name, a symlink, a hard link, a parent the archive did not list —
// takes the os.Root path, which checks every parent.
//
// Only the directories on the path the archive is in stay open: an archive
// lists a directory's entries together, depth first, so when an entry
// arrives outside an open directory, that directory is closed (its mode
// and mtime are then set through the root by finish), and an entry that
// comes back to it later takes the os.Root path. The open directories are
// at most the tree's depth, however many directories the archive holds.

// fresh marks the extractor's root as a directory made empty for it, so
// that the fast path starts there. f is the root, opened as a directory;
// live, when not nil, the live directory at the same place
// (extract_keep.go).
func (x *extractor) fresh(f, live *os.File) {
	if live != nil {
		var st unix.Stat_t
		if err := unix.Fstat(int(f.Fd()), &st); err != nil {
			_ = live.Close()
			live = nil // nothing below it is kept
		} else {
			x.keep.dev = st.Dev
		}
	}
	x.open = append(x.open[:0], madeDir{name: ".", f: f, meta: -1, live: live})
}

// liveDir opens the live twin of the directory base (full: its path) just
// made below the last open directory: nil when the extraction keeps no
// live files, the parent has no twin, or the name is not a directory there
// (a symlink is not followed).
func (x *extractor) liveDir(base, full string) *os.File {
	parent := x.open[len(x.open)-1].live
	if x.keep == nil || parent == nil {
		return nil
	}
	fd, err := unix.Openat(int(parent.Fd()), base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil
	}
	return os.NewFile(uintptr(fd), full)
}

// writeFile creates regular file base in the staged directory pfd (full:
// its path) with fill's bytes, size of them, gives it mode and the mtime
// of hdr, and counts them. A name staged already (an archive that lists it
// twice) is replaced: the later entry wins.
func (x *extractor) writeFile(pfd int, base, full string, hdr *tar.Header, mode fs.FileMode, fill func(io.Writer) (int64, error)) error {
	fail := func(err error) error {
		if df := diskFull(full, err); df != nil {
			return df
		}
		return invalid("body", "archive entry %q: %s", hdr.Name, err.Error())
	}
	// Created with its mode when the umask leaves it whole (the usual
	// 0644, 0755, 0444: creating a file grants its descriptor write
	// access whatever its mode), saving a chmod; else 0600, then chmod.
	create, chmod := uint32(0o600), true
	if umask := processUmask(); umask >= 0 && uint32(mode)&^0o777 == 0 && uint32(mode)&uint32(umask) == 0 {
		create, chmod = uint32(mode), false
	}
	const flags = unix.O_WRONLY | unix.O_CREAT | unix.O_EXCL | unix.O_NOFOLLOW | unix.O_CLOEXEC
	fd, err := unix.Openat(pfd, base, flags, create)
	if errors.Is(err, unix.EEXIST) {
		if err = x.clearStaged(pfd, base, hdr); err == nil {
			fd, err = unix.Openat(pfd, base, flags, create)
		}
		var bad *badRequestError
		if errors.As(err, &bad) {
			return err
		}
	}
	if err != nil {
		return fail(err)
	}
	f := os.NewFile(uintptr(fd), full)
	var w io.Writer = f
	if x.writer != nil {
		w = x.writer(f)
	}
	n, err := fill(w)
	x.budget -= n
	x.bytes += n
	if err == nil && chmod {
		err = f.Chmod(mode)
	}
	cerr := f.Close()
	if df := diskFull(full, cmp.Or(err, cerr)); df != nil {
		return df
	}
	if err != nil {
		return uploadError(err, 0)
	}
	if cerr != nil {
		return fail(cerr)
	}
	if !hdr.ModTime.IsZero() {
		if err := setTimes(pfd, base, hdr); err != nil {
			return fail(err)
		}
	}
	return nil
}

// clearStaged removes what is staged as base in the staged directory pfd
// for entry hdr, which replaces it; a directory is not replaced.
func (x *extractor) clearStaged(pfd int, base string, hdr *tar.Header) error {
	var st unix.Stat_t
	if err := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return invalid("body", "archive entry %q: %s", hdr.Name, err.Error())
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return invalid("body", "archive entry %q: a directory is in the way", hdr.Name)
	}
	if err := unix.Unlinkat(pfd, base, 0); err != nil {
		return invalid("body", "archive entry %q: %s", hdr.Name, err.Error())
	}
	return nil
}

// madeDir is an open directory of the fast path: its name, the directory,
// its entry's index in x.dirs (-1: none, the root or an extraction that
// is not exact), and its live twin.
type madeDir struct {
	name string
	f    *os.File
	meta int
	// live is the directory of the live tree at the same place, when the
	// extraction keeps live files (extract_keep.go) and there is one; k,
	// then, what may graft it.
	live *os.File
	k    *keptDir
}

func (d madeDir) close() {
	_ = d.f.Close()
	if d.live != nil {
		_ = d.live.Close()
	}
}

// leave closes the open directories that dir (an entry's parent) is not
// in, deepest first, settling whether each is grafted (extract_keep.go),
// and gives their listings in x.dirs to finish's path through the root.
func (x *extractor) leave(dir string) error {
	for len(x.open) > 1 {
		top := x.open[len(x.open)-1]
		if dir == top.name || inside(dir, top.name) {
			return nil
		}
		err := x.settle(&top, &x.open[len(x.open)-2])
		x.open = x.open[:len(x.open)-1]
		top.close()
		if top.meta >= 0 {
			x.dirs[top.meta].f, x.dirs[top.meta].parent = nil, nil
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// close closes the root and every directory the fast path kept open. It
// may be called more than once.
func (x *extractor) close() {
	for _, d := range x.open {
		d.close()
	}
	x.open = x.open[:0]
	_ = x.root.Close()
}

// fastEntry extracts hdr (named name, cleaned) when its parent is a
// directory this extraction made, and reports whether it did; false with
// a nil error sends the entry to the os.Root path.
func (x *extractor) fastEntry(hdr *tar.Header, name string, body io.Reader) (bool, error) {
	dir := path.Dir(name)
	if err := x.leave(dir); err != nil {
		return true, err
	}
	// The open directories are a path from the root: dir, when open, is
	// its last.
	if len(x.open) == 0 || x.open[len(x.open)-1].name != dir {
		return false, x.noGraft() // it could land in a grafted directory
	}
	top := &x.open[len(x.open)-1]
	if top.k != nil {
		top.k.count++
	}
	parent := top.f
	pfd, base := int(parent.Fd()), path.Base(name)
	full := filepath.Join(x.dir, name)
	fail := func(err error) error {
		if df := diskFull(full, err); df != nil {
			return df
		}
		return invalid("body", "archive entry %q: %s", hdr.Name, err.Error())
	}
	mode := unixMode(uint32(hdr.Mode) & 0o7777)
	switch hdr.Typeflag {
	case tar.TypeDir:
		if len(x.open) >= maxMadeDirs {
			return false, x.noGraft()
		}
		if err := unix.Mkdirat(pfd, base, 0o700); err != nil {
			if errors.Is(err, unix.EEXIST) { // listed again: its last listing's mode and mtime
				return false, x.noGraft()
			}
			return true, fail(err)
		}
		fd, err := unix.Openat(pfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return true, fail(err)
		}
		f := os.NewFile(uintptr(fd), full)
		meta := -1
		if x.exact {
			meta = len(x.dirs)
		}
		live := x.liveDir(base, full)
		k := x.keepDir(name, live)
		if k == nil {
			if err := x.notWhole(top); err != nil {
				_ = f.Close()
				if live != nil {
					_ = live.Close()
				}
				return true, err
			}
		}
		x.open = append(x.open, madeDir{name: name, f: f, meta: meta, live: live, k: k})
		if err := f.Chmod(mode | 0o700); err != nil { // stay writable for later entries
			return true, fail(err)
		}
		x.listDir(dirMeta{name: name, mode: mode, mtime: hdr.ModTime, parent: parent, f: f})
	case tar.TypeReg:
		if hdr.Size > x.budget {
			return true, fmt.Errorf("archive extracts to more than the upload limit: %w", errTooLarge)
		}
		if dir := top.live; x.keep != nil && dir != nil {
			if live, st := x.keep.twin(dir, base, hdr); live != nil {
				kept, err := x.keepOrWrite(pfd, dir, top.k, name, base, hdr, mode, live, st, body)
				_ = live.Close()
				if err == nil && !kept {
					err = x.notWhole(top)
				}
				if err != nil {
					return true, err
				}
				break
			}
		}
		if err := x.notWhole(top); err != nil {
			return true, err
		}
		if err := x.writeFile(pfd, base, full, hdr, mode, func(w io.Writer) (int64, error) { return io.CopyN(w, body, hdr.Size) }); err != nil {
			return true, err
		}
	case tar.TypeLink: // its target may be a kept file whose link is deferred
		return false, x.noGraft()
	default:
		return false, x.notWhole(top)
	}
	x.entries++
	return true, nil
}

// processUmask returns the agent's umask, read once from /proc/self/status
// (reading it with umask(2) sets it, racing every process the agent
// starts meanwhile); -1 when it cannot be read.
var processUmask = sync.OnceValue(func() int {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return -1
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "Umask:"); ok {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 8, 32)
			if err != nil || n > 0o777 {
				return -1
			}
			return int(n)
		}
	}
	return -1
})

// setTimes gives the entry base of the directory dirfd the archive's
// mtime as both its atime and its mtime (as os.Chtimes(mtime, mtime)).
func setTimes(dirfd int, base string, hdr *tar.Header) error {
	ts := unix.NsecToTimespec(hdr.ModTime.UnixNano())
	return unix.UtimesNanoAt(dirfd, base, []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW)
}
