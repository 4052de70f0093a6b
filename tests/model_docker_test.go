//go:build integration

package tests

import (
	"context"
	"fmt"
	"testing"

	"github.com/docker/docker/api/types/network"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/client"
	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/modelservice/modeltest"
	"github.com/quarryhq/quarry/providers"
)

// The model relay from inside Docker sandboxes: the official openai client,
// baked into quarry-test/python (scripts/images/python.sh), calls the relay
// of a gateway on the Docker provider and a trainer loop answers.
//
// The gateway runs as `make run` starts it: on 127.0.0.1, with nothing of
// the relay configured. How a container reaches the relay:
//   - "default bridge" (no network option: Docker's bridge) and "own
//     bridge" (a network the test creates): the container's 127.0.0.1 is
//     its own, so OPENAI_BASE_URL names the container's agent,
//     http://127.0.0.1:8000/..., which forwards the calls to the gateway's
//     relay socket, mounted into the container. No path from the container
//     to the gateway's network exists or is needed.
//   - "host network": the pool's containers share the host's network
//     (pool option network: host), so OPENAI_BASE_URL is the gateway's own
//     address, as for process sandboxes.

// dockerImagePython is Debian bookworm with python3 and the openai package
// in its site directory (scripts/images/build.sh builds it).
const dockerImagePython = "quarry-test/python:latest"

// dockerPythonPool is one pool of dockerImagePython on Docker network
// netName ("host", or a network's name; "": the provider's default).
func dockerPythonPool(netName string) string {
	pool := fmt.Sprintf(`pools:
  - name: py
    image: %s
    cpu: 1
    memory: 512Mi
    min_warm: 1
    max_total: 2
`, dockerImagePython)
	if netName != "" {
		pool += fmt.Sprintf("    options:\n      network: %q\n", netName)
	}
	return pool
}

// ownNetwork creates a bridge network for the test's containers, labelled
// with its gateway id, and returns its name.
// Cleanup removes the test's containers, then the network.
func (d *dockerTest) ownNetwork() (name string) {
	d.t.Helper()
	c, cancel := context.WithTimeout(context.Background(), dockerWait)
	defer cancel()
	name = "quarry-" + d.gatewayID
	created, err := d.cli.NetworkCreate(c, name, network.CreateOptions{
		Driver: "bridge",
		Labels: map[string]string{providers.LabelManaged: "true", providers.LabelGateway: d.gatewayID},
	})
	require.NoError(d.t, err, "create network %s", name)
	d.t.Cleanup(func() {
		d.removeAll() // a network with containers cannot be removed
		rc, cancel := context.WithTimeout(context.Background(), dockerWait)
		defer cancel()
		if err := d.cli.NetworkRemove(rc, created.ID); err != nil {
			d.t.Errorf("remove network %s: %v", name, err)
		}
	})
	return name
}

// containerWithFile returns the id of the test's running container of pool
// that has the file path (in its image's file system, not a mount).
func (d *dockerTest) containerWithFile(ctx context.Context, pool, path string) string {
	d.t.Helper()
	var found []string
	for id := range d.running(pool) {
		if _, err := d.cli.ContainerStatPath(ctx, id, path); err == nil {
			found = append(found, id)
		}
	}
	require.Len(d.t, found, 1, "containers of pool %s with %s", pool, path)
	return found[0]
}

func TestModelRelay_OpenAIClientInDockerSandbox_TrainerAnswers(t *testing.T) {
	needDocker(t, dockerImagePython)
	tests := []struct {
		name    string
		network string // "own": a network the test creates
	}{
		{name: "default bridge", network: ""},
		{name: "own bridge", network: "own"},
		{name: "host network", network: "host"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := requireDocker(t)

			netName := tt.network
			if netName == "own" {
				netName = d.ownNetwork()
			}
			g := d.startGateway(dockerPythonPool(netName))
			g.waitReady("py", 1)
			c := g.client()
			ctx := ctx(t)
			sbx, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Pool: "py", Labels: map[string]string{"run": "relay-docker"}})
			require.NoError(t, err)

			// It is a container of the Python image on the pool's network;
			// its relay URL is its agent's forwarder (on a bridge) or the
			// gateway's own address (on the host's network).
			base, _ := relayTokenOf(ctx, t, c, sbx.ID)
			relayHost := "http://127.0.0.1:8000"
			if netName == "host" {
				relayHost = g.url()
			}
			assert.Equal(t, relayHost+"/v1/sandboxes/"+sbx.ID+"/model/v1", base)
			// (Its hostname is the host's on the host network: a file marks it.)
			marker := "/tmp/quarry-" + sbx.ID
			res, err := c.Exec(ctx, sbx.ID, agentapi.ExecRequest{Argv: []string{"touch", marker}, TimeoutMS: 30000})
			require.NoError(t, err)
			require.Equal(t, 0, res.ExitCode, "touch %s: %s", marker, res.Stderr)
			info, err := d.cli.ContainerInspect(ctx, d.containerWithFile(ctx, "py", marker))
			require.NoError(t, err)
			assert.Equal(t, dockerImagePython, info.Config.Image)
			if netName == "" {
				netName = "bridge"
			}
			assert.Equal(t, netName, string(info.HostConfig.NetworkMode))

			tctx, stop := context.WithCancel(ctx)
			answered := trainerLoop(tctx, t, &modeltest.Trainer{URL: g.url(), Key: g.key})
			// No PYTHONPATH: the image's own site directory has the package.
			out := runAgent(ctx, t, c, sbx.ID, "")
			stop()
			assertAgentRun(t, out, answered(), transcriptOf(t, g.url(), g.key, sbx.ID), sbx.ID, "relay-docker")
		})
	}
}
