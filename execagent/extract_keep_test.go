package execagent

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ino returns p's inode number (not following a symlink).
func ino(t testing.TB, p string) uint64 {
	t.Helper()
	fi, err := os.Lstat(p)
	require.NoError(t, err)
	return fi.Sys().(*syscall.Stat_t).Ino
}

// files lists the regular files below dir, relative to it.
func files(t testing.TB, dir string) []string {
	t.Helper()
	var out []string
	require.NoError(t, filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			rel, _ := filepath.Rel(dir, p)
			out = append(out, rel)
		}
		return err
	}))
	return out
}

// A restore keeps the live files whose bytes are the archive's (the same
// inode, with the archive's mode and mtime), writes anew every other one,
// and the tree is the archive's either way: a file changed without its
// size or its mtime moving, past its first comparison chunk; a file
// rewritten; a file linked from outside the work dir (which must not stay
// linked); a file whose mode or sub-second mtime alone changed.
func TestRestore_KeepsTheFilesThatAreTheArchives(t *testing.T) {
	a := newTestAgent(t, nil)
	w := a.cfg.Workdir
	makeWorkspace(t, w, workspace{Files: 40, Bytes: 8 << 20}, 3) // ~200 KB a file: several chunks
	b, _, sum := takeCheckpoint(t, a, nil, nil)
	want := treeState(t, w)
	_, err := restoreArchive(a, sum, b) // the workspace's sub-second mtimes go; the files stay
	require.NoError(t, err)
	require.Equal(t, want, treeState(t, w))

	all := files(t, w)
	require.Len(t, all, 40)
	before := map[string]uint64{}
	for _, f := range all {
		before[f] = ino(t, filepath.Join(w, f))
	}
	// disguised: one byte past the first chunk changed, the size and
	// mtime put back; the other changes on the other files.
	var disguised string
	var rest []string
	for _, f := range all {
		if fi, err := os.Stat(filepath.Join(w, f)); err == nil && fi.Size() > keepChunk+1 && disguised == "" {
			disguised = f
		} else {
			rest = append(rest, f)
		}
	}
	require.NotEmpty(t, disguised, "a file of more than one chunk")
	rewritten, linked, chmodded, retimed, removed := rest[0], rest[1], rest[2], rest[3], rest[4]
	p := filepath.Join(w, disguised)
	fi, err := os.Stat(p)
	require.NoError(t, err)
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	require.NoError(t, err)
	one := make([]byte, 1)
	_, err = f.ReadAt(one, keepChunk+1)
	require.NoError(t, err)
	_, err = f.WriteAt([]byte{one[0] ^ 1}, keepChunk+1)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	require.NoError(t, os.Chtimes(p, fi.ModTime(), fi.ModTime()))
	write(t, filepath.Join(w, rewritten), "rewritten\n", 0o644)
	outside := filepath.Join(t.TempDir(), "linked")
	require.NoError(t, os.Link(filepath.Join(w, linked), outside))
	require.NoError(t, os.Chmod(filepath.Join(w, chmodded), 0o600))
	fi, err = os.Stat(filepath.Join(w, retimed))
	require.NoError(t, err)
	require.NoError(t, os.Chtimes(filepath.Join(w, retimed), fi.ModTime(), fi.ModTime().Add(123*time.Millisecond)))
	require.NoError(t, os.Remove(filepath.Join(w, removed)))
	write(t, filepath.Join(w, "created-since"), "x", 0o644)

	_, err = restoreArchive(a, sum, b)
	require.NoError(t, err)
	assert.Equal(t, want, treeState(t, w))
	for _, f := range all {
		now := ino(t, filepath.Join(w, f))
		switch f {
		case disguised, rewritten, linked, removed:
			assert.NotEqual(t, before[f], now, "%s is written anew", f)
		default:
			assert.Equal(t, before[f], now, "%s is kept", f)
		}
	}
	fi, err = os.Stat(filepath.Join(w, retimed))
	require.NoError(t, err)
	assert.Zero(t, fi.ModTime().Nanosecond(), "a kept file gets the archive's mtime, to the nanosecond")
	fi, err = os.Stat(filepath.Join(w, linked))
	require.NoError(t, err)
	assert.Equal(t, uint64(1), uint64(fi.Sys().(*syscall.Stat_t).Nlink), "not linked to the file outside the work dir")
	out, err := os.Stat(outside)
	require.NoError(t, err)
	assert.False(t, os.SameFile(fi, out))
	assert.Equal(t, uint64(1), uint64(out.Sys().(*syscall.Stat_t).Nlink), "the file outside is left alone")
	assert.Empty(t, stagingLeft(t, w))
}

// A live file is reached from the root without following a symlink: a
// directory of the archive that is a symlink in the live tree, to a twin
// of the archive's file outside the work dir, does not make the restored
// file a link to that twin.
func TestRestore_KeepsNothingThroughASymlink(t *testing.T) {
	a := newTestAgent(t, nil)
	w := a.cfg.Workdir
	write(t, filepath.Join(w, "d", "f"), "the archive's bytes\n", 0o644)
	old := time.Date(2022, 3, 4, 5, 6, 7, 0, time.UTC)
	require.NoError(t, os.Chtimes(filepath.Join(w, "d", "f"), old, old))
	b, _, sum := takeCheckpoint(t, a, nil, nil)
	want := treeState(t, w)

	twin := t.TempDir()
	write(t, filepath.Join(twin, "f"), "the archive's bytes\n", 0o644)
	require.NoError(t, os.Chtimes(filepath.Join(twin, "f"), old, old))
	require.NoError(t, os.RemoveAll(filepath.Join(w, "d")))
	require.NoError(t, os.Symlink(twin, filepath.Join(w, "d")))
	_, err := restoreArchive(a, sum, b)
	require.NoError(t, err)
	assert.Equal(t, want, treeState(t, w))
	restored, err := os.Stat(filepath.Join(w, "d", "f"))
	require.NoError(t, err)
	outside, err := os.Stat(filepath.Join(twin, "f"))
	require.NoError(t, err)
	assert.False(t, os.SameFile(restored, outside), "the file outside is not linked in")
	assert.Equal(t, uint64(1), uint64(outside.Sys().(*syscall.Stat_t).Nlink))
}

// A kept file whose mode and mtime the restore changed before its swap
// gets its own back, to the nanosecond, when the restore then fails.
func TestRestore_AFailedRestoreGivesKeptFilesTheirModesBack(t *testing.T) {
	a := newTestAgent(t, nil)
	w := a.cfg.Workdir
	write(t, filepath.Join(w, "f"), "data\n", 0o644)
	b, _, sum := takeCheckpoint(t, a, nil, nil)
	p := filepath.Join(w, "f")
	fi, err := os.Stat(p)
	require.NoError(t, err)
	mtime := time.Unix(fi.ModTime().Unix(), 987654321)
	require.NoError(t, os.Chmod(p, 0o600))
	require.NoError(t, os.Chtimes(p, mtime, mtime))

	_, err = a.client.Restore(t.Context(), sum, vouched{Reader: bytes.NewReader(b), vouch: strings.Repeat("0", 64)})
	ae := apiError(t, err)
	assert.Equal(t, http.StatusBadRequest, ae.Status, ae.Message)
	fi, err = os.Stat(p)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	assert.True(t, mtime.Equal(fi.ModTime()), "mtime %v, not %v", fi.ModTime(), mtime)
	assert.Empty(t, stagingLeft(t, w))

	_, err = restoreArchive(a, sum, b)
	require.NoError(t, err)
	fi, err = os.Stat(p)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o644), fi.Mode().Perm())
	assert.Zero(t, fi.ModTime().Nanosecond())
}

// writesWhileRead is an entry's body that, on its first read, appends to
// the live file the entry is being compared with: a process writing it
// during the restore.
type writesWhileRead struct {
	io.Reader
	live string
	done bool
}

func (r *writesWhileRead) Read(p []byte) (int, error) {
	if !r.done {
		r.done = true
		f, err := os.OpenFile(r.live, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			return 0, err
		}
		_, err = f.WriteString("written meanwhile\n")
		if err = errors.Join(err, f.Close()); err != nil {
			return 0, err
		}
	}
	return r.Reader.Read(p)
}

// A live file written while its bytes are compared is neither kept nor
// copied from: the entry fails (and the restore with it, nothing changed),
// unless the entry differs from its first byte, when the file is not read
// again and the entry is written from its own bytes.
func TestKeep_AFileWrittenDuringItsComparisonIsNotKept(t *testing.T) {
	dir := t.TempDir()
	data := strings.Repeat("the archive's bytes\n", keepChunk/10)
	require.Greater(t, len(data), keepChunk)
	mtime := time.Unix(time.Now().Unix(), 0)
	tests := []struct {
		name, body string
		changed    bool // the entry fails
	}{
		{name: "the same bytes", body: data, changed: true},
		{name: "a difference past the first chunk", body: data[:len(data)-1] + "!", changed: true},
		{name: "a difference in the first byte", body: "T" + data[1:]},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			write(t, filepath.Join(dir, "f"), data, 0o644)
			require.NoError(t, os.Chtimes(filepath.Join(dir, "f"), mtime, mtime))
			stage, x, err := newStage(dir, extractor{dir: dir, budget: 1 << 20, exact: true, keep: newKeeper()})
			require.NoError(t, err)
			defer func() { x.close(); require.NoError(t, os.RemoveAll(stage)) }()
			hdr := &tar.Header{Name: "f", Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(tt.body)), ModTime: mtime}
			err = x.entry(hdr, &writesWhileRead{Reader: strings.NewReader(tt.body), live: filepath.Join(dir, "f")})
			assert.Zero(t, x.keep.kept)
			if tt.changed {
				assert.ErrorIs(t, err, errChangedWhileRestored)
				assert.ErrorIs(t, err, errBusy, "409 busy: restore again")
				return
			}
			require.NoError(t, err)
			got, err := os.ReadFile(filepath.Join(stage, "new", "f"))
			require.NoError(t, err)
			assert.Equal(t, tt.body, string(got))
		})
	}
}

// A root staged beside itself whose parent became a symlink since the
// checkpoint restores as before (through the parent's path, as every step
// of a restore goes), keeping nothing below it.
func TestRestore_ARootWhoseParentIsASymlinkNow(t *testing.T) {
	a := newTestAgent(t, nil)
	base := t.TempDir()
	parent, elsewhere := filepath.Join(base, "parent"), filepath.Join(base, "elsewhere")
	root := filepath.Join(parent, "f.txt")
	write(t, root, "file root\n", 0o640)
	b, _, sum := takeCheckpoint(t, a, []string{root}, nil)
	require.NoError(t, os.Rename(parent, elsewhere))
	require.NoError(t, os.Symlink(elsewhere, parent))
	write(t, root, "changed\n", 0o640)
	_, err := restoreArchive(a, sum, b)
	require.NoError(t, err)
	data, err := os.ReadFile(filepath.Join(elsewhere, "f.txt"))
	require.NoError(t, err)
	assert.Equal(t, "file root\n", string(data))
}

// exactState is treeState with what keeping could get wrong on top:
// mtimes to the nanosecond (not of symlinks) and every regular file's
// link count (a checkpoint stores a hard link as a file of its own).
func exactState(t testing.TB, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for name, st := range treeState(t, root) {
		fi, err := os.Lstat(filepath.Join(root, name))
		require.NoError(t, err)
		s := fmt.Sprintf("%+v", st)
		if fi.Mode()&fs.ModeSymlink == 0 {
			s += fmt.Sprintf(" mtime=%d", fi.ModTime().UnixNano())
		}
		if fi.Mode().IsRegular() {
			s += fmt.Sprintf(" nlink=%d", fi.Sys().(*syscall.Stat_t).Nlink)
		}
		out[name] = s
	}
	return out
}

// FuzzRestoreKeeps checkpoints a tree, changes it as the fuzzer's bytes
// say (two bytes a change: which entry, and what: its bytes changed with
// its size and mtime put back, bytes added, its mode or its sub-second
// mtime changed, removed, linked from outside the work dir, replaced by a
// symlink to a twin outside, replaced by a directory, a file added beside
// it, its directory replaced by a symlink to a twin outside), then
// restores: whatever the changes, the tree is the checkpoint's exactly
// (extract_keep.go keeps only what is), and what is outside is untouched.
func FuzzRestoreKeeps(f *testing.F) {
	f.Add([]byte{0, 0, 1, 1, 2, 2, 3, 3})
	f.Add([]byte{4, 4, 5, 5, 6, 6, 7, 7})
	f.Add([]byte{0, 8, 1, 9, 2, 0, 9, 5})
	f.Add([]byte{})
	a := newTestAgent(f, nil)
	w := a.cfg.Workdir
	outside := f.TempDir()
	names := []string{"a.txt", "big.bin", "d/b.txt", "d/e/c.txt", "d/e/empty", "ro/r.txt", "x/y/z.txt"}
	big := strings.Repeat("0123456789abcdef", keepChunk/8) // two chunks
	mtime := time.Unix(1_700_000_000, 0)
	reset := func(t testing.TB) {
		makeWritable(w)
		ents, err := os.ReadDir(w)
		require.NoError(t, err)
		for _, e := range ents {
			require.NoError(t, os.RemoveAll(filepath.Join(w, e.Name())))
		}
		makeWritable(outside)
		require.NoError(t, os.RemoveAll(outside))
		require.NoError(t, os.MkdirAll(outside, 0o755))
		for i, n := range names {
			data := fmt.Sprintf("file %d: %s\n", i, n)
			if n == "big.bin" {
				data = big
			}
			if n == "d/e/empty" {
				data = ""
			}
			write(t, filepath.Join(w, n), data, 0o644)
		}
		require.NoError(t, os.Chmod(filepath.Join(w, "ro", "r.txt"), 0o444))
		require.NoError(t, os.Chmod(filepath.Join(w, "ro"), 0o555))
		for _, n := range append(names, "d", "d/e", "x", "x/y") {
			require.NoError(t, os.Chtimes(filepath.Join(w, n), mtime, mtime))
		}
	}
	reset(f)
	b, _, sum := takeCheckpoint(f, a, nil, nil)
	f.Fuzz(func(t *testing.T, changes []byte) {
		reset(t)
		// The first restore over the tree the checkpoint was taken of
		// keeps every file: the reference state.
		_, err := restoreArchive(a, sum, b)
		require.NoError(t, err)
		want := exactState(t, w)
		write(t, filepath.Join(outside, "sentinel"), "untouched", 0o644)
		for i := 0; i+1 < len(changes) && i < 32; i += 2 {
			n := names[int(changes[i])%len(names)]
			p := filepath.Join(w, n)
			makeWritable(w) // ro/ may be changed too
			fi, err := os.Lstat(p)
			if err != nil || !fi.Mode().IsRegular() {
				continue // changed already
			}
			switch changes[i+1] % 10 {
			case 0: // the same size and mtime, another byte
				data, err := os.ReadFile(p)
				require.NoError(t, err)
				if len(data) > 0 {
					data[len(data)-1] ^= 1
					require.NoError(t, os.WriteFile(p, data, 0o644))
					require.NoError(t, os.Chtimes(p, fi.ModTime(), fi.ModTime()))
				}
			case 1:
				f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
				require.NoError(t, err)
				_, err = f.WriteString("more")
				require.NoError(t, errors.Join(err, f.Close()))
			case 2:
				require.NoError(t, os.Chmod(p, 0o600))
			case 3:
				require.NoError(t, os.Chtimes(p, fi.ModTime(), fi.ModTime().Add(time.Duration(changes[i])+1)))
			case 4:
				require.NoError(t, os.Remove(p))
			case 5:
				require.NoError(t, os.Link(p, filepath.Join(outside, fmt.Sprintf("link%d", i))))
			case 6: // a symlink to a twin outside: same bytes, mode, mtime
				twin := filepath.Join(outside, fmt.Sprintf("twin%d", i))
				data, err := os.ReadFile(p)
				require.NoError(t, err)
				write(t, twin, string(data), fi.Mode().Perm())
				require.NoError(t, os.Chtimes(twin, fi.ModTime(), fi.ModTime()))
				require.NoError(t, os.Remove(p))
				require.NoError(t, os.Symlink(twin, p))
			case 7:
				require.NoError(t, os.Remove(p))
				require.NoError(t, os.Mkdir(p, 0o755))
			case 8:
				write(t, p+".extra", "extra", 0o644)
			case 9: // its directory, as a symlink to a twin outside
				dir := filepath.Dir(p)
				if dir == w {
					continue
				}
				twin := filepath.Join(outside, fmt.Sprintf("dir%d", i))
				require.NoError(t, os.Rename(dir, twin))
				require.NoError(t, os.Symlink(twin, dir))
			}
		}
		_, err = restoreArchive(a, sum, b)
		require.NoError(t, err)
		assert.Equal(t, want, exactState(t, w))
		data, err := os.ReadFile(filepath.Join(outside, "sentinel"))
		require.NoError(t, err)
		assert.Equal(t, "untouched", string(data))
		assert.Empty(t, stagingLeft(t, w))
	})
}

// A directory whose every entry is kept is moved in whole (a graft: the
// same directory inode after the restore); one with a changed file is
// staged anew, its unchanged files still kept; the tree is the
// archive's either way.
func TestRestore_GraftsTheDirectoriesKeptWhole(t *testing.T) {
	a := newTestAgent(t, nil)
	w := a.cfg.Workdir
	for _, d := range []string{"a", "a/deep", "b", "c"} {
		write(t, filepath.Join(w, d, "f.txt"), "in "+d+"\n", 0o644)
	}
	b, _, sum := takeCheckpoint(t, a, nil, nil)
	_, err := restoreArchive(a, sum, b) // settles sub-second mtimes
	require.NoError(t, err)
	want := exactState(t, w)
	before := map[string]uint64{}
	for _, p := range []string{"a", "a/deep", "b", "c", "b/f.txt", "c/f.txt"} {
		before[p] = ino(t, filepath.Join(w, p))
	}
	write(t, filepath.Join(w, "c", "f.txt"), "changed\n", 0o644)
	write(t, filepath.Join(w, "created-since"), "x", 0o644)

	_, err = restoreArchive(a, sum, b)
	require.NoError(t, err)
	assert.Equal(t, want, exactState(t, w))
	for _, p := range []string{"a", "a/deep", "b", "b/f.txt"} {
		assert.Equal(t, before[p], ino(t, filepath.Join(w, p)), "%s moved in whole or kept", p)
	}
	assert.NotEqual(t, before["c"], ino(t, filepath.Join(w, "c")), "c held a changed file: staged anew")
	assert.NotEqual(t, before["c/f.txt"], ino(t, filepath.Join(w, "c", "f.txt")))
	assert.Empty(t, stagingLeft(t, w))
}

// A directory an entry is added to between the staging and the swap (a
// process writing) is not moved in: the restore is 409 busy, every
// rename undone, the process's file where it wrote it; the next restore
// works.
func TestRestore_AGraftChangedBeforeTheSwapIsBusy(t *testing.T) {
	a := newTestAgent(t, nil)
	w := a.cfg.Workdir
	write(t, filepath.Join(w, "a", "f.txt"), "a\n", 0o644)
	write(t, filepath.Join(w, "b", "f.txt"), "b\n", 0o644)
	b, _, sum := takeCheckpoint(t, a, nil, nil)
	_, err := restoreArchive(a, sum, b)
	require.NoError(t, err)
	want := exactState(t, w)
	write(t, filepath.Join(w, "created-since"), "x", 0o644)
	ageRoot(t, w)

	renames := 0
	a.srv.rename = func(from, to string) error {
		if renames++; renames == 1 { // a's graft: b is written meanwhile
			write(t, filepath.Join(w, "b", "meanwhile.txt"), "m", 0o644)
		}
		return os.Rename(from, to)
	}
	before := exactState(t, w)
	_, err = restoreArchive(a, sum, b)
	ae := apiError(t, err)
	assert.Equal(t, http.StatusConflict, ae.Status, ae.Message)
	assert.Contains(t, ae.Message, "changed while the restore read it")
	before["b/meanwhile.txt"] = exactState(t, w)["b/meanwhile.txt"]
	delete(before, "b") // its mtime moved with the process's write
	got := exactState(t, w)
	delete(got, "b")
	assert.Equal(t, before, got, "every rename undone")
	assert.Empty(t, stagingLeft(t, w))

	a.srv.rename = os.Rename
	_, err = restoreArchive(a, sum, b)
	require.NoError(t, err)
	assert.Equal(t, want, exactState(t, w))
}

// An archive that comes back to a directory it has left (the entry takes
// the os.Root path) grafts nothing: the entry lands, and the files kept
// before it are linked.
func TestRestore_AnArchiveThatComesBackToADirectoryGraftsNothing(t *testing.T) {
	a := newTestAgent(t, nil)
	w := a.cfg.Workdir
	write(t, filepath.Join(w, "d", "f"), "F", 0o644)
	for _, p := range []string{"d/f", "d"} {
		require.NoError(t, os.Chtimes(filepath.Join(w, p), craftedMTime, craftedMTime))
	}
	kept := ino(t, filepath.Join(w, "d", "f"))
	reg := func(name, body string) craftedEntry {
		return craftedEntry{&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644}, body}
	}
	b, sum := craftedCheckpoint(t, w, []craftedEntry{
		{hdr: &tar.Header{Name: "d/", Typeflag: tar.TypeDir, Mode: 0o755}},
		reg("d/f", "F"),
		{hdr: &tar.Header{Name: "e/", Typeflag: tar.TypeDir, Mode: 0o755}},
		reg("d/g", "G"),
	})
	_, err := restoreArchive(a, sum, b)
	require.NoError(t, err)
	for name, want := range map[string]string{"d/f": "F", "d/g": "G"} {
		data, err := os.ReadFile(filepath.Join(w, name))
		require.NoError(t, err, name)
		assert.Equal(t, want, string(data), name)
	}
	assert.Equal(t, kept, ino(t, filepath.Join(w, "d", "f")), "d/f kept")
	assert.DirExists(t, filepath.Join(w, "e"))
	assert.Empty(t, stagingLeft(t, w))
}
