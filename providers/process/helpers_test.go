package process

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/quarryhq/quarry/providers"
	"github.com/quarryhq/quarry/providers/providertest"
)

// waitTimeout bounds every polled wait in these tests; they end as soon as
// the condition holds.
const waitTimeout = 2 * time.Minute

func TestMain(m *testing.M) {
	code := m.Run()
	providertest.RemoveAgentBuild()
	os.Exit(code)
}

// newProvider opens a Provider on dir running bin, closed when the test ends.
func newProvider(t testing.TB, dir, bin string, modify ...func(*Config)) *Provider {
	t.Helper()
	cfg := Config{AgentBinary: bin, Dir: dir, GatewayID: "test-gateway"}
	for _, m := range modify {
		m(&cfg)
	}
	logger := slog.New(slog.DiscardHandler) // benchmarks print every log line
	if _, ok := t.(*testing.T); ok {
		logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	p, err := New(cfg, logger)
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	return p
}

// writeScript writes an executable bash script and returns its path.
func writeScript(t testing.TB, name, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(path, []byte("#!/bin/bash\n"+body+"\n"), 0o700))
	return path
}

// Stand-in agents for tests of the provider's process handling. They write a
// (never served) loopback address, as the real agent does after binding.
const (
	// scriptSleeper is ready at once and runs until killed.
	scriptSleeper = `echo 127.0.0.1:9 > "$QUARRY_AGENT_ADDR_FILE"
exec sleep 600`
	// scriptTermIgnorer ignores SIGTERM, so only SIGKILL stops it.
	scriptTermIgnorer = `trap '' TERM
echo 127.0.0.1:9 > "$QUARRY_AGENT_ADDR_FILE"
while :; do sleep 1; done`
	// scriptWithGrandchild leaves a grandchild in its own process group
	// that ignores SIGTERM, and writes its pid to $HOME/gc.pid.
	scriptWithGrandchild = `set -m
(trap '' TERM; exec sleep 600) &
echo $! > "$HOME/gc.pid"
echo 127.0.0.1:9 > "$QUARRY_AGENT_ADDR_FILE"
exec sleep 600`
)

func spec(pool string) providers.Spec {
	return providers.Spec{Pool: pool, Image: "host", Env: map[string]string{"QUARRY_TEST": "1"}}
}

// launchOne launches one task and stops it when the test ends.
func launchOne(t testing.TB, p *Provider, pool, name string) providers.Task {
	t.Helper()
	tasks, err := p.Launch(context.Background(), spec(pool), []string{name})
	stopAtEnd(t, p, tasks...)
	require.NoError(t, err)
	require.Len(t, tasks, 1)
	return tasks[0]
}

func stopAtEnd(t testing.TB, p *Provider, tasks ...providers.Task) {
	t.Cleanup(func() {
		for _, task := range tasks {
			if err := p.Stop(context.Background(), task.ID, "test cleanup"); err != nil {
				t.Errorf("stop %s at cleanup: %v", task.ID, err)
			}
		}
	})
}

func mustRecord(t testing.TB, p *Provider, name string) *record {
	t.Helper()
	rec, err := readRecord(p.taskDir(name))
	require.NoError(t, err)
	return rec
}

// killGroup kills a process group from outside the provider.
func killGroup(t testing.TB, pgid int) {
	t.Helper()
	require.Positive(t, pgid)
	require.NoError(t, unix.Kill(-pgid, unix.SIGKILL))
}

// proc identifies one process across pid reuse.
type proc struct {
	pid   int
	start uint64
}

func procOf(t testing.TB, pid int) proc {
	t.Helper()
	st, err := readStat(pid)
	require.NoError(t, err)
	require.False(t, st.dead(), "process %d is alive", pid)
	return proc{pid: pid, start: st.StartTime}
}

// alive reports whether the process still runs (a zombie does not).
func (p proc) alive() bool {
	st, err := readStat(p.pid)
	return err == nil && !st.dead() && st.StartTime == p.start
}

// exists reports whether the process exists at all, zombie or not.
func (p proc) exists() bool {
	st, err := readStat(p.pid)
	return err == nil && st.StartTime == p.start
}

// readPIDFile waits for a file holding a pid and returns the pid.
func readPIDFile(t testing.TB, path string) int {
	t.Helper()
	var pid int
	eventually(t, "pid in "+path, func() bool {
		b, err := os.ReadFile(path)
		if err != nil {
			return false
		}
		pid, err = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil && pid > 0
	})
	return pid
}

// eventually polls cond until it holds, failing the test after waitTimeout.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached within %s", what, waitTimeout)
		}
		time.Sleep(pollInterval)
	}
}

func dirExists(t testing.TB, path string) bool {
	t.Helper()
	_, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false
	}
	require.NoError(t, err)
	return true
}

// processesWithEnv returns the live processes whose environment holds the
// entry kv ("NAME=value").
func processesWithEnv(t testing.TB, kv string) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	require.NoError(t, err)
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil {
			continue // gone, or not ours
		}
		if st, err := readStat(pid); err != nil || st.dead() {
			continue
		}
		for _, entry := range strings.Split(string(env), "\x00") {
			if entry == kv {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}
