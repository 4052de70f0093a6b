package execagent

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

// Session protocol (see docs/ARCHITECTURE.md, "Sessions").
//
// The shell runs interactive (`bash --noprofile --norc --noediting -i`, or
// `sh -i` when the image has no bash) in its own process group, with empty
// prompts and history off; its stdin is a control pipe. For each run the
// agent rewrites the session's command file (in StateDir) and writes one
// control line:
//
//	. FILE </dev/null 2>&98 98>&- 99>&-; printf '%d\n' $? >&99   (sh: `command .`, fds 8 and 9)
//
// The exit status comes back on a dedicated status pipe (fd 99, or 9 for
// sh, whose redirections stop at fd 9), never parsed out of the output;
// stdout and stderr share one output pipe. The shell's own stderr is
// /dev/null once it is initialized: a command's stderr is the output pipe,
// kept for it at fd 98 (sh: 8), so the shell's diagnostics between runs
// never land in a run's output (an interactive bash that reaps a command
// killed by the interrupt may print "tcsetattr: Inappropriate ioctl for
// device" after the resync, which the next run would otherwise get). Sourcing a file rather than
// eval-ing a string read from a pipe was measured: it avoids bash's
// byte-at-a-time `read -d ""`, `return` ends just the command, a syntax
// error returns 2 and the session lives on, and because bash runs sourced
// text non-interactively, interactive noise stays out of the output (no job
// notices like "[1] 123", no "exit" on exit). The command's stdin is
// /dev/null and the status fd is closed for it, so it can neither eat the
// control stream nor clobber the status pipe. Commands of sh sessions
// should not use fds 8 and 9 themselves.
//
// Output framing without markers: one goroutine owns the output pipe and
// appends to the current run (or discards between runs, so background jobs
// never block); another owns the status pipe. When a status line arrives,
// everything the command wrote is already in the output pipe, so draining
// it without waiting gives exactly that run's output.
//
// Timeouts: SIGINT to the session's process group kills the foreground
// command and makes the interactive shell abandon the command line without
// exiting, even inside a builtin loop; a resync line (printf of a token to
// the status pipe) confirms the shell is back. A timed-out run reports exit
// code 130 (128+SIGINT). If the shell is not back within InterruptGrace,
// the agent SIGKILLs the group's other members, then interrupts the shell
// again, then kills the session (the run reports closed).
const (
	bashInit    = "exec 99>&3 98>&2 3>&- 2>/dev/null; set +o history +H +m; PS1= PS2= PROMPT_COMMAND=; unset HISTFILE; printf 'ready\\n' >&99\n"
	bashRunLine = ". %s </dev/null 2>&98 98>&- 99>&-; printf '%%d\\n' $? >&99\n"
	shInit      = "exec 9>&3 8>&2 3>&- 2>/dev/null; set +m; PS1= PS2=; printf 'ready\\n' >&9\n"
	shRunLine   = "command . %s </dev/null 2>&8 8>&- 9>&-; printf '%%d\\n' $? >&9\n"
	// bashStatusPrefix starts a bash run line whose run must see $? = N: it
	// sources the status file, which holds "return N" (no fork). sh uses
	// shStatusPrefix, a subshell: dash and busybox abandon the line when
	// a sourced "return N" fails under set -e. "&& :" keeps a session under
	// set -e alive (a failure that is not the last of an && list is no
	// error).
	bashStatusPrefix = ". %s && :; "
	shStatusPrefix   = "(exit %d) && :; "
	// resyncLine prints a token (%s) on the status pipe (fd %d).
	resyncLine = "printf '%%s\\n' %s >&%d\n"

	// exitInterrupted is the exit code of a run interrupted on timeout.
	exitInterrupted = 130
	// sessionStartTimeout bounds a new shell's start-up handshake.
	sessionStartTimeout = 10 * time.Second
)

// Run states.
const (
	runRunning = iota
	runInterrupting
	runDone
)

// sessionRun is one command in a session.
type sessionRun struct {
	out      capBuffer
	state    int
	exitCode int
	timedOut bool
	closed   bool
	token    string // resync token while interrupting
	done     chan struct{}
}

// session is one persistent shell.
type session struct {
	srv     *Server
	id      string
	kind    string // "bash" or "sh"
	created time.Time
	cmd     *exec.Cmd
	pgid    int
	cmdFile string   // the command of the current run, sourced by the shell
	cmdF    *os.File // cmdFile, kept open; rewritten in place by each run
	runLine string   // the control line of a run
	rcFile  string   // bash: "return N", sourced before a run to set $? to the previous run's exit code
	rcF     *os.File // rcFile, kept open; rewritten in place when the code changes
	rcCode  int      // the code rcFile holds (0: not written yet)

	stdin   *os.File // control pipe (agent writes)
	statusR *os.File
	outR    *os.File
	outFD   int // outR's descriptor, for draining outside the poller
	writeMu sync.Mutex

	busy atomic.Bool

	mu       sync.Mutex // guards everything below and reads of outFD
	run      *sessionRun
	seq      int
	lastExit int // exit code of the latest run; the next run starts with $? set to it
	dead     bool
	fdClosed bool
	ready    chan struct{} // closed when the start-up handshake arrived
	exited   chan struct{} // closed when the shell has been waited for
}

// sessionTable holds the live sessions.
type sessionTable struct {
	srv     *Server
	mu      sync.Mutex
	m       map[string]*session
	pending int // sessions starting, counted against MaxSessions
}

func newSessionTable(s *Server) *sessionTable {
	return &sessionTable{srv: s, m: map[string]*session{}}
}

func newID(prefix string) string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// create starts a session shell and waits for its handshake.
func (t *sessionTable) create(env []string, dir string) (*session, error) {
	s := t.srv
	t.mu.Lock()
	if len(t.m)+t.pending >= s.cfg.MaxSessions {
		t.mu.Unlock()
		return nil, fmt.Errorf("too many sessions (the maximum is %d); close one first: %w", s.cfg.MaxSessions, errConflict)
	}
	t.pending++
	t.mu.Unlock()
	ss := &session{srv: s, id: newID("ses-"), kind: s.shell.Kind, created: time.Now(),
		ready: make(chan struct{}), exited: make(chan struct{})}
	err := ss.start(env, dir)
	t.mu.Lock()
	defer t.mu.Unlock()
	t.pending--
	if err != nil {
		return nil, err
	}
	select {
	case <-ss.exited: // died right after its handshake
		return nil, errors.New("start session shell: the shell exited during start-up")
	default:
	}
	t.m[ss.id] = ss
	return ss, nil
}

func (t *sessionTable) get(id string) (*session, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	ss, ok := t.m[id]
	if !ok || ss.hasExited() {
		return nil, fmt.Errorf("session %q: %w", id, errNotFound)
	}
	return ss, nil
}

func (t *sessionTable) remove(ss *session) {
	t.mu.Lock()
	if t.m[ss.id] == ss {
		delete(t.m, ss.id)
	}
	t.mu.Unlock()
}

func (t *sessionTable) list() []agentapi.SessionInfo {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]agentapi.SessionInfo, 0, len(t.m))
	for _, ss := range t.m {
		if !ss.hasExited() {
			out = append(out, ss.info())
		}
	}
	slices.SortFunc(out, func(a, b agentapi.SessionInfo) int { return a.CreatedAt.Compare(b.CreatedAt) })
	return out
}

// closeAll kills every session and waits for their shells.
func (t *sessionTable) closeAll() {
	for _, ss := range lockedValues(&t.mu, t.m) {
		ss.close()
	}
}

// hasExited reports whether the shell has exited (the session is being
// removed).
func (ss *session) hasExited() bool {
	select {
	case <-ss.exited:
		return true
	default:
		return false
	}
}

func (ss *session) info() agentapi.SessionInfo {
	return agentapi.SessionInfo{ID: ss.id, Shell: ss.kind, Busy: ss.busy.Load(), CreatedAt: ss.created}
}

// start launches the shell, its pipe owners and its waiter.
func (ss *session) start(env []string, dir string) error {
	s := ss.srv
	var files []*os.File // every descriptor created here, for cleanup on failure
	fail := func(err error) error {
		for _, f := range files {
			_ = f.Close()
		}
		for _, p := range []string{ss.cmdFile, ss.rcFile} {
			if p != "" {
				_ = os.Remove(p)
			}
		}
		return err
	}
	pipe := func() (*os.File, *os.File, error) {
		r, w, err := os.Pipe()
		if err != nil {
			return nil, nil, fmt.Errorf("create session pipe: %w", err)
		}
		files = append(files, r, w)
		return r, w, nil
	}
	stdinR, stdinW, err := pipe()
	if err != nil {
		return fail(err)
	}
	statusR, statusW, err := pipe()
	if err != nil {
		return fail(err)
	}
	outR, outW, err := pipe()
	if err != nil {
		return fail(err)
	}
	// stateFile creates a private file of the session in StateDir.
	stateFile := func(ext string) (string, *os.File, error) {
		p := filepath.Join(s.cfg.StateDir, ss.id+ext)
		f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
		if err != nil {
			return "", nil, fmt.Errorf("create session file: %w", err)
		}
		files = append(files, f)
		return p, f, nil
	}
	if ss.cmdFile, ss.cmdF, err = stateFile(".cmd"); err != nil {
		return fail(err)
	}
	if ss.kind == "bash" {
		if ss.rcFile, ss.rcF, err = stateFile(".rc"); err != nil {
			return fail(err)
		}
	}
	argv := []string{s.shell.Path, "-i"}
	init, runLine := shInit, shRunLine
	if ss.kind == "bash" {
		argv = []string{s.shell.Path, "--noprofile", "--norc", "--noediting", "-i"}
		init, runLine = bashInit, bashRunLine
	}
	ss.runLine = fmt.Sprintf(runLine, shellQuote(ss.cmdFile))
	env = mergeEnv(env, []string{"PS1=", "PS2=", "PROMPT_COMMAND=", "ENV=", "HISTFILE="})
	cmd := &exec.Cmd{Path: argv[0], Args: argv, Env: env, Dir: dir,
		Stdin: stdinR, Stdout: outW, Stderr: outW, ExtraFiles: []*os.File{statusW}}
	if err := s.children.start(cmd); err != nil {
		return fail(startError("start session shell", argv, env, err))
	}
	// The shell has its ends now; keep ours.
	_ = stdinR.Close()
	_ = statusW.Close()
	_ = outW.Close()
	rawOut, err := outR.SyscallConn()
	if err == nil {
		err = rawOut.Control(func(fd uintptr) { ss.outFD = int(fd) })
	}
	if err != nil {
		s.children.killGroup(cmd.Process.Pid, unix.SIGKILL)
		_, _ = s.children.wait(cmd)
		return fail(fmt.Errorf("prepare session output: %w", err))
	}
	ss.cmd, ss.pgid = cmd, cmd.Process.Pid
	ss.stdin, ss.statusR, ss.outR = stdinW, statusR, outR

	s.wg.Add(3)
	go func() { defer s.wg.Done(); ss.readOutput(rawOut) }()
	go func() { defer s.wg.Done(); ss.readStatus() }()
	go func() { defer s.wg.Done(); ss.waitShell() }()

	if err := ss.write(init, time.Now().Add(sessionStartTimeout)); err != nil {
		ss.close()
		return fmt.Errorf("start session shell: %w", err)
	}
	t := time.NewTimer(sessionStartTimeout)
	defer t.Stop()
	select {
	case <-ss.ready:
		return nil
	case <-ss.exited:
		ss.close()
		return errors.New("start session shell: the shell exited during start-up")
	case <-t.C:
		ss.close()
		return fmt.Errorf("start session shell: no handshake within %s", sessionStartTimeout)
	}
}

// write writes to the shell's control stdin.
func (ss *session) write(text string, deadline time.Time) error {
	ss.writeMu.Lock()
	defer ss.writeMu.Unlock()
	_ = ss.stdin.SetWriteDeadline(deadline)
	if _, err := ss.stdin.WriteString(text); err != nil {
		return fmt.Errorf("write to session shell: %w", err)
	}
	return nil
}

// readOutput owns the output pipe: it appends what arrives to the current
// run, or discards it between runs (so background jobs never block), until
// the pipe is closed.
func (ss *session) readOutput(raw syscall.RawConn) {
	buf := make([]byte, readChunk)
	for {
		eof := false
		err := raw.Read(func(fd uintptr) bool {
			ss.mu.Lock()
			defer ss.mu.Unlock()
			n, err := unix.Read(int(fd), buf)
			switch {
			case n > 0:
				ss.appendLocked(buf[:n])
				return true
			case errors.Is(err, unix.EAGAIN):
				return false
			case errors.Is(err, unix.EINTR):
				return true
			default: // EOF or error
				eof = true
				return true
			}
		})
		if err != nil || eof {
			return
		}
	}
}

func (ss *session) appendLocked(b []byte) {
	if r := ss.run; r != nil && r.state != runDone {
		r.out.write(b)
	}
}

// drainLocked reads what is left in the output pipe without waiting.
func (ss *session) drainLocked() {
	if ss.fdClosed {
		return
	}
	var buf [readChunk]byte
	for {
		n, err := unix.Read(ss.outFD, buf[:])
		if n > 0 {
			ss.appendLocked(buf[:n])
			continue
		}
		if errors.Is(err, unix.EINTR) {
			continue
		}
		return // EAGAIN, EOF or error
	}
}

// readStatus owns the status pipe: exit codes complete runs, resync tokens
// complete interrupts, "ready" completes the start-up handshake.
func (ss *session) readStatus() {
	buf := make([]byte, 256)
	var line []byte
	for {
		n, err := ss.statusR.Read(buf)
		for _, c := range buf[:n] {
			if c != '\n' {
				if len(line) < 64 {
					line = append(line, c)
				}
				continue
			}
			ss.onStatus(string(line))
			line = line[:0]
		}
		if err != nil {
			return
		}
	}
}

func (ss *session) onStatus(line string) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if line == "ready" {
		select {
		case <-ss.ready:
		default:
			ss.drainLocked() // discards the start-up noise ("no job control in this shell")
			close(ss.ready)
		}
		return
	}
	r := ss.run
	if r == nil || r.state == runDone {
		return
	}
	switch {
	case r.state == runInterrupting && line == r.token:
		ss.drainLocked()
		ss.finishLocked(r, exitInterrupted, true, false)
	case r.state == runRunning:
		code, err := strconv.Atoi(line)
		if err != nil {
			return
		}
		ss.drainLocked()
		ss.finishLocked(r, code, false, false)
	}
}

func (ss *session) finishLocked(r *sessionRun, code int, timedOut, closed bool) {
	if timedOut && code == 0 {
		code = exitInterrupted // a shell that exited 0 while interrupted did not run the command to success
	}
	r.exitCode, r.timedOut, r.closed = code, timedOut, closed
	r.state = runDone
	close(r.done)
}

// waitShell waits for the shell; when it exits (e.g. "exit 3", or killed),
// the current run completes with closed set, the session's process group is
// killed and the session is removed.
func (ss *session) waitShell() {
	ps, _ := ss.srv.children.wait(ss.cmd)
	code, sig := exitStatus(ps)
	if sig != "" {
		if ws, ok := ps.Sys().(syscall.WaitStatus); ok {
			code = 128 + int(ws.Signal())
		}
	}
	ss.srv.children.killGroup(ss.pgid, unix.SIGKILL) // background jobs die with their session
	ss.mu.Lock()
	ss.dead = true
	ss.mu.Unlock()
	// Leave the table before the last run completes: a client that saw
	// "closed" must find the session gone, from any request it sends next.
	close(ss.exited) // before remove: create checks exited under the table's lock
	ss.srv.sessions.remove(ss)
	ss.mu.Lock()
	if r := ss.run; r != nil && r.state != runDone {
		ss.drainLocked()
		ss.finishLocked(r, code, r.state == runInterrupting, true)
	}
	ss.fdClosed = true
	ss.mu.Unlock()
	_ = ss.outR.Close()
	_ = ss.statusR.Close()
	_ = ss.stdin.Close()
	_ = ss.cmdF.Close()
	_ = os.Remove(ss.cmdFile)
	if ss.rcF != nil {
		_ = ss.rcF.Close()
		_ = os.Remove(ss.rcFile)
	}
}

// close kills the shell and its process group and waits until the session
// is torn down. It is idempotent.
func (ss *session) close() {
	ss.srv.children.killGroup(ss.pgid, unix.SIGKILL)
	<-ss.exited
}

// exec runs one command. Concurrent runs are refused with errBusy.
func (ss *session) exec(ctx context.Context, command string, timeout time.Duration, limit int64) (agentapi.SessionRunResult, error) {
	if !ss.busy.CompareAndSwap(false, true) {
		return agentapi.SessionRunResult{}, fmt.Errorf("session %s is running a command: %w", ss.id, errBusy)
	}
	defer ss.busy.Store(false)
	r := &sessionRun{out: capBuffer{max: limit}, done: make(chan struct{})}
	ss.mu.Lock()
	if ss.dead {
		ss.mu.Unlock()
		return agentapi.SessionRunResult{}, fmt.Errorf("session %q: %w", ss.id, errNotFound)
	}
	ss.run = r
	ss.mu.Unlock()
	start := time.Now()
	deadline := start.Add(timeout)
	var err error
	var line string
	if err = ss.writeCommand(command); err == nil {
		line, err = ss.controlLine()
	}
	if err == nil {
		err = ss.write(line, deadline)
	}
	if err != nil {
		ss.interrupt(r) // finishes the run, or kills the session
	} else {
		timer := time.NewTimer(timeout)
		select {
		case <-r.done:
		case <-timer.C:
			ss.interrupt(r)
		case <-ctx.Done():
			ss.interrupt(r)
		case <-ss.srv.ctx.Done():
			ss.close()
		}
		timer.Stop()
	}
	<-r.done
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.run = nil
	if r.closed && ss.srv.closing() { // after the run ended: see Server.closing
		return agentapi.SessionRunResult{}, errKilledByShutdown
	}
	ss.lastExit = r.exitCode
	return agentapi.SessionRunResult{
		ExitCode:   r.exitCode,
		Output:     ss.hidePaths(r.out.buf),
		DurationMS: time.Since(start).Milliseconds(),
		TimedOut:   r.timedOut,
		Truncated:  r.out.truncated,
		Closed:     r.closed,
	}, nil
}

// hidePaths returns out without the session's command file, which the
// shell names in its error messages ("bash: /dev/shm/quarry-agent-…/ses-….cmd:
// line 1: …"): they read as for a command line ("bash: line 1: …"). The
// file is the agent's; the command is the user's.
func (ss *session) hidePaths(out []byte) string {
	file := []byte(ss.cmdFile + ": ")
	if !bytes.Contains(out, file) {
		return string(out)
	}
	return string(bytes.ReplaceAll(out, file, nil))
}

// controlLine is the line that runs the command file. The shell's $? is 0
// between runs (the status printf), so when the previous run failed the
// line first sets $? to its exit code (bashStatusPrefix, shStatusPrefix): a
// command such as "echo $?" sees the previous run's status, as at a
// terminal. bash's status file is rewritten only when the code changes.
// Only exec calls it (one run at a time).
func (ss *session) controlLine() (string, error) {
	ss.mu.Lock()
	code := ss.lastExit & 0xff
	ss.mu.Unlock()
	switch {
	case code == 0:
		return ss.runLine, nil
	case ss.rcF == nil: // sh
		return fmt.Sprintf(shStatusPrefix, code) + ss.runLine, nil
	}
	if code != ss.rcCode {
		if err := rewriteFile(ss.rcF, "return "+strconv.Itoa(code)+"\n"); err != nil {
			return "", fmt.Errorf("write session status file: %w", err)
		}
		ss.rcCode = code
	}
	return fmt.Sprintf(bashStatusPrefix, shellQuote(ss.rcFile)) + ss.runLine, nil
}

// writeCommand replaces the command file's content with command.
func (ss *session) writeCommand(command string) error {
	if err := rewriteFile(ss.cmdF, command+"\n"); err != nil {
		return fmt.Errorf("write session command: %w", err)
	}
	return nil
}

// rewriteFile replaces f's content. It writes in place and then truncates
// to the new length: truncating to zero before writing would make ext4
// (auto_da_alloc) flush the file on every run.
func rewriteFile(f *os.File, content string) error {
	if _, err := f.WriteAt([]byte(content), 0); err != nil {
		return err
	}
	return f.Truncate(int64(len(content)))
}

// interrupt stops the run r: SIGINT to the process group and a resync
// line. If the shell is not back within InterruptGrace (a command that
// ignores SIGINT), every other member of the group gets SIGKILL; if it still
// is not back, the shell gets SIGINT again; if it still is not back, the
// session is killed. It returns when r is done.
func (ss *session) interrupt(r *sessionRun) {
	grace := ss.srv.cfg.InterruptGrace
	started, ok := ss.resync(r, grace)
	if !started {
		<-r.done // it completed meanwhile
		return
	}
	if !ok {
		ss.close()
		<-r.done
		return
	}
	if waitDone(r.done, grace) {
		return
	}
	for _, pid := range groupMembers(ss.pgid) {
		if pid != ss.pgid {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
	}
	if waitDone(r.done, grace) {
		ss.flush(grace)
		return
	}
	ss.srv.children.signalLeader(ss.pgid, unix.SIGINT)
	if waitDone(r.done, grace) {
		ss.flush(grace)
		return
	}
	ss.srv.log.Warn("session did not come back after an interrupt; killing it", "session", ss.id)
	ss.close()
	<-r.done
}

// resync marks r as interrupting, sends SIGINT to the session's process
// group and writes a resync line whose token completes r when the shell
// prints it. started is false when r was no longer running; ok is false
// when the line could not be written.
func (ss *session) resync(r *sessionRun, grace time.Duration) (started, ok bool) {
	ss.mu.Lock()
	if r.state != runRunning {
		ss.mu.Unlock()
		return false, true
	}
	r.state = runInterrupting
	ss.seq++
	r.token = "R" + strconv.Itoa(ss.seq)
	ss.mu.Unlock()
	ss.srv.children.killGroup(ss.pgid, unix.SIGINT)
	return true, ss.write(fmt.Sprintf(resyncLine, r.token, ss.statusFD()), time.Now().Add(grace)) == nil
}

// statusFD is the status pipe's descriptor in the shell.
func (ss *session) statusFD() int {
	if ss.kind == "sh" {
		return 9
	}
	return 99
}

// flush runs one more resync round trip after an escalated interrupt and
// discards its output: a late SIGINT makes the idle shell print a newline
// (to its stderr, /dev/null, but a command's trap may write to the output),
// which must not land in the next run's output.
func (ss *session) flush(grace time.Duration) {
	r := &sessionRun{state: runInterrupting, done: make(chan struct{})}
	ss.mu.Lock()
	if ss.dead {
		ss.mu.Unlock()
		return
	}
	ss.seq++
	r.token = "R" + strconv.Itoa(ss.seq)
	prev := ss.run
	ss.run = r
	ss.mu.Unlock()
	if ss.write(fmt.Sprintf(resyncLine, r.token, ss.statusFD()), time.Now().Add(grace)) == nil {
		waitDone(r.done, grace)
	}
	ss.mu.Lock()
	ss.run = prev
	ss.mu.Unlock()
}

// waitDone waits for done at most d.
func waitDone(done <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}

// handleSessionCreate answers POST /v1/sessions.
func (s *Server) handleSessionCreate(w http.ResponseWriter, r *http.Request) error {
	var req agentapi.SessionCreateRequest
	if err := s.decodeJSON(w, r, &req); err != nil {
		return err
	}
	extra, err := envList("env", req.Env)
	if err != nil {
		return err
	}
	dir, err := s.resolveCwd(req.Cwd)
	if err != nil {
		return err
	}
	ss, err := s.sessions.create(s.commandEnv(extra), dir)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, ss.info())
	return nil
}

// handleSessionList answers GET /v1/sessions.
func (s *Server) handleSessionList(w http.ResponseWriter, r *http.Request) error {
	writeJSON(w, http.StatusOK, agentapi.SessionList{Sessions: s.sessions.list()})
	return nil
}

// handleSessionClose answers DELETE /v1/sessions/{id}.
func (s *Server) handleSessionClose(w http.ResponseWriter, r *http.Request) error {
	ss, err := s.sessions.get(r.PathValue("id"))
	if err != nil {
		return err
	}
	info := ss.info()
	ss.close()
	writeJSON(w, http.StatusOK, info)
	return nil
}

// handleSessionRun answers POST /v1/sessions/{id}/run.
func (s *Server) handleSessionRun(w http.ResponseWriter, r *http.Request) error {
	ss, err := s.sessions.get(r.PathValue("id"))
	if err != nil {
		return err
	}
	var req agentapi.SessionRunRequest
	if err := s.decodeJSON(w, r, &req); err != nil {
		return err
	}
	switch {
	case req.Command == "":
		return invalid("command", "required")
	case strings.ContainsRune(req.Command, 0):
		return invalid("command", "contains a NUL byte")
	}
	timeout, limit, err := s.runLimits(req.TimeoutMS, req.MaxOutputBytes)
	if err != nil {
		return err
	}
	res, err := ss.exec(r.Context(), req.Command, timeout, limit)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, res)
	return nil
}
