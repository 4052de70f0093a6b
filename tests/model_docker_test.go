//go:build integration

package tests

import (
	"context"
	"fmt"
	"net"
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
// How a container reaches the gateway, which the process-provider test gets
// for free (its sandboxes share the host's loopback):
//   - "own bridge": the test creates a Docker network of its own and starts
//     the gateway listening on that network's gateway address (the host's
//     end of the bridge, e.g. 172.18.0.1) instead of 127.0.0.1. Its default
//     QUARRY_SANDBOX_GATEWAY_URL, http://QUARRY_ADDR, is then what the
//     containers reach; the test client and the trainer use the same
//     address, the gateway reaches the agents on their ports published on
//     127.0.0.1. Nothing listens on an outside interface.
//   - "host network": the pool's containers share the host's network
//     (pool option network: host), so the gateway stays on 127.0.0.1.

// dockerImagePython is Debian bookworm with python3 and the openai package
// in its site directory (scripts/images/build.sh builds it).
const dockerImagePython = "quarry-test/python:latest"

// dockerPythonPool is one pool of dockerImagePython on Docker network
// netName ("host", or a network's name).
func dockerPythonPool(netName string) string {
	return fmt.Sprintf(`pools:
  - name: py
    image: %s
    cpu: 1
    memory: 512Mi
    min_warm: 1
    max_total: 2
    options:
      network: %q
`, dockerImagePython, netName)
}

// withAddr makes the gateway listen on addr instead of a free loopback
// port.
func withAddr(addr string) gwOption {
	return func(g *gatewayProc) { g.addr = addr }
}

// ownNetwork creates a bridge network for the test's containers, labelled
// with its gateway id, and returns its name and the host's address on it.
// Cleanup removes the test's containers, then the network.
func (d *dockerTest) ownNetwork() (name, hostIP string) {
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
	info, err := d.cli.NetworkInspect(c, created.ID, network.InspectOptions{})
	require.NoError(d.t, err)
	for _, cfg := range info.IPAM.Config {
		if ip := net.ParseIP(cfg.Gateway); ip != nil && ip.To4() != nil {
			return name, cfg.Gateway
		}
	}
	d.t.Fatalf("network %s has no IPv4 gateway address: %+v", name, info.IPAM.Config)
	return "", ""
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

// freeAddrOn returns host:port with a port that was free on host.
func freeAddrOn(t *testing.T, host string) string {
	t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().String()
}

func TestModelRelay_OpenAIClientInDockerSandbox_TrainerAnswers(t *testing.T) {
	needDocker(t, dockerImagePython)
	tests := []struct {
		name string
		host bool // the pool on the host's network; else on a bridge of the test's own
	}{
		{name: "own bridge", host: false},
		{name: "host network", host: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := requireDocker(t)

			netName, opts := "host", []gwOption(nil)
			if !tt.host {
				var hostIP string
				netName, hostIP = d.ownNetwork()
				opts = append(opts, withAddr(freeAddrOn(t, hostIP)))
			}
			g := d.startGateway(dockerPythonPool(netName), opts...)
			g.waitReady("py", 1)
			c := g.client()
			ctx := ctx(t)
			sbx, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Pool: "py", Labels: map[string]string{"run": "relay-docker"}})
			require.NoError(t, err)

			// It is a container of the Python image on the pool's network,
			// and its relay URL is the gateway's address.
			base, _ := relayTokenOf(ctx, t, c, sbx.ID)
			assert.Equal(t, g.url()+"/v1/sandboxes/"+sbx.ID+"/model/v1", base)
			// (Its hostname is the host's on the host network: a file marks it.)
			marker := "/tmp/quarry-" + sbx.ID
			res, err := c.Exec(ctx, sbx.ID, agentapi.ExecRequest{Argv: []string{"touch", marker}, TimeoutMS: 30000})
			require.NoError(t, err)
			require.Equal(t, 0, res.ExitCode, "touch %s: %s", marker, res.Stderr)
			info, err := d.cli.ContainerInspect(ctx, d.containerWithFile(ctx, "py", marker))
			require.NoError(t, err)
			assert.Equal(t, dockerImagePython, info.Config.Image)
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
