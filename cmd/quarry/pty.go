package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/term"

	"github.com/quarryhq/quarry/client"
	"github.com/quarryhq/quarry/execagent/agentapi"
)

// runShellCommand is `quarry sandbox shell`: a real terminal (a PTY in the
// sandbox, raw mode here) when stdin is a terminal, else the line mode of
// runShell, for pipes.
func runShellCommand(ctx context.Context, c *cli, args []string) error {
	if f, ok := c.stdin.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		return runTerminal(ctx, c, f, args)
	}
	return runShell(ctx, c, args)
}

// runTerminal opens a PTY running the sandbox's shell and connects the
// local terminal to it: raw mode, SIGWINCH → resize, the remote exit code
// as the CLI's. The PTY is deleted at the end.
func runTerminal(ctx context.Context, c *cli, in *os.File, args []string) (err error) {
	fs := c.flags("sandbox shell")
	var f commandFlags
	f.register(fs) // --timeout has no meaning for a terminal; accepted for the line mode's sake
	pos, cl, err := c.start(fs, args, 1, 1)
	if err != nil {
		return err
	}
	id := pos[0]
	fd := int(in.Fd())
	cols, rows, err := term.GetSize(fd)
	if err != nil {
		cols, rows = 80, 24
	}
	info, err := cl.CreatePTY(ctx, id, agentapi.PTYCreateRequest{Env: f.env, Cwd: f.cwd, Cols: cols, Rows: rows})
	if err != nil {
		return fmt.Errorf("open a terminal in %s: %w", id, err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeTimeout)
		defer cancel()
		if _, kerr := cl.KillPTY(cctx, id, info.ID); kerr != nil && !client.IsNotFound(kerr) {
			err = errors.Join(err, fmt.Errorf("delete terminal %s: %w", info.ID, kerr))
		}
	}()
	conn, err := cl.AttachPTY(ctx, id, client.PTYOptions{PTY: info.ID})
	if err != nil {
		return fmt.Errorf("attach to terminal %s: %w", info.ID, err)
	}
	defer conn.Close()

	old, err := term.MakeRaw(fd)
	if err != nil {
		return fmt.Errorf("raw mode: %w", err)
	}
	defer func() { _ = term.Restore(fd, old) }()

	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	defer signal.Stop(winch)
	done := make(chan struct{})
	defer close(done)
	go func() {
		for {
			select {
			case <-winch:
				if w, h, err := term.GetSize(fd); err == nil {
					_ = conn.Resize(w, h)
				}
			case <-done:
				return
			}
		}
	}()
	// Keystrokes go out as they come. The goroutine ends at the next key
	// after the end (the CLI exits then anyway): a read of a terminal cannot
	// be interrupted.
	go func() { _, _ = io.Copy(conn, in) }()

	if _, err := io.Copy(c.stdout, conn); err != nil {
		return fmt.Errorf("terminal %s: %w", info.ID, err)
	}
	code, ok := conn.ExitCode()
	if !ok {
		return fmt.Errorf("terminal %s closed without an exit code", info.ID)
	}
	_ = term.Restore(fd, old)
	return c.commandStatus(code, "", false)
}
