//go:build integration

package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/quarryhq/quarry/client"
)

// bins holds the binaries built once for the whole test run.
var bins struct {
	dir                    string
	gateway, agent, quarry string
}

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "quarry-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "temp dir:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	bins.dir = dir
	bins.gateway = filepath.Join(dir, "gateway")
	bins.agent = filepath.Join(dir, "execagent")
	bins.quarry = filepath.Join(dir, "quarry")
	for _, b := range []struct{ out, pkg string }{
		{bins.gateway, "./cmd/gateway"}, {bins.agent, "./cmd/execagent"}, {bins.quarry, "./cmd/quarry"},
	} {
		cmd := exec.Command("go", "build", "-o", b.out, b.pkg)
		cmd.Dir = ".."
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "build %s: %v\n%s", b.pkg, err, out)
			return 1
		}
	}
	return m.Run()
}

// gatewayProc is one gateway process under test, with its data directory.
type gatewayProc struct {
	t       *testing.T
	addr    string
	key     string
	dataDir string
	pools   string
	env     []string
	cmd     *exec.Cmd
	log     *bytes.Buffer
	logMu   *sync.Mutex
	exited  chan struct{}
	tls     *http.Client // with withTLS: a client that trusts the gateway's certificate
}

type gwOption func(*gatewayProc)

// withEnv adds QUARRY_* settings to the gateway's environment.
func withEnv(kv ...string) gwOption {
	return func(g *gatewayProc) { g.env = append(g.env, kv...) }
}

// withAddr makes the gateway listen on addr (host:port) instead of a free
// address of its own.
func withAddr(addr string) gwOption {
	return func(g *gatewayProc) { g.addr = addr }
}

// withKey makes key the gateway's first API key (client's).
func withKey(key string) gwOption {
	return func(g *gatewayProc) { g.key = key }
}

// withTLS makes the gateway serve HTTPS with the certificate and key in
// certFile and keyFile, which hc trusts.
func withTLS(certFile, keyFile string, hc *http.Client) gwOption {
	return func(g *gatewayProc) {
		g.env = append(g.env, "QUARRY_TLS_CERT_FILE="+certFile, "QUARRY_TLS_KEY_FILE="+keyFile)
		g.tls = hc
	}
}

// withDataDir makes the gateway use dir as its data directory instead of a
// fresh one: replicas on one host share it (the process provider's task
// state is on disk there).
func withDataDir(dir string) gwOption {
	return func(g *gatewayProc) { g.dataDir = dir }
}

const defaultPools = `pools:
  - name: default
    image: host
    min_warm: 2
    max_total: 8
`

// startGateway starts a gateway on a fresh data directory with the given pools file, and
// registers cleanup that stops it and every sandbox it left running.
func startGateway(t *testing.T, pools string, opts ...gwOption) *gatewayProc {
	t.Helper()
	g := &gatewayProc{
		t:       t,
		key:     "test-key-" + strings.ReplaceAll(strings.ToLower(t.Name()), "/", "-"),
		dataDir: t.TempDir(),
		pools:   pools,
		log:     &bytes.Buffer{},
		logMu:   &sync.Mutex{},
	}
	for _, o := range opts {
		o(g)
	}
	t.Cleanup(func() {
		g.stop()
		stopSandboxes(t, g.dataDir)
		if t.Failed() || os.Getenv("E2E_LOGS") != "" {
			t.Logf("gateway log:\n%s", g.logs())
		}
	})
	g.start()
	return g
}

func (g *gatewayProc) logs() string {
	g.logMu.Lock()
	defer g.logMu.Unlock()
	return g.log.String()
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// start (re)starts the gateway process on the same data directory and address.
func (g *gatewayProc) start() {
	t := g.t
	t.Helper()
	if g.addr == "" {
		g.addr = freeAddr(t)
	}
	poolsFile := filepath.Join(g.dataDir, "pools.yaml")
	require.NoError(t, os.WriteFile(poolsFile, []byte(g.pools), 0o644))
	cmd := exec.Command(bins.gateway)
	cmd.Env = append(os.Environ(),
		"QUARRY_ADDR="+g.addr,
		"QUARRY_API_KEYS="+g.key+",other-"+g.key,
		"QUARRY_DATA_DIR="+g.dataDir,
		"QUARRY_POOLS_FILE="+poolsFile,
		"QUARRY_AGENT_BINARY="+bins.agent,
		"QUARRY_LOG_LEVEL=debug",
		"QUARRY_RECONCILE_INTERVAL=200ms",
		"QUARRY_REAP_INTERVAL=200ms",
	)
	cmd.Env = append(cmd.Env, g.env...)
	// The gateway dies with the test binary: a test that hits go test's
	// -timeout panics, and no cleanup stops what it started (Linux only,
	// as the rest of the harness: /proc).
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	w := lockedWriter{mu: g.logMu, w: g.log}
	cmd.Stdout, cmd.Stderr = w, w
	require.NoError(t, cmd.Start())
	g.cmd = cmd
	g.exited = make(chan struct{})
	go func(c *exec.Cmd, done chan struct{}) { _ = c.Wait(); close(done) }(cmd, g.exited)
	eventually(t, 30*time.Second, "gateway answers /healthz", func() error {
		select {
		case <-g.exited:
			return fmt.Errorf("gateway exited: %s", g.logs())
		default:
		}
		resp, err := g.httpClient().Get(g.url() + "/healthz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	})
}

// stop sends SIGTERM and waits for a graceful exit.
func (g *gatewayProc) stop() {
	if g.cmd == nil {
		return
	}
	_ = g.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-g.exited:
	case <-time.After(30 * time.Second):
		_ = g.cmd.Process.Kill()
		<-g.exited
	}
	g.cmd = nil
}

// kill ends the gateway with SIGKILL, as a crash would.
func (g *gatewayProc) kill() {
	_ = g.cmd.Process.Kill()
	<-g.exited
	g.cmd = nil
}

func (g *gatewayProc) url() string {
	if g.tls != nil {
		return "https://" + g.addr
	}
	return "http://" + g.addr
}

// httpClient is the HTTP client that reaches the gateway.
func (g *gatewayProc) httpClient() *http.Client {
	if g.tls != nil {
		return g.tls
	}
	return http.DefaultClient
}

// client returns an API client with the gateway's first key.
func (g *gatewayProc) client() *client.Client {
	return client.New(g.url(), g.key, client.WithHTTPClient(g.httpClient()))
}

// otherClient returns a client with a second valid key (another tenant).
func (g *gatewayProc) otherClient() *client.Client { return client.New(g.url(), "other-"+g.key) }

// waitReady waits until the pool has n ready tasks.
func (g *gatewayProc) waitReady(pool string, n int) {
	g.t.Helper()
	c := g.client()
	eventually(g.t, 60*time.Second, fmt.Sprintf("pool %s has %d ready tasks", pool, n), func() error {
		ps, err := c.Pools(context.Background())
		if err != nil {
			return err
		}
		for _, p := range ps {
			if p.Name == pool {
				if p.Ready >= n {
					return nil
				}
				return fmt.Errorf("ready=%d launching=%d leased=%d", p.Ready, p.Launching, p.Leased)
			}
		}
		return fmt.Errorf("pool %s not listed", pool)
	})
}

// taskFile is what the process provider records per sandbox task.
type taskFile struct {
	Name string `json:"name"`
	Pool string `json:"pool"`
	PID  int    `json:"pid"`
}

// tasks lists the process provider's task records in the data directory.
func (g *gatewayProc) tasks() []taskFile {
	g.t.Helper()
	return readTasks(g.t, g.dataDir)
}

func readTasks(t *testing.T, dataDir string) []taskFile {
	files, err := filepath.Glob(filepath.Join(dataDir, "process", "*", "task.json"))
	require.NoError(t, err)
	var out []taskFile
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			continue // removed while we looked
		}
		var tf taskFile
		if json.Unmarshal(data, &tf) == nil && tf.Name != "" {
			out = append(out, tf)
		}
	}
	return out
}

// stopSandboxes kills every agent session whose work directory is under dataDir, recorded or
// not (a gateway killed mid-launch may not have recorded a pid): sandboxes outlive gateways.
func stopSandboxes(t *testing.T, dataDir string) {
	entries, _ := os.ReadDir("/proc")
	want := []byte("QUARRY_AGENT_WORKDIR=" + dataDir + "/")
	for _, e := range entries {
		var pid int
		if _, err := fmt.Sscanf(e.Name(), "%d", &pid); err != nil {
			continue
		}
		env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		if err == nil && bytes.Contains(env, want) {
			killSession(pid)
		}
	}
}

func isAgent(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return err == nil && strings.Contains(string(data), "execagent")
}

// killSession SIGKILLs every process whose session id is sid.
func killSession(sid int) {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		var pid int
		if _, err := fmt.Sscanf(e.Name(), "%d", &pid); err != nil {
			continue
		}
		if s, err := unix.Getsid(pid); err == nil && s == sid {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().String()
}

// eventually polls f until it returns nil or the deadline passes (then the test fails with
// the last error). Deadlines are generous: CI machines are small and busy.
func eventually(t *testing.T, d time.Duration, what string, f func() error) {
	t.Helper()
	eventuallyEvery(t, d, 50*time.Millisecond, what, f)
}

// eventuallyEvery is eventually polling every interval.
func eventuallyEvery(t *testing.T, d, interval time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	var err error
	for {
		if err = f(); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s: %v", what, d, err)
		}
		time.Sleep(interval)
	}
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return c
}

// raw sends one request with an optional API key (none when key is "") and
// returns the status and the body, for tests of bad input.
func (g *gatewayProc) raw(ctx context.Context, t *testing.T, method, path, key, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, g.url()+path, strings.NewReader(body))
	require.NoError(t, err)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}
