package secretfile

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func counter(n *atomic.Int64) func() (string, error) {
	return func() (string, error) {
		return "secret-" + strings.Repeat("x", int(n.Add(1))), nil
	}
}

func TestLoadOrCreate_CreatesOnceThenReads(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a", "b", "key")
	var n atomic.Int64
	s, created, err := LoadOrCreate(path, counter(&n), nil)
	require.NoError(t, err)
	assert.True(t, created)
	assert.Equal(t, "secret-x", s)
	fi, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	di, err := os.Stat(filepath.Dir(path))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o700), di.Mode().Perm())

	again, created, err := LoadOrCreate(path, counter(&n), nil)
	require.NoError(t, err)
	assert.False(t, created)
	assert.Equal(t, s, again)
	left, err := filepath.Glob(filepath.Join(filepath.Dir(path), ".*.tmp"))
	require.NoError(t, err)
	assert.Empty(t, left, "temporary files are removed")
}

// Many creators at once: exactly one creates, every one returns its secret,
// none reads an empty or partial file (the bug an O_EXCL create had).
func TestLoadOrCreate_ConcurrentCreatorsAgree(t *testing.T) {
	for round := range 20 {
		path := filepath.Join(t.TempDir(), "key")
		var n atomic.Int64
		const workers = 16
		got := make([]string, workers)
		made := make([]bool, workers)
		errs := make([]error, workers)
		var wg sync.WaitGroup
		for i := range workers {
			wg.Go(func() { got[i], made[i], errs[i] = LoadOrCreate(path, counter(&n), nil) })
		}
		wg.Wait()
		creators := 0
		for i := range workers {
			require.NoError(t, errs[i], "round %d worker %d", round, i)
			assert.Equal(t, got[0], got[i], "round %d", round)
			if made[i] {
				creators++
			}
		}
		assert.Equal(t, 1, creators, "round %d", round)
	}
}

func TestLoadOrCreate_BadFiles(t *testing.T) {
	dir := t.TempDir()
	gen := func() (string, error) { t.Fatal("generate called for an existing file"); return "", nil }
	tests := []struct {
		name, content, want string
		check               func(string) error
	}{
		{name: "empty", content: "\n \n", want: "is empty"},
		{name: "too big", content: strings.Repeat("k", maxSize+1), want: "larger than"},
		{name: "check", content: "short\n", want: "too short",
			check: func(string) error { return errors.New("too short") }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(dir, tt.name)
			require.NoError(t, os.WriteFile(path, []byte(tt.content), 0o600))
			_, _, err := LoadOrCreate(path, gen, tt.check)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
			assert.Contains(t, err.Error(), path)
			b, err := os.ReadFile(path)
			require.NoError(t, err)
			assert.Equal(t, tt.content, string(b), "a bad file is never overwritten")
		})
	}
}

func TestLoadOrCreate_GenerateErrorLeavesNoFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "key")
	_, _, err := LoadOrCreate(path, func() (string, error) { return "", errors.New("no entropy") }, nil)
	require.ErrorContains(t, err, "no entropy")
	_, err = os.Stat(path)
	assert.ErrorIs(t, err, os.ErrNotExist)
}

func TestLoadOrCreate_UnreadableDirectory(t *testing.T) {
	if os.Geteuid() == 0 {
		// root reads through permission bits; make the parent a file instead.
		parent := filepath.Join(t.TempDir(), "file")
		require.NoError(t, os.WriteFile(parent, nil, 0o600))
		_, _, err := LoadOrCreate(filepath.Join(parent, "key"), func() (string, error) { return "s", nil }, nil)
		require.Error(t, err)
		assert.Contains(t, err.Error(), parent)
		return
	}
	dir := filepath.Join(t.TempDir(), "locked")
	require.NoError(t, os.Mkdir(dir, 0o000))
	_, _, err := LoadOrCreate(filepath.Join(dir, "key"), func() (string, error) { return "s", nil }, nil)
	require.Error(t, err)
}
