package execagent

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
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
// neither kept nor copied from: the restore fails, nothing changed. A kept file whose mode or mtime differ from the archive's is
// given the archive's before the swap, and its own back when the restore
// fails (keeper.undo). Nothing else of a live file changes before the
// swap; its atime is left as it is, where a copy's is its mtime.
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
}

// keptMeta is a kept file's mode and times before the restore gave it the
// archive's: name is its staged name, below the extractor's root.
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
// whose status was st: a link to live when their bytes are the same, else
// a copy, as fastEntry writes one.
func (x *extractor) keepOrWrite(pfd int, dir *os.File, name, base string, hdr *tar.Header, mode fs.FileMode, live *os.File, st *unix.Stat_t, body io.Reader) error {
	k, full := x.keep, filepath.Join(x.dir, name)
	for off := int64(0); off < hdr.Size; {
		n := int(min(int64(keepChunk), hdr.Size-off))
		if _, err := io.ReadFull(body, k.entry[:n]); err != nil {
			return uploadError(err, 0)
		}
		if _, err := io.ReadFull(live, k.live[:n]); err == nil && bytes.Equal(k.entry[:n], k.live[:n]) {
			off += int64(n)
			continue
		}
		// The first difference: the bytes before it are the archive's.
		head, pending := off, k.entry[:n]
		return x.writeFile(pfd, base, full, hdr, mode, func(w io.Writer) (int64, error) {
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
		return fmt.Errorf("%s %w", full, errChangedWhileRestored)
	}
	err := unix.Linkat(int(dir.Fd()), base, pfd, base, 0)
	if errors.Is(err, unix.EEXIST) { // the archive's second entry of that name: the later wins
		if err = x.clearStaged(pfd, base, hdr); err == nil {
			err = unix.Linkat(int(dir.Fd()), base, pfd, base, 0)
		}
	}
	if err != nil {
		// Not linkable (another file system mounted below the root, say):
		// a copy of the live file, whose bytes are the archive's.
		return x.writeFile(pfd, base, full, hdr, mode, func(w io.Writer) (int64, error) {
			c, err := io.Copy(w, io.NewSectionReader(live, 0, hdr.Size))
			if err == nil && (c != hdr.Size || changed(live, st)) {
				err = fmt.Errorf("%s %w", full, errChangedWhileRestored)
			}
			return c, err
		})
	}
	x.budget -= hdr.Size
	x.bytes += hdr.Size
	k.kept++
	mtime := time.Unix(st.Mtim.Unix())
	if st.Mode&0o7777 == uint32(hdr.Mode)&0o7777 && mtime.Equal(hdr.ModTime) {
		return nil
	}
	k.undo = append(k.undo, keptMeta{name: name, mode: unixMode(st.Mode & 0o7777), atime: time.Unix(st.Atim.Unix()), mtime: mtime})
	if err := live.Chmod(mode); err != nil {
		return invalid("body", "archive entry %q: %s", hdr.Name, err.Error())
	}
	if err := setTimes(pfd, base, hdr); err != nil {
		return invalid("body", "archive entry %q: %s", hdr.Name, err.Error())
	}
	return nil
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
		err = errors.Join(err, x.root.Chmod(m.name, m.mode), x.root.Chtimes(m.name, m.atime, m.mtime))
	}
	x.keep.undo = nil
	return err
}
