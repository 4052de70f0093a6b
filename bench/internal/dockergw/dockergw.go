// Package dockergw is what the Docker benchmarks (bench/dockerbench, bench/ckbench) share: a
// gateway binary run on the Docker provider with a pools file of their own, waits on its
// pools, the removal of every container of a gateway id, and the p50/p99 summaries they
// print and write.
//
// It must not import any other Quarry package but client, providers, providers/docker and
// internal/stats.
package dockergw

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	dockertypes "github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/volume"
	dockerclient "github.com/docker/docker/client"

	"github.com/quarryhq/quarry/client"
	"github.com/quarryhq/quarry/internal/stats"
	"github.com/quarryhq/quarry/providers"
	"github.com/quarryhq/quarry/providers/docker"
)

// Options start a gateway.
type Options struct {
	Bin       string   // directory with the gateway and execagent binaries
	Dir       string   // its data directory (created; removed by Stop)
	Key       string   // its API key (at least 16 characters)
	GatewayID string   // QUARRY_GATEWAY_ID: the label of every container it starts
	Pools     string   // the pools file's content
	Env       []string // more QUARRY_* settings
}

// Gateway is one gateway process; C is a client of it, at Base.
type Gateway struct {
	C    *client.Client
	Base string // http://127.0.0.1:port
	Dir  string
	cmd  *exec.Cmd
	done chan struct{}
}

// Start starts the gateway (its log in Dir/gateway.log) and returns once it is running;
// callers wait for their pools with WaitPool.
func Start(o Options) (*Gateway, error) {
	if err := os.MkdirAll(o.Dir, 0o700); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(o.Dir, "pools.yaml"), []byte(o.Pools), 0o644); err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := l.Addr().String()
	_ = l.Close()
	logf, err := os.Create(filepath.Join(o.Dir, "gateway.log"))
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := exec.Command(filepath.Join(o.Bin, "gateway"))
	cmd.Env = append(append(os.Environ(),
		"QUARRY_ADDR="+addr, "QUARRY_API_KEYS="+o.Key, "QUARRY_DATA_DIR="+o.Dir,
		"QUARRY_POOLS_FILE="+filepath.Join(o.Dir, "pools.yaml"), "QUARRY_PROVIDER=docker",
		"QUARRY_AGENT_BINARY="+filepath.Join(o.Bin, "execagent"), "QUARRY_GATEWAY_ID="+o.GatewayID,
		"QUARRY_LOG_LEVEL=warn",
	), o.Env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	g := &Gateway{C: client.New("http://"+addr, o.Key), Base: "http://" + addr, Dir: o.Dir, cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(g.done) }()
	return g, nil
}

// LogTail returns the end of the gateway's log, for an error message.
func (g *Gateway) LogTail() string {
	b, _ := os.ReadFile(filepath.Join(g.Dir, "gateway.log"))
	if len(b) > 4<<10 {
		b = b[len(b)-4<<10:]
	}
	return string(b)
}

// Stop stops the gateway (SIGTERM, then SIGKILL after 30 s) and removes its directory.
func (g *Gateway) Stop() {
	_ = g.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-g.done:
	case <-time.After(30 * time.Second):
		_ = g.cmd.Process.Kill()
		<-g.done
	}
	_ = os.RemoveAll(g.Dir)
}

// WaitPool polls GET /v1/pools until pool satisfies ok, the gateway exits, or limit passes.
func (g *Gateway) WaitPool(ctx context.Context, pool string, limit time.Duration, ok func(client.Pool) bool) error {
	deadline := time.Now().Add(limit)
	for {
		select {
		case <-g.done:
			return errors.New("the gateway exited")
		default:
		}
		ps, err := g.C.Pools(ctx)
		if err == nil {
			for _, p := range ps {
				if p.Name == pool && ok(p) {
					return nil
				}
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pool %s: not there within %s (last error %v)", pool, limit, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ContainerIDs lists the containers (stopped ones too) labelled with gateway id gwID.
func ContainerIDs(ctx context.Context, cli *dockerclient.Client, gwID string) (map[string]bool, error) {
	list, err := cli.ContainerList(ctx, dockertypes.ListOptions{All: true,
		Filters: filters.NewArgs(filters.Arg("label", providers.LabelGateway+"="+gwID))})
	if err != nil {
		return nil, err
	}
	out := make(map[string]bool, len(list))
	for _, c := range list {
		out[c.ID] = true
	}
	return out, nil
}

// Engine connects to the local Docker engine for a benchmark called name
// and picks its gateway id (name-<random>). The caller defers done, which
// removes every container of that gateway id and closes the client.
func Engine(name string) (cli *dockerclient.Client, gwID string, done func(), err error) {
	cli, err = dockerclient.NewClientWithOpts(dockerclient.WithHost(docker.DefaultHost), dockerclient.WithAPIVersionNegotiation())
	if err != nil {
		return nil, "", nil, err
	}
	gwID = name + "-" + RandomHex(5)
	return cli, gwID, func() { RemoveAll(cli, gwID, name); cli.Close() }, nil
}

// RemoveAll removes every container of gateway id gwID; failures are printed with name.
func RemoveAll(cli *dockerclient.Client, gwID, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ids, err := ContainerIDs(ctx, cli, gwID)
	if err != nil {
		fmt.Fprintln(os.Stderr, name+": clean up:", err)
		return
	}
	for id := range ids {
		if err := cli.ContainerRemove(ctx, id, dockertypes.RemoveOptions{Force: true}); err != nil {
			fmt.Fprintln(os.Stderr, name+": clean up:", err)
		}
	}
	vols, err := volumesOf(ctx, cli, gwID)
	if err != nil {
		fmt.Fprintln(os.Stderr, name+": clean up:", err)
		return
	}
	for _, overlays := range []bool{true, false} { // an overlay names the others
		for _, v := range vols {
			if (v.Labels[volumeRole] == "overlay") == overlays {
				if err := cli.VolumeRemove(ctx, v.Name, true); err != nil {
					fmt.Fprintln(os.Stderr, name+": clean up:", err)
				}
			}
		}
	}
}

// volumeRole is the label of the Docker provider's volumes that says what
// each holds: layer, overlay, upper, work.
const volumeRole = "quarry.docker.volume"

// volumesOf lists the volumes labelled with gateway id gwID.
func volumesOf(ctx context.Context, cli *dockerclient.Client, gwID string) ([]*volume.Volume, error) {
	list, err := cli.VolumeList(ctx, volume.ListOptions{Filters: filters.NewArgs(filters.Arg("label", providers.LabelGateway+"="+gwID))})
	if err != nil {
		return nil, fmt.Errorf("list volumes: %w", err)
	}
	return list.Volumes, nil
}

// VolumeBytes is what gateway gwID's copy-on-write volumes hold on the
// engine's disk, by role (layer, upper, work: not the overlays, which
// show the layer again), measured with du on their mountpoints (the
// benchmark runs on the engine's host, as root).
func VolumeBytes(ctx context.Context, cli *dockerclient.Client, gwID string) (map[string]int64, error) {
	vols, err := volumesOf(ctx, cli, gwID)
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for _, v := range vols {
		role := v.Labels[volumeRole]
		if role == "overlay" || role == "" {
			continue
		}
		b, err := exec.CommandContext(ctx, "du", "-sb", v.Mountpoint).Output()
		if err != nil {
			return nil, fmt.Errorf("du %s: %w", v.Mountpoint, err)
		}
		var n int64
		if _, err := fmt.Sscan(string(b), &n); err != nil {
			return nil, fmt.Errorf("du %s: %q: %w", v.Mountpoint, b, err)
		}
		out[role] += n
	}
	return out, nil
}

// Summary is the p50, p99, min and max of ds in milliseconds.
func Summary(ds []time.Duration) map[string]float64 {
	return map[string]float64{"p50": MS(stats.Percentile(ds, 50)), "p99": MS(stats.Percentile(ds, 99)),
		"min": MS(stats.Percentile(ds, 0)), "max": MS(stats.Percentile(ds, 100))}
}

// Line is Summary as one printed line, with the count.
func Line(ds []time.Duration) string {
	r := func(p int) time.Duration { return stats.Percentile(ds, p).Round(100 * time.Microsecond) }
	return fmt.Sprintf("n=%d p50 %s p99 %s (min %s, max %s)", len(ds), r(50), r(99), r(0), r(100))
}

// MS is d in milliseconds.
func MS(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// RandomHex returns n random bytes in hex.
func RandomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
