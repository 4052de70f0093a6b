package execagent

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

// readChunk is the size of one read from a command's output pipe.
const readChunk = 32 << 10

// shellInfo is the shell that runs command strings and sessions.
type shellInfo struct {
	Path string
	Kind string // "bash" or "sh"
}

// detectShell returns the configured shell, or bash when present, else /bin/sh.
func detectShell(path string) (shellInfo, error) {
	if path == "" {
		for _, p := range []string{"/bin/bash", "/usr/bin/bash", "/bin/sh"} {
			if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
				path = p
				break
			}
		}
		if path == "" {
			return shellInfo{}, errors.New("detect shell: neither bash nor /bin/sh found; set QUARRY_AGENT_SHELL")
		}
	}
	kind := "sh"
	if strings.HasPrefix(filepath.Base(path), "bash") {
		kind = "bash"
	}
	return shellInfo{Path: path, Kind: kind}, nil
}

// maxInlineCommand is the longest command string passed to the shell as an
// argument ("-c"); a longer one is written to a script file in StateDir,
// because Linux bounds each argument (MAX_ARG_STRLEN, 128 KiB) and all of
// them together (ARG_MAX).
const maxInlineCommand = 64 << 10

// maxArgString is Linux's MAX_ARG_STRLEN: the longest argument or "K=V"
// environment string of a new process, its terminating NUL included.
const maxArgString = 32 * 4096

// cmdSpec is a validated command: what to run, where and with what.
type cmdSpec struct {
	argv  []string // argv[0] already resolved to a path
	env   []string
	dir   string
	stdin []byte // nil: /dev/null (unless stdinPipe)
	// stdinPipe: without stdin, a stdin pipe whose write end
	// (runningCmd.inW) the caller writes and closes (envd's SendInput).
	stdinPipe bool
	script    string // a command too long for argv; prepare writes it to a file
}

// prepare returns spec ready to start: a long command (spec.script) is
// written to a private script file in StateDir (mode 0600) that the shell
// runs ("bash FILE" in place of "bash -c command": the same semantics —
// exit codes, stdin, no positional parameters — but $0 names the file).
// cleanup removes the file; call it once the process has ended (or failed
// to start).
func (s *Server) prepare(spec cmdSpec) (cmdSpec, func(), error) {
	if spec.script == "" {
		return spec, func() {}, nil
	}
	f, err := os.CreateTemp(s.cfg.StateDir, "cmd-*.sh") // mode 0600
	if err != nil {
		return spec, nil, fmt.Errorf("create command script: %w", err)
	}
	cleanup := func() { _ = os.Remove(f.Name()) }
	_, err = f.WriteString(spec.script)
	if e := f.Close(); err == nil {
		err = e
	}
	if err != nil {
		cleanup()
		return spec, nil, fmt.Errorf("write command script: %w", err)
	}
	spec.argv = []string{s.shell.Path, f.Name()}
	return spec, cleanup, nil
}

// startError explains a failed start of spec: E2BIG (arguments and
// environment over the kernel's limit) is bad input naming the bigger of
// the two, anything else is wrapped as "action".
func startError(action string, argv, env []string, err error) error {
	if errors.Is(err, errClosed) {
		return err
	}
	if errors.Is(err, syscall.E2BIG) {
		argBytes, envBytes := stringsSize(argv), stringsSize(env)
		field := "env"
		if argBytes > envBytes {
			field = "argv"
		}
		return invalid(field, "the arguments (%d bytes) and environment (%d bytes) together exceed the kernel's limit for a new process",
			argBytes, envBytes)
	}
	return fmt.Errorf("%s: %w", action, err)
}

// stringsSize is the room strings take in a new process's argument area.
func stringsSize(ss []string) int {
	n := 0
	for _, v := range ss {
		n += len(v) + 1 + 8 // NUL and pointer
	}
	return n
}

// argTooLong says why a string of n bytes cannot be one argument or one
// "K=V" variable of a new process, or returns "" when it can.
func argTooLong(n int) string {
	if n+1 > maxArgString {
		return fmt.Sprintf("%d bytes exceeds the kernel's limit for a new process (%d bytes per argument or variable)",
			n, maxArgString-1)
	}
	return ""
}

// commandSpec validates the command fields shared by exec and processes.
func (s *Server) commandSpec(command string, argv []string, env map[string]string, cwd string) (cmdSpec, error) {
	var spec cmdSpec
	switch {
	case command != "" && len(argv) > 0:
		return spec, invalid("command", "set either command or argv, not both")
	case command == "" && len(argv) == 0:
		return spec, invalid("command", "required (or argv)")
	case strings.ContainsRune(command, 0):
		return spec, invalid("command", "contains a NUL byte")
	}
	for i, a := range argv {
		field := fmt.Sprintf("argv[%d]", i)
		if strings.ContainsRune(a, 0) {
			return spec, invalid(field, "contains a NUL byte")
		}
		if msg := argTooLong(len(a)); msg != "" {
			return spec, invalid(field, "%s", msg)
		}
	}
	extra, err := envList("env", env)
	if err != nil {
		return spec, err
	}
	dir, err := s.resolveCwd(cwd)
	if err != nil {
		return spec, err
	}
	spec.env = s.commandEnv(extra)
	spec.dir = dir
	if command != "" {
		if len(command) > maxInlineCommand {
			spec.script = command
			return spec, nil
		}
		spec.argv = []string{s.shell.Path, "-c", command}
		return spec, nil
	}
	if argv[0] == "" {
		return spec, invalid("argv[0]", "must not be empty")
	}
	path, err := lookPath(argv[0], dir, spec.env)
	if err != nil {
		return spec, invalid("argv[0]", "%s", err.Error())
	}
	spec.argv = append([]string{path}, argv[1:]...)
	return spec, nil
}

// resolveCwd resolves a command's cwd (empty: the workdir) and checks that
// it is a directory.
func (s *Server) resolveCwd(cwd string) (string, error) {
	if cwd == "" {
		return s.cfg.Workdir, nil
	}
	p, err := s.resolvePath("cwd", cwd)
	if err != nil {
		return "", err
	}
	fi, err := os.Stat(p)
	if err != nil {
		return "", invalid("cwd", "%q: no such directory", cwd)
	}
	if !fi.IsDir() {
		return "", invalid("cwd", "%q is not a directory", cwd)
	}
	return p, nil
}

// runLimits validates a request's timeout_ms and max_output_bytes (0: the
// defaults).
func (s *Server) runLimits(timeoutMS, maxOutput int64) (time.Duration, int64, error) {
	timeout, err := s.timeout(timeoutMS)
	if err != nil {
		return 0, 0, err
	}
	limit, err := s.outputCap(maxOutput)
	if err != nil {
		return 0, 0, err
	}
	return timeout, limit, nil
}

// timeout validates a request's timeout_ms (0: the default).
func (s *Server) timeout(ms int64) (time.Duration, error) {
	switch {
	case ms < 0:
		return 0, invalid("timeout_ms", "must be non-negative, got %d", ms)
	case ms == 0:
		return s.cfg.DefaultTimeout, nil
	case ms > s.cfg.MaxTimeout.Milliseconds():
		return 0, invalid("timeout_ms", "%d is above the agent's maximum of %d", ms, s.cfg.MaxTimeout.Milliseconds())
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// outputCap validates a request's max_output_bytes (0: the default).
func (s *Server) outputCap(n int64) (int64, error) {
	switch {
	case n < 0:
		return 0, invalid("max_output_bytes", "must be non-negative, got %d", n)
	case n == 0:
		return s.cfg.DefaultOutputBytes, nil
	case n > s.cfg.MaxOutputBytes:
		return 0, invalid("max_output_bytes", "%d is above the agent's maximum of %d", n, s.cfg.MaxOutputBytes)
	}
	return n, nil
}

// lookPath finds name like a shell would, with the child's PATH and cwd.
func lookPath(name, dir string, env []string) (string, error) {
	check := func(p string) error {
		fi, err := os.Stat(p)
		if err != nil {
			return err
		}
		if fi.IsDir() || fi.Mode()&0o111 == 0 {
			return fmt.Errorf("%q is not an executable file", p)
		}
		return nil
	}
	if strings.Contains(name, "/") {
		p := name
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		if err := check(p); err != nil {
			return "", fmt.Errorf("%q: not an executable file", name)
		}
		return p, nil
	}
	path := "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	for _, d := range filepath.SplitList(path) {
		if d == "" {
			d = "."
		}
		if !filepath.IsAbs(d) {
			d = filepath.Join(dir, d)
		}
		p := filepath.Join(d, name)
		if check(p) == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("%q: executable file not found in PATH", name)
}

// newCmd builds an exec.Cmd for spec (process group and env are set by
// childTable.start; Env is always explicit).
func newCmd(spec cmdSpec) *exec.Cmd {
	return &exec.Cmd{Path: spec.argv[0], Args: spec.argv, Env: spec.env, Dir: spec.dir}
}

// Output streams of a command.
const (
	streamStdout = 1
	streamStderr = 2
)

// runningCmd is a started one-shot command with its pipes.
type runningCmd struct {
	s       *Server
	cmd     *exec.Cmd
	start   time.Time
	oom     oomMark    // the OOM kill count at start
	pipes   []*os.File // read ends, one per stream
	inW     *os.File   // stdin write end, or nil; drain closes it
	readers sync.WaitGroup
	stdinWG sync.WaitGroup
	cleanup func() // removes the command's script file, if any
}

// startCommand starts spec and its output readers, which call sink(stream,
// data) for each chunk; data is only valid during the call, and calls for
// one stream are sequential. sink returns false to discard the rest.
func (s *Server) startCommand(spec cmdSpec, sink func(stream int, data []byte)) (*runningCmd, error) {
	spec, cleanup, err := s.prepare(spec)
	if err != nil {
		return nil, err
	}
	rc := &runningCmd{s: s, cmd: newCmd(spec), cleanup: cleanup}
	var parentClose []*os.File
	fail := func(err error) (*runningCmd, error) {
		for _, f := range append(parentClose, rc.pipes...) {
			_ = f.Close()
		}
		if rc.inW != nil {
			_ = rc.inW.Close()
		}
		cleanup()
		return nil, err
	}
	for range 2 {
		r, w, err := os.Pipe()
		if err != nil {
			return fail(fmt.Errorf("create output pipe: %w", err))
		}
		rc.pipes = append(rc.pipes, r)
		parentClose = append(parentClose, w)
	}
	rc.cmd.Stdout, rc.cmd.Stderr = parentClose[0], parentClose[1]
	if spec.stdin != nil || spec.stdinPipe {
		r, w, err := os.Pipe()
		if err != nil {
			return fail(fmt.Errorf("create stdin pipe: %w", err))
		}
		rc.cmd.Stdin, rc.inW = r, w
		parentClose = append(parentClose, r)
	}
	rc.start, rc.oom = time.Now(), s.children.oom.mark()
	if err := s.children.start(rc.cmd); err != nil {
		return fail(startError("start command", spec.argv, spec.env, err))
	}
	for _, f := range parentClose {
		_ = f.Close()
	}
	for i, r := range rc.pipes {
		stream := streamStdout + i
		rc.readers.Add(1)
		go func() {
			defer rc.readers.Done()
			readStream(r, func(b []byte) { sink(stream, b) })
		}()
	}
	if spec.stdin != nil {
		rc.stdinWG.Add(1)
		go func() {
			defer rc.stdinWG.Done()
			_, _ = rc.inW.Write(spec.stdin) // EPIPE when the command does not read it all
			_ = rc.inW.Close()
		}()
	}
	return rc, nil
}

// readStream reads r until EOF or error, passing chunks that end at UTF-8
// character boundaries to emit (a split character is carried over).
func readStream(r *os.File, emit func([]byte)) {
	buf := make([]byte, readChunk+utf8Carry)
	carry := 0
	for {
		n, err := r.Read(buf[carry : carry+readChunk])
		if n > 0 {
			total := carry + n
			cut := utf8Split(buf[:total])
			if cut > 0 {
				emit(buf[:cut])
			}
			carry = copy(buf, buf[cut:total])
		}
		if err != nil {
			if carry > 0 {
				emit(buf[:carry])
			}
			return
		}
	}
}

// utf8Split returns how many bytes of b end at a UTF-8 character boundary:
// a trailing incomplete (but so far valid) sequence is held back, so a
// character split across two reads is not turned into two U+FFFD.
func utf8Split(b []byte) int {
	n := len(b)
	for i := 1; i <= utf8.UTFMax-1 && i <= n; i++ {
		c := b[n-i]
		if c < 0x80 { // ASCII: boundary after it
			return n
		}
		if utf8.RuneStart(c) {
			need := 0
			switch {
			case c&0xE0 == 0xC0:
				need = 2
			case c&0xF0 == 0xE0:
				need = 3
			case c&0xF8 == 0xF0:
				need = 4
			default:
				return n
			}
			if i < need {
				return n - i
			}
			return n
		}
	}
	return n
}

// utf8Carry is the room for an incomplete UTF-8 sequence carried between reads.
const utf8Carry = 4

// execOutcome is how a one-shot command ended.
type execOutcome struct {
	exitCode int
	signal   string
	duration time.Duration
	timedOut bool
	// oomKilled: the kernel's OOM killer killed it (oomCounter.killedSince).
	oomKilled bool
	// killedByShutdown: the command died of a signal while the agent was
	// closing (Close kills every process group it started).
	killedByShutdown bool
}

// wait waits for the command until it exits, timeout passes or ctx is done
// (then the whole process group is killed), then for its output (at most
// DrainTimeout after the exit), and releases the pipes.
func (rc *runningCmd) wait(ctx context.Context, timeout time.Duration) execOutcome {
	s := rc.s
	pgid := rc.cmd.Process.Pid
	type waited struct{ ps *os.ProcessState }
	done := make(chan waited, 1)
	go func() {
		ps, _ := s.children.wait(rc.cmd)
		done <- waited{ps}
	}()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	var out execOutcome
	var w waited
	killed := false // by the agent: its death is no OOM kill
	select {
	case w = <-done:
	case <-timer.C:
		// A command that exited before its deadline finished on its own,
		// even when its wait was late (the reaper held the table, e.g.
		// sweeping a fork bomb's zombies): its result is its own.
		if !hasExited(pgid) {
			out.timedOut, killed = true, true
			s.children.killGroup(pgid, syscall.SIGKILL)
		}
		w = <-done
	case <-ctx.Done():
		killed = true
		s.children.killGroup(pgid, syscall.SIGKILL)
		w = <-done
	case <-s.ctx.Done():
		killed = true
		s.children.killGroup(pgid, syscall.SIGKILL)
		w = <-done
	}
	out.duration = time.Since(rc.start)
	rc.cleanup()
	rc.drain(ctx)
	out.exitCode, out.signal = exitStatus(w.ps)
	if out.timedOut {
		out.exitCode = -1 // killed at its deadline: never the status of an exit seen too late
	}
	out.oomKilled = !killed && s.children.oomKilled(rc.oom, out.exitCode, out.signal, pgid)
	out.killedByShutdown = out.signal != "" && s.closing() // after the wait: see closing
	return out
}

// drain waits for the output readers, at most DrainTimeout (or until ctx is
// done), then closes the pipes and the stdin writer.
func (rc *runningCmd) drain(ctx context.Context) {
	readersDone := make(chan struct{})
	go func() {
		rc.readers.Wait()
		close(readersDone)
	}()
	t := time.NewTimer(rc.s.cfg.DrainTimeout)
	select {
	case <-readersDone:
	case <-t.C:
	case <-ctx.Done():
	}
	t.Stop()
	for _, p := range rc.pipes {
		_ = p.Close() // unblocks readers still waiting on a leftover child
	}
	<-readersDone
	if rc.inW != nil {
		_ = rc.inW.Close()
	}
	rc.stdinWG.Wait()
}

// exitStatus returns the exit code (-1 when killed by a signal) and the
// signal name.
func exitStatus(ps *os.ProcessState) (int, string) {
	if ps == nil {
		return -1, ""
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return -1, signalName(ws.Signal())
	}
	return ps.ExitCode(), ""
}

// signalName names a signal "SIGKILL"; unknown signals "SIG<n>".
func signalName(sig unix.Signal) string {
	if name := unix.SignalName(sig); name != "" {
		return name
	}
	return "SIG" + strconv.Itoa(int(sig))
}

// capBuffer collects up to max bytes and remembers whether more came.
type capBuffer struct {
	buf       []byte
	max       int64
	truncated bool
}

func (c *capBuffer) write(b []byte) {
	room := c.max - int64(len(c.buf))
	if int64(len(b)) > room {
		b = b[:max(room, 0)]
		c.truncated = true
	}
	c.buf = append(c.buf, b...)
}

// handleExec answers POST /v1/exec: JSON, or server-sent events when the
// request accepts text/event-stream.
func (s *Server) handleExec(w http.ResponseWriter, r *http.Request) error {
	var req agentapi.ExecRequest
	if err := s.decodeJSON(w, r, &req); err != nil {
		return err
	}
	spec, err := s.commandSpec(req.Command, req.Argv, req.Env, req.Cwd)
	if err != nil {
		return err
	}
	if spec.stdin, err = execStdin(req); err != nil {
		return err
	}
	timeout, limit, err := s.runLimits(req.TimeoutMS, req.MaxOutputBytes)
	if err != nil {
		return err
	}
	enc, err := outputEncoding(req.Encoding)
	if err != nil {
		return err
	}
	stream := wantsEventStream(r)
	if limit, err = streamLimit(req, stream, limit); err != nil {
		return err
	}
	if stream {
		return s.execStream(w, r, spec, timeout, limit, enc)
	}
	var mu sync.Mutex
	bufs := [3]capBuffer{{}, {max: limit}, {max: limit}}
	rc, err := s.startCommand(spec, func(stream int, data []byte) {
		mu.Lock()
		bufs[stream].write(data)
		mu.Unlock()
	})
	if err != nil {
		return err
	}
	out := rc.wait(r.Context(), timeout)
	if out.killedByShutdown {
		return errKilledByShutdown
	}
	mu.Lock()
	defer mu.Unlock()
	writeJSON(w, http.StatusOK, agentapi.ExecResult{
		ExitCode:   out.exitCode,
		Signal:     out.signal,
		Stdout:     agentapi.EncodeOutput(enc, bufs[streamStdout].buf),
		Stderr:     agentapi.EncodeOutput(enc, bufs[streamStderr].buf),
		DurationMS: out.duration.Milliseconds(),
		TimedOut:   out.timedOut,
		Truncated:  bufs[streamStdout].truncated || bufs[streamStderr].truncated,
		OOMKilled:  out.oomKilled,
	})
	return nil
}

// wantsEventStream reports whether the request asks for server-sent events.
func wantsEventStream(r *http.Request) bool {
	return strings.Contains(r.Header.Get("Accept"), "text/event-stream")
}

// streamChunk is one output chunk on its way to an event stream.
type streamChunk struct {
	stream int
	data   []byte
}

// execStream runs spec and streams its output as server-sent events: stdout
// and stderr chunks as produced (in encoding enc, at most limit bytes of
// each stream), keep-alive comments while quiet, then one exit event. At
// most a few chunks are held at a time: a slow client slows the command. A
// client that goes away kills the command.
func (s *Server) execStream(w http.ResponseWriter, r *http.Request, spec cmdSpec, timeout time.Duration, limit int64, enc string) error {
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	chunks := make(chan streamChunk, 16)
	var mu sync.Mutex
	sent := [3]int64{}
	truncated := false
	rc, err := s.startCommand(spec, func(stream int, data []byte) {
		mu.Lock()
		room := limit - sent[stream]
		if int64(len(data)) > room {
			data = data[:max(room, 0)]
			truncated = true
		}
		sent[stream] += int64(len(data))
		mu.Unlock()
		if len(data) == 0 {
			return
		}
		select {
		case chunks <- streamChunk{stream: stream, data: append([]byte(nil), data...)}:
		case <-ctx.Done():
		}
	})
	if err != nil {
		return err
	}
	done := make(chan execOutcome, 1)
	go func() { done <- rc.wait(ctx, timeout) }()

	ev := newEventWriter(w)
	ev.start()
	keep := time.NewTicker(s.cfg.KeepAlive)
	defer keep.Stop()
	send := func(c streamChunk) {
		name := agentapi.EventStdout
		if c.stream == streamStderr {
			name = agentapi.EventStderr
		}
		if ev.event(name, agentapi.StreamChunk{Data: agentapi.EncodeOutput(enc, c.data)}) != nil {
			cancel() // the client is gone: kill the command
		}
	}
	for {
		select {
		case c := <-chunks:
			send(c)
			keep.Reset(s.cfg.KeepAlive)
		case <-keep.C:
			if ev.comment("keep-alive") != nil {
				cancel()
			}
		case out := <-done:
			for pending := true; pending; {
				select {
				case c := <-chunks:
					send(c)
				default:
					pending = false
				}
			}
			if out.killedByShutdown {
				_ = ev.event(agentapi.EventError, agentapi.ErrorDetail{Code: agentapi.CodeGone, Message: errKilledByShutdown.Error()})
				return nil
			}
			mu.Lock()
			res := agentapi.ExecResult{
				ExitCode:   out.exitCode,
				Signal:     out.signal,
				DurationMS: out.duration.Milliseconds(),
				TimedOut:   out.timedOut,
				Truncated:  truncated,
				OOMKilled:  out.oomKilled,
			}
			mu.Unlock()
			_ = ev.event(agentapi.EventExit, res)
			return nil
		}
	}
}
