package docker

import (
	"archive/tar"
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/build"
	"github.com/docker/docker/api/types/events"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/api/types/registry"
	"github.com/docker/docker/pkg/jsonmessage"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/internal/testenv"
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
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	files["Dockerfile"] = []byte(dockerfile)
	for name, b := range files {
		require.NoError(t, tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(b))}))
		_, err := tw.Write(b)
		require.NoError(t, err)
	}
	require.NoError(t, tw.Close())
	return &buf
}

// readStream reads an engine's JSON stream to its end; its error message,
// if any, is the error.
func readStream(rc io.ReadCloser) error {
	defer rc.Close()
	dec := json.NewDecoder(rc)
	for {
		var m jsonmessage.JSONMessage
		if err := dec.Decode(&m); errors.Is(err, io.EOF) {
			return nil
		} else if err != nil {
			return err
		}
		if m.Error != nil {
			return errors.New(m.Error.Message)
		}
	}
}

// registryUser is basic credentials of a test registry ("" for none).
type registryUser struct{ user, password string }

func (u registryUser) header(t testing.TB, host string) string {
	t.Helper()
	if u.user == "" {
		return ""
	}
	h, err := registry.EncodeAuthConfig(registry.AuthConfig{Username: u.user, Password: u.password, ServerAddress: host})
	require.NoError(t, err)
	return h
}

// pushedImage builds an image of quarry-test/busybox plus a layer of
// layerKB KiB of random bytes, pushes it to the registry at host as
// host/quarry-test-<hex>/name:1 and removes it from the engine, so that it
// is only in the registry; it returns the reference and the image's size
// as the engine had it. When the test ends, the engine's copy (after the
// namespace's containers) and the registry's manifest are removed.
func pushedImage(t *testing.T, e *testEnv, host string, u registryUser, name string, layerKB int) (string, int64) {
	t.Helper()
	ctx := context.Background()
	ref := fmt.Sprintf("%s/quarry-test-%s/%s:1", host, randomHex(t, 4), name)
	data := make([]byte, layerKB<<10)
	_, err := rand.Read(data)
	require.NoError(t, err)
	bctx := contextTar(t, "FROM "+imageBusybox+"\nCOPY data /data\n", map[string][]byte{"data": data})
	resp, err := e.cli.ImageBuild(ctx, bctx, build.ImageBuildOptions{Tags: []string{ref}, Remove: true, ForceRemove: true, Version: build.BuilderV1})
	require.NoError(t, err)
	require.NoError(t, readStream(resp.Body), "build %s", ref)
	t.Cleanup(func() { removeTestImage(t, e, host, u, ref) })
	ins, err := e.cli.ImageInspect(ctx, ref)
	require.NoError(t, err)
	rc, err := e.cli.ImagePush(ctx, ref, image.PushOptions{RegistryAuth: cmp.Or(u.header(t, host), "e30=")})
	require.NoError(t, err)
	require.NoError(t, readStream(rc), "push %s", ref)
	_, err = e.cli.ImageRemove(ctx, ref, image.RemoveOptions{PruneChildren: true})
	require.NoError(t, err)
	return ref, ins.Size
}

// removeTestImage removes ref from the engine (after the namespace's
// containers) and its manifest from the registry.
func removeTestImage(t *testing.T, e *testEnv, host string, u registryUser, ref string) {
	e.removeAll(t)
	ctx := context.Background()
	if _, err := e.cli.ImageRemove(ctx, ref, image.RemoveOptions{PruneChildren: true}); err != nil && !isNotFound(err) {
		t.Errorf("remove image %s: %v", ref, err)
	}
	repo, tag, _ := strings.Cut(strings.TrimPrefix(ref, host+"/"), ":")
	url := fmt.Sprintf("http://%s/v2/%s/manifests/", host, repo)
	do := func(method, url string) (*http.Response, error) {
		req, err := http.NewRequestWithContext(ctx, method, url, nil)
		if err != nil {
			return nil, err
		}
		req.Header.Set("Accept", "application/vnd.docker.distribution.manifest.v2+json")
		if u.user != "" {
			req.SetBasicAuth(u.user, u.password)
		}
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		return resp, err
	}
	resp, err := do(http.MethodHead, url+tag)
	if err != nil || resp.StatusCode != http.StatusOK {
		return // never pushed
	}
	resp, err = do(http.MethodDelete, url+resp.Header.Get("Docker-Content-Digest"))
	if err != nil || resp.StatusCode != http.StatusAccepted {
		t.Errorf("delete %s from the registry: %v %v", ref, resp, err)
	}
}

// enginePulls counts the engine's pull events of ref since start.
func enginePulls(t *testing.T, e *testEnv, ref string, since time.Time) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	msgs, errs := e.cli.Events(ctx, events.ListOptions{
		Since: timestamp(since), Until: timestamp(time.Now()),
		Filters: filters.NewArgs(filters.Arg("type", string(events.ImageEventType)), filters.Arg("event", string(events.ActionPull))),
	})
	n := 0
	for {
		select {
		case m := <-msgs:
			if m.Actor.ID == ref {
				n++
			}
		case err := <-errs:
			if err != nil && !errors.Is(err, io.EOF) {
				require.NoError(t, err)
			}
			return n
		}
	}
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
