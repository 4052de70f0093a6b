package main

import (
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRelayDir_InTheDataDirUnlessTooLongForASocket(t *testing.T) {
	short := socketDir(t)
	dir, err := relayDir(short)
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(short, "relay"), dir)

	long := filepath.Join(short, strings.Repeat("d", 120))
	dir, err = relayDir(long)
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(dir, filepath.Join(os.TempDir(), "quarry-relay-")), dir)
	assert.LessOrEqual(t, len(filepath.Join(dir, "relay.sock")), maxSocketPath)
	again, err := relayDir(long)
	require.NoError(t, err)
	assert.Equal(t, dir, again, "the same data dir gets the same socket")
	other, err := relayDir(long + "x")
	require.NoError(t, err)
	assert.NotEqual(t, dir, other)
}

func TestListenRelay_ReplacesAnOldSocketAndRefusesAFile(t *testing.T) {
	dir := filepath.Join(socketDir(t), "relay")
	ln, err := listenRelay(dir)
	require.NoError(t, err)
	path := filepath.Join(dir, "relay.sock")
	fi, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o666), fi.Mode().Perm(), "the pool's user connects")
	di, err := os.Stat(dir)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o755), di.Mode().Perm())
	// A gateway that died leaves its socket behind.
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	require.NoError(t, ln.Close())
	ln, err = listenRelay(dir)
	require.NoError(t, err, "the next gateway replaces a stale socket")
	c, err := net.Dial("unix", path)
	require.NoError(t, err)
	_ = c.Close()
	require.NoError(t, ln.Close())
	removeRelaySocket(dir, slog.New(slog.NewTextHandler(io.Discard, nil)))
	_, err = os.Stat(dir)
	assert.True(t, os.IsNotExist(err), "an empty relay directory is removed")

	require.NoError(t, os.MkdirAll(dir, 0o755))
	require.NoError(t, os.WriteFile(path, []byte("not a socket"), 0o600))
	_, err = listenRelay(dir)
	assert.ErrorContains(t, err, "is not a socket")
}

// socketDir is a fresh directory with a short path: a Unix socket's path
// must fit in about 100 bytes, and t.TempDir's, under a test's long name,
// need not.
func socketDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "qs")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}
