// Package procgw starts a real gateway binary for a benchmark: the process
// provider, the embedded store, a temporary data directory, loopback only.
// Stop stops it, kills the agents it left (sandboxes outlive gateways) and
// removes the directory.
//
// It must not import any other Quarry package.
package procgw

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Options say what to start.
type Options struct {
	// Bin holds the gateway and execagent binaries.
	Bin string
	// Key is the API key.
	Key string
	// Pools is the pools file's text.
	Pools string
	// Env adds QUARRY_* settings.
	Env []string
	// Files are settings that name a file: variable → the file's text,
	// written to the gateway's directory (e.g. QUARRY_ENVS_FILE).
	Files map[string]string
}

// Gateway is a running gateway process.
type Gateway struct {
	// Base is its URL, http://127.0.0.1:port.
	Base string
	key  string
	cmd  *exec.Cmd
	dir  string
	done chan struct{}
}

// Start starts the gateway and waits (30 s at most) until /healthz answers.
func Start(ctx context.Context, o Options) (*Gateway, error) {
	bin, err := filepath.Abs(o.Bin)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "procgw-")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "pools.yaml"), []byte(o.Pools), 0o644); err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := l.Addr().String()
	_ = l.Close()
	env := o.Env
	for name, text := range o.Files {
		path := filepath.Join(dir, name+".txt")
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			return nil, err
		}
		env = append(env, name+"="+path)
	}
	logf, err := os.Create(filepath.Join(dir, "gateway.log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(filepath.Join(bin, "gateway"))
	cmd.Env = append(append(os.Environ(), "QUARRY_ADDR="+addr, "QUARRY_API_KEYS="+o.Key,
		"QUARRY_DATA_DIR="+filepath.Join(dir, "data"), "QUARRY_POOLS_FILE="+filepath.Join(dir, "pools.yaml"),
		"QUARRY_AGENT_BINARY="+filepath.Join(bin, "execagent"), "QUARRY_LOG_LEVEL=warn"), env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start gateway: %w", err)
	}
	g := &Gateway{Base: "http://" + addr, key: o.Key, cmd: cmd, dir: dir, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); _ = logf.Close(); close(g.done) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(g.Base + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return g, nil
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			g.Stop()
			return nil, fmt.Errorf("gateway did not answer /healthz within 30 s (log: %s)", logf.Name())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// WaitReady waits (3 minutes at most) until every pool has n ready sandboxes.
func (g *Gateway) WaitReady(ctx context.Context, n int) error {
	deadline := time.Now().Add(3 * time.Minute)
	for time.Now().Before(deadline) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, g.Base+"/v1/pools", nil)
		if err != nil {
			return err
		}
		req.Header.Set("Authorization", "Bearer "+g.key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		var ps struct {
			Pools []struct {
				Ready int `json:"ready"`
			} `json:"pools"`
		}
		err = json.NewDecoder(resp.Body).Decode(&ps)
		resp.Body.Close()
		if err != nil {
			return fmt.Errorf("decode pools: %w", err)
		}
		ready := len(ps.Pools) > 0
		for _, p := range ps.Pools {
			ready = ready && p.Ready >= n
		}
		if ready {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
	return fmt.Errorf("the pools did not reach %d ready sandboxes in 3 minutes", n)
}

// Stop stops the gateway (SIGTERM, then SIGKILL after 30 s), kills the
// agents it started and removes its directory.
func (g *Gateway) Stop() {
	_ = g.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-g.done:
	case <-time.After(30 * time.Second):
		_ = g.cmd.Process.Kill()
		<-g.done
	}
	killAgents(filepath.Join(g.dir, "data"))
	_ = os.RemoveAll(g.dir)
}

// killAgents SIGKILLs every process in the session of an agent whose
// workdir is under dataDir (the process provider starts each agent in its
// own session).
func killAgents(dataDir string) {
	want := []byte("QUARRY_AGENT_WORKDIR=" + dataDir + "/")
	var sessions []int
	for _, pid := range pids() {
		env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		if err == nil && bytes.Contains(env, want) {
			sessions = append(sessions, pid)
		}
	}
	for _, pid := range pids() {
		if sid, err := unix.Getsid(pid); err == nil && slices.Contains(sessions, sid) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

func pids() []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			out = append(out, pid)
		}
	}
	return out
}
