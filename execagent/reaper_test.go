package execagent

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

func TestReaper_OrphanedGrandchildIsReaped(t *testing.T) {
	a := newTestAgent(t, nil)
	ctx := context.Background()
	tests := []struct {
		name  string
		start func() string // returns the orphan's pid
	}{
		{"orphan of an exec", func() string {
			res, err := a.client.Exec(ctx, agentapi.ExecRequest{Command: "(sleep 0.2) >/dev/null 2>&1 & echo $!"})
			require.NoError(t, err)
			return res.Stdout
		}},
		{"orphan of a process", func() string {
			p, err := a.client.StartProcess(ctx, agentapi.ProcessStartRequest{Command: "(sleep 0.2) >/dev/null 2>&1 & echo $!"})
			require.NoError(t, err)
			waitProcessExited(t, a, p.ID)
			out, err := a.client.ProcessOutput(ctx, p.ID, 0, 0)
			require.NoError(t, err)
			return out.Data
		}},
		{"orphan of a session job", func() string {
			id := newSession(t, a, agentapi.SessionCreateRequest{})
			// The job's subshell outlives the sh that started it.
			return run(t, a, id, "sh -c '(sleep 0.2) >/dev/null 2>&1 & echo $!'", 0).Output
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pid, err := strconv.Atoi(strings.TrimSpace(tt.start()))
			require.NoError(t, err)
			// Without a reaper the orphan would stay a zombie forever.
			eventually(t, func() bool { return processGone(pid) }, "orphan %d was not reaped (state %q)", pid, processState(pid))
		})
	}
}

func TestReaper_TrackedExitCodesUnderLoad(t *testing.T) {
	a := newTestAgent(t, nil)
	ctx := context.Background()
	const workers, runs = 4, 25
	var wg sync.WaitGroup
	errs := make(chan error, workers*runs)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range runs {
				code := (w*runs + i) % 200
				// Every run leaves an orphan that exits soon, so the reaper
				// is busy while tracked children exit.
				res, err := a.client.Exec(ctx, agentapi.ExecRequest{
					Command: fmt.Sprintf("(sleep 0.01) >/dev/null 2>&1 & exit %d", code)})
				if err != nil {
					errs <- err
					continue
				}
				if res.ExitCode != code || res.Signal != "" {
					errs <- fmt.Errorf("run %d/%d: exit %d signal %q, want %d", w, i, res.ExitCode, res.Signal, code)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		assert.NoError(t, err)
	}
	p, err := a.client.StartProcess(ctx, agentapi.ProcessStartRequest{Command: "exit 77"})
	require.NoError(t, err)
	info := waitProcessExited(t, a, p.ID)
	assert.Equal(t, 77, *info.ExitCode)
}

func TestServer_Close_KillsEveryProcessGroup(t *testing.T) {
	cfg := Config{Token: testToken, Workdir: t.TempDir(), Env: []string{"PATH=/usr/bin:/bin"}}
	srv, err := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(context.Background(), ln) }()
	c := agentapi.New("http://"+ln.Addr().String(), testToken, nil)
	ctx := context.Background()

	var pids []int
	// A session with a background job.
	info, err := c.CreateSession(ctx, agentapi.SessionCreateRequest{})
	require.NoError(t, err)
	res, err := c.RunSession(ctx, info.ID, agentapi.SessionRunRequest{Command: "sleep 1000 & echo $$ $!"})
	require.NoError(t, err)
	for _, f := range strings.Fields(res.Output) {
		pid, err := strconv.Atoi(f)
		require.NoError(t, err)
		pids = append(pids, pid)
	}
	// A background process.
	p, err := c.StartProcess(ctx, agentapi.ProcessStartRequest{Command: "sleep 1000"})
	require.NoError(t, err)
	pids = append(pids, p.PID)
	// A streaming exec.
	st, err := c.ExecStream(ctx, agentapi.ExecRequest{Command: "echo $$; sleep 1000"})
	require.NoError(t, err)
	defer st.Close()
	ev, err := st.Next()
	require.NoError(t, err)
	var chunk agentapi.StreamChunk
	require.NoError(t, ev.Decode(&chunk))
	pid, err := strconv.Atoi(strings.TrimSpace(chunk.Data))
	require.NoError(t, err)
	pids = append(pids, pid)
	for _, pid := range pids {
		require.False(t, processDead(pid), "pid %d should be running before Close", pid)
	}

	cctx, cancel := context.WithTimeout(ctx, waitLong)
	defer cancel()
	require.NoError(t, srv.Close(cctx))
	require.NoError(t, <-served)
	for _, pid := range pids {
		eventually(t, func() bool { return processDead(pid) }, "pid %d survived Close", pid)
	}
	_, err = c.Health(ctx)
	assert.Error(t, err, "the server no longer answers")
}

func TestPeekZombie_ReportsWithoutReaping(t *testing.T) {
	// No agent runs in this test, so nothing else reaps the child.
	cmd := exec.Command("true")
	require.NoError(t, cmd.Start())
	pid := cmd.Process.Pid
	eventually(t, func() bool { return processState(pid) == "Z" }, "child never became a zombie")
	assert.Equal(t, pid, peekZombie())
	assert.Equal(t, "Z", processState(pid), "peeking must not reap")
	require.NoError(t, cmd.Wait(), "the owner's Wait still gets the status")
	assert.Equal(t, 0, peekZombie())
}
