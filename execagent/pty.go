package execagent

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/creack/pty"
	"github.com/gorilla/websocket"
	"golang.org/x/sys/unix"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

// PTY sessions (docs/ARCHITECTURE.md "Terminals, ports and the console"):
// a program under a pseudo-terminal in its own session, a bounded replay
// ring of its output, and WebSocket clients attached to it.

// Bounds of PTYs.
const (
	// ptyReadChunk is the largest output message: one read of the PTY.
	ptyReadChunk = 32 << 10
	// ptyClientQueue bounds the live output messages queued for one
	// client beyond its replay; a client that falls further behind is
	// closed (1008), never allowed to block the PTY's reader.
	ptyClientQueue = 64
	// ptyWriteTimeout bounds writing one message to a client.
	ptyWriteTimeout = 10 * time.Second
	// ptyHangupGrace is how long a PTY's programs get after SIGHUP before
	// its session is killed.
	ptyHangupGrace = 2 * time.Second
	// ptyCloseGrace is how long a client has to answer a close.
	ptyCloseGrace = 2 * time.Second
	// maxPTYSize bounds cols and rows.
	maxPTYSize = 1000
	// closeLeaseGone is the close of a client whose PTY went with the
	// lease (a new lease's init): 4000 + 410.
	closeLeaseGone = 4410
)

// ptyTable holds the agent's PTYs. Safe for concurrent use.
type ptyTable struct {
	srv *Server
	mu  sync.Mutex
	m   map[string]*ptySession
	// beforeAttach, when set (tests), runs in an attach between the
	// WebSocket's upgrade and the client's attach to its PTY.
	beforeAttach func()
}

func newPTYTable(s *Server) *ptyTable { return &ptyTable{srv: s, m: map[string]*ptySession{}} }

// ptySession is one PTY: its program, the master side and the clients.
type ptySession struct {
	id      string
	command []string
	cmd     *exec.Cmd
	pid     int // the program's pid: its session and process group id
	master  *os.File
	started time.Time

	// tap, when set, gets each chunk of output after the clients (an envd
	// process's subscribers, envd_process.go); it may block the reader.
	tap func([]byte)

	writeMu sync.Mutex // input writes, in order

	mu         sync.Mutex
	out        *ring
	cols, rows int
	clients    map[*ptyClient]struct{}
	// dropCode and dropWhy, once reset forgot the PTY, are what a client
	// that attaches after it is closed with (a lease_gone that the attach
	// raced).
	dropCode int
	dropWhy  string
	exited   bool
	exitCode int
	signal   string
	ended    time.Time
	done     chan struct{} // closed when exited is set
	readDone chan struct{}
}

// ptyMsg is one message queued for a client: output bytes, or the exit.
type ptyMsg struct {
	data []byte
	exit *agentapi.PTYControl
}

// ptyClient is one attached WebSocket.
type ptyClient struct {
	conn *websocket.Conn
	send chan ptyMsg
	gone chan struct{} // closed by drop
	once sync.Once
	code int
	why  string
}

// drop ends the client with a close code (once); its writer sends it.
func (c *ptyClient) drop(code int, why string) {
	c.once.Do(func() {
		c.code, c.why = code, why
		close(c.gone)
		// A write blocked on a client that reads nothing gets a second
		// more; then the connection is cut.
		_ = c.conn.NetConn().SetWriteDeadline(time.Now().Add(time.Second))
	})
}

// create starts a PTY for req; tap (may be nil) gets its output (ptySession.tap).
func (t *ptyTable) create(req agentapi.PTYCreateRequest, tap func([]byte)) (*ptySession, error) {
	s := t.srv
	cols, rows, err := ptySize(req.Cols, req.Rows, 80, 24)
	if err != nil {
		return nil, err
	}
	argv := req.Command
	if len(argv) == 0 {
		argv = []string{s.shell.Path}
	}
	env := req.Env
	if _, ok := env["TERM"]; !ok {
		env = make(map[string]string, len(req.Env)+1)
		for k, v := range req.Env {
			env[k] = v
		}
		env["TERM"] = "xterm-256color"
	}
	spec, err := s.commandSpec("", argv, env, req.Cwd)
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.m) >= s.cfg.MaxPTYs && !t.evictExitedLocked() {
		return nil, fmt.Errorf("too many PTYs (the maximum is %d running); delete some first: %w", s.cfg.MaxPTYs, errConflict)
	}
	master, tty, err := pty.Open()
	if err != nil {
		return nil, fmt.Errorf("open pty: %w", err)
	}
	defer tty.Close()
	if err := pty.Setsize(master, &pty.Winsize{Cols: uint16(cols), Rows: uint16(rows)}); err != nil {
		_ = master.Close()
		return nil, fmt.Errorf("size pty: %w", err)
	}
	cmd := newCmd(spec)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = tty, tty, tty
	// Its own session (so its own process group) with the PTY as its
	// controlling terminal: job control and ^C work as on a terminal.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := s.children.start(cmd); err != nil {
		_ = master.Close()
		return nil, startError("start pty program", spec.argv, spec.env, err)
	}
	p := &ptySession{
		id: newID("pty-"), command: argv, cmd: cmd, pid: cmd.Process.Pid, master: master, started: time.Now(),
		out: newRing(s.cfg.PTYReplay), cols: cols, rows: rows, clients: map[*ptyClient]struct{}{},
		done: make(chan struct{}), readDone: make(chan struct{}), tap: tap,
	}
	t.m[p.id] = p
	s.wg.Add(2)
	go func() { defer s.wg.Done(); p.read() }()
	go func() { defer s.wg.Done(); p.wait(s) }()
	return p, nil
}

// evictExitedLocked forgets the PTY that exited first, to make room; false
// when every PTY runs. t.mu is held.
func (t *ptyTable) evictExitedLocked() bool {
	var oldest *ptySession
	for _, p := range t.m {
		p.mu.Lock()
		if p.exited && (oldest == nil || p.ended.Before(oldest.ended)) {
			oldest = p
		}
		p.mu.Unlock()
	}
	if oldest == nil {
		return false
	}
	delete(t.m, oldest.id)
	return true
}

// ptySize checks a terminal size; zero takes the default.
func ptySize(cols, rows, defCols, defRows int) (int, int, error) {
	if cols == 0 {
		cols = defCols
	}
	if rows == 0 {
		rows = defRows
	}
	if cols < 1 || cols > maxPTYSize {
		return 0, 0, invalid("cols", "must be 1 to %d, got %d", maxPTYSize, cols)
	}
	if rows < 1 || rows > maxPTYSize {
		return 0, 0, invalid("rows", "must be 1 to %d, got %d", maxPTYSize, rows)
	}
	return cols, rows, nil
}

// read copies the PTY's output into the ring and to every client, until
// the PTY closes (every program holding its terminal has exited, or wait
// closed it).
func (p *ptySession) read() {
	defer close(p.readDone)
	buf := make([]byte, ptyReadChunk)
	for {
		n, err := p.master.Read(buf)
		if n > 0 {
			b := append([]byte(nil), buf[:n]...) // shared by the clients' queues
			p.broadcast(b)
			if p.tap != nil {
				p.tap(b)
			}
		}
		if err != nil {
			return
		}
	}
}

// broadcast appends b to the ring and queues it for every client; a client
// whose queue is full is dropped (1008).
func (p *ptySession) broadcast(b []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.out.write(b)
	for c := range p.clients {
		select {
		case c.send <- ptyMsg{data: b}:
		default:
			delete(p.clients, c)
			c.drop(websocket.ClosePolicyViolation, "client too slow: output queue full")
		}
	}
}

// wait reaps the program, lets the reader drain (bounded by DrainTimeout),
// records the exit and tells every client.
func (p *ptySession) wait(s *Server) {
	ps, _ := s.children.wait(p.cmd)
	code, sig := exitStatus(ps)
	waitDone(p.readDone, s.cfg.DrainTimeout)
	_ = p.master.Close()
	<-p.readDone
	p.mu.Lock()
	defer p.mu.Unlock()
	p.exited, p.exitCode, p.signal, p.ended = true, code, sig, time.Now()
	close(p.done)
	exit := p.exitControl()
	for c := range p.clients {
		select {
		case c.send <- ptyMsg{exit: exit}:
		default:
			c.drop(websocket.ClosePolicyViolation, "client too slow: output queue full")
		}
		delete(p.clients, c)
	}
}

// exitControl is the exit message; p.mu is held and p.exited set.
func (p *ptySession) exitControl() *agentapi.PTYControl {
	code := p.exitCode
	return &agentapi.PTYControl{Type: agentapi.PTYControlExit, ExitCode: &code, Signal: p.signal}
}

// attach registers c: the replay ring first, then live output (no gap, no
// repeat: both under p.mu), or the exit when the PTY has exited.
func (p *ptySession) attach(c *ptyClient) {
	p.mu.Lock()
	defer p.mu.Unlock()
	replay, _, _ := p.out.read(p.out.oldest(), int(p.out.total-p.out.oldest()))
	for len(replay) > 0 {
		n := min(len(replay), ptyReadChunk)
		c.send <- ptyMsg{data: replay[:n]} // the queue has room for the whole ring
		replay = replay[n:]
	}
	if p.dropCode != 0 { // reset forgot it while this client attached
		c.drop(p.dropCode, p.dropWhy)
		return
	}
	if p.exited {
		c.send <- ptyMsg{exit: p.exitControl()}
		return
	}
	p.clients[c] = struct{}{}
}

func (p *ptySession) detach(c *ptyClient) {
	p.mu.Lock()
	delete(p.clients, c)
	p.mu.Unlock()
}

// write sends input to the program.
func (p *ptySession) write(b []byte) error {
	p.writeMu.Lock()
	defer p.writeMu.Unlock()
	_, err := p.master.Write(b)
	return err
}

// resize sets the terminal size (the program gets SIGWINCH).
func (p *ptySession) resize(cols, rows int) error {
	cols, rows, err := ptySize(cols, rows, 0, 0)
	if err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.exited {
		return fmt.Errorf("pty %s has exited: %w", p.id, errConflict)
	}
	if err := pty.Setsize(p.master, &pty.Winsize{Cols: uint16(cols), Rows: uint16(rows)}); err != nil {
		return fmt.Errorf("resize pty: %w", err)
	}
	p.cols, p.rows = cols, rows
	return nil
}

func (p *ptySession) info() agentapi.PTYInfo {
	p.mu.Lock()
	defer p.mu.Unlock()
	in := agentapi.PTYInfo{
		ID: p.id, PID: p.pid, Command: p.command, Cols: p.cols, Rows: p.rows, State: agentapi.PTYRunning,
		StartedAt: p.started, Clients: len(p.clients), OutputBytes: p.out.total,
	}
	if p.exited {
		code, ended := p.exitCode, p.ended
		in.State, in.ExitCode, in.Signal, in.EndedAt = agentapi.PTYExited, &code, p.signal, &ended
	}
	return in
}

// hangUp ends the PTY's programs: SIGHUP to its process group, then, after
// ptyHangupGrace, SIGKILL to every process of its session (jobs in other
// process groups included); it waits (bounded) for the exit.
func (t *ptyTable) hangUp(p *ptySession) {
	s := t.srv
	s.children.killGroup(p.pid, unix.SIGHUP)
	if !waitDone(p.done, ptyHangupGrace) {
		killSession(p.pid)
		s.children.killGroup(p.pid, unix.SIGKILL)
	}
	// A job that left the session's process group may hold the terminal.
	killSession(p.pid)
	waitDone(p.done, s.cfg.DrainTimeout+10*time.Second)
}

// killSession sends SIGKILL to every process of session sid.
func killSession(sid int) {
	for _, pid := range scanProc(func(f procStat) bool { return f.sid == sid && !f.dead() }) {
		_ = unix.Kill(pid, unix.SIGKILL)
	}
}

func (t *ptyTable) get(id string) (*ptySession, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p, ok := t.m[id]
	if !ok {
		return nil, fmt.Errorf("pty %q: %w", id, errNotFound)
	}
	return p, nil
}

func (t *ptyTable) list() []agentapi.PTYInfo {
	all := lockedValues(&t.mu, t.m)
	out := make([]agentapi.PTYInfo, 0, len(all))
	for _, p := range all {
		out = append(out, p.info())
	}
	slices.SortFunc(out, func(a, b agentapi.PTYInfo) int { return a.StartedAt.Compare(b.StartedAt) })
	return out
}

// kill hangs p up, forgets it and returns its last state.
func (t *ptyTable) kill(p *ptySession) agentapi.PTYInfo {
	t.hangUp(p)
	t.forget(p)
	return p.info()
}

// forget removes p from the table (if it is still there).
func (t *ptyTable) forget(p *ptySession) {
	t.mu.Lock()
	if t.m[p.id] == p {
		delete(t.m, p.id)
	}
	t.mu.Unlock()
}

// reset ends every PTY for a new lease (or the agent's Close): the PTYs are
// forgotten and their clients closed with code (4410 lease_gone, 1001 going
// away) at once, so the next lease never sees them; their programs are hung
// up in the background (goroutines of the server's WaitGroup), so an init
// does not wait for them.
func (t *ptyTable) reset(code int, why string) {
	t.mu.Lock()
	all := make([]*ptySession, 0, len(t.m))
	for id, p := range t.m {
		all = append(all, p)
		delete(t.m, id)
	}
	t.mu.Unlock()
	for _, p := range all {
		p.mu.Lock()
		p.dropCode, p.dropWhy = code, why
		for c := range p.clients {
			c.drop(code, why)
			delete(p.clients, c)
		}
		p.mu.Unlock()
		t.srv.wg.Add(1)
		go func() { defer t.srv.wg.Done(); t.hangUp(p) }()
	}
}

// handlePTYCreate answers POST /v1/ptys.
func (s *Server) handlePTYCreate(w http.ResponseWriter, r *http.Request) error {
	var req agentapi.PTYCreateRequest
	if r.ContentLength != 0 {
		if err := s.decodeJSON(w, r, &req); err != nil {
			return err
		}
	}
	p, err := s.ptys.create(req, nil)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, p.info())
	return nil
}

// handlePTYList answers GET /v1/ptys.
func (s *Server) handlePTYList(w http.ResponseWriter, r *http.Request) error {
	writeJSON(w, http.StatusOK, agentapi.PTYList{PTYs: s.ptys.list()})
	return nil
}

// handlePTYGet answers GET /v1/ptys/{id}.
func (s *Server) handlePTYGet(w http.ResponseWriter, r *http.Request) error {
	p, err := s.ptys.get(r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, p.info())
	return nil
}

// handlePTYResize answers POST /v1/ptys/{id}/resize.
func (s *Server) handlePTYResize(w http.ResponseWriter, r *http.Request) error {
	p, err := s.ptys.get(r.PathValue("id"))
	if err != nil {
		return err
	}
	var req agentapi.PTYResizeRequest
	if err := s.decodeJSON(w, r, &req); err != nil {
		return err
	}
	if req.Cols == 0 || req.Rows == 0 {
		return invalid("cols", "cols and rows are required")
	}
	if err := p.resize(req.Cols, req.Rows); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, p.info())
	return nil
}

// handlePTYKill answers DELETE /v1/ptys/{id}.
func (s *Server) handlePTYKill(w http.ResponseWriter, r *http.Request) error {
	p, err := s.ptys.get(r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, s.ptys.kill(p))
	return nil
}

// handlePTYAttach answers GET /v1/ptys/{id}/attach: a WebSocket
// (agentapi.PTYSubprotocol) with the replay ring, then live output; input
// and resizes from the client. It returns when the client leaves or the PTY
// ends.
func (s *Server) handlePTYAttach(w http.ResponseWriter, r *http.Request) error {
	p, err := s.ptys.get(r.PathValue("id"))
	if err != nil {
		return err
	}
	up := websocket.Upgrader{
		HandshakeTimeout: 10 * time.Second,
		ReadBufferSize:   4 << 10,
		WriteBufferSize:  4 << 10,
		Subprotocols:     []string{agentapi.PTYSubprotocol},
		// The bearer token authenticated the request; there is no
		// browser session (cookie) to protect here.
		CheckOrigin: func(*http.Request) bool { return true },
	}
	conn, err := up.Upgrade(w, r, nil)
	if err != nil {
		return nil // the upgrader answered
	}
	conn.SetReadLimit(agentapi.MaxPTYMessage)
	if s.ptys.beforeAttach != nil {
		s.ptys.beforeAttach()
	}
	c := &ptyClient{
		conn: conn, gone: make(chan struct{}),
		send: make(chan ptyMsg, ptyClientQueue+int(s.cfg.PTYReplay/ptyReadChunk)+2),
	}
	p.attach(c)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); c.writeLoop(s) }()
	c.readLoop(p)
	p.detach(c)
	c.drop(websocket.CloseNormalClosure, "")
	wg.Wait()
	_ = conn.Close()
	return nil
}

// writeLoop sends queued messages to the client until the exit (then a
// normal close), a drop (its close code) or a failed write.
func (c *ptyClient) writeLoop(s *Server) {
	defer func() {
		// The client has ptyCloseGrace to answer the close; then its reads fail.
		_ = c.conn.SetReadDeadline(time.Now().Add(ptyCloseGrace))
	}()
	for {
		select {
		case <-c.gone:
			c.closeWith(c.code, c.why)
			return
		default:
		}
		select {
		case m := <-c.send:
			if err := c.write(m); err != nil {
				return
			}
			if m.exit != nil {
				c.closeWith(websocket.CloseNormalClosure, "")
				return
			}
		case <-c.gone:
			c.closeWith(c.code, c.why)
			return
		case <-s.ctx.Done():
			c.closeWith(websocket.CloseGoingAway, "the agent is shutting down")
			return
		}
	}
}

func (c *ptyClient) write(m ptyMsg) error {
	_ = c.conn.SetWriteDeadline(time.Now().Add(ptyWriteTimeout))
	if m.exit != nil {
		b, _ := json.Marshal(m.exit)
		return c.conn.WriteMessage(websocket.TextMessage, b)
	}
	return c.conn.WriteMessage(websocket.BinaryMessage, m.data)
}

func (c *ptyClient) closeWith(code int, why string) {
	_ = c.conn.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(code, why), time.Now().Add(ptyWriteTimeout))
}

// readLoop passes the client's input and resizes to p until the client
// closes or fails (a message over agentapi.MaxPTYMessage: the library
// closes with 1009).
func (c *ptyClient) readLoop(p *ptySession) {
	for {
		typ, b, err := c.conn.ReadMessage()
		if err != nil {
			return
		}
		switch typ {
		case websocket.BinaryMessage:
			if err := p.write(b); err != nil {
				return
			}
		case websocket.TextMessage:
			var ctl agentapi.PTYControl
			if json.Unmarshal(b, &ctl) != nil || ctl.Type != agentapi.PTYControlResize {
				c.drop(4000+http.StatusBadRequest, agentapi.CodeBadRequest)
				return
			}
			if err := p.resize(ctl.Cols, ctl.Rows); err != nil {
				var br *badRequestError
				if errors.As(err, &br) {
					c.drop(4000+http.StatusBadRequest, agentapi.CodeBadRequest)
					return
				}
			}
		}
	}
}
