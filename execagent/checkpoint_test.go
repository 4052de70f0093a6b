package execagent

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

// entryState is what a restore must bring back of one entry.
type entryState struct {
	Mode  string // kind and permissions (fs.FileMode.String)
	Link  string // a symlink's target
	Data  string // a regular file's sha256
	MTime int64  // seconds; not of symlinks
}

// treeState describes root and everything below it, by path relative to
// root ("." for root), without following symlinks.
func treeState(t testing.TB, root string) map[string]entryState {
	t.Helper()
	out := map[string]entryState{}
	fi, err := os.Lstat(root)
	require.NoError(t, err)
	err = walkTree(root, fi, func(full string, fi fs.FileInfo) error {
		rel, err := filepath.Rel(root, full)
		require.NoError(t, err)
		st := entryState{Mode: fi.Mode().String(), MTime: fi.ModTime().Unix()}
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			st.MTime = 0
			st.Link, err = os.Readlink(full)
			require.NoError(t, err)
		case fi.Mode().IsRegular():
			b, err := os.ReadFile(full)
			require.NoError(t, err)
			sum := sha256.Sum256(b)
			st.Data = hex.EncodeToString(sum[:])
		}
		out[rel] = st
		return nil
	})
	require.NoError(t, err)
	return out
}

// takeCheckpoint takes a checkpoint of paths (nil: the work dir) and
// returns the archive with its info and sha256.
func takeCheckpoint(t testing.TB, a *testAgent, paths, exclude []string) ([]byte, agentapi.CheckpointInfo, string) {
	t.Helper()
	return takeCheckpointAt(t, a, paths, exclude, "")
}

// takeCheckpointAt is takeCheckpoint at a compression level ("": the
// agent's default).
func takeCheckpointAt(t testing.TB, a *testAgent, paths, exclude []string, level string) ([]byte, agentapi.CheckpointInfo, string) {
	t.Helper()
	rc, info, err := a.client.CheckpointLevel(context.Background(), paths, exclude, level)
	require.NoError(t, err)
	defer rc.Close()
	b, err := io.ReadAll(rc)
	require.NoError(t, err)
	sum := sha256.Sum256(b)
	return b, info, hex.EncodeToString(sum[:])
}

// restoreArchive restores b, whose sha256 is sum.
func restoreArchive(a *testAgent, sum string, b []byte) (agentapi.RestoreResult, error) {
	return a.client.Restore(context.Background(), sum, bytes.NewReader(b))
}

// readArchive reads a checkpoint archive with the standard library's gzip
// (so every compression level is plain gzip) and returns its roots and
// entries.
func readArchive(t testing.TB, b []byte) ([]string, []*tar.Header) {
	t.Helper()
	var in io.Reader = bytes.NewReader(b)
	if bytes.HasPrefix(b, []byte{0x1f, 0x8b}) {
		zr, err := gzip.NewReader(in)
		require.NoError(t, err)
		in = zr
	}
	tr := tar.NewReader(in)
	first, err := tr.Next()
	require.NoError(t, err)
	require.Equal(t, byte(tar.TypeXGlobalHeader), first.Typeflag, "the first entry is the roots header")
	var roots []string
	require.NoError(t, json.Unmarshal([]byte(first.PAXRecords[agentapi.PAXRoots]), &roots))
	var hdrs []*tar.Header
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		hdrs = append(hdrs, h)
	}
	return roots, hdrs
}

// names lists the entries' names.
func names(hdrs []*tar.Header) []string {
	out := make([]string, len(hdrs))
	for i, h := range hdrs {
		out[i] = h.Name
	}
	return out
}

// write creates a file with parents.
func write(t testing.TB, p, data string, mode fs.FileMode) {
	t.Helper()
	require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
	require.NoError(t, os.WriteFile(p, []byte(data), mode))
	require.NoError(t, os.Chmod(p, mode))
}

// makeTree fills dir with what a restore must bring back exactly: modes
// (a read-only file, an executable, a private and a read-only directory),
// symlinks (relative, absolute inside the root, absolute outside it,
// dangling), an empty directory, a hard link, old mtimes.
func makeTree(t testing.TB, dir, outside string) {
	t.Helper()
	write(t, filepath.Join(dir, "README.md"), "# hello\n", 0o644)
	write(t, filepath.Join(dir, "run.sh"), "#!/bin/sh\necho run\n", 0o755)
	write(t, filepath.Join(dir, "src", "main.py"), "print('main')\n", 0o600)
	write(t, filepath.Join(dir, "src", "lib", "util.py"), "X = 1\n", 0o400)
	write(t, filepath.Join(dir, "ro", "frozen.txt"), "frozen\n", 0o444)
	require.NoError(t, os.Chmod(filepath.Join(dir, "ro"), 0o555))
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "private"), 0o700))
	require.NoError(t, os.Chmod(filepath.Join(dir, "private"), 0o700))
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "empty", "deeper"), 0o755))
	require.NoError(t, os.Symlink("src/main.py", filepath.Join(dir, "rel-link")))
	require.NoError(t, os.Symlink(filepath.Join(dir, "README.md"), filepath.Join(dir, "abs-inside")))
	require.NoError(t, os.Symlink(outside, filepath.Join(dir, "abs-outside")))
	require.NoError(t, os.Symlink("nowhere/at/all", filepath.Join(dir, "dangling")))
	require.NoError(t, os.Link(filepath.Join(dir, "README.md"), filepath.Join(dir, "hard-link")))
	old := time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, p := range []string{"README.md", "src/main.py", "src/lib", "empty/deeper", "ro/frozen.txt", "ro", "src", "."} { // ".": the root's mtime comes back too
		require.NoError(t, os.Chtimes(filepath.Join(dir, p), old, old))
	}
}

// mess changes everything makeTree made, and adds files.
func mess(t testing.TB, dir string) {
	t.Helper()
	write(t, filepath.Join(dir, "README.md"), "changed\n", 0o666) // the hard link's data changes too
	require.NoError(t, os.Chmod(filepath.Join(dir, "run.sh"), 0o644))
	require.NoError(t, os.Remove(filepath.Join(dir, "src", "main.py")))
	write(t, filepath.Join(dir, "src", "new.py"), "new\n", 0o644)
	require.NoError(t, os.Chmod(filepath.Join(dir, "ro"), 0o755))
	write(t, filepath.Join(dir, "ro", "thawed.txt"), "thawed\n", 0o644)
	require.NoError(t, os.RemoveAll(filepath.Join(dir, "empty")))
	write(t, filepath.Join(dir, "empty"), "a file where a directory was\n", 0o644)
	require.NoError(t, os.Remove(filepath.Join(dir, "rel-link")))
	write(t, filepath.Join(dir, "rel-link"), "a file where a link was\n", 0o644)
	require.NoError(t, os.Remove(filepath.Join(dir, "abs-outside")))
	require.NoError(t, os.Symlink("/somewhere/else", filepath.Join(dir, "abs-outside")))
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "created", "since", "then"), 0o755))
	write(t, filepath.Join(dir, "created", "since", "then", "f"), "new\n", 0o644)
	write(t, filepath.Join(dir, ".hidden"), "new\n", 0o644)
}

// A checkpoint of the work dir and of a second root restores both exactly:
// modes, symlinks (none followed), empty directories, mtimes; files created
// since are gone; processes' work dir stays.
func TestCheckpoint_RoundTrip_TreeComesBackExactly(t *testing.T) {
	a := newTestAgent(t, nil)
	outside := t.TempDir()
	write(t, filepath.Join(outside, "secret"), "not in the checkpoint\n", 0o600)
	other := filepath.Join(t.TempDir(), "other")
	makeTree(t, a.cfg.Workdir, outside)
	write(t, filepath.Join(other, "data.bin"), "\x00\x01\x02", 0o640)
	wantWork, wantOther := treeState(t, a.cfg.Workdir), treeState(t, other)

	b, info, sum := takeCheckpoint(t, a, []string{".", other}, nil)
	assert.Equal(t, agentapi.FormatTarGzip, info.Format)
	assert.Equal(t, len(wantWork)+len(wantOther), info.Files, "entries counted before streaming")
	assert.Zero(t, info.Skipped)
	roots, hdrs := readArchive(t, b)
	assert.Equal(t, []string{a.cfg.Workdir, other}, roots)
	assert.Equal(t, roots, info.Roots, "the roots header names the archive's roots, resolved")
	require.Len(t, hdrs, info.Files)
	assert.Equal(t, strings.TrimPrefix(a.cfg.Workdir, "/")+"/", hdrs[0].Name, "the root's own entry first, under its absolute path")
	var bytesInFiles int64
	for _, h := range hdrs {
		assert.NotEqual(t, byte(tar.TypeLink), h.Typeflag, "%s: hard links are archived as files", h.Name)
		bytesInFiles += h.Size
		if strings.HasSuffix(h.Name, "/abs-outside") {
			assert.Equal(t, outside, h.Linkname, "a link out of the root is archived as a link")
		}
		assert.NotContains(t, h.Name, "secret", "a link is never followed")
	}
	assert.Equal(t, bytesInFiles, info.Bytes)

	mess(t, a.cfg.Workdir)
	require.NoError(t, os.RemoveAll(other)) // a root that is gone comes back
	res, err := restoreArchive(a, sum, b)
	require.NoError(t, err)
	assert.Equal(t, info.Files, res.Files)
	assert.Equal(t, info.Bytes, res.Bytes)
	assert.Equal(t, wantWork, treeState(t, a.cfg.Workdir))
	assert.Equal(t, wantOther, treeState(t, other))
	st, err := os.Stat(filepath.Join(outside, "secret"))
	require.NoError(t, err, "what a link points at outside the root is left alone")
	assert.Equal(t, fs.FileMode(0o600), st.Mode().Perm())
	a1, err := os.Stat(filepath.Join(a.cfg.Workdir, "README.md"))
	require.NoError(t, err)
	a2, err := os.Stat(filepath.Join(a.cfg.Workdir, "hard-link"))
	require.NoError(t, err)
	assert.False(t, os.SameFile(a1, a2), "a hard link comes back as a file of its own")

	// Restoring again is the same (nothing left over from the first).
	_, err = restoreArchive(a, sum, b)
	require.NoError(t, err)
	assert.Equal(t, wantWork, treeState(t, a.cfg.Workdir))
}

// A root whose kind changed since, or a file root, is staged beside
// itself and swapped whole.
func TestCheckpoint_RoundTrip_RootsStagedBeside(t *testing.T) {
	a := newTestAgent(t, nil)
	dir := t.TempDir()
	fileRoot, dirRoot, linkRoot := filepath.Join(dir, "f.txt"), filepath.Join(dir, "d"), filepath.Join(dir, "l")
	write(t, fileRoot, "file root\n", 0o640)
	write(t, filepath.Join(dirRoot, "x"), "x\n", 0o644)
	require.NoError(t, os.Symlink("d/x", linkRoot))
	want := treeState(t, dir)
	b, info, sum := takeCheckpoint(t, a, []string{fileRoot, dirRoot, linkRoot}, nil)
	assert.Equal(t, 4, info.Files)

	require.NoError(t, os.Remove(fileRoot))
	require.NoError(t, os.Mkdir(fileRoot, 0o755)) // a directory where the file was
	require.NoError(t, os.RemoveAll(dirRoot))
	write(t, dirRoot, "a file where the root directory was\n", 0o644)
	require.NoError(t, os.Remove(linkRoot))
	write(t, linkRoot, "a file where the link was\n", 0o644)
	_, err := restoreArchive(a, sum, b)
	require.NoError(t, err)
	got := treeState(t, dir)
	delete(got, ".")
	delete(want, ".")
	assert.Equal(t, want, got)
}

// Every compression level restores: none is a plain tar (FormatTar), the
// others gzip (FormatTarGzip).
func TestCheckpoint_CompressionLevels(t *testing.T) {
	a := newTestAgent(t, nil)
	makeWorkspace(t, a.cfg.Workdir, workspace{Files: 40, Bytes: 400 << 10}, 7)
	want := treeState(t, a.cfg.Workdir)
	sizes := map[string]int{}
	for _, level := range []string{agentapi.CompressionFast, agentapi.CompressionNone, agentapi.CompressionSmall} {
		t.Run(level, func(t *testing.T) {
			b, info, sum := takeCheckpointAt(t, a, nil, nil, level)
			_, hdrs := readArchive(t, b)
			assert.Len(t, hdrs, info.Files)
			assert.Equal(t, agentapi.FormatOf(level), info.Format)
			assert.Equal(t, level != agentapi.CompressionNone, bytes.HasPrefix(b, []byte{0x1f, 0x8b}), "gzip")
			sizes[level] = len(b)
			require.NoError(t, os.RemoveAll(filepath.Join(a.cfg.Workdir, "d000")))
			_, err := restoreArchive(a, sum, b)
			require.NoError(t, err)
			assert.Equal(t, want, treeState(t, a.cfg.Workdir))
		})
	}
	assert.Less(t, sizes[agentapi.CompressionSmall], sizes[agentapi.CompressionFast])
	assert.Less(t, sizes[agentapi.CompressionFast], sizes[agentapi.CompressionNone])
}

// Excludes apply per root: a pattern without "/" matches a last element at
// any depth, one with "/" the whole relative path ("**": any elements).
func TestCheckpoint_Excludes(t *testing.T) {
	a := newTestAgent(t, nil)
	w := a.cfg.Workdir
	other := filepath.Join(t.TempDir(), "other")
	for _, p := range []string{
		"keep.py", "drop.pyc", "src/a.pyc", "src/a.py", "node_modules/x/index.js", "src/node_modules/y.js",
		"build/a.o", "build/sub/b.o", "build/keep.txt", "deep/er/cache/c", "cache/top", "data/big/one",
	} {
		write(t, filepath.Join(w, p), p, 0o644)
	}
	write(t, filepath.Join(other, "build", "a.o"), "other", 0o644)
	write(t, filepath.Join(other, "z.pyc"), "other", 0o644)
	b, info, _ := takeCheckpoint(t, a, []string{w, other}, []string{"*.pyc", "node_modules", "build/*.o", "**/cache", "data/**"})
	_, hdrs := readArchive(t, b)
	wn, on := strings.TrimPrefix(w, "/"), strings.TrimPrefix(other, "/")
	assert.ElementsMatch(t, []string{
		wn + "/", wn + "/keep.py", wn + "/src/", wn + "/src/a.py", wn + "/build/", wn + "/build/sub/", wn + "/build/sub/b.o",
		wn + "/build/keep.txt", wn + "/deep/", wn + "/deep/er/",
		on + "/", on + "/build/",
	}, names(hdrs))
	assert.Equal(t, len(hdrs), info.Files)
}

func TestExcludes_Match(t *testing.T) {
	tests := []struct {
		name     string
		patterns []string
		match    []string
		keep     []string
	}{
		{name: "base name at any depth", patterns: []string{"*.pyc"}, match: []string{"a.pyc", "x/y/a.pyc"}, keep: []string{"a.py", "a.pyc/b"}},
		{name: "a directory's name", patterns: []string{".git"}, match: []string{".git", "sub/.git"}, keep: []string{".gitignore"}},
		{name: "trailing slash ignored", patterns: []string{"build/"}, match: []string{"build", "x/build"}},
		{name: "anchored", patterns: []string{"build/*.o"}, match: []string{"build/a.o"}, keep: []string{"build/x/a.o", "x/build/a.o", "a.o"}},
		{name: "double star", patterns: []string{"**/cache"}, match: []string{"cache", "a/cache", "a/b/cache"}, keep: []string{"cache2", "a/cache/x"}},
		{name: "double star in the middle", patterns: []string{"a/**/z"}, match: []string{"a/z", "a/b/z", "a/b/c/z"}, keep: []string{"b/z", "a/z/y"}},
		{name: "double star at the end", patterns: []string{"data/**"}, match: []string{"data", "data/x", "data/x/y"}, keep: []string{"database"}},
		{name: "no patterns", keep: []string{"a", "a/b"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ex, err := parseExcludes(tt.patterns)
			require.NoError(t, err)
			for _, p := range tt.match {
				assert.True(t, ex.match(p), "%q excludes %q", tt.patterns, p)
			}
			for _, p := range tt.keep {
				assert.False(t, ex.match(p), "%q keeps %q", tt.patterns, p)
			}
		})
	}
}

// A checkpoint refuses, before it sends anything, what it cannot take.
func TestCheckpoint_Refusals(t *testing.T) {
	a := newTestAgent(t, func(c *Config) { c.MaxReadBytes = 1000; c.MaxCheckpointEntries = 20 })
	w := a.cfg.Workdir
	write(t, filepath.Join(w, "small"), "x", 0o644)
	big := t.TempDir()
	write(t, filepath.Join(big, "big"), strings.Repeat("x", 1001), 0o644)
	many := t.TempDir()
	for i := range 21 {
		write(t, filepath.Join(many, "f", strings.Repeat("a", i+1)), "", 0o644)
	}
	tests := []struct {
		name    string
		paths   []string
		exclude []string
		status  int
		want    string
	}{
		{name: "missing path", paths: []string{"nope"}, status: 404, want: `"` + filepath.Join(w, "nope") + `"`},
		{name: "the file system's root", paths: []string{"/"}, status: 400, want: "root of the file system"},
		{name: "nested roots", paths: []string{w, filepath.Join(w, "small")}, status: 400, want: "overlap"},
		{name: "the same root twice", paths: []string{w, "."}, status: 400, want: "overlap"},
		{name: "bad pattern", paths: []string{w}, exclude: []string{"[a-"}, status: 400, want: `exclude: "[a-"`},
		{name: "absolute pattern", paths: []string{w}, exclude: []string{"/x"}, status: 400, want: "not absolute"},
		{name: "dot-dot pattern", paths: []string{w}, exclude: []string{"a/../b"}, status: 400, want: `".."`},
		{name: "over the byte limit", paths: []string{big}, status: 413, want: "QUARRY_AGENT_MAX_READ_BYTES"},
		{name: "over the entry limit", paths: []string{many}, status: 413, want: "QUARRY_AGENT_MAX_CHECKPOINT_ENTRIES"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := a.client.Checkpoint(context.Background(), tt.paths, tt.exclude)
			ae := apiError(t, err)
			assert.Equal(t, tt.status, ae.Status, ae.Message)
			assert.Contains(t, ae.Message, tt.want)
		})
	}
	_, _, err := a.client.CheckpointLevel(context.Background(), nil, nil, "best")
	ae := apiError(t, err)
	assert.Equal(t, 400, ae.Status)
	assert.Contains(t, ae.Message, "compression")
}

// Devices, sockets and fifos are left out and counted.
func TestCheckpoint_SpecialFilesSkippedAndCounted(t *testing.T) {
	a := newTestAgent(t, nil)
	w := a.cfg.Workdir
	write(t, filepath.Join(w, "file"), "x", 0o644)
	require.NoError(t, syscall.Mkfifo(filepath.Join(w, "fifo"), 0o644))
	dir, err := os.MkdirTemp("", "ck") // a socket's path must be short
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	ln, err := net.Listen("unix", filepath.Join(dir, "s"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	b, info, _ := takeCheckpoint(t, a, []string{w, dir}, nil)
	assert.Equal(t, 2, info.Skipped)
	_, hdrs := readArchive(t, b)
	assert.Equal(t, []string{strings.TrimPrefix(w, "/") + "/", strings.TrimPrefix(w, "/") + "/file", strings.TrimPrefix(dir, "/") + "/"}, names(hdrs))
}

// ageRoot gives dir an mtime long past, so that a test sees a change of
// it (a staging directory made and removed in it) within the second.
func ageRoot(t testing.TB, dir string) {
	t.Helper()
	old := time.Date(2021, 2, 3, 4, 5, 6, 0, time.UTC)
	require.NoError(t, os.Chtimes(dir, old, old))
}

// stagingLeft lists staging directories left in dir.
func stagingLeft(t testing.TB, dir string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, stagingPrefix+"*"))
	require.NoError(t, err)
	return m
}

// A body that is not the checkpoint asked for, or not a checkpoint at
// all, is refused and nothing changes.
func TestRestore_BadBodyLeavesTheTreeAsItWas(t *testing.T) {
	a := newTestAgent(t, nil)
	w := a.cfg.Workdir
	makeTree(t, w, t.TempDir())
	b, _, sum := takeCheckpoint(t, a, nil, nil)
	mess(t, w)
	ageRoot(t, w)
	want := treeState(t, w)

	flipped := bytes.Clone(b)
	flipped[len(flipped)/2] ^= 0xff
	var plain bytes.Buffer
	zw := gzip.NewWriter(&plain)
	tw := tar.NewWriter(zw)
	require.NoError(t, tw.WriteHeader(&tar.Header{Name: "x", Typeflag: tar.TypeReg, Mode: 0o644}))
	require.NoError(t, tw.Close())
	require.NoError(t, zw.Close())
	hash := func(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }
	tests := []struct {
		name string
		sum  string
		body []byte
		want string
	}{
		{name: "another sha256", sum: strings.Repeat("ab", 32), body: b, want: "the body hashes to " + sum},
		{name: "a flipped byte", sum: sum, body: flipped, want: "body"},
		{name: "a flipped byte, its own hash", sum: hash(flipped), body: flipped, want: "body"},
		{name: "cut short", sum: hash(b[:len(b)/2]), body: b[:len(b)/2], want: "body"},
		{name: "not gzip", sum: hash([]byte("hello")), body: []byte("hello"), want: "body"},
		{name: "a tar without the roots header", sum: hash(plain.Bytes()), body: plain.Bytes(), want: agentapi.PAXRoots},
		{name: "a bad sha256", sum: "xyz", body: b, want: "sha256: must be"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := restoreArchive(a, tt.sum, tt.body)
			ae := apiError(t, err)
			assert.Equal(t, http.StatusBadRequest, ae.Status, ae.Message)
			assert.Contains(t, ae.Message, tt.want)
			assert.Equal(t, want, treeState(t, w), "nothing changed")
			assert.Empty(t, stagingLeft(t, w))
		})
	}
	_, err := restoreArchive(a, strings.ToUpper(sum), b)
	require.NoError(t, err, "upper-case hex is the same hash")
}

// vouched is a restore body its sender vouches for with vouch
// (agentapi.VouchedBody).
type vouched struct {
	io.Reader
	vouch string
}

func (v vouched) Vouch() string { return v.vouch }

// A body whose sender vouches for its SHA-256 (the gateway, which read it
// from its store through a hash check) is not hashed again: the agent
// commits when the vouch is the sha256 asked for, and refuses, changing
// nothing, when it is not, or is empty (the sender's check failed).
func TestRestore_AVouchedBodyIsNotHashedAgain(t *testing.T) {
	a := newTestAgent(t, nil)
	w := a.cfg.Workdir
	makeTree(t, w, t.TempDir())
	b, _, sum := takeCheckpoint(t, a, nil, nil)
	orig := treeState(t, w)
	mess(t, w)
	ageRoot(t, w)
	messed := treeState(t, w)

	for _, tt := range []struct{ name, vouch string }{
		{"no vouch: the sender's check failed", ""},
		{"a vouch for another sha256", strings.Repeat("ab", 32)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := a.client.Restore(context.Background(), sum, vouched{bytes.NewReader(b), tt.vouch})
			ae := apiError(t, err)
			assert.Equal(t, http.StatusBadRequest, ae.Status, ae.Message)
			assert.Contains(t, ae.Message, "the sender vouched for")
			assert.Equal(t, messed, treeState(t, w), "nothing changed")
			assert.Empty(t, stagingLeft(t, w))
		})
	}

	// The vouch stands for the hash: a body that hashes to another sum is
	// taken when its sender vouches for the one asked for.
	other := strings.Repeat("cd", 32)
	res, err := a.client.Restore(context.Background(), other, vouched{bytes.NewReader(b), other})
	require.NoError(t, err)
	assert.Positive(t, res.Files)
	assert.Equal(t, orig, treeState(t, w), "restored")
	assert.Empty(t, stagingLeft(t, w))
}

// An archive over the upload limit is 413 and nothing changes.
func TestRestore_OverTheLimitLeavesTheTreeAsItWas(t *testing.T) {
	a := newTestAgent(t, func(c *Config) { c.MaxUploadBytes = 64 << 10 })
	w := a.cfg.Workdir
	makeWorkspace(t, w, workspace{Files: 20, Bytes: 200 << 10}, 3)
	b, _, sum := takeCheckpoint(t, a, nil, nil)
	require.NoError(t, os.RemoveAll(filepath.Join(w, "d000", "e1")))
	write(t, filepath.Join(w, "new"), "new", 0o644)
	ageRoot(t, w)
	want := treeState(t, w)
	_, err := restoreArchive(a, sum, b)
	ae := apiError(t, err)
	assert.Equal(t, http.StatusRequestEntityTooLarge, ae.Status, ae.Message)
	assert.Equal(t, want, treeState(t, w))
	assert.Empty(t, stagingLeft(t, w))
}

// A rename that fails during the swap is undone with every rename before
// it, wherever it fails: the tree is as it was, nothing is left staged.
func TestRestore_FailedRenameIsUndone(t *testing.T) {
	a := newTestAgent(t, nil)
	w := a.cfg.Workdir
	other := filepath.Join(t.TempDir(), "other")
	makeTree(t, w, t.TempDir())
	write(t, filepath.Join(other, "o"), "o", 0o644)
	b, _, sum := takeCheckpoint(t, a, []string{w, other}, nil)
	mess(t, w)
	require.NoError(t, os.RemoveAll(other))
	write(t, other, "a file now", 0o600)
	wantWork, wantOther := treeState(t, w), treeState(t, other)

	var renames int
	a.srv.rename = func(from, to string) error { renames++; return os.Rename(from, to) }
	_, err := restoreArchive(a, sum, b)
	require.NoError(t, err)
	total := renames
	require.Greater(t, total, 10)
	for _, failAt := range []int{1, total / 2, total} {
		mess(t, w)
		require.NoError(t, os.RemoveAll(other))
		write(t, other, "a file now", 0o600)
		ageRoot(t, w)
		wantWork, wantOther = treeState(t, w), treeState(t, other)
		n := 0
		a.srv.rename = func(from, to string) error {
			n++
			if n == failAt {
				return &os.LinkError{Op: "rename", Old: from, New: to, Err: syscall.EIO}
			}
			return os.Rename(from, to)
		}
		_, err := restoreArchive(a, sum, b)
		ae := apiError(t, err)
		assert.Equal(t, http.StatusInternalServerError, ae.Status, "rename %d of %d: %s", failAt, total, ae.Message)
		assert.Contains(t, ae.Message, "put back as it was")
		assert.Equal(t, wantWork, treeState(t, w), "rename %d of %d", failAt, total)
		assert.Equal(t, wantOther, treeState(t, other), "rename %d of %d", failAt, total)
		assert.Empty(t, stagingLeft(t, w))
		assert.Empty(t, stagingLeft(t, filepath.Dir(other)))
		a.srv.rename = os.Rename
		_, err = restoreArchive(a, sum, b)
		require.NoError(t, err, "a restore after an undone one works")
	}
}

// A second restore while one runs is 409 busy, as is a checkpoint; the
// first goes on.
func TestRestore_ConcurrentIsBusy(t *testing.T) {
	a := newTestAgent(t, nil)
	w := a.cfg.Workdir
	makeWorkspace(t, w, workspace{Files: 50, Bytes: 2 << 20}, 5)
	want := treeState(t, w)
	b, _, sum := takeCheckpointAt(t, a, nil, nil, agentapi.CompressionNone)
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		_, err := a.client.Restore(context.Background(), sum, pr)
		done <- err
	}()
	_, err := pw.Write(b[:len(b)/2])
	require.NoError(t, err)
	eventually(t, func() bool { return len(stagingLeft(t, w)) == 1 }, "the first restore stages")
	_, err = restoreArchive(a, sum, b)
	ae := apiError(t, err)
	assert.Equal(t, http.StatusConflict, ae.Status)
	assert.Equal(t, agentapi.CodeBusy, ae.Code)
	_, _, err = a.client.Checkpoint(context.Background(), nil, nil)
	ae = apiError(t, err)
	assert.Equal(t, http.StatusConflict, ae.Status)
	assert.Equal(t, agentapi.CodeBusy, ae.Code)
	_, err = pw.Write(b[len(b)/2:])
	require.NoError(t, err)
	require.NoError(t, pw.Close())
	require.NoError(t, <-done)
	assert.Equal(t, want, treeState(t, w))
}

// Processes keep running across a restore, and one whose cwd is the root
// keeps a working cwd (the root itself is never replaced).
func TestRestore_ProcessesKeepRunning(t *testing.T) {
	a := newTestAgent(t, nil)
	w := a.cfg.Workdir
	write(t, filepath.Join(w, "a"), "a", 0o644)
	b, _, sum := takeCheckpoint(t, a, nil, nil)
	ctx := context.Background()
	p, err := a.client.StartProcess(ctx, agentapi.ProcessStartRequest{Command: "while :; do echo tick >> ticks; sleep 0.02; done"})
	require.NoError(t, err)
	ticks := filepath.Join(w, "ticks")
	eventually(t, func() bool { _, err := os.Stat(ticks); return err == nil }, "the process writes")
	// A marker in the file the restore must remove: a new file may get the
	// old one's inode number (a file system reuses a freed inode at once),
	// so os.SameFile cannot tell them apart.
	f, err := os.OpenFile(ticks, os.O_APPEND|os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteString("before the restore\n")
	require.NoError(t, err)
	require.NoError(t, f.Close())
	_, err = restoreArchive(a, sum, b)
	require.NoError(t, err)
	info, err := a.client.GetProcess(ctx, p.ID)
	require.NoError(t, err)
	assert.Equal(t, agentapi.ProcessRunning, info.State)
	eventually(t, func() bool {
		got, err := os.ReadFile(ticks)
		return err == nil && len(got) > 0 && !strings.Contains(string(got), "before the restore")
	}, "the restore removed ticks (created since), and the process writes a new one into the same root: its cwd works")
	_, err = a.client.KillProcess(ctx, p.ID)
	require.NoError(t, err)
}

// A checkpoint restored by an agent with another work dir (the process
// provider's sandboxes each have their own) lands below that agent's work
// dir, never in the work dir it was taken from; a root outside the work
// dir is restored where it was.
func TestRestore_AnotherWorkdirIsRebased(t *testing.T) {
	src, dst := newTestAgent(t, nil), newTestAgent(t, nil)
	outside := filepath.Join(t.TempDir(), "outside")
	makeTree(t, src.cfg.Workdir, t.TempDir())
	write(t, filepath.Join(src.cfg.Workdir, "sub", "x.txt"), "x\n", 0o644)
	write(t, filepath.Join(outside, "o.txt"), "o\n", 0o644)
	want := treeState(t, src.cfg.Workdir)
	wantSub := treeState(t, filepath.Join(src.cfg.Workdir, "sub"))

	b, _, sum := takeCheckpoint(t, src, nil, nil)
	mess(t, src.cfg.Workdir)
	messed := treeState(t, src.cfg.Workdir)
	_, err := restoreArchive(dst, sum, b)
	require.NoError(t, err)
	assert.Equal(t, want, treeState(t, dst.cfg.Workdir), "restored below the restoring agent's work dir")
	assert.Equal(t, messed, treeState(t, src.cfg.Workdir), "the source's work dir is left alone")

	b, _, sum = takeCheckpoint(t, src, []string{"sub", outside}, nil)
	require.NoError(t, os.RemoveAll(outside))
	_, err = restoreArchive(dst, sum, b)
	require.NoError(t, err)
	assert.Equal(t, wantSub, treeState(t, filepath.Join(dst.cfg.Workdir, "sub")), "a root below the work dir moves with it")
	_, err = os.Stat(filepath.Join(outside, "o.txt"))
	assert.NoError(t, err, "a root outside the work dir comes back where it was")
}

// fullDisk is a staged file's writer on a file system that fills up: its
// writes fail with ENOSPC once left bytes are written (shared by every
// file of a restore).
type fullDisk struct {
	f    *os.File
	left *int64
}

func (d fullDisk) Write(p []byte) (int, error) {
	if int64(len(p)) > *d.left {
		n, _ := d.f.Write(p[:*d.left])
		*d.left = 0
		return n, &fs.PathError{Op: "write", Path: d.f.Name(), Err: syscall.ENOSPC}
	}
	*d.left -= int64(len(p))
	return d.f.Write(p)
}

// A disk that fills up while a restore stages is 507 insufficient_storage
// and nothing changes: the staged part is removed (a real full disk: a
// small tmpfs needs privileges, so the staged files' writer fails as
// write(2) does on one).
func TestRestore_DiskFullWhileStagingLeavesTheTreeAsItWas(t *testing.T) {
	a := newTestAgent(t, nil)
	w := a.cfg.Workdir
	makeWorkspace(t, w, workspace{Files: 40, Bytes: 1 << 20}, 7)
	makeTree(t, filepath.Join(w, "tree"), t.TempDir())
	b, _, sum := takeCheckpoint(t, a, nil, nil)
	mess(t, filepath.Join(w, "tree"))
	require.NoError(t, os.RemoveAll(filepath.Join(w, "d000")))
	ageRoot(t, w)
	want := treeState(t, w)
	for _, room := range []int64{0, 100 << 10, 900 << 10} {
		left := room
		a.srv.stagedFile = func(f *os.File) io.Writer { return fullDisk{f: f, left: &left} }
		_, err := restoreArchive(a, sum, b)
		ae := apiError(t, err)
		assert.Equal(t, http.StatusInsufficientStorage, ae.Status, "room %d: %s", room, ae.Message)
		assert.Equal(t, agentapi.CodeInsufficientStorage, ae.Code)
		assert.Contains(t, ae.Message, "no space left on device")
		assert.Equal(t, want, treeState(t, w), "room %d: nothing changed", room)
		assert.Empty(t, stagingLeft(t, w), "room %d", room)
	}
	a.srv.stagedFile = func(f *os.File) io.Writer { return f }
	_, err := restoreArchive(a, sum, b)
	require.NoError(t, err, "with room, the same restore works")
	_, err = os.Stat(filepath.Join(w, "d000"))
	assert.NoError(t, err)
}

// craftedEntry is one entry of a hand-made checkpoint: its header (name
// relative to the work dir) and, for a regular file, its body.
type craftedEntry struct {
	hdr  *tar.Header
	body string
}

// craftedCheckpoint builds a checkpoint archive of the work dir w by hand:
// the roots header, w's own entry, then entries. Every mtime is craftedMTime.
func craftedCheckpoint(t *testing.T, w string, entries []craftedEntry) ([]byte, string) {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	list, err := json.Marshal([]string{w})
	require.NoError(t, err)
	require.NoError(t, tw.WriteHeader(&tar.Header{Typeflag: tar.TypeXGlobalHeader, PAXRecords: map[string]string{
		agentapi.PAXRoots: string(list), agentapi.PAXWorkdir: w,
	}}))
	require.NoError(t, tw.WriteHeader(&tar.Header{Name: w[1:] + "/", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: craftedMTime}))
	for _, e := range entries {
		h := *e.hdr
		h.Name = w[1:] + "/" + h.Name
		h.ModTime = craftedMTime
		h.Size = int64(len(e.body))
		require.NoError(t, tw.WriteHeader(&h))
		_, err := tw.Write([]byte(e.body))
		require.NoError(t, err)
	}
	require.NoError(t, tw.Close())
	require.NoError(t, zw.Close())
	s := sha256.Sum256(buf.Bytes())
	return buf.Bytes(), hex.EncodeToString(s[:])
}

var craftedMTime = time.Unix(1_700_000_000, 0)

// The fast path (extract_fast.go) hands every entry it cannot take safely
// to the os.Root path: names listed twice, a parent the archive never
// listed, and an entry below a symlink (refused, nothing changed).
func TestRestore_FastPathFallbacks(t *testing.T) {
	a := newTestAgent(t, nil)
	w := a.cfg.Workdir
	write(t, filepath.Join(w, "before"), "was here", 0o644)
	reg := func(name string, mode int64, body string) craftedEntry {
		return craftedEntry{&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: mode}, body}
	}
	dir := func(name string, mode int64) craftedEntry {
		return craftedEntry{hdr: &tar.Header{Name: name, Typeflag: tar.TypeDir, Mode: mode}}
	}
	b, sum := craftedCheckpoint(t, w, []craftedEntry{
		dir("d/", 0o750),
		reg("d/twice", 0o600, "first"),
		reg("d/twice", 0o640, "second"),
		dir("d/", 0o755), // listed again: the later mode wins
		reg("d/sub/unlisted-parent", 0o644, "deep"),
		{hdr: &tar.Header{Name: "link", Typeflag: tar.TypeSymlink, Linkname: "d", Mode: 0o777}},
		reg("d/ro", 0o444, "read only"),
	})
	_, err := restoreArchive(a, sum, b)
	require.NoError(t, err)
	got := treeState(t, w)
	assert.NotContains(t, got, "before", "created since: removed")
	assert.Equal(t, "-rw-r-----", got["d/twice"].Mode, "the later entry wins")
	assert.Equal(t, "drwxr-xr-x", got["d"].Mode)
	assert.Equal(t, "-r--r--r--", got["d/ro"].Mode)
	assert.Equal(t, craftedMTime.Unix(), got["d/ro"].MTime)
	assert.Equal(t, craftedMTime.Unix(), got["d"].MTime)
	assert.Equal(t, "d", got["link"].Link)
	for name, want := range map[string]string{"d/twice": "second", "d/sub/unlisted-parent": "deep", "d/ro": "read only"} {
		data, err := os.ReadFile(filepath.Join(w, name))
		require.NoError(t, err)
		assert.Equal(t, want, string(data), name)
	}
	assert.Empty(t, stagingLeft(t, w))

	before := treeState(t, w)
	b, sum = craftedCheckpoint(t, w, []craftedEntry{
		{hdr: &tar.Header{Name: "link", Typeflag: tar.TypeSymlink, Linkname: t.TempDir(), Mode: 0o777}},
		reg("link/escaped", 0o644, "no"),
	})
	_, err = restoreArchive(a, sum, b)
	ae := apiError(t, err)
	assert.Equal(t, http.StatusBadRequest, ae.Status, ae.Message)
	assert.Contains(t, ae.Message, "symlink")
	assert.Equal(t, before, treeState(t, w), "nothing changed")
	assert.Empty(t, stagingLeft(t, w))
}

// A name that became a symlink after the walk is read as vanished, never
// through the link.
func TestCopyFile_DoesNotFollowASymlink(t *testing.T) {
	dir := t.TempDir()
	secret := filepath.Join(t.TempDir(), "secret")
	write(t, secret, "outside the tree", 0o600)
	require.NoError(t, os.Symlink(secret, filepath.Join(dir, "was-a-file")))
	var out bytes.Buffer
	n, err := copyFile(&out, filepath.Join(dir, "was-a-file"), 16, make([]byte, 8))
	require.NoError(t, err)
	assert.Zero(t, n)
	assert.Empty(t, out.String())

	write(t, filepath.Join(dir, "plain"), "0123456789abcdefXYZ", 0o644)
	n, err = copyFile(&out, filepath.Join(dir, "plain"), 16, make([]byte, 5))
	require.NoError(t, err)
	assert.Equal(t, int64(16), n, "at most the walked size")
	assert.Equal(t, "0123456789abcdef", out.String())
}
