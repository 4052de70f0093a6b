package execagent

import (
	"archive/tar"
	"bytes"
	"context"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// treeOf lists the tree at dir: each path below it with its kind and
// content, so two looks can be compared.
func treeOf(t testing.TB, dir string) []string {
	t.Helper()
	var out []string
	require.NoError(t, filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		require.NoError(t, err)
		rel, _ := filepath.Rel(dir, p)
		line := rel + " " + fi.Mode().String() + " " + fi.ModTime().UTC().Format(time.RFC3339Nano)
		switch {
		case fi.Mode()&os.ModeSymlink != 0:
			l, err := os.Readlink(p)
			require.NoError(t, err)
			line += " -> " + l
		case fi.Mode().IsRegular():
			b, err := os.ReadFile(p)
			require.NoError(t, err)
			line += " " + string(b)
		}
		out = append(out, line)
		return nil
	}))
	sort.Strings(out)
	return out
}

// An archive refused for one entry leaves its target as it was: the
// entries before the bad one do not land (they used to), what they would
// have replaced stays, and no staging directory is left; a target the
// upload made is gone again.
func TestArchiveUpload_RefusedLeavesNothing(t *testing.T) {
	good := []tarEntry{
		{name: "new.txt", body: "new"},
		{name: "keep.txt", body: "replaced"},
		{name: "sub/", typ: tar.TypeDir, mode: 0o700},
		{name: "sub/deep/file", body: "deep"},
		{name: "link", typ: tar.TypeSymlink, link: "new.txt"},
	}
	tests := []struct {
		name     string
		bad      tarEntry
		message  string
		inTheWay bool // bad for what the target holds: in a new target it lands
	}{
		{name: "dot dot", bad: tarEntry{name: "../escape", body: "x"}, message: `archive entry "../escape": ".." escapes the target directory`},
		{name: "device", bad: tarEntry{name: "dev", typ: tar.TypeChar}, message: `archive entry "dev": type "3" (device, fifo, ...) is not supported`},
		{name: "hard link outside", bad: tarEntry{name: "h", typ: tar.TypeLink, link: "../../etc/passwd"},
			message: `archive entry "h": hard link to "../../etc/passwd": ".." escapes the target directory`},
		{name: "hard link to a file of the target, not of the archive", bad: tarEntry{name: "h", typ: tar.TypeLink, link: "old.txt"},
			message: `archive entry "h": hard link to "old.txt": not a regular file of the archive`},
		{name: "a directory in the way", bad: tarEntry{name: "olddir", body: "x"}, message: `archive entry "olddir": a directory is in the way`, inTheWay: true},
		{name: "a file in the way", bad: tarEntry{name: "old.txt/", typ: tar.TypeDir}, message: `archive entry "old.txt": a file is in the way`, inTheWay: true},
		{name: "below a file", bad: tarEntry{name: "old.txt/x", body: "x"}, message: `archive entry "old.txt/x": "old.txt" is not a directory`, inTheWay: true},
		{name: "below an existing symlink", bad: tarEntry{name: "oldlink/x", body: "x"}, message: `archive entry "oldlink/x": writes through the symlink "oldlink"`, inTheWay: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newTestAgent(t, nil)
			ctx := context.Background()
			dir := filepath.Join(a.cfg.Workdir, "t")
			require.NoError(t, os.MkdirAll(filepath.Join(dir, "olddir"), 0o755))
			require.NoError(t, os.MkdirAll(filepath.Join(dir, "sub"), 0o755))
			require.NoError(t, os.WriteFile(filepath.Join(dir, "keep.txt"), []byte("kept"), 0o644))
			require.NoError(t, os.WriteFile(filepath.Join(dir, "old.txt"), []byte("old"), 0o644))
			require.NoError(t, os.Symlink(t.TempDir(), filepath.Join(dir, "oldlink")))
			old := time.Unix(1600000000, 0)
			for _, p := range []string{"sub", "olddir", ""} {
				require.NoError(t, os.Chtimes(filepath.Join(dir, p), old, old))
			}
			before := treeOf(t, dir)

			_, err := a.client.UploadArchive(ctx, "t", bytes.NewReader(makeTar(t, false, append(good, tt.bad)...)))
			ae := apiError(t, err)
			assert.Equal(t, http.StatusBadRequest, ae.Status)
			assert.Equal(t, "body: "+tt.message, ae.Message)
			assert.Equal(t, before, treeOf(t, dir), "nothing of the archive landed, nothing was replaced")

			if !tt.inTheWay {
				_, err = a.client.UploadArchive(ctx, "made/for/it", bytes.NewReader(makeTar(t, false, append(good, tt.bad)...)))
				assert.Equal(t, "body: "+tt.message, apiError(t, err).Message)
				_, err = os.Lstat(filepath.Join(a.cfg.Workdir, "made"))
				assert.ErrorIs(t, err, os.ErrNotExist, "the target the upload made is gone")
			}
		})
	}
}

// The same archive, good to its end, lands: new entries, replaced files,
// a directory merged into the one there (with the archive's mode), and no
// staging directory is left.
func TestArchiveUpload_MergesIntoTheTarget(t *testing.T) {
	a := newTestAgent(t, nil)
	ctx := context.Background()
	dir := filepath.Join(a.cfg.Workdir, "t")
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "sub"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "sub/old"), []byte("old"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "keep.txt"), []byte("kept"), 0o644))
	res, err := a.client.UploadArchive(ctx, "t", bytes.NewReader(makeTar(t, false,
		tarEntry{name: "new.txt", body: "new"},
		tarEntry{name: "keep.txt", body: "replaced"},
		tarEntry{name: "sub/", typ: tar.TypeDir, mode: 0o750},
		tarEntry{name: "sub/deep/file", body: "deep"},
		tarEntry{name: "hard", typ: tar.TypeLink, link: "sub/deep/file"},
	)))
	require.NoError(t, err)
	assert.Equal(t, 5, res.Entries)
	for p, want := range map[string]string{"new.txt": "new", "keep.txt": "replaced", "sub/old": "old", "sub/deep/file": "deep", "hard": "deep"} {
		b, err := os.ReadFile(filepath.Join(dir, p))
		require.NoError(t, err, p)
		assert.Equal(t, want, string(b), p)
	}
	fi, err := os.Stat(filepath.Join(dir, "sub"))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o750), fi.Mode().Perm(), "the archive's mode, kept writable by its owner")
	f1, err := os.Stat(filepath.Join(dir, "hard"))
	require.NoError(t, err)
	f2, err := os.Stat(filepath.Join(dir, "sub/deep/file"))
	require.NoError(t, err)
	assert.True(t, os.SameFile(f1, f2), "a hard link stays one")
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	assert.ElementsMatch(t, []string{"hard", "keep.txt", "new.txt", "sub"}, names, "no staging directory is left")
}

// An archive with entries below a mount point in its target (another file
// system: renames cannot cross it) is refused before anything moves,
// naming the mount point. A mount needs privileges: the test forges the
// staging directory's file system instead.
func TestArchiveUpload_RefusesEntriesBelowAMountPoint(t *testing.T) {
	a := newTestAgent(t, nil)
	dir := filepath.Join(a.cfg.Workdir, "t")
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "mnt"), 0o755))
	before := treeOf(t, dir)
	u, err := a.srv.newUpload(dir)
	require.NoError(t, err)
	u.dev++ // as if mnt, and dir itself, were another file system than the stage
	require.NoError(t, u.x.entry(&tar.Header{Name: "mnt/x", Typeflag: tar.TypeReg, Mode: 0o644}, bytes.NewReader(nil)))
	err = u.merge()
	u.discard()
	_, _, msg := classify(err)
	assert.Equal(t, `body: archive entry "mnt": "`+filepath.Join(dir, "mnt")+`" is a mount point (another file system than "`+dir+
		`"): upload what goes below it with path="`+filepath.Join(dir, "mnt")+`"`, msg)
	assert.Equal(t, before, treeOf(t, dir))
}
