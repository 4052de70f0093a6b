package execagent

import (
	"archive/tar"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// stageInto makes a staging directory in a new temporary directory and
// returns its extractor (exact, as a restore's) and where it extracts.
func stageInto(t *testing.T) (*extractor, string) {
	t.Helper()
	dir := t.TempDir()
	stage, x, err := newStage(dir, extractor{dir: dir, budget: 1 << 30, exact: true})
	require.NoError(t, err)
	t.Cleanup(x.close)
	return x, filepath.Join(stage, "new")
}

// An archive of more directories than the fast path may hold open (here
// 2,600, past maxMadeDirs) is extracted on the fast path to its last
// entry: the directories it has left are closed as it goes, so at most
// the tree's depth are open. Before, every entry past the 1,024th
// directory took the os.Root path (a third of a 100 MB / 10k-file
// workspace's entries).
func TestExtract_FastPathHoldsOnlyTheOpenPath(t *testing.T) {
	x, neu := stageInto(t)
	mtime := time.Unix(1_600_000_000, 0)
	dirs := 0
	for i := range 650 {
		top := fmt.Sprintf("d%03d", i)
		require.NoError(t, x.entry(&tar.Header{Name: top + "/", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: mtime}, nil))
		dirs++
		for j := range 3 {
			sub := fmt.Sprintf("%s/e%d", top, j)
			require.NoError(t, x.entry(&tar.Header{Name: sub + "/", Typeflag: tar.TypeDir, Mode: 0o750, ModTime: mtime}, nil))
			dirs++
			require.NoError(t, x.entry(&tar.Header{Name: sub + "/f", Typeflag: tar.TypeReg, Mode: 0o640, Size: 2, ModTime: mtime}, strings.NewReader("hi")))
			assert.LessOrEqual(t, len(x.open), 3, "open: the root, the top directory and the one below it")
		}
	}
	require.Greater(t, dirs, maxMadeDirs)
	assert.Zero(t, x.rooted, "no entry took the os.Root path")
	require.NoError(t, x.finish())
	for _, p := range []string{"d000", "d000/e0", "d649/e2", "d649/e2/f"} {
		fi, err := os.Lstat(filepath.Join(neu, p))
		require.NoError(t, err)
		assert.Equal(t, mtime.Unix(), fi.ModTime().Unix(), p)
	}
	fi, err := os.Lstat(filepath.Join(neu, "d000/e0"))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o750), fi.Mode().Perm(), "a closed directory gets its mode through the root")
}

// An entry that comes back to a directory the archive had left (not in
// depth-first order, as an archive of another tool may be) takes the
// os.Root path, and every directory, closed or open, gets its archive's
// mode and mtime; one without write permission still takes its entries.
func TestExtract_BackToALeftDirectory(t *testing.T) {
	x, neu := stageInto(t)
	m1, m2 := time.Unix(1_500_000_000, 0), time.Unix(1_500_000_500, 0)
	entries := []*tar.Header{
		{Name: "a/", Typeflag: tar.TypeDir, Mode: 0o555, ModTime: m1},
		{Name: "a/x", Typeflag: tar.TypeReg, Mode: 0o644, ModTime: m1},
		{Name: "b/", Typeflag: tar.TypeDir, Mode: 0o700, ModTime: m2},
		{Name: "a/y", Typeflag: tar.TypeReg, Mode: 0o600, ModTime: m2},
		{Name: "b/z", Typeflag: tar.TypeReg, Mode: 0o644, ModTime: m2},
	}
	for _, h := range entries {
		require.NoError(t, x.entry(h, strings.NewReader("")), h.Name)
	}
	assert.Equal(t, 2, x.rooted, "a/y and b/z: their directories were left")
	require.NoError(t, x.finish())
	for name, want := range map[string]struct {
		mode  os.FileMode
		mtime time.Time
	}{"a": {0o555, m1}, "a/x": {0o644, m1}, "a/y": {0o600, m2}, "b": {0o700, m2}, "b/z": {0o644, m2}} {
		fi, err := os.Lstat(filepath.Join(neu, name))
		require.NoError(t, err, name)
		assert.Equal(t, want.mode, fi.Mode().Perm(), name)
		assert.Equal(t, want.mtime.Unix(), fi.ModTime().Unix(), name)
	}
	require.NoError(t, os.Chmod(filepath.Join(neu, "a"), 0o755)) // for TempDir's removal
}

// A regular file gets its archive's mode exactly, whether the umask leaves
// it whole (created with it) or not (created 0600, then chmod-ed).
func TestExtract_ModesWhateverTheUmask(t *testing.T) {
	umask := processUmask()
	require.GreaterOrEqual(t, umask, 0, "the agent's umask is read from /proc/self/status")
	probe := filepath.Join(t.TempDir(), "probe")
	f, err := os.OpenFile(probe, os.O_CREATE|os.O_WRONLY, 0o666)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	fi, err := os.Stat(probe)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o666&^umask), fi.Mode().Perm(), "the umask read is the one the kernel applies")

	x, neu := stageInto(t)
	modes := []int64{0o644, 0o666, 0o444, 0o700, 0o755, 0o600, 0o777, 0o000}
	for i, m := range modes {
		h := &tar.Header{Name: fmt.Sprintf("f%d", i), Typeflag: tar.TypeReg, Mode: m, Size: 1, ModTime: time.Unix(1_600_000_000, 0)}
		require.NoError(t, x.entry(h, strings.NewReader("x")))
	}
	require.NoError(t, x.finish())
	assert.Zero(t, x.rooted)
	for i, m := range modes {
		fi, err := os.Lstat(filepath.Join(neu, fmt.Sprintf("f%d", i)))
		require.NoError(t, err)
		assert.Equal(t, os.FileMode(m), fi.Mode().Perm(), "mode %04o", m)
		data, err := os.ReadFile(filepath.Join(neu, fmt.Sprintf("f%d", i)))
		if m&0o400 != 0 {
			require.NoError(t, err)
			assert.Equal(t, "x", string(data), "written whatever its mode")
		}
	}
}
