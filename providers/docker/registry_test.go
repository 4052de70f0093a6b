package docker

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/internal/testenv"
	"github.com/quarryhq/quarry/internal/testimages"
	"github.com/quarryhq/quarry/providers"
)

// needRegistry makes t need Docker with the test images and the open test
// registry (testenv.Registry), and returns the registry's host:port.
func needRegistry(t *testing.T) string {
	t.Helper()
	needDocker(t)
	return testenv.Registry(t)
}

// contextTar returns a build context: a Dockerfile and files.
func contextTar(t testing.TB, dockerfile string, files map[string][]byte) *bytes.Buffer {
	t.Helper()
	buf, err := testimages.ContextTar(dockerfile, files)
	require.NoError(t, err)
	return buf
}

// registryUser is basic credentials of a test registry ("" for none).
type registryUser = testimages.User

// pushedImage builds an image of quarry-test/busybox plus a layer of
// layerKB KiB of random bytes, pushes it to the registry at host as
// host/quarry-test-<hex>/name:1 and removes it from the engine, so that it
// is only in the registry; it returns the reference and the image's size
// as the engine had it. When the test ends, the engine's copy (after the
// namespace's containers) and the registry's manifest are removed.
func pushedImage(t *testing.T, e *testEnv, host string, u registryUser, name string, layerKB int) (string, int64) {
	t.Helper()
	ref := fmt.Sprintf("%s/quarry-test-%s/%s:1", host, randomHex(t, 4), name)
	data := make([]byte, layerKB<<10)
	_, err := rand.Read(data)
	require.NoError(t, err)
	t.Cleanup(func() { removeTestImage(t, e, host, u, ref) })
	size, err := testimages.BuildPushed(context.Background(), e.cli, imageBusybox, host, u, ref, data)
	require.NoError(t, err)
	return ref, size
}

// removeTestImage removes ref from the engine (after the namespace's
// containers) and its manifest from the registry.
func removeTestImage(t *testing.T, e *testEnv, host string, u registryUser, ref string) {
	e.removeAll(t)
	if err := testimages.Remove(context.Background(), e.cli, host, u, ref); err != nil {
		t.Error(err)
	}
}

// enginePulls counts the engine's pull events of ref since start.
func enginePulls(t *testing.T, e *testEnv, ref string, since time.Time) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	n, err := testimages.Pulls(ctx, e.cli, ref, since)
	require.NoError(t, err)
	return n
}

// openImages returns a provider of the namespace with a ledger in the
// test's temp dir.
func (e *testEnv) openImages(t *testing.T, modify ...func(*Config)) *Provider {
	t.Helper()
	ledger := filepath.Join(t.TempDir(), "docker", "images.json")
	return e.open(t, append([]func(*Config){func(c *Config) { c.LedgerFile = ledger }}, modify...)...)
}

// closedAddr returns an address on 127.0.0.1 on which nothing listens.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

// onDemandSpec is spec of an on-demand pool of class "default".
func onDemandSpec(pool, image string) providers.Spec {
	s := spec(pool, image)
	s.Class = "default"
	return s
}
