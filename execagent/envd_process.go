package execagent

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

// envd's process service (process.Process) on the agent's processes: a
// Start without a PTY is startCommand's (exec.go), one with a PTY is the
// ptyTable's (pty.go). The table here names them by pid and tag, fans their
// output out to the streams that subscribe, and keeps the end of an exited
// one for a while so that it can still be connected to.

// Bounds of envd processes.
const (
	// envdSubQueue bounds the output chunks queued for one subscriber;
	// envdSubStall is how long a full queue may hold the process's output
	// reader (and so the process) before that subscriber is dropped.
	envdSubQueue = 64
	envdSubStall = 30 * time.Second
	// envdMaxSubscribers bounds the streams of one process.
	envdMaxSubscribers = 16
	// envdExitRetention is how long an exited process stays connectable;
	// envdMaxRetained bounds the exited processes kept.
	envdExitRetention = 60 * time.Second
	envdMaxRetained   = 256
	// envdStreamGrace: a Start's stream outlives its Connect-Timeout-Ms by
	// the drain timeout and this, to carry the end of the process killed
	// at that deadline.
	envdStreamGrace = 5 * time.Second
	// envdInputIdle bounds the wait for StreamInput's next message.
	envdInputIdle = 10 * time.Minute
	// noTimeout is runningCmd.wait's timeout of a process started without
	// Connect-Timeout-Ms: it runs until it exits, is killed or the agent
	// closes.
	noTimeout = time.Duration(math.MaxInt64)
)

// streamPTY is the output stream of a PTY (after streamStdout, streamStderr).
const streamPTY = 3

// envdProc is one process of envd's service.
type envdProc struct {
	pid     int
	tag     *string
	config  pbProcessConfig
	started time.Time
	rc      *runningCmd // a process on pipes, or nil
	pty     *ptySession // a process under a PTY, or nil

	stdinMu     sync.Mutex
	stdinClosed bool // CloseStdin closed rc.inW

	published atomic.Int64 // bytes of output read from the process, subscribers or none

	mu   sync.Mutex
	subs map[*envdSub]struct{}
	// end, ended and atDeadline are set once, before done is closed; read
	// them after done.
	end        *pbEndEvent
	ended      time.Time
	atDeadline bool // killed at its Start's Connect-Timeout-Ms
	done       chan struct{}
}

// envdSub is one subscriber of a process's output: a Start or a Connect
// stream.
type envdSub struct {
	data chan pbDataEvent // bounded: envdSubQueue
	gone chan struct{}    // closed by drop
	once sync.Once
}

// drop tells the subscriber's stream that it was dropped (too slow).
func (sub *envdSub) drop() { sub.once.Do(func() { close(sub.gone) }) }

// send queues ev; a full queue waits up to envdSubStall, then drops the
// subscriber.
func (sub *envdSub) send(ev pbDataEvent) {
	select {
	case sub.data <- ev:
		return
	case <-sub.gone:
		return
	default:
	}
	t := time.NewTimer(envdSubStall)
	defer t.Stop()
	select {
	case sub.data <- ev:
	case <-sub.gone:
	case <-t.C:
		sub.drop()
	}
}

func newEnvdProc(config pbProcessConfig, tag *string) *envdProc {
	return &envdProc{config: config, tag: tag, started: time.Now(), subs: map[*envdSub]struct{}{}, done: make(chan struct{})}
}

// subscribe adds a subscriber (at most envdMaxSubscribers).
func (ep *envdProc) subscribe() (*envdSub, error) {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	if len(ep.subs) >= envdMaxSubscribers {
		return nil, withCode(connectResourceExhausted,
			fmt.Errorf("process %d has %d streams already (the most the agent keeps per process)", ep.pid, envdMaxSubscribers))
	}
	sub := &envdSub{data: make(chan pbDataEvent, envdSubQueue), gone: make(chan struct{})}
	ep.subs[sub] = struct{}{}
	return sub, nil
}

func (ep *envdProc) unsubscribe(sub *envdSub) {
	ep.mu.Lock()
	delete(ep.subs, sub)
	ep.mu.Unlock()
	sub.drop() // a publisher waiting on it gives up
}

// publish hands a chunk of output (b is the call's to keep) to every
// subscriber; with none, it is discarded, as envd discards it.
func (ep *envdProc) publish(stream int, b []byte) {
	ep.published.Add(int64(len(b)))
	var ev pbDataEvent
	switch stream {
	case streamStdout:
		ev.Stdout = &b
	case streamStderr:
		ev.Stderr = &b
	default:
		ev.PTY = &b
	}
	ep.mu.Lock()
	subs := slices.Collect(maps.Keys(ep.subs))
	ep.mu.Unlock()
	for _, sub := range subs {
		sub.send(ev)
	}
}

// hasExited reports whether the process's end is known.
func (ep *envdProc) hasExited() bool {
	select {
	case <-ep.done:
		return true
	default:
		return false
	}
}

// envdProcTable holds envd's processes by pid and tag: the running ones and
// the exited ones retained for Connect. Safe for concurrent use.
type envdProcTable struct {
	srv *Server

	mu      sync.Mutex
	byPID   map[int]*envdProc    // running and retained
	byTag   map[string]*envdProc // the latest process of each tag
	running int                  // reserved or running (bounded by MaxProcesses)
	exited  []*envdProc          // retained, in the order they exited
}

func newEnvdProcTable(s *Server) *envdProcTable {
	return &envdProcTable{srv: s, byPID: map[int]*envdProc{}, byTag: map[string]*envdProc{}}
}

// reserve takes room for one more running process; release gives it back
// when the start failed.
func (t *envdProcTable) reserve() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if limit := t.srv.cfg.MaxProcesses; t.running >= limit {
		return t.srv.refused("QUARRY_AGENT_MAX_PROCESSES", withCode(connectResourceExhausted,
			fmt.Errorf("too many processes: %d are running, the most the agent runs (QUARRY_AGENT_MAX_PROCESSES); kill some first", limit)))
	}
	t.running++
	return nil
}

func (t *envdProcTable) release() {
	t.mu.Lock()
	t.running--
	t.mu.Unlock()
}

// add registers a started process. A retained exit with the same pid (the
// pid was reused) or tag is no longer found.
func (t *envdProcTable) add(ep *envdProc) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.pruneLocked(time.Now())
	t.byPID[ep.pid] = ep
	if ep.tag != nil {
		t.byTag[*ep.tag] = ep
	}
}

// finish records the end of ep (its output delivered to the subscribers'
// queues) and retains it. Its room is freed before done is closed: a
// client that has seen the end may start another process at once (the
// room was freed after it, and such a start was refused now and then: 1
// run of TestEnvd_Start_BoundedByMaxProcesses in 20 under stress-ng).
func (t *envdProcTable) finish(ep *envdProc, end pbEndEvent, atDeadline bool) {
	now := time.Now()
	ep.mu.Lock()
	ep.end, ep.ended, ep.atDeadline = &end, now, atDeadline
	ep.mu.Unlock()
	t.mu.Lock()
	t.running--
	t.exited = append(t.exited, ep)
	t.pruneLocked(now)
	t.mu.Unlock()
	ep.mu.Lock()
	close(ep.done)
	ep.mu.Unlock()
}

// pruneLocked forgets the exited processes past their retention or beyond
// envdMaxRetained, oldest first: the work is what expired.
func (t *envdProcTable) pruneLocked(now time.Time) {
	for len(t.exited) > 0 {
		ep := t.exited[0]
		if len(t.exited) <= envdMaxRetained && now.Sub(ep.ended) < envdExitRetention {
			return
		}
		t.exited[0] = nil
		t.exited = t.exited[1:]
		if t.byPID[ep.pid] == ep {
			delete(t.byPID, ep.pid)
		}
		if ep.tag != nil && t.byTag[*ep.tag] == ep {
			delete(t.byTag, *ep.tag)
		}
		if ep.pty != nil {
			t.srv.ptys.forget(ep.pty)
		}
	}
}

// find returns the process sel names: running only, or also a retained
// exit (withExited, for Connect). Not there is not_found.
func (t *envdProcTable) find(sel *pbProcessSelector, withExited bool) (*envdProc, error) {
	if sel == nil || (sel.PID == nil && sel.Tag == nil) {
		return nil, invalid("process", "a pid or a tag is required")
	}
	t.mu.Lock()
	t.pruneLocked(time.Now())
	var ep *envdProc
	var what string
	if sel.PID != nil {
		ep, what = t.byPID[int(*sel.PID)], fmt.Sprintf("pid %d", *sel.PID)
	} else {
		ep, what = t.byTag[*sel.Tag], fmt.Sprintf("tag %q", *sel.Tag)
	}
	t.mu.Unlock()
	if ep == nil || (!withExited && ep.hasExited()) {
		return nil, fmt.Errorf("process with %s: %w", what, errNotFound)
	}
	return ep, nil
}

// list returns the running processes, oldest first.
func (t *envdProcTable) list() []pbProcessInfo {
	t.mu.Lock()
	all := slices.Collect(maps.Values(t.byPID))
	t.mu.Unlock()
	slices.SortFunc(all, func(a, b *envdProc) int { return a.started.Compare(b.started) })
	out := make([]pbProcessInfo, 0, len(all))
	for _, ep := range all {
		if !ep.hasExited() {
			out = append(out, pbProcessInfo{Config: ep.config, PID: uint32(ep.pid), Tag: ep.tag})
		}
	}
	return out
}

// processMethods are the RPCs of process.Process.
func (s *Server) processMethods() map[string]envdMethod {
	return map[string]envdMethod{
		"Start":       serverStream(s, s.envdStart),
		"Connect":     serverStream(s, s.envdConnect),
		"List":        unary(s, s.envdList),
		"SendInput":   unary(s, s.envdSendInput),
		"StreamInput": {stream: true, serve: s.serveStreamInput},
		"SendSignal":  unary(s, s.envdSendSignal),
		"CloseStdin":  unary(s, s.envdCloseStdin),
		"Update":      unary(s, s.envdUpdate),
	}
}

// envdStart answers process.Process/Start: it starts the process, then
// streams start{pid}, its output and its end. Connect-Timeout-Ms bounds the
// process itself (killed at the deadline); a client that goes away leaves
// it running. X-Quarry-Envd-User is ignored: it runs as the agent's user.
func (s *Server) envdStart(r *http.Request, req *pbStartRequest, st *connectStream) error {
	if req.Process == nil || req.Process.Cmd == "" {
		return invalid("process.cmd", "required")
	}
	timeout, err := requestTimeout(r)
	if err != nil {
		return err
	}
	cwd, err := s.envdPath("process.cwd", deref(req.Process.Cwd))
	if err != nil {
		return err
	}
	if err := s.envdProcs.reserve(); err != nil {
		return err
	}
	ep := newEnvdProc(*req.Process, req.Tag)
	sub, _ := ep.subscribe() // the first subscriber: there is room
	if err := s.startEnvdProc(ep, req, cwd); err != nil {
		s.envdProcs.release()
		return err
	}
	s.envdProcs.add(ep)
	s.ownEnvdProc(ep, timeout)
	streamLimit := time.Duration(0)
	if timeout > 0 {
		streamLimit = timeout + s.cfg.DrainTimeout + envdStreamGrace
	}
	return s.streamProcess(r, st, ep, sub, streamLimit, true)
}

// startEnvdProc starts ep's program: under a PTY of the ptyTable when req
// has one, else on pipes with startCommand (a stdin pipe unless stdin is
// false).
func (s *Server) startEnvdProc(ep *envdProc, req *pbStartRequest, cwd string) error {
	argv := append([]string{req.Process.Cmd}, req.Process.Args...)
	env := s.envdEnv(req.Process.Envs)
	if req.PTY != nil {
		var cols, rows int
		if sz := req.PTY.Size; sz != nil {
			cols, rows = int(sz.Cols), int(sz.Rows)
		}
		p, err := s.ptys.create(agentapi.PTYCreateRequest{Command: argv, Env: env, Cwd: cwd, Cols: cols, Rows: rows},
			func(b []byte) { ep.publish(streamPTY, b) })
		if err != nil {
			return err
		}
		ep.pty, ep.pid = p, p.pid
		return nil
	}
	spec, err := s.commandSpec("", argv, env, cwd)
	if err != nil {
		return err
	}
	spec.stdinPipe = req.Stdin == nil || *req.Stdin
	rc, err := s.startCommand(spec, func(stream int, b []byte) { ep.publish(stream, bytes.Clone(b)) })
	if err != nil {
		return err
	}
	ep.rc, ep.pid = rc, rc.cmd.Process.Pid
	return nil
}

// envdEnv is a command's env: HOME is the workdir (E2B's /home/user, see
// docs/E2B.md) unless the lease's env or the request sets it.
func (s *Server) envdEnv(envs map[string]string) map[string]string {
	env := maps.Clone(envs)
	if env == nil {
		env = map[string]string{}
	}
	if _, ok := env["HOME"]; ok {
		return env
	}
	s.leaseMu.Lock()
	leaseHome := slices.ContainsFunc(s.leaseEnv, func(kv string) bool { return strings.HasPrefix(kv, "HOME=") })
	s.leaseMu.Unlock()
	if !leaseHome {
		env["HOME"] = s.cfg.Workdir
	}
	return env
}

// ownEnvdProc starts ep's owner, a goroutine of the server: it waits for
// the process (killing it at timeout, when not 0) and records its end.
func (s *Server) ownEnvdProc(ep *envdProc, timeout time.Duration) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		var (
			end        pbEndEvent
			atDeadline bool
		)
		if ep.rc != nil {
			out := ep.rc.wait(s.ctx, orDefault(timeout, noTimeout))
			end, atDeadline = endEvent(out.exitCode, out.signal), out.timedOut
		} else {
			end, atDeadline = s.waitEnvdPTY(ep.pty, timeout)
		}
		s.envdProcs.finish(ep, end, atDeadline)
	}()
}

// orDefault returns d, or def when d is 0.
func orDefault(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

// waitEnvdPTY waits for a PTY's program, killing its session at timeout
// (when not 0), and returns its end and whether it was killed at timeout.
// The agent's Close hangs PTYs up.
func (s *Server) waitEnvdPTY(p *ptySession, timeout time.Duration) (pbEndEvent, bool) {
	expired, stop := deadline(timeout)
	defer stop()
	atDeadline := false
	select {
	case <-p.done:
	case <-expired:
		atDeadline = true
		killSession(p.pid)
		s.children.killGroup(p.pid, unix.SIGKILL)
	case <-s.ctx.Done():
	}
	if !waitDone(p.done, s.cfg.DrainTimeout+10*time.Second) {
		msg := fmt.Sprintf("the pty's program (pid %d) did not end within %s of its kill", p.pid, s.cfg.DrainTimeout+10*time.Second)
		return pbEndEvent{ExitCode: -1, Status: "unknown", Error: &msg}, atDeadline
	}
	info := p.info()
	code := -1
	if info.ExitCode != nil {
		code = *info.ExitCode
	}
	return endEvent(code, info.Signal), atDeadline
}

// endEvent is envd's end of a process that exited with code, or died of
// the signal named sig: status and error as Go's ProcessState.String().
func endEvent(code int, sig string) pbEndEvent {
	if sig != "" {
		status := "signal: " + sig
		if n := unix.SignalNum(sig); n != 0 {
			status = "signal: " + n.String()
		}
		return pbEndEvent{ExitCode: -1, Status: status, Error: &status}
	}
	status := "exit status " + strconv.Itoa(code)
	end := pbEndEvent{ExitCode: int32(code), Exited: true, Status: status}
	if code != 0 {
		end.Error = &status
	}
	return end
}

// streamProcess streams start{pid}, then ep's output, keepalives and its
// end to one subscriber, until the end, the client leaves, the subscriber
// is dropped, limit (when not 0) passes or the agent closes. It
// unsubscribes.
//
// The Start stream (started) of a process killed at its Connect-Timeout-Ms
// ends as envd's does, in deadline_exceeded (the SDK's TimeoutException),
// after the output; a Connect stream gets the end event.
func (s *Server) streamProcess(r *http.Request, st *connectStream, ep *envdProc, sub *envdSub, limit time.Duration, started bool) error {
	defer ep.unsubscribe(sub)
	event := func(ev pbProcessEvent) error { return st.send(pbProcessStream{Event: ev}) }
	if event(pbProcessEvent{Start: &pbStartEvent{PID: uint32(ep.pid)}}) != nil {
		return nil // the client is gone
	}
	clock := newStreamClock(r, limit)
	defer clock.Stop()
	for {
		select {
		case ev := <-sub.data:
			if event(pbProcessEvent{Data: &ev}) != nil {
				return nil
			}
			clock.sent()
		case <-ep.done:
			// Every chunk was queued before done: send what is left.
			for range envdSubQueue {
				select {
				case ev := <-sub.data:
					if event(pbProcessEvent{Data: &ev}) != nil {
						return nil
					}
					continue
				default:
				}
				break
			}
			if started && ep.atDeadline {
				return withCode(connectDeadlineExceeded, fmt.Errorf(
					"process %d was killed at its deadline (Connect-Timeout-Ms): %s", ep.pid, ep.end.Status))
			}
			_ = event(pbProcessEvent{End: ep.end})
			return nil
		case <-sub.gone:
			return s.refused("envdSubQueue", withCode(connectResourceExhausted, fmt.Errorf(
				"this stream read the output of process %d too slowly (%d chunks queued for %s) and was dropped; connect again",
				ep.pid, envdSubQueue, envdSubStall)))
		case <-clock.keep.C:
			if event(pbProcessEvent{Keepalive: &struct{}{}}) != nil {
				return nil
			}
		case <-r.Context().Done():
			return nil
		case <-s.ctx.Done():
			return fmt.Errorf("stream of process %d: %w", ep.pid, errClosed)
		case <-clock.expired:
			return withCode(connectDeadlineExceeded, fmt.Errorf("the stream of process %d reached its deadline (Connect-Timeout-Ms); the process runs on", ep.pid))
		}
	}
}

// envdConnect answers process.Process/Connect: start{pid}, then the
// output from now on and the end; an exited process still retained gets
// start and its end.
func (s *Server) envdConnect(r *http.Request, req *pbProcessRequest, st *connectStream) error {
	limit, err := requestTimeout(r)
	if err != nil {
		return err
	}
	ep, err := s.envdProcs.find(req.Process, true)
	if err != nil {
		return err
	}
	sub, err := ep.subscribe()
	if err != nil {
		return s.refused("envdMaxSubscribers", err)
	}
	return s.streamProcess(r, st, ep, sub, limit, false)
}

// envdList answers process.Process/List: the running processes.
func (s *Server) envdList(_ *http.Request, _ *pbEmpty) (*pbListResponse, error) {
	return &pbListResponse{Processes: s.envdProcs.list()}, nil
}

// envdSendInput answers process.Process/SendInput.
func (s *Server) envdSendInput(_ *http.Request, req *pbSendInputRequest) (*pbEmpty, error) {
	ep, err := s.envdProcs.find(req.Process, false)
	if err != nil {
		return nil, err
	}
	return &pbEmpty{}, s.envdInput(ep, req.Input)
}

// envdInput writes input to ep: stdin bytes to its stdin pipe, pty bytes
// to its terminal, each write bounded by StdinTimeout.
func (s *Server) envdInput(ep *envdProc, in *pbProcessInput) error {
	timeout := s.cfg.StdinTimeout
	switch {
	case in != nil && in.PTY != nil:
		if ep.pty == nil {
			return withCode(connectFailedPrecondition, fmt.Errorf("process %d has no pty: send stdin input", ep.pid))
		}
		_ = ep.pty.master.SetWriteDeadline(time.Now().Add(timeout))
		if err := ep.pty.write(*in.PTY); err != nil {
			return stdinError(strconv.Itoa(ep.pid), 0, timeout, err)
		}
		return nil
	case in != nil && in.Stdin != nil:
		if ep.rc == nil {
			return withCode(connectFailedPrecondition, fmt.Errorf("process %d runs under a pty: send pty input", ep.pid))
		}
		ep.stdinMu.Lock()
		defer ep.stdinMu.Unlock()
		switch {
		case ep.rc.inW == nil:
			return fmt.Errorf("process %d was started without stdin (stdin: false): %w", ep.pid, errConflict)
		case ep.stdinClosed:
			return fmt.Errorf("stdin of process %d is closed: %w", ep.pid, errConflict)
		}
		_ = ep.rc.inW.SetWriteDeadline(time.Now().Add(timeout))
		if n, err := ep.rc.inW.Write(*in.Stdin); err != nil {
			return stdinError(strconv.Itoa(ep.pid), int64(n), timeout, err)
		}
		return nil
	default:
		return invalid("input", "stdin or pty bytes are required")
	}
}

// serveStreamInput answers process.Process/StreamInput: enveloped
// messages, start{process} first, then data{input} and keepalives, until
// the body ends; each message within envdInputIdle of the last.
func (s *Server) serveStreamInput(w http.ResponseWriter, r *http.Request) error {
	st := newConnectStream(w)
	err := s.streamInput(w, r)
	if err == nil {
		err = st.send(pbEmpty{})
	}
	st.end(err)
	return nil
}

func (s *Server) streamInput(w http.ResponseWriter, r *http.Request) error {
	rc := http.NewResponseController(w)
	var ep *envdProc
	for {
		_ = rc.SetReadDeadline(time.Now().Add(envdInputIdle))
		msg, err := readEnvelope(r.Body, s.cfg.MaxJSONBody)
		switch {
		case errors.Is(err, io.EOF):
			return nil
		case errors.Is(err, os.ErrDeadlineExceeded):
			return withCode(connectDeadlineExceeded, fmt.Errorf("no input message for %s", envdInputIdle))
		case err != nil:
			return err
		}
		var m pbStreamInputRequest
		if err := decodeProto(msg, &m); err != nil {
			return err
		}
		switch {
		case m.Start != nil:
			if ep, err = s.envdProcs.find(m.Start.Process, false); err != nil {
				return err
			}
		case m.Data != nil:
			if ep == nil {
				return invalid("start", "the first message must be start{process}")
			}
			if err := s.envdInput(ep, m.Data.Input); err != nil {
				return err
			}
		case m.Keepalive != nil:
		default:
			return invalid("event", "a message must be start, data or keepalive")
		}
	}
}

// envdSendSignal answers process.Process/SendSignal: SIGTERM or SIGKILL to
// the process's group (and, for SIGKILL under a PTY, its session).
func (s *Server) envdSendSignal(_ *http.Request, req *pbSendSignalRequest) (*pbEmpty, error) {
	ep, err := s.envdProcs.find(req.Process, false)
	if err != nil {
		return nil, err
	}
	var sig unix.Signal
	switch req.Signal {
	case signalSIGKILL:
		sig = unix.SIGKILL
	case signalSIGTERM:
		sig = unix.SIGTERM
	default:
		return nil, withCode(connectUnimplemented, fmt.Errorf("signal %d: only SIGNAL_SIGTERM and SIGNAL_SIGKILL are served", req.Signal))
	}
	if _, err := s.children.signalGroup(ep.pid, sig); err != nil {
		return nil, fmt.Errorf("signal process %d: %w", ep.pid, err)
	}
	if ep.pty != nil && sig == unix.SIGKILL {
		killSession(ep.pid)
	}
	return &pbEmpty{}, nil
}

// envdCloseStdin answers process.Process/CloseStdin: the process reads
// EOF. Closing a closed (or absent) stdin is no error.
func (s *Server) envdCloseStdin(_ *http.Request, req *pbProcessRequest) (*pbEmpty, error) {
	ep, err := s.envdProcs.find(req.Process, false)
	if err != nil {
		return nil, err
	}
	if ep.pty != nil {
		return nil, withCode(connectFailedPrecondition, fmt.Errorf("process %d runs under a pty: send Ctrl+D (0x04) as pty input instead", ep.pid))
	}
	ep.stdinMu.Lock()
	defer ep.stdinMu.Unlock()
	if ep.rc.inW == nil || ep.stdinClosed {
		return &pbEmpty{}, nil
	}
	ep.stdinClosed = true
	if err := ep.rc.inW.Close(); err != nil {
		return nil, fmt.Errorf("close stdin of process %d: %w", ep.pid, err)
	}
	return &pbEmpty{}, nil
}

// envdUpdate answers process.Process/Update: a new size of its PTY.
func (s *Server) envdUpdate(_ *http.Request, req *pbUpdateRequest) (*pbEmpty, error) {
	ep, err := s.envdProcs.find(req.Process, false)
	if err != nil {
		return nil, err
	}
	if req.PTY == nil || req.PTY.Size == nil {
		return &pbEmpty{}, nil
	}
	if ep.pty == nil {
		return nil, withCode(connectFailedPrecondition, fmt.Errorf("process %d has no pty to resize", ep.pid))
	}
	if err := ep.pty.resize(int(req.PTY.Size.Cols), int(req.PTY.Size.Rows)); err != nil {
		return nil, err
	}
	return &pbEmpty{}, nil
}

// deref returns *p, or "" when p is nil.
func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}
