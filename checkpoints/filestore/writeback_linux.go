package filestore

import (
	"os"

	"golang.org/x/sys/unix"
)

// writebackEvery is how many bytes a receive writes between two requests
// to the kernel to start writing them to disk.
const writebackEvery = 8 << 20

// writeback is a temp file's writer that asks the kernel to start writing
// each writebackEvery bytes to disk as they arrive (sync_file_range with
// SYNC_FILE_RANGE_WRITE: it starts the writes and does not wait), so the
// fsync at the end of a receive waits for the last few megabytes, not for
// the whole checkpoint: the disk works while the archive is still
// streaming. It changes no durability guarantee: the fsync still decides.
type writeback struct {
	f       *os.File
	off     int64 // bytes written
	started int64 // bytes whose writeback was started
}

func newWriteback(f *os.File) *writeback { return &writeback{f: f} }

func (w *writeback) Write(p []byte) (int, error) {
	n, err := w.f.Write(p)
	w.off += int64(n)
	if w.off-w.started >= writebackEvery {
		// Advisory: a failure here only means the fsync does all the work.
		_ = unix.SyncFileRange(int(w.f.Fd()), w.started, w.off-w.started, unix.SYNC_FILE_RANGE_WRITE)
		w.started = w.off
	}
	return n, err
}
