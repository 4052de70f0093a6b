//go:build integration

package tests

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/client"
)

// Ctrl-C on `quarry sandbox exec` ends the command in the sandbox within
// 2 s (the bound), through the real gateway, process provider and
// agent; before, it ran until the agent's next keep-alive write failed
// (15-30 s).
func TestE2E_CLIExecInterruptedEndsTheCommand(t *testing.T) {
	g := startGateway(t, defaultPools)
	sbx, err := g.client().CreateSandbox(ctx(t), client.CreateSandboxRequest{Pool: "default"})
	require.NoError(t, err)

	cmd := exec.Command(bins.quarry, "sandbox", "exec", sbx.ID, `sh -c 'echo $$; exec sleep 4242'`)
	cmd.Env = append(os.Environ(), "QUARRY_URL="+g.url(), "QUARRY_API_KEY="+g.key)
	var stdout, stderr bytes.Buffer
	var mu sync.Mutex
	cmd.Stdout, cmd.Stderr = lockedWriter{mu: &mu, w: &stdout}, lockedWriter{mu: &mu, w: &stderr}
	began := time.Now()
	require.NoError(t, cmd.Start())
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})

	var pid int
	eventually(t, 30*time.Second, "the command prints its pid and becomes sleep 4242", func() error {
		mu.Lock()
		line, complete := strings.CutSuffix(stdout.String(), "\n")
		errs := stderr.String()
		mu.Unlock()
		var err error
		if pid, err = strconv.Atoi(line); !complete || err != nil {
			return fmt.Errorf("stdout %q, stderr %q", line, errs)
		}
		if !isSleep4242(pid) {
			return fmt.Errorf("pid %d is not sleep 4242", pid)
		}
		return nil
	})

	time.Sleep(time.Until(began.Add(time.Second)))
	require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		t.Fatal("quarry sandbox exec did not exit on SIGINT")
	}
	interrupted := time.Now()
	for isSleep4242(pid) && time.Since(interrupted) < 2*time.Second {
		time.Sleep(20 * time.Millisecond)
	}
	assert.False(t, isSleep4242(pid), "sleep 4242 (pid %d) still runs %s after quarry sandbox exec was interrupted", pid, time.Since(interrupted))
}

// isSleep4242 reports whether pid is a live (not zombie) `sleep 4242`.
func isSleep4242(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	if i := bytes.LastIndexByte(stat, ')'); i < 0 || bytes.HasPrefix(stat[i+1:], []byte(" Z")) {
		return false
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return err == nil && string(cmdline) == "sleep\x004242\x00"
}
