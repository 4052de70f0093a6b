//go:build integration

package tests

import (
	"bufio"
	"bytes"
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/client"
	"github.com/quarryhq/quarry/execagent/agentapi"
)

// runScript is scripts/run.sh (what make run starts after make build) with
// the test's binaries, address and data directory, the settings in env
// (QUARRY_*=…), and none of the caller's other QUARRY_* settings.
func runScript(addr, dataDir string, env ...string) *exec.Cmd {
	cmd := exec.Command("./scripts/run.sh")
	cmd.Dir = ".."
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "QUARRY_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "QUARRY_ADDR="+addr, "QUARRY_DATA_DIR="+dataDir,
		"QUARRY_GATEWAY_BINARY="+bins.gateway, "QUARRY_AGENT_BINARY="+bins.agent)
	cmd.Env = append(cmd.Env, env...)
	return cmd
}

// madeRun is a make run (scripts/run.sh) that printed its banner.
type madeRun struct {
	addr, dataDir string
	key           string   // the banner's API key
	banner        []string // the banner's lines, "Quarry gateway: …" to "Ctrl-C stops …"
	cmd           *exec.Cmd
	exited        chan error
	stopped       bool
}

// bannerLine is the banner's first line that starts (after its indent) with prefix, trimmed; "" for none.
func (m *madeRun) bannerLine(prefix string) string {
	for _, l := range m.banner {
		if l = strings.TrimSpace(l); strings.HasPrefix(l, prefix) {
			return l
		}
	}
	return ""
}

// client is an API client with the banner's URL and key.
func (m *madeRun) client() *client.Client { return client.New("http://"+m.addr, m.key) }

// stop ends the gateway as Ctrl-C does (SIGTERM to the script, which
// passes it on) and waits for it, at most a minute; it is idempotent. The
// sandboxes keep running, as after a real make run.
func (m *madeRun) stop() {
	if m.stopped {
		return
	}
	m.stopped = true
	_ = m.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-m.exited:
	case <-time.After(time.Minute):
		_ = m.cmd.Process.Kill()
		<-m.exited
	}
}

// startMakeRun starts runScript on a free address and a fresh data
// directory and waits (2 min) for its whole banner; cleanup stops it and
// the sandboxes it left.
func startMakeRun(t *testing.T, env ...string) *madeRun {
	t.Helper()
	return startMakeRunIn(t, t.TempDir(), env...)
}

// startMakeRunIn is startMakeRun on dataDir, which may hold what an
// earlier make run left.
func startMakeRunIn(t *testing.T, dataDir string, env ...string) *madeRun {
	t.Helper()
	m := &madeRun{addr: freeAddr(t), dataDir: dataDir, exited: make(chan error, 1)}
	cmd := runScript(m.addr, m.dataDir, env...)
	m.cmd = cmd
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr bytes.Buffer
	var mu sync.Mutex
	cmd.Stderr = lockedWriter{mu: &mu, w: &stderr}
	logs := func() string { mu.Lock(); defer mu.Unlock(); return stderr.String() }
	require.NoError(t, cmd.Start())
	go func() { m.exited <- cmd.Wait() }()
	t.Cleanup(func() {
		m.stop()
		stopSandboxes(t, m.dataDir)
		if t.Failed() {
			t.Logf("make run's stderr:\n%s", logs())
		}
	})

	bannerc := make(chan []string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		var banner []string
		sent := false
		for sc.Scan() { // to its end: the gateway writes here after the banner too
			l := sc.Text()
			if sent {
				continue
			}
			if len(banner) > 0 || strings.HasPrefix(strings.TrimSpace(l), "Quarry gateway:") {
				banner = append(banner, l)
			}
			if strings.HasPrefix(strings.TrimSpace(l), "Ctrl-C stops the gateway") {
				bannerc <- banner
				sent = true
			}
		}
	}()
	select {
	case m.banner = <-bannerc:
	case err := <-m.exited:
		t.Fatalf("make run exited before its banner: %v\n%s", err, logs())
	case <-time.After(2 * time.Minute):
		t.Fatalf("no banner from make run within 2 min\n%s", logs())
	}
	m.key, _ = strings.CutPrefix(m.bannerLine("API key:"), "API key:")
	m.key = strings.TrimSpace(m.key)
	require.NotEmpty(t, m.key, "the banner's API key:\n%s", strings.Join(m.banner, "\n"))
	return m
}

// make run prints a banner whose key and URL work, and a second make run on
// the same address refuses to start instead of printing a banner for the
// gateway that is already there.
func TestMakeRun_BannerWorksAndABusyAddressIsRefused(t *testing.T) {
	m := startMakeRun(t)
	addr, dataDir, key := m.addr, m.dataDir, m.key
	c := client.New("http://"+addr, key)
	sbx, err := c.CreateSandbox(ctx(t), client.CreateSandboxRequest{})
	require.NoError(t, err, "the banner's key and URL work")
	res, err := c.Exec(ctx(t), sbx.ID, agentapi.ExecRequest{Command: "echo from-make-run"})
	require.NoError(t, err)
	assert.Equal(t, "from-make-run\n", res.Stdout)
	assert.Equal(t, []string{checkoutGatewayID(t)}, gatewayLabels(t, dataDir),
		"make run labels its sandboxes with this checkout's gateway id (make clean's)")

	second := runScript(addr, t.TempDir())
	var out2, err2 bytes.Buffer
	second.Stdout, second.Stderr = &out2, &err2
	c2, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	done := make(chan error, 1)
	require.NoError(t, second.Start())
	go func() { done <- second.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		require.ErrorAs(t, err, &ee)
		assert.Equal(t, 1, ee.ExitCode())
	case <-c2.Done():
		_ = second.Process.Kill()
		t.Fatal("a second make run on a busy address did not exit")
	}
	assert.Contains(t, err2.String(), "already listens on "+addr)
	assert.NotContains(t, out2.String(), "API key:", "no banner for a gateway it did not start")

	resp, err := http.Get("http://" + addr + "/healthz")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode, "the first gateway still serves")
}

// bannerSandbox is a sandbox id in a JSON answer ("id" of a create, "sandbox_id" of an env's).
var bannerSandbox = regexp.MustCompile(`"(?:sandbox_)?id":"(sbx-[a-z0-9]+)"`)

// runBanner runs every command m's banner prints, in order, as a reader
// would (readerShell, after the banner's export line), with <id> the sandbox
// the last command without one answered with; a command that fails (an HTTP
// error too) fails t. It returns how many commands ran.
func runBanner(t *testing.T, m *madeRun) int {
	t.Helper()
	export := m.bannerLine("export QUARRY_URL=")
	require.NotEmpty(t, export, "the banner's export line:\n%s", strings.Join(m.banner, "\n"))
	dir, env := readerShell(t)
	id, n := "", 0
	for _, l := range m.banner {
		l = strings.TrimSpace(l)
		if !strings.HasPrefix(l, "curl ") && !strings.HasPrefix(l, "./bin/quarry ") {
			continue
		}
		if strings.Contains(l, "<id>") {
			require.NotEmpty(t, id, "%q: no sandbox made before it", l)
			l = strings.ReplaceAll(l, "<id>", id)
		} else {
			id = ""
		}
		c, cancel := context.WithTimeout(context.Background(), time.Minute)
		cmd := exec.CommandContext(c, "bash", "-c", "set -euo pipefail; "+export+"; "+l)
		cmd.Dir, cmd.Env = dir, env
		out, err := cmd.CombinedOutput()
		cancel()
		require.NoError(t, err, "the banner's %q:\n%s", l, out)
		if s := bannerSandbox.FindSubmatch(out); s != nil && id == "" {
			id = string(s[1])
		}
		n++
	}
	return n
}

// The banner says only what the gateway serves: every command it prints
// works, on make run's defaults (the example envs) and with a pools file of
// one's own (QUARRY_POOLS_FILE: no envs, and no pool named default).
func TestMakeRun_BannerSaysOnlyWhatIsServed(t *testing.T) {
	t.Run("defaults", func(t *testing.T) {
		m := startMakeRun(t)
		banner := strings.Join(m.banner, "\n")
		assert.Contains(t, banner, "/v1/envs", "make run's defaults serve the example envs")
		assert.Equal(t, 7, runBanner(t, m), banner)
	})
	t.Run("own pools file", func(t *testing.T) {
		pools := filepath.Join(t.TempDir(), "pools.yaml")
		require.NoError(t, os.WriteFile(pools, []byte("pools:\n  - name: work\n    image: host\n    min_warm: 1\n    max_total: 4\n"), 0o644))
		m := startMakeRun(t, "QUARRY_POOLS_FILE="+pools)
		banner := strings.Join(m.banner, "\n")
		assert.NotContains(t, banner, "/v1/envs", "no envs are served")
		assert.Contains(t, banner, "set QUARRY_ENVS_FILE")
		assert.Equal(t, 4, runBanner(t, m), banner)
	})
}
