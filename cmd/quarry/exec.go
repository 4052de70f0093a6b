package main

import (
	"bufio"
	"context"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/quarryhq/quarry/client"
	"github.com/quarryhq/quarry/execagent/agentapi"
)

// maxShellLine bounds one line read by `quarry sandbox shell`.
const maxShellLine = 1 << 20

// maxExecStdin bounds what `quarry sandbox exec -i` reads from stdin.
const maxExecStdin = 1 << 20

// closeTimeout bounds closing a session after the shell ends.
const closeTimeout = 10 * time.Second

// exitOutputCut is the exit status of `quarry sandbox exec` when the
// command succeeded but its output went over --max-output (a failed
// command's own status wins).
const exitOutputCut = 3

// commandFlags are the flags of exec and shell.
type commandFlags struct {
	timeout time.Duration
	env     kvFlag
	cwd     string
}

func (f *commandFlags) register(fs *flag.FlagSet) {
	f.env = kvFlag{}
	fs.DurationVar(&f.timeout, "timeout", 0, "bound on each command, e.g. 30s (0: the agent's default)")
	fs.Var(f.env, "env", "K=V added to the command's environment (repeatable)")
	fs.StringVar(&f.cwd, "cwd", "", "working directory (default: the sandbox's)")
}

// timeoutMS is the timeout in whole milliseconds (at least 1 when set).
func (f *commandFlags) timeoutMS() (int64, error) {
	switch {
	case f.timeout < 0:
		return 0, fmt.Errorf("--timeout: must not be negative, got %s", f.timeout)
	case f.timeout == 0:
		return 0, nil
	}
	return max(f.timeout.Milliseconds(), 1), nil
}

func runExec(ctx context.Context, c *cli, args []string) error {
	fs := c.flags("sandbox exec")
	var f commandFlags
	f.register(fs)
	interactive := fs.Bool("i", false, "pass this command's standard input to the command (its exact bytes, at most 1 MiB; for files use cp)")
	var maxOutput sizeFlag
	fs.Var(&maxOutput, "max-output", "cap each of stdout and stderr at `SIZE` bytes, e.g. 64Mi (at most the agent's maximum, 64Mi by default): "+
		"output over it is discarded and exec fails, with status "+strconv.Itoa(exitOutputCut)+" when the command succeeded (default: no cap, all the output is streamed)")
	pos, argv, err := c.parse(fs, args, usageOf(fs.Name()))
	if err != nil {
		return err
	}
	// Output travels as base64 so that it is written byte for byte; without
	// a cap, all of it is streamed.
	req := agentapi.ExecRequest{Env: f.env, Cwd: f.cwd, Encoding: agentapi.EncodingBase64,
		MaxOutputBytes: int64(maxOutput), UnlimitedOutput: maxOutput == 0}
	if *interactive {
		b, err := io.ReadAll(io.LimitReader(c.stdin, maxExecStdin+1))
		if err != nil {
			return fmt.Errorf("sandbox exec: read stdin: %w", err)
		}
		if len(b) > maxExecStdin {
			return fmt.Errorf("sandbox exec -i: stdin is over %d bytes; copy it in with quarry sandbox cp", maxExecStdin)
		}
		if utf8.Valid(b) {
			req.Stdin = string(b)
		} else {
			req.StdinBase64 = base64.StdEncoding.EncodeToString(b)
		}
	}
	switch {
	case len(pos) == 0:
		return errors.New("sandbox exec: missing sandbox id (see quarry sandbox exec -h)")
	case argv != nil && len(pos) > 1:
		return fmt.Errorf("sandbox exec: unexpected argument %q before --", pos[1])
	case argv != nil && len(argv) == 0:
		return errors.New("sandbox exec: missing command after --")
	case argv != nil:
		req.Argv = argv
	case len(pos) == 1:
		return errors.New("sandbox exec: missing command: give ID -- CMD ARGS… or ID 'SHELL STRING'")
	default:
		req.Command = strings.Join(pos[1:], " ")
	}
	if req.TimeoutMS, err = f.timeoutMS(); err != nil {
		return err
	}
	cl, err := c.client()
	if err != nil {
		return err
	}
	id := pos[0]
	s, err := cl.ExecStream(ctx, id, req)
	if err != nil {
		return fmt.Errorf("exec in %s: %w", id, err)
	}
	defer s.Close()
	for {
		ev, err := s.Next()
		if err != nil {
			return fmt.Errorf("exec in %s: %w", id, err)
		}
		switch ev.Type {
		case agentapi.EventStdout:
			_, err = io.WriteString(c.stdout, ev.Data)
		case agentapi.EventStderr:
			_, err = io.WriteString(c.stderr, ev.Data)
		case agentapi.EventExit:
			return c.execStatus(ev.Result, int64(maxOutput))
		}
		if err != nil {
			return fmt.Errorf("write output: %w", err)
		}
	}
}

// execStatus is commandStatus for an exec's result, except that output cut
// at the cap (maxOutput, 0: the agent's) is said on stderr and fails: with
// the command's status when that is not 0, else exitOutputCut.
func (c *cli) execStatus(res agentapi.ExecResult, maxOutput int64) error {
	err := c.commandStatus(res.ExitCode, res.Signal, res.TimedOut)
	if !res.Truncated {
		return err
	}
	if maxOutput > 0 {
		fmt.Fprintf(c.stderr, "quarry: output over --max-output %d bytes: the rest was discarded (raise --max-output, or leave it out to stream all of it)\n", maxOutput)
	} else {
		fmt.Fprintln(c.stderr, "quarry: output over the sandbox agent's cap: the rest was discarded")
	}
	if err != nil {
		return err
	}
	return &exitError{code: exitOutputCut}
}

// sizeFlag is a flag of a number of bytes: a whole number with an optional
// unit, k, M or G (powers of 1024; also written Ki, KiB, KB, and so on).
type sizeFlag int64

func (s *sizeFlag) String() string {
	if s == nil || *s == 0 {
		return ""
	}
	return strconv.FormatInt(int64(*s), 10)
}

func (s *sizeFlag) Set(v string) error {
	num, unit := v, ""
	if i := strings.IndexFunc(v, func(r rune) bool { return r < '0' || r > '9' }); i >= 0 {
		num, unit = v[:i], v[i:]
	}
	mult := int64(0)
	switch strings.ToLower(unit) {
	case "", "b":
		mult = 1
	case "k", "ki", "kib", "kb":
		mult = 1 << 10
	case "m", "mi", "mib", "mb":
		mult = 1 << 20
	case "g", "gi", "gib", "gb":
		mult = 1 << 30
	}
	n, err := strconv.ParseInt(num, 10, 64)
	switch {
	case mult == 0 || err != nil:
		return fmt.Errorf("want a number of bytes such as 1048576, 512k, 64Mi or 1G, got %q", v)
	case n > math.MaxInt64/mult:
		return fmt.Errorf("%q is too large", v)
	}
	*s = sizeFlag(n * mult)
	return nil
}

// signalNumber is the number of a signal a command commonly dies of, for
// the shell convention of exiting with 128+n; 0 for others.
func signalNumber(name string) int {
	switch strings.TrimPrefix(name, "SIG") {
	case "HUP":
		return 1
	case "INT":
		return 2
	case "QUIT":
		return 3
	case "ABRT":
		return 6
	case "KILL":
		return 9
	case "SEGV":
		return 11
	case "PIPE":
		return 13
	case "ALRM":
		return 14
	case "TERM":
		return 15
	}
	return 0
}

// commandStatus turns a remote exit status into run's result: nil for 0,
// else an *exitError with the status (128+n for a signal, as shells do),
// after saying on stderr why a command was killed.
func (c *cli) commandStatus(code int, signal string, timedOut bool) error {
	switch {
	case timedOut:
		fmt.Fprintln(c.stderr, "quarry: command timed out")
	case signal != "":
		fmt.Fprintf(c.stderr, "quarry: command killed by %s\n", signal)
	}
	if code < 0 {
		code = 255
		if n := signalNumber(signal); n > 0 {
			code = 128 + n
		}
	}
	if code == 0 {
		return nil
	}
	return &exitError{code: code}
}

func runShell(ctx context.Context, c *cli, args []string) (err error) {
	fs := c.flags("sandbox shell")
	var f commandFlags
	f.register(fs)
	pos, cl, err := c.start(fs, args, 1, 1)
	if err != nil {
		return err
	}
	timeoutMS, err := f.timeoutMS()
	if err != nil {
		return err
	}
	id := pos[0]
	ses, err := cl.CreateSession(ctx, id, agentapi.SessionCreateRequest{Env: f.env, Cwd: f.cwd})
	if err != nil {
		return fmt.Errorf("create session in %s: %w", id, err)
	}
	open := true
	defer func() {
		if !open {
			return
		}
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeTimeout)
		defer cancel()
		if cerr := cl.CloseSession(cctx, id, ses.ID); cerr != nil {
			err = errors.Join(err, fmt.Errorf("close session %s: %w", ses.ID, cerr))
		}
	}()
	fmt.Fprintf(c.stderr, "session %s in %s (Ctrl-D ends it)\n", ses.ID, id)

	sc := bufio.NewScanner(c.stdin)
	sc.Buffer(make([]byte, 0, 64<<10), maxShellLine)
	last := 0
	for {
		if last == 0 {
			fmt.Fprintf(c.stderr, "%s$ ", id)
		} else {
			fmt.Fprintf(c.stderr, "%s [%d]$ ", id, last)
		}
		if !sc.Scan() {
			break
		}
		line := sc.Text()
		if strings.TrimSpace(line) == "" {
			continue
		}
		res, err := cl.RunSession(ctx, id, ses.ID, agentapi.SessionRunRequest{Command: line, TimeoutMS: timeoutMS})
		if err != nil {
			if client.IsNotFound(err) {
				open = false // the session is gone already
			}
			return fmt.Errorf("run in session %s: %w", ses.ID, err)
		}
		out := res.Output
		if out != "" && !strings.HasSuffix(out, "\n") {
			out += "\n"
		}
		if _, err := io.WriteString(c.stdout, out); err != nil {
			return fmt.Errorf("write output: %w", err)
		}
		switch {
		case res.TimedOut:
			fmt.Fprintln(c.stderr, "quarry: command timed out; the session is still usable")
		case res.Truncated:
			fmt.Fprintln(c.stderr, "quarry: output truncated")
		}
		last = res.ExitCode
		if res.Closed {
			open = false
			return c.commandStatus(last, "", false)
		}
	}
	fmt.Fprintln(c.stderr)
	if err := sc.Err(); err != nil {
		return fmt.Errorf("read stdin: %w", err)
	}
	return nil
}
