package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/providers"
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

// relayProvider is a provider whose sandboxes get the relay socket's
// directory mounted (as Docker's on a bridge). Its first Launch records
// what a container's bind mount would find then; it launches nothing.
type relayProvider struct {
	dir   string
	once  sync.Once
	first chan relaySeen
}

// relaySeen is what the first Launch found.
type relaySeen struct {
	dirErr, dialErr error
}

var _ providers.Provider = (*relayProvider)(nil)

func (p *relayProvider) Launch(context.Context, providers.Spec, []string) ([]providers.Task, error) {
	p.once.Do(func() {
		var seen relaySeen
		_, seen.dirErr = os.Stat(p.dir)
		c, err := net.Dial("unix", filepath.Join(p.dir, providers.RelaySocketName))
		if err == nil {
			_ = c.Close()
		}
		seen.dialErr = err
		p.first <- seen
	})
	return nil, errors.New("the test's provider launches nothing")
}

func (p *relayProvider) Describe(_ context.Context, ids []string) ([]providers.Task, error) {
	out := make([]providers.Task, len(ids))
	for i, id := range ids {
		out[i] = providers.Task{ID: id, State: providers.TaskStopped, Reason: "not found"}
	}
	return out, nil
}

func (p *relayProvider) Stop(context.Context, string, string) error { return nil }

func (p *relayProvider) List(context.Context, string) ([]providers.Task, error) { return nil, nil }

func (p *relayProvider) SandboxRelayURL(providers.Spec) string { return "http://127.0.0.1:8000" }

// A Docker sandbox bind-mounts the relay socket's directory: the warm
// pools' first launch must find it, and the socket listening (a Docker
// gateway's first launches failed with "bind source path does not exist:
// …/relay", the directory made ~40 ms after the pools started). Closing the
// stack removes it again.
func TestBuild_RelaySocketListensBeforeTheFirstLaunch(t *testing.T) {
	data := socketDir(t)
	for k, v := range map[string]string{
		"QUARRY_DATA_DIR":  data,
		"QUARRY_PROVIDER":  "docker",
		"QUARRY_POOLS":     `{"pools": [{"name": "default", "image": "quarry-test/busybox", "min_warm": 1, "max_total": 1}]}`,
		"QUARRY_API_KEYS":  "qk_relay_socket_test_key",
		"QUARRY_ADDR":      "127.0.0.1:0",
		"QUARRY_LOG_LEVEL": "error",
	} {
		t.Setenv(k, v)
	}
	cfg, log, err := loadConfig()
	require.NoError(t, err)
	dir, err := relayDir(data)
	require.NoError(t, err)
	prov := &relayProvider{dir: dir, first: make(chan relaySeen, 1)}
	makers := map[string]providerMaker{"docker": func(Config, *slog.Logger) (providers.Provider, error) { return prov, nil }}
	ctx, cancel := context.WithTimeout(t.Context(), deadline)
	defer cancel()
	st, err := build(ctx, cfg, log, makers, true)
	require.NoError(t, err)
	closed := false
	t.Cleanup(func() {
		if !closed {
			st.close(context.Background())
		}
	})
	select {
	case seen := <-prov.first:
		assert.NoError(t, seen.dirErr, "the relay directory exists at the first launch")
		assert.NoError(t, seen.dialErr, "the relay socket listens at the first launch")
	case <-ctx.Done():
		require.FailNow(t, "the warm pool never launched")
	}
	st.close(context.Background())
	closed = true
	_, err = os.Stat(dir)
	assert.True(t, os.IsNotExist(err), "closing the stack removes the relay directory: %v", err)
}
