//go:build integration

package tests

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/docker/docker/api/types/container"
	dockervolume "github.com/docker/docker/api/types/volume"
	dockerclient "github.com/docker/docker/client"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/providers"
)

// withoutQuarryEnv is the test's environment without QUARRY_* settings, as
// a person's shell running make would have it.
func withoutQuarryEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "QUARRY_") {
			env = append(env, kv)
		}
	}
	return env
}

// checkoutGatewayID is the gateway id of this checkout's make run
// (scripts/gateway-id.sh, QUARRY_GATEWAY_ID unset).
func checkoutGatewayID(t *testing.T) string {
	t.Helper()
	cmd := exec.Command("./scripts/gateway-id.sh")
	cmd.Dir, cmd.Env = "..", withoutQuarryEnv()
	out, err := cmd.Output()
	require.NoError(t, err)
	id := strings.TrimSpace(string(out))
	require.Regexp(t, `^quarry-[0-9a-f]{10}$`, id)
	return id
}

// gatewayLabels returns the distinct quarry.gateway labels of the process
// provider's tasks in dataDir.
func gatewayLabels(t *testing.T, dataDir string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dataDir, "process", "*", "task.json"))
	require.NoError(t, err)
	seen := map[string]bool{}
	var out []string
	for _, f := range files {
		data, err := os.ReadFile(f)
		require.NoError(t, err)
		var rec struct {
			Labels map[string]string `json:"labels"`
		}
		require.NoError(t, json.Unmarshal(data, &rec), "%s", f)
		if id := rec.Labels[providers.LabelGateway]; !seen[id] {
			seen[id] = true
			out = append(out, id)
		}
	}
	return out
}

// make clean (scripts/stop-sandboxes.sh) removes the Docker sandboxes of
// this checkout's make run, whose gateway id scripts/gateway-id.sh derives
// from the checkout's path, and leaves alone those of the default id
// "quarry", which other checkouts and users share.
func TestMakeClean_RemovesOnlyThisCheckoutsDockerSandboxes(t *testing.T) {
	needDocker(t)
	ours := checkoutGatewayID(t)

	cli, err := dockerclient.NewClientWithOpts(dockerclient.WithHost("unix:///var/run/docker.sock"), dockerclient.WithAPIVersionNegotiation())
	require.NoError(t, err)
	t.Cleanup(func() { _ = cli.Close() })
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	suffix := hex.EncodeToString(b)
	create := func(name, gatewayID string) string {
		created, err := cli.ContainerCreate(context.Background(), &container.Config{
			Image: dockerImageBusybox, Cmd: []string{"true"},
			Labels: map[string]string{providers.LabelManaged: "true", providers.LabelGateway: gatewayID},
		}, nil, nil, nil, name+"-"+suffix)
		require.NoError(t, err)
		t.Cleanup(func() {
			_ = cli.ContainerRemove(context.Background(), created.ID, container.RemoveOptions{Force: true})
		})
		return created.ID
	}
	mine := create("make-clean-ours", ours)
	theirs := create("make-clean-theirs", "quarry")
	// A copy-on-write layer's holder and volume (providers/docker): ours go, another's stay.
	holder, err := cli.ContainerCreate(context.Background(), &container.Config{
		Image: dockerImageBusybox, Cmd: []string{"true"},
		Labels: map[string]string{providers.LabelGateway: ours, "quarry.docker.volume": "unpack"},
	}, nil, nil, nil, "make-clean-holder-"+suffix)
	require.NoError(t, err)
	t.Cleanup(func() { _ = cli.ContainerRemove(context.Background(), holder.ID, container.RemoveOptions{Force: true}) })
	volume := func(name, gatewayID string) string {
		v, err := cli.VolumeCreate(context.Background(), dockervolume.CreateOptions{Name: name + "-" + suffix,
			Labels: map[string]string{providers.LabelGateway: gatewayID, "quarry.docker.volume": "layer"}})
		require.NoError(t, err)
		t.Cleanup(func() { _ = cli.VolumeRemove(context.Background(), v.Name, true) })
		return v.Name
	}
	myVolume, theirVolume := volume("make-clean-layer-ours", ours), volume("make-clean-layer-theirs", "quarry")

	clean := exec.Command("./scripts/stop-sandboxes.sh")
	clean.Dir = ".."
	clean.Env = append(withoutQuarryEnv(), "QUARRY_DATA_DIR="+t.TempDir())
	out, err := clean.CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Contains(t, string(out), "of gateway "+ours)

	_, err = cli.ContainerInspect(context.Background(), mine)
	assert.True(t, dockerclient.IsErrNotFound(err), "this checkout's sandbox is removed: %v", err)
	_, err = cli.ContainerInspect(context.Background(), theirs)
	assert.NoError(t, err, "a sandbox of the default gateway id (another checkout's or user's) is left alone")
	_, err = cli.ContainerInspect(context.Background(), holder.ID)
	assert.True(t, dockerclient.IsErrNotFound(err), "this checkout's layer holder is removed: %v", err)
	_, err = cli.VolumeInspect(context.Background(), myVolume)
	assert.True(t, dockerclient.IsErrNotFound(err), "this checkout's layer volume is removed: %v", err)
	_, err = cli.VolumeInspect(context.Background(), theirVolume)
	assert.NoError(t, err, "another gateway id's volume is left alone")
}
