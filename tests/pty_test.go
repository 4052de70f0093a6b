//go:build integration

package tests

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/creack/pty"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/client"
	"github.com/quarryhq/quarry/execagent/agentapi"
)

// readAll reads the terminal until it ends (EOF after the exit, or an
// error), bounded by d.
func readAll(t *testing.T, r io.Reader, d time.Duration) (string, error) {
	t.Helper()
	type res struct {
		out string
		err error
	}
	ch := make(chan res, 1)
	go func() {
		b, err := io.ReadAll(r)
		ch <- res{string(b), err}
	}()
	select {
	case r := <-ch:
		return r.out, r.err
	case <-time.After(d):
		require.FailNow(t, "the terminal did not end in time")
		return "", nil
	}
}

// readUntil reads the terminal until its output contains want.
func readUntil(t *testing.T, term *client.PTYConn, want string) {
	t.Helper()
	buf := make([]byte, 4096)
	var seen strings.Builder
	for !strings.Contains(seen.String(), want) {
		n, err := term.Read(buf)
		require.NoError(t, err, "waiting for %q; got %q", want, seen.String())
		seen.Write(buf[:n])
	}
}

// PTY sessions end to end: the real gateway binary, the process provider
// and its real agents, the Go client's terminal.
func TestE2E_PTY_ProcessProvider(t *testing.T) {
	g := startGateway(t, defaultPools, withEnv("QUARRY_WS_LEASE_CHECK=200ms"))
	cl := g.client()
	sbx, err := cl.CreateSandbox(ctx(t), client.CreateSandboxRequest{})
	require.NoError(t, err)

	t.Run("shell with size, output and exit code", func(t *testing.T) {
		term, err := cl.AttachPTY(ctx(t), sbx.ID, client.PTYOptions{Cols: 91, Rows: 19})
		require.NoError(t, err)
		defer term.Close()
		require.NotEmpty(t, term.ID, "the PTY the gateway created")
		_, err = term.Write([]byte("stty size; echo hi-$((40+2)); exit 5\n"))
		require.NoError(t, err)
		out, err := readAll(t, term, time.Minute)
		require.NoError(t, err)
		assert.Contains(t, out, "19 91")
		assert.Contains(t, out, "hi-42")
		code, ok := term.ExitCode()
		require.True(t, ok)
		assert.Equal(t, 5, code)
	})

	t.Run("REST create, reattach with the replay, kill", func(t *testing.T) {
		info, err := cl.CreatePTY(ctx(t), sbx.ID, agentapi.PTYCreateRequest{Env: map[string]string{"MARK": "m-1"}})
		require.NoError(t, err)
		term, err := cl.AttachPTY(ctx(t), sbx.ID, client.PTYOptions{PTY: info.ID})
		require.NoError(t, err)
		_, err = term.Write([]byte("echo got-$MARK\n"))
		require.NoError(t, err)
		readUntil(t, term, "got-m-1")
		require.NoError(t, term.Close())
		again, err := cl.AttachPTY(ctx(t), sbx.ID, client.PTYOptions{PTY: info.ID})
		require.NoError(t, err)
		readUntil(t, again, "got-m-1") // the replay
		list, err := cl.ListPTYs(ctx(t), sbx.ID)
		require.NoError(t, err)
		assert.NotEmpty(t, list)
		_, err = cl.KillPTY(ctx(t), sbx.ID, info.ID)
		require.NoError(t, err)
		_, err = readAll(t, again, time.Minute)
		assert.NoError(t, err, "the hang-up ends the socket normally")
	})

	t.Run("another key's sandbox is not found", func(t *testing.T) {
		_, err := g.otherClient().AttachPTY(ctx(t), sbx.ID, client.PTYOptions{})
		assert.True(t, client.IsNotFound(err), "%v", err)
	})

	t.Run("the CLI: line mode on a pipe", func(t *testing.T) {
		r := quarryCLI(t, g, []byte("echo piped-$((2+2))\nexit 4\n"), "sandbox", "shell", sbx.ID)
		assert.Equal(t, 4, r.code, "%s", r.stderr)
		assert.Contains(t, string(r.stdout), "piped-4")
		assert.Contains(t, string(r.stderr), "session ", "the line mode's banner")
	})

	t.Run("the CLI: a real terminal", func(t *testing.T) {
		cmd := exec.Command(bins.quarry, "sandbox", "shell", sbx.ID)
		cmd.Env = append(os.Environ(), "QUARRY_URL="+g.url(), "QUARRY_API_KEY="+g.key)
		tty, err := pty.StartWithSize(cmd, &pty.Winsize{Cols: 77, Rows: 22})
		require.NoError(t, err)
		defer tty.Close()
		_, err = tty.Write([]byte("stty size; echo hi; exit 3\n"))
		require.NoError(t, err)
		var out bytes.Buffer
		done := make(chan struct{})
		go func() { _, _ = io.Copy(&out, tty); close(done) }() // EIO when the CLI exits
		werr := cmd.Wait()
		<-done
		var ee *exec.ExitError
		require.True(t, errors.As(werr, &ee), "exit status: %v; output %q", werr, out.String())
		assert.Equal(t, 3, ee.ExitCode(), "the remote exit code; output %q", out.String())
		assert.Contains(t, out.String(), "hi")
		assert.Contains(t, out.String(), "22 77", "the local size reaches the remote terminal")
		assert.NotContains(t, out.String(), "session ", "not the line mode")
	})

	t.Run("release while open closes 4410 lease_gone", func(t *testing.T) {
		sbx2, err := cl.CreateSandbox(ctx(t), client.CreateSandboxRequest{})
		require.NoError(t, err)
		term, err := cl.AttachPTY(ctx(t), sbx2.ID, client.PTYOptions{})
		require.NoError(t, err)
		defer term.Close()
		_, err = term.Write([]byte("echo up-$((3+3))\n"))
		require.NoError(t, err)
		readUntil(t, term, "up-6")
		_, err = cl.DeleteSandbox(ctx(t), sbx2.ID)
		require.NoError(t, err)
		start := time.Now()
		_, err = readAll(t, term, time.Minute)
		var ce *client.Error
		require.ErrorAs(t, err, &ce)
		assert.Equal(t, 410, ce.Status)
		assert.Equal(t, "lease_gone", ce.Code)
		assert.Less(t, time.Since(start), 5*time.Second, "within a lease-check interval or so")

		// At connect time: the upgrade succeeds and the close says why.
		late, err := cl.AttachPTY(ctx(t), sbx2.ID, client.PTYOptions{})
		require.NoError(t, err)
		defer late.Close()
		_, err = readAll(t, late, time.Minute)
		require.ErrorAs(t, err, &ce)
		assert.Equal(t, "lease_gone", ce.Code)
	})
}

// A terminal in a Docker sandbox: the agent in the container opens the PTY
// (its devpts), the gateway relays; for both images (bash, and busybox's
// sh as the default shell).
func TestDocker_PTY_ShellInAContainer(t *testing.T) {
	d := requireDocker(t)
	g, cl, c := d.startTwoPools()
	for _, pool := range []string{"bash", "plain"} {
		t.Run(pool, func(t *testing.T) {
			sbx, err := cl.CreateSandbox(c, client.CreateSandboxRequest{Pool: pool})
			require.NoError(t, err)
			term, err := cl.AttachPTY(c, sbx.ID, client.PTYOptions{Cols: 83, Rows: 21})
			require.NoError(t, err)
			defer term.Close()
			_, err = term.Write([]byte("stty size; tty; echo in-$((5*5)); exit 6\n"))
			require.NoError(t, err)
			out, err := readAll(t, term, time.Minute)
			require.NoError(t, err, "output %q; gateway log:\n%s", out, g.logs())
			assert.Contains(t, out, "21 83")
			assert.Contains(t, out, "/dev/pts/")
			assert.Contains(t, out, "in-25")
			code, ok := term.ExitCode()
			require.True(t, ok)
			assert.Equal(t, 6, code)
		})
	}
}
