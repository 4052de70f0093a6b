package docker

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/moby/sys/atomicwriter"
)

// ledgerVersion is the version of the ledger file's layout.
const ledgerVersion = 1

// ledgerEntry is one image this provider pulled for an on-demand pool.
type ledgerEntry struct {
	Ref      string    `json:"ref"`   // normalized reference (imageRef.name)
	Image    string    `json:"image"` // as it was asked for (Spec.Image)
	ID       string    `json:"id"`    // the engine's image id
	Digest   string    `json:"digest,omitempty"`
	Size     int64     `json:"size"` // bytes, as the engine sized it after the pull
	Pulled   time.Time `json:"pulled"`
	LastUsed time.Time `json:"last_used"`
}

// ledgerFile is the ledger's file.
type ledgerFile struct {
	Version int           `json:"version"`
	Images  []ledgerEntry `json:"images"`
	// Pinned are the references of images that a configured pool
	// (Spec.Class "") was launched with: never removed.
	Pinned []string `json:"pinned"`
}

// ledger records the images this provider pulled for on-demand pools,
// when each was last used, and the images of configured pools, in a small
// JSON file (written atomically: readers see the old file or the new one).
// Adding, removing and pinning write at once (they follow a pull or are
// rare); a use only marks the ledger dirty, and flush writes it (the
// provider flushes every ledgerFlushInterval and at Close). With no path
// it lives in memory. Safe for concurrent use.
type ledger struct {
	path string

	mu     sync.Mutex
	images map[string]ledgerEntry // by Ref; guarded by mu
	pinned map[string]bool        // by Ref; guarded by mu
	dirty  bool                   // a use not written yet; guarded by mu
	// writeMu orders writes of the file (held without mu while writing).
	writeMu sync.Mutex
}

// loadLedger reads the ledger at path (none yet: an empty one); a file it
// cannot read or parse is an error naming it.
func loadLedger(path string) (*ledger, error) {
	l := &ledger{path: path, images: map[string]ledgerEntry{}, pinned: map[string]bool{}}
	if path == "" {
		return l, nil
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return l, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the image ledger: %w", err)
	}
	var f ledgerFile
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("read the image ledger %s: %w", path, err)
	}
	if f.Version != ledgerVersion {
		return nil, fmt.Errorf("read the image ledger %s: version %d, want %d", path, f.Version, ledgerVersion)
	}
	for _, e := range f.Images {
		l.images[e.Ref] = e
	}
	for _, r := range f.Pinned {
		l.pinned[r] = true
	}
	return l, nil
}

// add records a pulled image (replacing an earlier entry of its ref) and
// writes the file.
func (l *ledger) add(e ledgerEntry) error {
	l.mu.Lock()
	l.images[e.Ref] = e
	l.mu.Unlock()
	return l.write()
}

// remove forgets an image and writes the file; an unknown ref is no change.
func (l *ledger) remove(ref string) error {
	l.mu.Lock()
	_, ok := l.images[ref]
	delete(l.images, ref)
	l.mu.Unlock()
	if !ok {
		return nil
	}
	return l.write()
}

// pin records that a configured pool uses ref; it writes the file only the
// first time.
func (l *ledger) pin(ref string) error {
	l.mu.Lock()
	known := l.pinned[ref]
	l.pinned[ref] = true
	l.mu.Unlock()
	if known {
		return nil
	}
	return l.write()
}

// touch records a use of ref at (if later than the last); the file is
// written by the next flush. A ref the ledger does not hold is ignored.
func (l *ledger) touch(ref string, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.images[ref]
	if !ok || !at.After(e.LastUsed) {
		return
	}
	e.LastUsed = at
	l.images[ref] = e
	l.dirty = true
}

// get returns the entry of ref.
func (l *ledger) get(ref string) (ledgerEntry, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.images[ref]
	return e, ok
}

// total is the sum of the entries' sizes.
func (l *ledger) total() int64 {
	entries, _ := l.snapshot()
	return sumSizes(entries)
}

// isPinned reports whether a configured pool uses ref.
func (l *ledger) isPinned(ref string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.pinned[ref]
}

// snapshot returns the entries and the pinned refs, each sorted by ref.
func (l *ledger) snapshot() ([]ledgerEntry, []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.snapshotLocked()
}

// snapshotLocked is snapshot with mu held.
func (l *ledger) snapshotLocked() ([]ledgerEntry, []string) {
	entries := make([]ledgerEntry, 0, len(l.images))
	for _, r := range slices.Sorted(maps.Keys(l.images)) {
		entries = append(entries, l.images[r])
	}
	return entries, slices.Sorted(maps.Keys(l.pinned))
}

// flush writes the file if a use is not written yet.
func (l *ledger) flush() error {
	l.mu.Lock()
	dirty := l.dirty
	l.mu.Unlock()
	if !dirty {
		return nil
	}
	return l.write()
}

// write writes the whole ledger to its file, atomically (mode 0600, its
// directory made 0700 if missing).
func (l *ledger) write() error {
	if l.path == "" {
		l.mu.Lock()
		l.dirty = false
		l.mu.Unlock()
		return nil
	}
	l.writeMu.Lock()
	defer l.writeMu.Unlock()
	l.mu.Lock()
	entries, pinned := l.snapshotLocked()
	l.dirty = false
	l.mu.Unlock()
	f := ledgerFile{Version: ledgerVersion, Images: entries, Pinned: pinned}
	b, err := json.MarshalIndent(f, "", "  ")
	if err == nil {
		err = os.MkdirAll(filepath.Dir(l.path), 0o700)
	}
	if err == nil {
		err = atomicwriter.WriteFile(l.path, b, 0o600)
	}
	if err != nil {
		l.mu.Lock()
		l.dirty = true // the next flush tries again
		l.mu.Unlock()
		return fmt.Errorf("write the image ledger %s: %w", l.path, err)
	}
	return nil
}
