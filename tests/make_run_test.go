//go:build integration

package tests

import (
	"bufio"
	"bytes"
	"context"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/client"
	"github.com/quarryhq/quarry/execagent/agentapi"
)

// runScript is scripts/run.sh (what make run starts after make build) with
// the test's binaries, address and data directory, and none of the
// caller's other QUARRY_* settings.
func runScript(addr, dataDir string) *exec.Cmd {
	cmd := exec.Command("./scripts/run.sh")
	cmd.Dir = ".."
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "QUARRY_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "QUARRY_ADDR="+addr, "QUARRY_DATA_DIR="+dataDir,
		"QUARRY_GATEWAY_BINARY="+bins.gateway, "QUARRY_AGENT_BINARY="+bins.agent)
	return cmd
}

// make run prints a banner whose key and URL work, and a second make run on
// the same address refuses to start instead of printing a banner for the
// gateway that is already there.
func TestMakeRun_BannerWorksAndABusyAddressIsRefused(t *testing.T) {
	dataDir, addr := t.TempDir(), freeAddr(t)
	first := runScript(addr, dataDir)
	out, err := first.StdoutPipe()
	require.NoError(t, err)
	var stderr bytes.Buffer
	first.Stderr = &stderr
	require.NoError(t, first.Start())
	exited := make(chan error, 1)
	go func() { exited <- first.Wait() }()
	t.Cleanup(func() {
		_ = first.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(time.Minute):
			_ = first.Process.Kill()
		}
		stopSandboxes(t, dataDir)
	})

	keyc := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if k, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "API key:"); ok {
				keyc <- strings.TrimSpace(k)
			}
		}
	}()
	var key string
	select {
	case key = <-keyc:
	case err := <-exited:
		t.Fatalf("make run exited before its banner: %v\n%s", err, stderr.String())
	case <-time.After(2 * time.Minute):
		t.Fatalf("no banner from make run\n%s", stderr.String())
	}
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
