package execagent

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

const (
	// defaultPageBytes is the default size of an output page.
	defaultPageBytes = 64 << 10
	// maxEventBytes bounds the data of one output event of a followed process.
	maxEventBytes = 64 << 10
)

// process is one background process.
type process struct {
	id      string
	tbl     *childTable // the agent's, for its process group's members
	cmd     *exec.Cmd
	pgid    int
	name    string // "" when unnamed
	command string
	argv    []string
	started time.Time
	oom     oomMark // the OOM kill count at start

	rpc     *rpcPipe // nil unless started with rpc
	cleanup func()   // removes the command's script file, if any; called by wait

	stdinMu     sync.Mutex
	stdin       *os.File // nil without a stdin pipe
	stdinClosed bool

	mu       sync.Mutex
	out      *ring
	exited   bool
	exitCode int
	signal   string
	ended    time.Time
	changed  chan struct{} // closed and replaced when output arrives or the process exits
	done     chan struct{} // closed once exited (output complete)
	outR     *os.File
	readDone chan struct{}
	// oomKilled: the OOM killer killed it (set with exited, under mu).
	oomKilled bool
}

// processTable holds the background processes of the /v1/processes routes,
// by id and by name, until they are deleted. Their OS children are the
// childTable's.
type processTable struct {
	srv   *Server
	mu    sync.Mutex
	m     map[string]*process
	names map[string]*process // named processes, by name
}

func newProcessTable(s *Server) *processTable {
	return &processTable{srv: s, m: map[string]*process{}, names: map[string]*process{}}
}

// start starts spec as a background process.
func (t *processTable) start(spec cmdSpec, command string, argv []string, withStdin bool, opts procOptions) (*process, error) {
	s := t.srv
	t.mu.Lock()
	defer t.mu.Unlock()
	replaced, err := t.checkNameLocked(opts.name)
	if err != nil {
		return nil, err
	}
	if n := len(t.m); n >= s.cfg.MaxProcesses && (replaced == nil || n > s.cfg.MaxProcesses) {
		return nil, fmt.Errorf("too many processes (the maximum is %d, exited ones included); delete some first: %w", s.cfg.MaxProcesses, errConflict)
	}
	spec, cleanup, err := s.prepare(spec)
	if err != nil {
		return nil, err
	}
	p := &process{id: newID("proc-"), tbl: s.children, name: opts.name, command: command, argv: argv, out: newRing(s.cfg.ProcessOutputBytes),
		changed: make(chan struct{}), done: make(chan struct{}), readDone: make(chan struct{}), cleanup: cleanup}
	started := false
	defer func() {
		if !started {
			cleanup()
		}
	}()
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("create process output pipe: %w", err)
	}
	cmd := newCmd(spec)
	cmd.Stdout, cmd.Stderr = outW, outW
	var rpcW *os.File
	if opts.rpc {
		withStdin = true
		var rpcR *os.File
		if rpcR, rpcW, err = os.Pipe(); err != nil {
			_ = outR.Close()
			_ = outW.Close()
			return nil, fmt.Errorf("create process reply pipe: %w", err)
		}
		p.rpc = newRPCPipe(rpcR)
		cmd.Stdout = rpcW
	}
	var inR *os.File
	if withStdin {
		if inR, p.stdin, err = os.Pipe(); err != nil {
			_ = outR.Close()
			_ = outW.Close()
			p.rpc.close()
			closeFile(rpcW)
			return nil, fmt.Errorf("create process stdin pipe: %w", err)
		}
		cmd.Stdin = inR
	}
	p.started, p.oom = time.Now(), s.children.oom.mark()
	err = s.children.start(cmd)
	_ = outW.Close()
	closeFile(rpcW)
	if inR != nil {
		_ = inR.Close()
	}
	if err != nil {
		_ = outR.Close()
		p.rpc.close()
		if p.stdin != nil {
			_ = p.stdin.Close()
		}
		return nil, startError("start process", spec.argv, spec.env, err)
	}
	started = true
	p.cmd, p.pgid, p.outR = cmd, cmd.Process.Pid, outR
	if replaced != nil {
		t.forgetLocked(replaced)
	}
	t.m[p.id] = p
	if p.name != "" {
		t.names[p.name] = p
	}
	s.wg.Add(2)
	go func() { defer s.wg.Done(); p.readOutput() }()
	go func() { defer s.wg.Done(); p.wait(s) }()
	return p, nil
}

// readOutput appends the process's output to its ring until EOF or until
// the pipe is closed.
func (p *process) readOutput() {
	defer close(p.readDone)
	buf := make([]byte, readChunk)
	for {
		n, err := p.outR.Read(buf)
		if n > 0 {
			p.mu.Lock()
			p.out.write(buf[:n])
			p.notifyLocked()
			p.mu.Unlock()
		}
		if err != nil {
			return
		}
	}
}

func (p *process) notifyLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// wait records the exit status once the process exited and its output was
// read (at most DrainTimeout after the exit, while a leftover child keeps
// the pipe open).
func (p *process) wait(s *Server) {
	ps, _ := s.children.wait(p.cmd)
	p.cleanup()
	code, sig := exitStatus(ps)
	oomKilled := s.children.oomKilled(p.oom, code, sig, p.pgid)
	t := time.NewTimer(s.cfg.DrainTimeout)
	select {
	case <-p.readDone:
	case <-t.C:
	case <-s.ctx.Done():
	}
	t.Stop()
	_ = p.outR.Close()
	<-p.readDone
	p.mu.Lock()
	p.exited, p.exitCode, p.signal, p.oomKilled, p.ended = true, code, sig, oomKilled, time.Now()
	p.notifyLocked()
	close(p.done)
	p.mu.Unlock()
	p.stdinMu.Lock()
	if p.stdin != nil && !p.stdinClosed {
		p.stdinClosed = true
		_ = p.stdin.Close()
	}
	p.stdinMu.Unlock()
}

func (p *process) info() agentapi.ProcessInfo {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.infoLocked()
}

func (p *process) infoLocked() agentapi.ProcessInfo {
	pi := agentapi.ProcessInfo{
		ID: p.id, Name: p.name, RPC: p.rpc != nil, PID: p.pgid, Command: p.command, Argv: p.argv,
		State: agentapi.ProcessRunning, StartedAt: p.started, OutputBytes: p.out.total,
	}
	if p.exited {
		code, ended := p.exitCode, p.ended
		pi.State, pi.ExitCode, pi.Signal, pi.EndedAt, pi.OOMKilled = agentapi.ProcessExited, &code, p.signal, &ended, p.oomKilled
		pi.GroupRunning = p.tbl.groupAlive(p.pgid)
	}
	return pi
}

// get returns the process with this id or name.
func (t *processTable) get(id string) (*process, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p, ok := t.m[id]
	if !ok {
		p, ok = t.names[id]
	}
	if !ok {
		return nil, fmt.Errorf("process %q: %w", id, errNotFound)
	}
	return p, nil
}

func (t *processTable) list() []agentapi.ProcessInfo {
	all := lockedValues(&t.mu, t.m)
	out := make([]agentapi.ProcessInfo, 0, len(all))
	for _, p := range all {
		out = append(out, p.info())
	}
	slices.SortFunc(out, func(a, b agentapi.ProcessInfo) int { return a.StartedAt.Compare(b.StartedAt) })
	return out
}

// kill kills the process's group, waits for its exit (bounded) and forgets it.
func (t *processTable) kill(p *process) agentapi.ProcessInfo {
	t.srv.children.killGroup(p.pgid, unix.SIGKILL)
	waitDone(p.done, t.srv.cfg.DrainTimeout+10*time.Second)
	t.mu.Lock()
	t.forgetLocked(p)
	t.mu.Unlock()
	return p.info()
}

// closeAll kills every process group (the server is closing); the waiters
// finish on their own and are waited for by the server.
func (t *processTable) closeAll() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, p := range t.m {
		t.srv.children.killGroup(p.pgid, unix.SIGKILL)
	}
}

// handleProcessStart answers POST /v1/processes.
func (s *Server) handleProcessStart(w http.ResponseWriter, r *http.Request) error {
	var req agentapi.ProcessStartRequest
	if err := s.decodeJSON(w, r, &req); err != nil {
		return err
	}
	spec, err := s.commandSpec(req.Command, req.Argv, req.Env, req.Cwd)
	if err != nil {
		return err
	}
	opts, err := processOptions(req)
	if err != nil {
		return err
	}
	p, err := s.processes.start(spec, req.Command, req.Argv, req.Stdin, opts)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, p.info())
	return nil
}

// handleProcessList answers GET /v1/processes.
func (s *Server) handleProcessList(w http.ResponseWriter, r *http.Request) error {
	writeJSON(w, http.StatusOK, agentapi.ProcessList{Processes: s.processes.list()})
	return nil
}

// handleProcessGet answers GET /v1/processes/{id}.
func (s *Server) handleProcessGet(w http.ResponseWriter, r *http.Request) error {
	p, err := s.processes.get(r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, p.info())
	return nil
}

// handleProcessKill answers DELETE /v1/processes/{id}: kill (if running) and forget.
func (s *Server) handleProcessKill(w http.ResponseWriter, r *http.Request) error {
	p, err := s.processes.get(r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, s.processes.kill(p))
	return nil
}

// handleProcessSignal answers POST /v1/processes/{id}/signal.
func (s *Server) handleProcessSignal(w http.ResponseWriter, r *http.Request) error {
	p, err := s.processes.get(r.PathValue("id"))
	if err != nil {
		return err
	}
	var req agentapi.SignalRequest
	if err := s.decodeJSON(w, r, &req); err != nil {
		return err
	}
	sig, err := parseSignal(req.Signal)
	if err != nil {
		return err
	}
	p.mu.Lock()
	exited := p.exited
	p.mu.Unlock()
	if exited {
		return fmt.Errorf("process %s has exited: %w", p.id, errConflict)
	}
	sent, err := s.children.signalGroup(p.pgid, sig)
	if err != nil {
		return err
	}
	if !sent {
		return fmt.Errorf("process %s has exited and left no process in its group: %w", p.id, errConflict)
	}
	writeJSON(w, http.StatusOK, p.info())
	return nil
}

// parseSignal parses "TERM", "SIGTERM", "sigterm" or "15".
func parseSignal(v string) (unix.Signal, error) {
	if v == "" {
		return 0, invalid("signal", "required")
	}
	if n, err := strconv.Atoi(v); err == nil {
		if n <= 0 || n > 64 {
			return 0, invalid("signal", "%d is not a signal number", n)
		}
		return unix.Signal(n), nil
	}
	name := strings.ToUpper(v)
	if !strings.HasPrefix(name, "SIG") {
		name = "SIG" + name
	}
	if sig := unix.SignalNum(name); sig != 0 {
		return sig, nil
	}
	return 0, invalid("signal", "unknown signal %q", v)
}

// handleProcessStdin answers POST /v1/processes/{id}/stdin: the raw body is
// written to the process's stdin; ?close=true closes it afterwards.
func (s *Server) handleProcessStdin(w http.ResponseWriter, r *http.Request) error {
	p, err := s.processes.get(r.PathValue("id"))
	if err != nil {
		return err
	}
	closeAfter := false
	if v := r.URL.Query().Get("close"); v != "" {
		if closeAfter, err = strconv.ParseBool(v); err != nil {
			return invalid("close", "must be true or false, got %q", v)
		}
	}
	if p.stdin == nil {
		return fmt.Errorf("process %s was started without a stdin pipe (start it with \"stdin\": true): %w", p.id, errConflict)
	}
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	if p.stdinClosed {
		return fmt.Errorf("stdin of process %s is closed: %w", p.id, errConflict)
	}
	body := http.MaxBytesReader(w, r.Body, s.cfg.MaxUploadBytes)
	_ = p.stdin.SetWriteDeadline(time.Now().Add(s.cfg.StdinTimeout))
	n, err := io.Copy(p.stdin, body)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return err
		}
		return stdinError(p.id, n, s.cfg.StdinTimeout, err)
	}
	if closeAfter {
		p.stdinClosed = true
		if err := p.stdin.Close(); err != nil {
			return fmt.Errorf("close stdin of process %s: %w", p.id, err)
		}
	}
	writeJSON(w, http.StatusOK, agentapi.WriteResult{Bytes: n})
	return nil
}

// stdinError explains the failed write of n bytes to the stdin of process
// id, whose writes are bounded by timeout.
func stdinError(id string, n int64, timeout time.Duration, err error) error {
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		return fmt.Errorf("process %s did not read its stdin within %s (%d bytes written): %w", id, timeout, n, errTimeout)
	case errors.Is(err, unix.EPIPE), errors.Is(err, os.ErrClosed):
		return fmt.Errorf("process %s closed its stdin (%d bytes written): %w", id, n, errConflict)
	default:
		return fmt.Errorf("write stdin of process %s: %w", id, err)
	}
}

// handleProcessOutput answers GET /v1/processes/{id}/output: one JSON page
// from ?offset (default 0) of at most ?limit bytes, or with
// Accept: text/event-stream (or ?follow=true) a stream of output events until
// the process exits, then an exit event with its ProcessInfo.
func (s *Server) handleProcessOutput(w http.ResponseWriter, r *http.Request) error {
	p, err := s.processes.get(r.PathValue("id"))
	if err != nil {
		return err
	}
	q := r.URL.Query()
	var off int64
	if v := q.Get("offset"); v != "" {
		if off, err = strconv.ParseInt(v, 10, 64); err != nil || off < 0 {
			return invalid("offset", "must be a non-negative integer, got %q", v)
		}
	}
	limit := defaultPageBytes
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			return invalid("limit", "must be a positive integer, got %q", v)
		}
		limit = int(min(int64(n), s.cfg.ProcessOutputBytes))
	}
	follow := wantsEventStream(r)
	if v := q.Get("follow"); v != "" {
		if follow, err = strconv.ParseBool(v); err != nil {
			return invalid("follow", "must be true or false, got %q", v)
		}
	}
	p.mu.Lock()
	total := p.out.total
	p.mu.Unlock()
	if off > total {
		return invalid("offset", "%d is beyond the output (%d bytes so far)", off, total)
	}
	if follow {
		return s.followOutput(w, r, p, off)
	}
	p.mu.Lock()
	data, from, dropped := p.out.read(off, limit)
	if !p.exited {
		data = data[:utf8Split(data)]
	}
	page := agentapi.ProcessOutput{
		Offset: from, NextOffset: from + int64(len(data)), Data: string(data), Dropped: dropped,
		State: agentapi.ProcessRunning,
	}
	if p.exited {
		code := p.exitCode
		page.State, page.ExitCode = agentapi.ProcessExited, &code
	}
	p.mu.Unlock()
	writeJSON(w, http.StatusOK, page)
	return nil
}

// followOutput streams a process's output from off as server-sent events.
func (s *Server) followOutput(w http.ResponseWriter, r *http.Request, p *process, off int64) error {
	ev := newEventWriter(w)
	ev.start()
	keep := time.NewTicker(s.cfg.KeepAlive)
	defer keep.Stop()
	ctx := r.Context()
	for {
		p.mu.Lock()
		data, from, _ := p.out.read(off, maxEventBytes)
		exited := p.exited
		if !exited {
			data = data[:utf8Split(data)]
		}
		changed := p.changed
		var info agentapi.ProcessInfo
		if exited && len(data) == 0 {
			info = p.infoLocked()
		}
		p.mu.Unlock()
		if len(data) > 0 {
			if err := ev.event(agentapi.EventOutput, agentapi.StreamChunk{Data: string(data), Offset: from}); err != nil {
				return nil // the client is gone
			}
			off = from + int64(len(data))
			keep.Reset(s.cfg.KeepAlive)
			continue
		}
		if exited {
			_ = ev.event(agentapi.EventExit, info)
			return nil
		}
		select {
		case <-changed:
		case <-keep.C:
			if ev.comment("keep-alive") != nil {
				return nil
			}
		case <-ctx.Done():
			return nil
		case <-s.ctx.Done():
			return nil
		}
	}
}
