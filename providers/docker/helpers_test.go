package docker

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/volume"
	"github.com/docker/docker/client"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/internal/testenv"
	"github.com/quarryhq/quarry/providers"
	"github.com/quarryhq/quarry/providers/providertest"
)

// The test images scripts/images/build.sh builds.
const (
	imageBusybox = "quarry-test/busybox:latest" // /bin/sh is busybox; no bash
	imageBash    = "quarry-test/bash:latest"    // busybox and bash
	imageNoShell = "quarry-test/nosh:latest"    // neither /bin/sh nor bash
)

// waitTimeout bounds every polled wait; waits end as soon as they succeed.
const waitTimeout = 2 * time.Minute

func TestMain(m *testing.M) {
	code := m.Run()
	providertest.RemoveAgentBuild()
	os.Exit(code)
}

// needDocker makes t need the Docker engine with the test images
// (testenv.Docker: skipped under plain go test, a failure under make test or
// when QUARRY_TEST_DOCKER=1 and the engine or an image is missing).
func needDocker(t testing.TB) {
	t.Helper()
	testenv.Docker(t, imageBusybox, imageBash, imageNoShell)
}

// dockerProvider makes t need Docker (needDocker) and returns a fresh
// namespace and a Provider on it.
func dockerProvider(t *testing.T) (*testEnv, *Provider) {
	t.Helper()
	needDocker(t)
	e := newTestEnv(t)
	return e, e.open(t)
}

// engine returns a client of the local engine, closed when the test ends.
func engine(t testing.TB) *client.Client {
	t.Helper()
	cli, err := client.NewClientWithOpts(client.WithHost(DefaultHost), client.WithAPIVersionNegotiation())
	require.NoError(t, err)
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// testEnv is one test's provider namespace: a gateway id of its own (so
// tests never see each other's containers) and a token key.
type testEnv struct {
	gatewayID string
	keyFile   string
	agent     string
	cli       *client.Client
}

// newTestEnv prepares a namespace and removes every container of it when the
// test ends.
func newTestEnv(t testing.TB) *testEnv {
	t.Helper()
	e := &testEnv{
		gatewayID: "test-" + randomHex(t, 6),
		keyFile:   filepath.Join(t.TempDir(), "docker", "token.key"),
		agent:     providertest.BuildAgent(t),
		cli:       engine(t),
	}
	t.Cleanup(func() { e.removeAll(t) })
	return e
}

// open returns a new Provider on the namespace, closed when the test ends.
func (e *testEnv) open(t testing.TB, modify ...func(*Config)) *Provider {
	t.Helper()
	cfg := Config{AgentBinary: e.agent, TokenKeyFile: e.keyFile, GatewayID: e.gatewayID}
	for _, m := range modify {
		m(&cfg)
	}
	logger := slog.New(slog.DiscardHandler) // benchmarks print every log line
	if _, ok := t.(*testing.T); ok {
		logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	p, err := New(cfg, logger)
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	return p
}

// containers lists every container of the namespace, stopped ones included.
func (e *testEnv) containers(t testing.TB) []container.Summary {
	t.Helper()
	list, err := e.cli.ContainerList(context.Background(), container.ListOptions{
		All: true, Filters: filters.NewArgs(filters.Arg("label", providers.LabelGateway+"="+e.gatewayID)),
	})
	require.NoError(t, err)
	return list
}

// removeAll force-removes every container of the namespace.
func (e *testEnv) removeAll(t testing.TB) {
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	list, err := e.cli.ContainerList(ctx, container.ListOptions{
		All: true, Filters: filters.NewArgs(filters.Arg("label", providers.LabelGateway+"="+e.gatewayID)),
	})
	if err != nil {
		t.Errorf("list the test's containers for cleanup: %v", err)
		return
	}
	for _, c := range list {
		err := e.cli.ContainerRemove(ctx, c.ID, container.RemoveOptions{Force: true, RemoveVolumes: true})
		if err != nil && !isNotFound(err) {
			t.Errorf("remove container %s: %v", c.ID, err)
		}
	}
	// Then its volumes (copy-on-write layers and the tasks' overlays,
	// overlays first: they name the others).
	vols, err := e.cli.VolumeList(ctx, volume.ListOptions{Filters: filters.NewArgs(filters.Arg("label", providers.LabelGateway+"="+e.gatewayID))})
	if err != nil {
		t.Errorf("list the test's volumes for cleanup: %v", err)
		return
	}
	overlayFirst := func(v *volume.Volume) int {
		if v.Labels[labelVolume] == volumeOverlay {
			return 0
		}
		return 1
	}
	slices.SortFunc(vols.Volumes, func(a, b *volume.Volume) int { return cmp.Compare(overlayFirst(a), overlayFirst(b)) })
	for _, v := range vols.Volumes {
		if err := e.cli.VolumeRemove(ctx, v.Name, true); err != nil && !isNotFound(err) {
			t.Errorf("remove volume %s: %v", v.Name, err)
		}
	}
}

// spec returns a spec of image for pool.
func spec(pool, image string) providers.Spec {
	return providers.Spec{Pool: pool, Image: image, CPU: 0.5, MemoryMB: 256, Env: map[string]string{"QUARRY_TEST": "1"}}
}

// launchOne launches one task of s and requires success.
func launchOne(t testing.TB, p *Provider, s providers.Spec, name string) providers.Task {
	t.Helper()
	tasks, err := p.Launch(context.Background(), s, []string{name})
	require.NoError(t, err)
	require.Len(t, tasks, 1)
	return tasks[0]
}

// agentOf returns a client of the task's agent once it answers /healthz.
func agentOf(t testing.TB, task providers.Task) *agentapi.Client {
	t.Helper()
	a := agentapi.New(task.AgentURL, task.AgentToken, nil)
	eventually(t, "agent of "+task.Name+" healthy", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := a.Health(ctx)
		return err
	})
	return a
}

// execIn runs command in the task and returns its result.
func execIn(t testing.TB, a *agentapi.Client, command string) agentapi.ExecResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := a.Exec(ctx, agentapi.ExecRequest{Command: command})
	require.NoError(t, err, command)
	return res
}

// eventually polls f until it returns nil, failing the test with its last
// error after waitTimeout.
func eventually(t testing.TB, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			require.NoError(t, err, "%s: not within %s", what, waitTimeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func randomHex(t testing.TB, n int) string {
	t.Helper()
	b := make([]byte, n)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return hex.EncodeToString(b)
}

// assertGone checks that the engine no longer has the container.
func assertGone(t testing.TB, cli *client.Client, id string) {
	t.Helper()
	_, err := cli.ContainerInspect(context.Background(), id)
	assert.True(t, isNotFound(err), "container %s still exists (err %v)", id, err)
}
