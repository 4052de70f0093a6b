package execagent

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

// Limits of named and rpc processes.
const (
	maxProcessName = 63
	// defaultReplyBytes bounds a reply line when a call names no limit.
	defaultReplyBytes = 1 << 20
	// stderrTailBytes is how much of a process's output ring an rpc error
	// quotes.
	stderrTailBytes = 2 << 10
	// rpcReadBuffer is the read buffer of a reply pipe; longer lines are
	// assembled from several reads.
	rpcReadBuffer = 64 << 10
)

// procOptions are the start options of named and rpc processes.
type procOptions struct {
	name string
	rpc  bool
}

// processOptions validates the name and rpc fields of a start request.
func processOptions(req agentapi.ProcessStartRequest) (procOptions, error) {
	if req.Name != "" {
		if err := checkProcessName(req.Name); err != nil {
			return procOptions{}, err
		}
	}
	return procOptions{name: req.Name, rpc: req.RPC}, nil
}

// checkProcessName accepts 1..63 letters, digits, '.', '_' and '-',
// starting with a letter or digit and not with "proc-" (the prefix of ids).
func checkProcessName(name string) error {
	ok := len(name) <= maxProcessName && isAlnumByte(name[0]) && !strings.HasPrefix(name, "proc-")
	for i := 0; ok && i < len(name); i++ {
		c := name[i]
		ok = isAlnumByte(c) || c == '.' || c == '_' || c == '-'
	}
	if !ok {
		return invalid("name", "must be 1 to %d letters, digits, '.', '_' or '-', starting with a letter or digit and not with \"proc-\", got %q", maxProcessName, name)
	}
	return nil
}

func isAlnumByte(c byte) bool {
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')
}

// checkNameLocked refuses a name held by a running process and returns the
// exited process of that name, which the new one replaces (nil if none).
// t.mu is held.
func (t *processTable) checkNameLocked(name string) (*process, error) {
	if name == "" {
		return nil, nil
	}
	old := t.names[name]
	if old == nil {
		return nil, nil
	}
	old.mu.Lock()
	exited := old.exited
	old.mu.Unlock()
	if !exited {
		return nil, statusError(errConflict, http.StatusConflict, agentapi.CodeNameInUse,
			"a running process (%s) is named %q; delete it first", old.id, name)
	}
	return old, nil
}

// forgetLocked removes p from the table and closes its reply pipe. t.mu is
// held.
func (t *processTable) forgetLocked(p *process) {
	delete(t.m, p.id)
	if p.name != "" && t.names[p.name] == p {
		delete(t.names, p.name)
	}
	p.rpc.close()
}

// rpcPipe is the reply side of an rpc process: its stdout, read one line per
// call. One call at a time holds mu.
type rpcPipe struct {
	mu sync.Mutex
	f  *os.File
	r  *bufio.Reader
}

func newRPCPipe(f *os.File) *rpcPipe {
	return &rpcPipe{f: f, r: bufio.NewReaderSize(f, rpcReadBuffer)}
}

// close closes the reply pipe; a call reading it fails. Safe on nil.
func (rp *rpcPipe) close() {
	if rp != nil {
		_ = rp.f.Close()
	}
}

// closeFile closes f when it is not nil.
func closeFile(f *os.File) {
	if f != nil {
		_ = f.Close()
	}
}

// errReplyTooLong: a reply line exceeded its limit.
var errReplyTooLong = errors.New("reply line too long")

// readLine reads the next line (without its "\n", and a "\r" before it) of
// at most max bytes, until deadline.
func (rp *rpcPipe) readLine(deadline time.Time, max int64) ([]byte, error) {
	if err := rp.f.SetReadDeadline(deadline); err != nil {
		return nil, fmt.Errorf("set reply deadline: %w", err)
	}
	var line []byte
	for {
		chunk, err := rp.r.ReadSlice('\n')
		if int64(len(line)+len(chunk)) > max+1 { // +1: the newline
			return nil, errReplyTooLong
		}
		line = append(line, chunk...)
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if err != nil {
			return nil, err
		}
		line = bytes.TrimSuffix(line[:len(line)-1], []byte("\r"))
		if int64(len(line)) > max {
			return nil, errReplyTooLong
		}
		return line, nil
	}
}

// handleProcessCall answers POST /v1/processes/{id}/call.
func (s *Server) handleProcessCall(w http.ResponseWriter, r *http.Request) error {
	p, err := s.processes.get(r.PathValue("id"))
	if err != nil {
		return err
	}
	var req agentapi.ProcessCallRequest
	if err := s.decodeJSON(w, r, &req); err != nil {
		return err
	}
	var line bytes.Buffer
	if r := bytes.TrimSpace(req.Request); len(r) == 0 || string(r) == "null" {
		return invalid("request", "required: one JSON value (not null) to write as a line")
	}
	if err := json.Compact(&line, req.Request); err != nil {
		return invalid("request", "must be one JSON value: %s", err.Error())
	}
	line.WriteByte('\n')
	timeout, err := s.timeout(req.TimeoutMS)
	if err != nil {
		return err
	}
	maxReply := int64(defaultReplyBytes)
	switch {
	case req.MaxReplyBytes < 0 || req.MaxReplyBytes > s.cfg.MaxOutputBytes:
		return invalid("max_reply_bytes", "must be between 0 (the default, %d) and %d", defaultReplyBytes, s.cfg.MaxOutputBytes)
	case req.MaxReplyBytes > 0:
		maxReply = req.MaxReplyBytes
	}
	if p.rpc == nil {
		return fmt.Errorf("process %s was not started with \"rpc\": true: %w", p.id, errConflict)
	}
	if !p.rpc.mu.TryLock() {
		return fmt.Errorf("process %s is answering another call: %w", p.id, errBusy)
	}
	defer p.rpc.mu.Unlock()
	start := time.Now()
	reply, err := s.call(p, line.Bytes(), start.Add(timeout), maxReply)
	if err != nil && s.closing() { // after the call ended: see Server.closing
		return errKilledByShutdown
	}
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, agentapi.ProcessCallResult{Reply: reply, DurationMS: time.Since(start).Milliseconds()})
	return nil
}

// call writes line to p's stdin and reads its reply line. p.rpc.mu is held.
func (s *Server) call(p *process, line []byte, deadline time.Time, maxReply int64) (json.RawMessage, error) {
	if p.isExited() {
		return nil, s.exitedError(p, agentapi.CodeProcessExited, "had exited before the call")
	}
	writeBy := time.Now().Add(s.cfg.StdinTimeout)
	if deadline.Before(writeBy) {
		writeBy = deadline
	}
	if err := p.writeLine(line, writeBy); err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			s.processes.killAndWait(p)
			return nil, statusError(errTimeout, http.StatusGatewayTimeout, agentapi.CodeTimeout,
				"process %s did not read its request within the timeout; it was killed", p.id)
		}
		// Nothing was read: the request never reached the process.
		return nil, s.exitedError(p, agentapi.CodeProcessExited, "closed its stdin before the call")
	}
	reply, err := p.rpc.readLine(deadline, maxReply)
	switch {
	case err == nil && json.Valid(reply):
		return reply, nil
	case err == nil:
		s.processes.killAndWait(p)
		return nil, statusError(errConflict, http.StatusConflict, agentapi.CodeProtocolError,
			"process %s wrote a reply line that is not one JSON value (%s); it was killed%s", p.id, quoteHead(reply), s.tailNote(p))
	case errors.Is(err, errReplyTooLong):
		s.processes.killAndWait(p)
		return nil, statusError(errConflict, http.StatusConflict, agentapi.CodeProtocolError,
			"process %s wrote a reply line over %d bytes; it was killed%s", p.id, maxReply, s.tailNote(p))
	case errors.Is(err, os.ErrDeadlineExceeded):
		s.processes.killAndWait(p)
		return nil, statusError(errTimeout, http.StatusGatewayTimeout, agentapi.CodeTimeout,
			"process %s did not reply within the timeout; it was killed%s", p.id, s.tailNote(p))
	default: // EOF: every writer of its stdout is gone
		waitDone(p.done, s.cfg.DrainTimeout+5*time.Second)
		if !p.isExited() {
			s.processes.killAndWait(p)
		}
		return nil, s.exitedError(p, agentapi.CodeNoReply, "exited before it replied")
	}
}

// writeLine writes line to p's stdin until deadline.
func (p *process) writeLine(line []byte, deadline time.Time) error {
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	if p.stdin == nil || p.stdinClosed {
		return os.ErrClosed
	}
	_ = p.stdin.SetWriteDeadline(deadline)
	_, err := p.stdin.Write(line)
	if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) && !errors.Is(err, unix.EPIPE) && !errors.Is(err, os.ErrClosed) {
		return fmt.Errorf("write stdin of process %s: %w", p.id, err)
	}
	return err
}

func (p *process) isExited() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exited
}

// killAndWait kills p's group and waits (bounded) until it has exited; p
// stays in the table, so its status and output remain readable.
func (t *processTable) killAndWait(p *process) {
	t.srv.children.killGroup(p.pgid, unix.SIGKILL)
	waitDone(p.done, t.srv.cfg.DrainTimeout+10*time.Second)
}

// exitedError is the 409 process_exited or no_reply answer for p, with its exit status
// and the tail of its stderr.
func (s *Server) exitedError(p *process, code, what string) error {
	waitDone(p.done, s.cfg.DrainTimeout+5*time.Second)
	p.mu.Lock()
	status := "is still running"
	if p.exited {
		status = fmt.Sprintf("exit code %d", p.exitCode)
		if p.signal != "" {
			status += ", signal " + p.signal
		}
	}
	p.mu.Unlock()
	return statusError(errConflict, http.StatusConflict, code,
		"process %s %s (%s)%s", p.id, what, status, s.tailNote(p))
}

// tailNote quotes the end of p's output ring (its stderr, for an rpc
// process), or returns "" when it is empty.
func (s *Server) tailNote(p *process) string {
	p.mu.Lock()
	data, _, _ := p.out.read(max(0, p.out.total-stderrTailBytes), stderrTailBytes)
	p.mu.Unlock()
	tail := strings.TrimSpace(strings.ToValidUTF8(string(data), "\uFFFD"))
	if tail == "" {
		return ""
	}
	return "; stderr tail: " + tail
}

// quoteHead quotes the first bytes of b for an error message.
func quoteHead(b []byte) string {
	const n = 200
	if len(b) > n {
		return fmt.Sprintf("%q...", strings.ToValidUTF8(string(b[:n]), "\uFFFD"))
	}
	return fmt.Sprintf("%q", strings.ToValidUTF8(string(b), "\uFFFD"))
}
