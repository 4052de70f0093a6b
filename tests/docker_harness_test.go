//go:build integration

package tests

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/volume"
	dockerclient "github.com/docker/docker/client"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/client"
	"github.com/quarryhq/quarry/internal/testenv"
	"github.com/quarryhq/quarry/providers"
)

// The test images scripts/images/build.sh builds.
const (
	dockerImageBusybox = "quarry-test/busybox:latest" // /bin/sh is busybox; no bash
	dockerImageBash    = "quarry-test/bash:latest"    // busybox and bash
)

// dockerWait bounds the polled waits of the Docker suites.
const dockerWait = 2 * time.Minute

// dockerTest is one Docker suite's engine and gateway namespace.
type dockerTest struct {
	t         *testing.T
	cli       *dockerclient.Client
	gatewayID string
}

// needDocker makes t need the Docker engine with the test images and the
// extra images (testenv.Docker: skipped under plain go test, a failure under
// make test or when QUARRY_TEST_DOCKER=1 and the engine or an image is
// missing).
func needDocker(t *testing.T, extra ...string) {
	t.Helper()
	testenv.Docker(t, append([]string{dockerImageBusybox, dockerImageBash}, extra...)...)
}

// requireDocker makes t need Docker (needDocker) and returns a dockerTest
// whose containers (labelled with its own gateway id) are removed when the
// test ends.
func requireDocker(t *testing.T) *dockerTest {
	t.Helper()
	needDocker(t)
	cli, err := dockerclient.NewClientWithOpts(dockerclient.WithHost("unix:///var/run/docker.sock"), dockerclient.WithAPIVersionNegotiation())
	require.NoError(t, err)
	t.Cleanup(func() { _ = cli.Close() })
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	d := &dockerTest{t: t, cli: cli, gatewayID: "e2e-" + hex.EncodeToString(b)}
	t.Cleanup(d.removeAll) // registered before the gateway's: runs after it stopped
	return d
}

// startGateway starts a gateway on the Docker provider with the test's
// gateway id.
func (d *dockerTest) startGateway(pools string, opts ...gwOption) *gatewayProc {
	d.t.Helper()
	opts = append([]gwOption{withEnv("QUARRY_PROVIDER=docker", "QUARRY_GATEWAY_ID="+d.gatewayID)}, opts...)
	return startGateway(d.t, pools, opts...)
}

// startTwoPools starts a gateway on dockerTwoPools and waits until both
// pools have a ready task; it returns the gateway, its client and a context
// bounded for the test.
func (d *dockerTest) startTwoPools(opts ...gwOption) (*gatewayProc, *client.Client, context.Context) {
	d.t.Helper()
	g := d.startGateway(dockerTwoPools, opts...)
	g.waitReady("plain", 1)
	g.waitReady("bash", 1)
	return g, g.client(), ctx(d.t)
}

// containers lists the test's containers (stopped ones included) of pool,
// or of every pool for "".
func (d *dockerTest) containers(pool string) []container.Summary {
	d.t.Helper()
	f := filters.NewArgs(filters.Arg("label", providers.LabelGateway+"="+d.gatewayID))
	if pool != "" {
		f.Add("label", providers.LabelPool+"="+pool)
	}
	list, err := d.cli.ContainerList(context.Background(), container.ListOptions{All: true, Filters: f})
	require.NoError(d.t, err)
	return list
}

// volumeRoleOverlay is the role label of a sandbox's overlay volume
// (providers/docker: a sandbox started on a copy-on-write layer).
const volumeRoleOverlay = "overlay"

// volumes lists the names of the test's volumes of role (the provider's
// quarry.docker.volume label), or of every role for "".
func (d *dockerTest) volumes(role string) []string {
	d.t.Helper()
	f := filters.NewArgs(filters.Arg("label", providers.LabelGateway+"="+d.gatewayID))
	if role != "" {
		f.Add("label", "quarry.docker.volume="+role)
	}
	vols, err := d.cli.VolumeList(context.Background(), volume.ListOptions{Filters: f})
	require.NoError(d.t, err)
	var out []string
	for _, v := range vols.Volumes {
		out = append(out, v.Name)
	}
	return out
}

// running returns the ids of the pool's running containers.
func (d *dockerTest) running(pool string) map[string]bool {
	out := map[string]bool{}
	for _, c := range d.containers(pool) {
		if c.State == container.StateRunning {
			out[c.ID] = true
		}
	}
	return out
}

// containerOf returns the id of the container whose short id (its hostname)
// is host.
func (d *dockerTest) containerOf(host string) string {
	d.t.Helper()
	host = strings.TrimSpace(host)
	for _, c := range d.containers("") {
		if strings.HasPrefix(c.ID, host) && host != "" {
			return c.ID
		}
	}
	d.t.Fatalf("no container of this test has hostname %q", host)
	return ""
}

// removeAll force-removes the test's containers, again until none is left
// (after an engine restart a removal can fail once).
func (d *dockerTest) removeAll() {
	c, cancel := context.WithTimeout(context.Background(), dockerWait)
	defer cancel()
	f := filters.NewArgs(filters.Arg("label", providers.LabelGateway+"="+d.gatewayID))
	var last error
	for c.Err() == nil {
		list, err := d.cli.ContainerList(c, container.ListOptions{All: true, Filters: f})
		if err == nil && len(list) == 0 {
			d.removeVolumes()
			return
		}
		last = err
		for _, ct := range list {
			if err := d.cli.ContainerRemove(c, ct.ID, container.RemoveOptions{Force: true, RemoveVolumes: true}); err != nil {
				last = fmt.Errorf("remove container %s: %w", ct.ID, err)
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	d.t.Errorf("containers of %s left after cleanup: %v", d.gatewayID, last)
}

// removeVolumes removes the test's volumes (after its containers: a
// volume in use stays), overlays first: they name the others.
func (d *dockerTest) removeVolumes() {
	c, cancel := context.WithTimeout(context.Background(), dockerWait)
	defer cancel()
	vols, err := d.cli.VolumeList(c, volume.ListOptions{Filters: filters.NewArgs(filters.Arg("label", providers.LabelGateway+"="+d.gatewayID))})
	if err != nil {
		d.t.Errorf("list the volumes of %s: %v", d.gatewayID, err)
		return
	}
	for _, overlays := range []bool{true, false} {
		for _, v := range vols.Volumes {
			if (v.Labels["quarry.docker.volume"] == volumeRoleOverlay) != overlays {
				continue
			}
			if err := d.cli.VolumeRemove(c, v.Name, true); err != nil {
				d.t.Errorf("remove volume %s: %v", v.Name, err)
			}
		}
	}
}

// restartEngine stops dockerd (SIGTERM to the pid in /var/run/docker.pid,
// waiting for it to exit) and starts it again with scripts/docker-up.sh.
func (d *dockerTest) restartEngine() {
	d.t.Helper()
	b, err := os.ReadFile("/var/run/docker.pid")
	require.NoError(d.t, err, "the engine's pid file (the Docker suites restart the engine that scripts/docker-up.sh started)")
	var pid int
	_, err = fmt.Sscanf(strings.TrimSpace(string(b)), "%d", &pid)
	require.NoError(d.t, err)
	proc, err := os.FindProcess(pid)
	require.NoError(d.t, err)
	require.NoError(d.t, proc.Signal(syscall.SIGTERM), "stop dockerd (pid %d)", pid)
	eventually(d.t, dockerWait, "dockerd exits", func() error {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return nil // gone
		}
		// The state follows the command name in parentheses; Z is a zombie
		// that its (foreign) parent has not reaped yet: it exited.
		if i := strings.LastIndexByte(string(stat), ')'); i > 0 && strings.HasPrefix(string(stat[i+1:]), " Z") {
			return nil
		}
		return fmt.Errorf("dockerd (pid %d) still runs", pid)
	})
	cmd := exec.Command("../scripts/docker-up.sh")
	out, err := cmd.CombinedOutput()
	require.NoError(d.t, err, "restart dockerd: %s", out)
	// The engine outlives this run: it must not keep the run's temp dir
	// (TMPDIR), which is removed at its end, where runc keeps the state of
	// every `docker exec`.
	b, err = os.ReadFile("/var/run/docker.pid")
	require.NoError(d.t, err)
	environ, err := os.ReadFile("/proc/" + strings.TrimSpace(string(b)) + "/environ")
	require.NoError(d.t, err)
	for _, kv := range strings.Split(string(environ), "\x00") {
		assert.False(d.t, strings.HasPrefix(kv, "TMPDIR="), "the restarted engine has the run's %s", kv)
	}
}
