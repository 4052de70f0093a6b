package execagent

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// A restore in place mostly writes back what is already there: a sandbox
// rolled back after an episode has changed a few of its thousands of
// files. So a restore keeps a live file whose bytes are the archive's
// (docs/ARCHITECTURE.md, "Checkpoints: the agent's side"): its staged
// entry is a hard link to the live file instead of a copy, and the swap
// moves that link in as it moves a copy. Kept, a file costs a read and a
// link, not a write now and an unlink of its pages later, and its bytes
// are in memory once, not twice, while the restore runs.
//
// A live file is a candidate (keeper.twin) when it is where the archive's
// entry lands, reached from the restore's root through directories opened
// one at a time without following a symlink; a regular file, its only
// link (a file linked elsewhere would stay linked there), the agent's own
// (what a file it writes would be), of the entry's size, and with its
// mtime in the entry's second: a file written since the checkpoint has a
// later one, and is written without being read (a checkpoint's mtimes are
// in seconds; a live file's, in nanoseconds until a restore). Its bytes are
// then compared with the entry's as they are read; the first difference
// writes a copy as usual (the bytes before it copied from the live file,
// which were the archive's). A file that changed while it was compared is
// neither kept nor copied from: the restore fails, nothing changed. A kept
// file whose mode or mtime differ from the archive's is given the
// archive's before the swap, and its own back when the restore fails
// (keeper.undo). Nothing else of a live file changes before the swap; its
// atime is left as it is, where a copy's is its mtime.
//
// What keeping changes for a process: one that holds a kept file open
// keeps writing to the file in the restored tree, where with a copy it
// writes to the old file, which the restore unlinks.

// keepChunk is the size of each comparison of a live file's bytes with an
// entry's.
const keepChunk = 64 << 10

// keeper keeps live files for a restore's extractor.
type keeper struct {
	uid, gid    uint32
	entry, live []byte // comparison buffers, keepChunk each
	kept        int    // files kept
	undo        []keptMeta
	// dev is the staging's file system (extractor.fresh): only a live
	// directory on it can be renamed in, and only a file on it linked.
	dev uint64
	// grafts are the directories moved in whole at the swap, disjoint;
	// noGrafts: none any more (extractor.noGraft). graftSet indexes
	// grafts once staging is done.
	grafts   []*keptDir
	noGrafts bool
	graftSet map[string]bool
}

// keptMeta is a kept file's mode and times before the restore gave it the
// archive's: name is its live path.
type keptMeta struct {
	name         string
	mode         fs.FileMode
	atime, mtime time.Time
}

func newKeeper() *keeper {
	return &keeper{uid: uint32(os.Geteuid()), gid: uint32(os.Getegid()),
		entry: make([]byte, keepChunk), live: make([]byte, keepChunk)}
}

// mayKeep reports whether st may be kept for regular file entry hdr.
func (k *keeper) mayKeep(st *unix.Stat_t, hdr *tar.Header) bool {
	return st.Mode&unix.S_IFMT == unix.S_IFREG && st.Nlink == 1 && st.Uid == k.uid && st.Gid == k.gid &&
		st.Size == hdr.Size && st.Mtim.Sec == hdr.ModTime.Unix()
}

// twin opens the candidate named base in the live directory dir for the
// regular file entry hdr, with its status; nil: there is none.
func (k *keeper) twin(dir *os.File, base string, hdr *tar.Header) (*os.File, *unix.Stat_t) {
	if hdr.ModTime.IsZero() {
		return nil, nil // a copy's mtime would be the time of the restore
	}
	var st unix.Stat_t
	if err := unix.Fstatat(int(dir.Fd()), base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil || !k.mayKeep(&st, hdr) {
		return nil, nil
	}
	// O_NONBLOCK: should it be a fifo by now, the open does not wait for a
	// writer (fstat below then refuses it).
	fd, err := unix.Openat(int(dir.Fd()), base, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NOATIME|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil
	}
	var now unix.Stat_t
	if err := unix.Fstat(fd, &now); err != nil || now.Dev != st.Dev || now.Ino != st.Ino || !k.mayKeep(&now, hdr) {
		_ = unix.Close(fd)
		return nil, nil
	}
	return os.NewFile(uintptr(fd), base), &now
}

// errChangedWhileRestored: a live file changed while a restore compared
// it. It is errBusy (409 busy): the sandbox is busy writing it.
var errChangedWhileRestored = fmt.Errorf("changed while the restore read it (a process is writing it); nothing was changed: restore again once it is done: %w", errBusy)

// keepOrWrite stages regular file entry hdr, named name (base in the
// staged directory pfd), from live, its twin in the live directory dir
// whose status was st: when their bytes are the same, it keeps live (a
// link in pfd, or, while kd, the entry's directory, may be moved in whole,
// a link deferred to kd) and reports true; else it writes a copy, as
// fastEntry writes one.
func (x *extractor) keepOrWrite(pfd int, dir *os.File, kd *keptDir, name, base string, hdr *tar.Header, mode fs.FileMode, live *os.File, st *unix.Stat_t, body io.Reader) (bool, error) {
	k, full := x.keep, filepath.Join(x.dir, name)
	for off := int64(0); off < hdr.Size; {
		n := int(min(int64(keepChunk), hdr.Size-off))
		if _, err := io.ReadFull(body, k.entry[:n]); err != nil {
			return false, uploadError(err, 0)
		}
		if _, err := io.ReadFull(live, k.live[:n]); err == nil && bytes.Equal(k.entry[:n], k.live[:n]) {
			off += int64(n)
			continue
		}
		// The first difference: the bytes before it are the archive's.
		head, pending := off, k.entry[:n]
		return false, x.writeFile(pfd, base, full, hdr, mode, func(w io.Writer) (int64, error) {
			c, err := io.Copy(w, io.NewSectionReader(live, 0, head))
			if err == nil && head > 0 && (c != head || changed(live, st)) {
				err = fmt.Errorf("%s %w", full, errChangedWhileRestored)
			}
			if err != nil {
				return c, err
			}
			m, err := w.Write(pending)
			if err != nil {
				return c + int64(m), err
			}
			r, err := io.CopyN(w, body, hdr.Size-head-int64(n))
			return c + int64(m) + r, err
		})
	}
	if changed(live, st) {
		return false, fmt.Errorf("%s %w", full, errChangedWhileRestored)
	}
	// The archive's mode and mtime, through the live directory: a
	// deferred link has no staged name yet.
	if mtime := time.Unix(st.Mtim.Unix()); st.Mode&0o7777 != uint32(hdr.Mode)&0o7777 || !mtime.Equal(hdr.ModTime) {
		k.undo = append(k.undo, keptMeta{name: full, mode: unixMode(st.Mode & 0o7777), atime: time.Unix(st.Atim.Unix()), mtime: mtime})
		if err := live.Chmod(mode); err != nil {
			return false, invalid("body", "archive entry %q: %s", hdr.Name, err.Error())
		}
		if err := setTimes(int(dir.Fd()), base, hdr); err != nil {
			return false, invalid("body", "archive entry %q: %s", hdr.Name, err.Error())
		}
		if err := unix.Fstat(int(live.Fd()), st); err != nil {
			return false, fmt.Errorf("%s: %w", full, err)
		}
	}
	if kd != nil && kd.whole && !k.noGrafts && st.Dev == k.dev {
		kd.deferred = append(kd.deferred, keptLink{base: base, ino: st.Ino, ctime: st.Ctim})
		x.kept(hdr.Size)
		return true, nil
	}
	err := unix.Linkat(int(dir.Fd()), base, pfd, base, 0)
	if errors.Is(err, unix.EEXIST) { // the archive's second entry of that name: the later wins
		if err = x.clearStaged(pfd, base, hdr); err == nil {
			err = unix.Linkat(int(dir.Fd()), base, pfd, base, 0)
		}
	}
	if err != nil {
		// Not linkable (another file system mounted below the root, say):
		// a copy of the live file, whose bytes (and now mode and mtime)
		// are the archive's.
		return false, x.writeFile(pfd, base, full, hdr, mode, func(w io.Writer) (int64, error) {
			c, err := io.Copy(w, io.NewSectionReader(live, 0, hdr.Size))
			if err == nil && (c != hdr.Size || changed(live, st)) {
				err = fmt.Errorf("%s %w", full, errChangedWhileRestored)
			}
			return c, err
		})
	}
	x.kept(hdr.Size)
	return true, nil
}

// kept counts a kept file of size bytes.
func (x *extractor) kept(size int64) {
	x.budget -= size
	x.bytes += size
	x.keep.kept++
}

// changed reports whether live is no longer the file whose status was st:
// its size or its ctime (every write moves it) differ.
func changed(live *os.File, st *unix.Stat_t) bool {
	var now unix.Stat_t
	return unix.Fstat(int(live.Fd()), &now) != nil || now.Size != st.Size || now.Ctim != st.Ctim
}

// undoKept gives the files a failed restore kept their modes and times
// back, the last first; what fails is logged by the caller.
func (x *extractor) undoKept() error {
	if x.keep == nil {
		return nil
	}
	var err error
	for i := len(x.keep.undo) - 1; i >= 0; i-- {
		m := x.keep.undo[i]
		err = errors.Join(err, os.Chmod(m.name, m.mode), os.Chtimes(m.name, m.atime, m.mtime))
	}
	x.keep.undo = nil
	return err
}

// A directory whose every entry is kept is moved in whole (a graft): at
// the swap, the live directory is renamed into the staged tree, in place
// of the empty one staged for it, instead of a link staged for each of its
// files and an unlink of each old name after the swap. A directory of the
// staged tree with a live twin (extractor.liveDir) is a candidate while
// its entries are kept files and grafted directories (keptDir.whole): its
// kept files' links are deferred. When it is left, it is grafted if the
// live twin has no other entry and the archive's mode and mtime, and is
// then folded into its parent's graft if the parent is still whole. When
// an entry of it is written, or it is not grafted, its deferred links are
// made and its grafted directories stay grafts of their own
// (extractor.notWhole). An entry the fast path does not take (a name the
// archive lists twice, a hard link, a parent it did not list) could land
// in a grafted directory: then every deferred link is made and nothing is
// grafted (extractor.noGrafts). The swap checks that each grafted live
// directory, and every one below it, is the one left (device, inode,
// ctime: an entry added or removed since moves it), then moves it.

// keptDir is a directory a restore made whose live twin it may graft.
type keptDir struct {
	name     string // below the extractor's root
	whole    bool   // every entry so far is kept or grafted
	count    int    // the archive's entries in it so far
	ino      uint64 // the live twin's, on the staging's device
	ctime    unix.Timespec
	deferred []keptLink // kept files, linked if it is not grafted
	children []*keptDir // grafted directories in it, while whole
}

// keptLink is a kept file whose link is deferred: its name in its
// directory, and its inode and ctime when it was compared.
type keptLink struct {
	base  string
	ino   uint64
	ctime unix.Timespec
}

// keepDir returns the keptDir of directory name, just made, whose live
// twin is live: nil when there is none, or when it is on another file
// system than the staging (a mount below the root: it could not be renamed
// in).
func (x *extractor) keepDir(name string, live *os.File) *keptDir {
	if live == nil {
		return nil
	}
	var st unix.Stat_t
	if unix.Fstat(int(live.Fd()), &st) != nil || st.Dev != x.keep.dev {
		return nil
	}
	return &keptDir{name: name, whole: true, ino: st.Ino}
}

// notWhole marks d no graft: it makes d's deferred links, and its grafted
// directories become grafts of their own.
func (x *extractor) notWhole(d *madeDir) error {
	k := d.k
	if k == nil || !k.whole {
		return nil
	}
	k.whole = false
	if err := linkKept(d.live, d.f, k); err != nil {
		return err
	}
	x.keep.grafts = append(x.keep.grafts, k.children...)
	k.children = nil
	return nil
}

// settle decides, as d is left, whether it is grafted: into its parent's
// graft while parent is whole, else a graft of its own. When it is not,
// neither is parent.
func (x *extractor) settle(d, parent *madeDir) error {
	if d.k == nil {
		return nil // parent was marked when d was made
	}
	if d.k.whole && !x.keep.noGrafts && x.graftable(d) {
		if parent.k != nil && parent.k.whole {
			parent.k.children = append(parent.k.children, d.k)
		} else {
			x.keep.grafts = append(x.keep.grafts, d.k)
		}
		return nil
	}
	if err := x.notWhole(d); err != nil {
		return err
	}
	return x.notWhole(parent)
}

// graftable reports whether d's live twin holds the archive's entries of
// d and nothing else, with the archive's mode and mtime, and records its
// ctime.
func (x *extractor) graftable(d *madeDir) bool {
	if d.meta < 0 {
		return false
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(d.live.Fd()), &st); err != nil {
		return false
	}
	want := x.dirs[d.meta]
	if unixMode(st.Mode&0o7777) != want.mode || !time.Unix(st.Mtim.Unix()).Equal(want.mtime) {
		return false
	}
	if _, err := d.live.Seek(0, io.SeekStart); err != nil {
		return false
	}
	names, err := d.live.Readdirnames(-1)
	if err != nil || len(names) != d.k.count {
		return false
	}
	d.k.ctime = st.Ctim
	return true
}

// noGraft makes every deferred link and grafts nothing from now on: an
// entry is about to take the os.Root path, which could land in a
// directory that would be grafted (or link to a file not linked yet).
func (x *extractor) noGraft() error {
	if x.keep == nil || x.keep.noGrafts {
		return nil
	}
	x.keep.noGrafts = true
	for i := range x.open {
		if err := x.notWhole(&x.open[i]); err != nil {
			return err
		}
	}
	grafts := x.keep.grafts
	x.keep.grafts = nil
	for _, g := range grafts {
		if err := x.ungraft(g); err != nil {
			return err
		}
	}
	return nil
}

// ungraft makes the deferred links of g and of every directory grafted
// into it, opening their live and staged directories from the roots
// without following a symlink.
func (x *extractor) ungraft(g *keptDir) error {
	live, err := openBelow(x.open[0].live, g.name, filepath.Join(x.dir, g.name))
	if err != nil {
		return fmt.Errorf("%s %w", filepath.Join(x.dir, g.name), errChangedWhileRestored)
	}
	defer live.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(live.Fd()), &st); err != nil || st.Dev != x.keep.dev || st.Ino != g.ino {
		return fmt.Errorf("%s %w", filepath.Join(x.dir, g.name), errChangedWhileRestored)
	}
	staged, err := openBelow(x.open[0].f, g.name, g.name)
	if err != nil {
		return fmt.Errorf("restore: open the staged %q: %w", g.name, err)
	}
	defer staged.Close()
	if err := linkKept(live, staged, g); err != nil {
		return err
	}
	for _, c := range g.children {
		if err := x.ungraft(c); err != nil {
			return err
		}
	}
	return nil
}

// openBelow opens directory name below dir, one element at a time,
// following no symlink; full is the path it is named by.
func openBelow(dir *os.File, name, full string) (*os.File, error) {
	fd := int(dir.Fd())
	for i, part := range strings.Split(name, "/") {
		next, err := unix.Openat(fd, part, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if i > 0 {
			_ = unix.Close(fd)
		}
		if err != nil {
			return nil, err
		}
		fd = next
	}
	return os.NewFile(uintptr(fd), full), nil
}

// linkKept makes k's deferred links, from the live directory live into
// the staged one: each file must be the one compared.
func linkKept(live, staged *os.File, k *keptDir) error {
	for _, l := range k.deferred {
		var st unix.Stat_t
		if err := unix.Fstatat(int(live.Fd()), l.base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil || st.Ino != l.ino || st.Ctim != l.ctime {
			return fmt.Errorf("%s %w", filepath.Join(live.Name(), l.base), errChangedWhileRestored)
		}
		err := unix.Linkat(int(live.Fd()), l.base, int(staged.Fd()), l.base, 0)
		if errors.Is(err, unix.EEXIST) {
			continue // the archive lists the name again, later: the later entry wins
		}
		if err != nil {
			return fmt.Errorf("restore: link %s: %w", filepath.Join(live.Name(), l.base), err)
		}
	}
	k.deferred = nil
	return nil
}

// grafted reports whether directory name lies in (or is) a graft.
func (k *keeper) grafted(name string) bool {
	if k == nil || len(k.grafts) == 0 {
		return false
	}
	if k.graftSet == nil {
		k.graftSet = make(map[string]bool, len(k.grafts))
		for _, g := range k.grafts {
			k.graftSet[g.name] = true
		}
	}
	for p := name; p != "." && p != "/" && p != ""; p = path.Dir(p) {
		if k.graftSet[p] {
			return true
		}
	}
	return false
}
