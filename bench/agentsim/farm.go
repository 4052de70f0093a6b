package agentsim

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

const (
	// maxBody bounds a request body the agents read (the real agent's
	// default JSON limit is larger; the gateway's calls here are small).
	maxBody = 1 << 20
	// maxSessions bounds the sessions one agent keeps.
	maxSessions = 64
	// idleTimeout closes keep-alive connections idle this long.
	idleTimeout = 10 * time.Minute
)

// Config configures a Farm.
type Config struct {
	// Log receives a line for each agent that fails to come up (nil:
	// discarded).
	Log *slog.Logger
}

// Farm serves simulated agents, one per loopback address. Safe for
// concurrent use.
type Farm struct {
	log *slog.Logger
	srv *http.Server

	mu     sync.Mutex
	agents map[string]*agent
	closed bool
	wg     sync.WaitGroup

	stats counters
}

// counters are a Farm's counts.
type counters struct {
	ups, downs, upErrors       atomic.Int64
	requests, unauthorized     atomic.Int64
	stale, inits, execs, other atomic.Int64
	sessionRuns, healths       atomic.Int64
	maxUp                      atomic.Int64
}

// Stats are a Farm's counters since NewFarm (simulated agents).
type Stats struct {
	// Simulated is always true: these are simulated agents.
	Simulated bool `json:"simulated"`
	// Up is the number of agents serving now, MaxUp the most at once.
	Up    int64 `json:"up"`
	MaxUp int64 `json:"max_up"`
	// Ups and Downs count Up and Down calls that succeeded; UpErrors the
	// Up calls that failed (an address in use, not loopback).
	Ups      int64 `json:"ups"`
	Downs    int64 `json:"downs"`
	UpErrors int64 `json:"up_errors"`
	// Requests counts every request; Unauthorized the ones with a wrong or
	// missing token, Stale the ones fenced by the generation.
	Requests     int64 `json:"requests"`
	Unauthorized int64 `json:"unauthorized"`
	Stale        int64 `json:"stale"`
	// Healths, Inits, Execs and SessionRuns count those calls answered
	// with success; Other the rest of the successful ones (session create,
	// list and close).
	Healths     int64 `json:"healths"`
	Inits       int64 `json:"inits"`
	Execs       int64 `json:"execs"`
	SessionRuns int64 `json:"session_runs"`
	Other       int64 `json:"other"`
}

// Add returns the sum of s and o (Up and MaxUp are summed too: the agents of
// several processes).
func (s Stats) Add(o Stats) Stats {
	return Stats{
		Simulated: true, Up: s.Up + o.Up, MaxUp: s.MaxUp + o.MaxUp, Ups: s.Ups + o.Ups, Downs: s.Downs + o.Downs,
		UpErrors: s.UpErrors + o.UpErrors, Requests: s.Requests + o.Requests, Unauthorized: s.Unauthorized + o.Unauthorized,
		Stale: s.Stale + o.Stale, Healths: s.Healths + o.Healths, Inits: s.Inits + o.Inits, Execs: s.Execs + o.Execs,
		SessionRuns: s.SessionRuns + o.SessionRuns, Other: s.Other + o.Other,
	}
}

// agent is one simulated agent: its token, lease state and sessions, and
// the listener and connections that Down closes.
type agent struct {
	addr    string
	authHdr []byte
	started time.Time
	ln      net.Listener

	mu       sync.Mutex
	leaseID  string
	gen      int64
	initDone bool
	sessions map[string]agentapi.SessionInfo
	nextSess int
	conns    map[net.Conn]struct{}
	down     bool
}

// NewFarm returns a Farm serving no agents.
func NewFarm(cfg Config) *Farm {
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	f := &Farm{log: log, agents: map[string]*agent{}}
	f.srv = &http.Server{
		Handler:           f.routes(),
		ReadHeaderTimeout: time.Minute,
		IdleTimeout:       idleTimeout,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			if ac, ok := c.(*agentConn); ok {
				return context.WithValue(ctx, agentKey{}, ac.a)
			}
			return ctx
		},
	}
	return f
}

type agentKey struct{}

// Up starts serving an agent on addr (a loopback host:port) whose token is
// token. It fails when addr is not loopback, is served already, or cannot
// be listened on.
func (f *Farm) Up(addr, token string) error {
	if token == "" {
		f.stats.upErrors.Add(1)
		return fmt.Errorf("agent %s: empty token", addr)
	}
	if err := checkLoopback(addr); err != nil {
		f.stats.upErrors.Add(1)
		return err
	}
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return errors.New("agent farm closed")
	}
	if _, ok := f.agents[addr]; ok {
		f.mu.Unlock()
		f.stats.upErrors.Add(1)
		return fmt.Errorf("agent %s: already up", addr)
	}
	// Reserve the address while listening (outside the lock).
	a := &agent{addr: addr, authHdr: []byte("Bearer " + token), started: time.Now(),
		sessions: map[string]agentapi.SessionInfo{}, conns: map[net.Conn]struct{}{}}
	f.agents[addr] = a
	f.mu.Unlock()

	ln, err := net.Listen("tcp", addr)
	if err != nil {
		f.mu.Lock()
		delete(f.agents, addr)
		f.mu.Unlock()
		f.stats.upErrors.Add(1)
		f.log.Warn("agent could not listen", "addr", addr, "err", err)
		return fmt.Errorf("agent %s: listen: %w", addr, err)
	}
	a.mu.Lock()
	if a.down { // Down raced the listen
		a.mu.Unlock()
		_ = ln.Close()
		return fmt.Errorf("agent %s: taken down while coming up", addr)
	}
	a.ln = ln
	a.mu.Unlock()
	f.stats.ups.Add(1)
	f.noteUp()
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		_ = f.srv.Serve(&agentListener{Listener: ln, a: a}) // returns when Down or Close closes ln
	}()
	return nil
}

// noteUp records the number of agents up after an Up.
func (f *Farm) noteUp() {
	f.mu.Lock()
	n := int64(len(f.agents))
	f.mu.Unlock()
	for {
		cur := f.stats.maxUp.Load()
		if n <= cur || f.stats.maxUp.CompareAndSwap(cur, n) {
			return
		}
	}
}

// Down stops the agent on addr: its listener and every connection to it
// are closed. An address that is not up is an error.
func (f *Farm) Down(addr string) error {
	f.mu.Lock()
	a, ok := f.agents[addr]
	delete(f.agents, addr)
	f.mu.Unlock()
	if !ok {
		return fmt.Errorf("agent %s: not up", addr)
	}
	a.close()
	f.stats.downs.Add(1)
	return nil
}

// close closes a's listener and connections.
func (a *agent) close() {
	a.mu.Lock()
	a.down = true
	ln := a.ln
	conns := make([]net.Conn, 0, len(a.conns))
	for c := range a.conns {
		conns = append(conns, c)
	}
	a.conns = map[net.Conn]struct{}{}
	a.mu.Unlock()
	if ln != nil {
		_ = ln.Close()
	}
	for _, c := range conns {
		_ = c.Close()
	}
}

// Close takes every agent down and stops serving; ctx bounds the wait for
// requests in flight. Idempotent.
func (f *Farm) Close(ctx context.Context) error {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return nil
	}
	f.closed = true
	agents := f.agents
	f.agents = map[string]*agent{}
	f.mu.Unlock()
	for _, a := range agents {
		a.close()
	}
	err := f.srv.Shutdown(ctx) // the listeners are closed already
	f.wg.Wait()
	if err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("close agent farm: %w", err)
	}
	return nil
}

// Stats returns the counters. Safe for concurrent use.
func (f *Farm) Stats() Stats {
	f.mu.Lock()
	up := int64(len(f.agents))
	f.mu.Unlock()
	c := &f.stats
	return Stats{
		Simulated: true, Up: up, MaxUp: c.maxUp.Load(), Ups: c.ups.Load(), Downs: c.downs.Load(), UpErrors: c.upErrors.Load(),
		Requests: c.requests.Load(), Unauthorized: c.unauthorized.Load(), Stale: c.stale.Load(),
		Healths: c.healths.Load(), Inits: c.inits.Load(), Execs: c.execs.Load(), SessionRuns: c.sessionRuns.Load(), Other: c.other.Load(),
	}
}

// checkLoopback refuses an address that is not a loopback host:port.
func checkLoopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("agent %s: %w", addr, err)
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("agent %s: not a loopback address (the simulated agents listen on 127.0.0.0/8 only)", addr)
	}
	return nil
}

// agentListener tags the connections it accepts with their agent.
type agentListener struct {
	net.Listener
	a *agent
}

func (l *agentListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	ac := &agentConn{Conn: c, a: l.a}
	l.a.mu.Lock()
	down := l.a.down
	if !down {
		l.a.conns[ac] = struct{}{}
	}
	l.a.mu.Unlock()
	if down {
		_ = c.Close()
		return nil, net.ErrClosed
	}
	return ac, nil
}

// agentConn is a connection to one agent; closing it forgets it.
type agentConn struct {
	net.Conn
	a    *agent
	once sync.Once
}

func (c *agentConn) Close() error {
	c.once.Do(func() {
		c.a.mu.Lock()
		delete(c.a.conns, c)
		c.a.mu.Unlock()
	})
	return c.Conn.Close()
}

// handler is one route's handler; it returns an error to answer.
type handler func(a *agent, w http.ResponseWriter, r *http.Request) *apiError

// apiError is an answer in the agent's ErrorBody shape.
type apiError struct {
	status int
	code   string
	msg    string
}

func errorf(status int, code, format string, args ...any) *apiError {
	return &apiError{status: status, code: code, msg: fmt.Sprintf(format, args...)}
}

func (f *Farm) routes() http.Handler {
	mux := http.NewServeMux()
	route := func(pattern string, fenced bool, count *atomic.Int64, h handler) {
		mux.Handle(pattern, f.wrap(fenced, count, h))
	}
	route("GET "+agentapi.RouteHealth, false, &f.stats.healths, handleHealth)
	route("POST "+agentapi.RouteInit, false, &f.stats.inits, handleInit)
	route("POST "+agentapi.RouteExec, true, &f.stats.execs, handleExec)
	route("POST "+agentapi.RouteSessions, true, &f.stats.other, handleSessionCreate)
	route("GET "+agentapi.RouteSessions, true, &f.stats.other, handleSessionList)
	route("DELETE "+agentapi.RouteSession, true, &f.stats.other, handleSessionClose)
	route("POST "+agentapi.RouteSessionRun, true, &f.stats.sessionRuns, handleSessionRun)
	route("DELETE "+agentapi.RouteCall, true, &f.stats.other, func(_ *agent, _ http.ResponseWriter, r *http.Request) *apiError {
		return errorf(http.StatusNotFound, agentapi.CodeNotFound, "no call %q in flight", r.PathValue("id"))
	})
	route("/", false, &f.stats.other, func(_ *agent, _ http.ResponseWriter, r *http.Request) *apiError {
		return errorf(http.StatusNotFound, agentapi.CodeNotFound,
			"agentsim (simulated agents) does not simulate %s %s: it serves /healthz, /v1/init, /v1/exec, /v1/sessions and /v1/calls", r.Method, r.URL.Path)
	})
	return mux
}

// wrap authenticates (and fences, when fenced) before h, as the agent does.
func (f *Farm) wrap(fenced bool, count *atomic.Int64, h handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.stats.requests.Add(1)
		a, _ := r.Context().Value(agentKey{}).(*agent)
		if a == nil {
			writeError(w, errorf(http.StatusNotFound, agentapi.CodeNotFound, "no agent on this address"))
			return
		}
		if err := authenticate(a, r); err != nil {
			f.stats.unauthorized.Add(1)
			writeError(w, err)
			return
		}
		if fenced {
			if err := a.checkGeneration(r); err != nil {
				if err.code == agentapi.CodeStaleGeneration {
					f.stats.stale.Add(1)
				}
				writeError(w, err)
				return
			}
		}
		if err := h(a, w, r); err != nil {
			if err.code == agentapi.CodeStaleGeneration {
				f.stats.stale.Add(1)
			}
			writeError(w, err)
			return
		}
		count.Add(1)
	})
}

func authenticate(a *agent, r *http.Request) *apiError {
	got := r.Header.Get("Authorization")
	if got == "" {
		return errorf(http.StatusUnauthorized, agentapi.CodeUnauthorized, "missing bearer token (Authorization: Bearer <token>)")
	}
	if subtle.ConstantTimeCompare([]byte(got), a.authHdr) != 1 {
		return errorf(http.StatusUnauthorized, agentapi.CodeUnauthorized, "wrong bearer token")
	}
	return nil
}

// checkGeneration refuses a request whose generation is below the agent's.
func (a *agent) checkGeneration(r *http.Request) *apiError {
	g := int64(0)
	if v := r.Header.Get(agentapi.HeaderGeneration); v != "" {
		var err error
		if g, err = strconv.ParseInt(v, 10, 64); err != nil || g < 0 {
			return errorf(http.StatusBadRequest, agentapi.CodeBadRequest, "%s: must be a non-negative integer, got %q", agentapi.HeaderGeneration, v)
		}
	}
	a.mu.Lock()
	cur := a.gen
	a.mu.Unlock()
	if g < cur {
		return errorf(http.StatusConflict, agentapi.CodeStaleGeneration, "request generation %d is older than the agent's generation %d", g, cur)
	}
	return nil
}

func (a *agent) health() agentapi.Health {
	a.mu.Lock()
	defer a.mu.Unlock()
	return agentapi.Health{Status: "ok", Version: agentapi.Version, LeaseID: a.leaseID, Generation: a.gen,
		UptimeMS: time.Since(a.started).Milliseconds()}
}

func handleHealth(a *agent, w http.ResponseWriter, _ *http.Request) *apiError {
	writeJSON(w, http.StatusOK, a.health())
	return nil
}

func handleInit(a *agent, w http.ResponseWriter, r *http.Request) *apiError {
	var req agentapi.InitRequest
	if err := decode(w, r, &req); err != nil {
		return err
	}
	if req.Generation < 0 {
		return errorf(http.StatusBadRequest, agentapi.CodeBadRequest, "generation: must be non-negative, got %d", req.Generation)
	}
	a.mu.Lock()
	switch {
	case req.Generation < a.gen:
		cur := a.gen
		a.mu.Unlock()
		return errorf(http.StatusConflict, agentapi.CodeStaleGeneration, "init generation %d is older than the agent's generation %d", req.Generation, cur)
	case req.Generation == a.gen && a.initDone && req.LeaseID != a.leaseID:
		cur := a.leaseID
		a.mu.Unlock()
		return errorf(http.StatusConflict, agentapi.CodeConflict, "generation %d is already initialized for lease %q, not %q", req.Generation, cur, req.LeaseID)
	}
	a.gen, a.leaseID, a.initDone = req.Generation, req.LeaseID, true
	a.mu.Unlock()
	writeJSON(w, http.StatusOK, a.health())
	return nil
}

func handleExec(_ *agent, w http.ResponseWriter, r *http.Request) *apiError {
	if r.Header.Get("Accept") == "text/event-stream" {
		return errorf(http.StatusBadRequest, agentapi.CodeBadRequest, "agentsim (simulated agents) does not simulate streaming execs")
	}
	var req agentapi.ExecRequest
	if err := decode(w, r, &req); err != nil {
		return err
	}
	if (req.Command == "") == (len(req.Argv) == 0) {
		return errorf(http.StatusBadRequest, agentapi.CodeBadRequest, "command, argv: set exactly one")
	}
	writeJSON(w, http.StatusOK, agentapi.ExecResult{ExitCode: 0})
	return nil
}

func handleSessionCreate(a *agent, w http.ResponseWriter, r *http.Request) *apiError {
	var req agentapi.SessionCreateRequest
	if err := decode(w, r, &req); err != nil {
		return err
	}
	a.mu.Lock()
	if len(a.sessions) >= maxSessions {
		a.mu.Unlock()
		return errorf(http.StatusConflict, agentapi.CodeConflict, "at most %d sessions", maxSessions)
	}
	a.nextSess++
	info := agentapi.SessionInfo{ID: "s" + strconv.Itoa(a.nextSess), Shell: "bash", CreatedAt: time.Now().UTC()}
	a.sessions[info.ID] = info
	a.mu.Unlock()
	writeJSON(w, http.StatusCreated, info)
	return nil
}

func handleSessionList(a *agent, w http.ResponseWriter, _ *http.Request) *apiError {
	a.mu.Lock()
	list := agentapi.SessionList{Sessions: make([]agentapi.SessionInfo, 0, len(a.sessions))}
	for _, s := range a.sessions {
		list.Sessions = append(list.Sessions, s)
	}
	a.mu.Unlock()
	writeJSON(w, http.StatusOK, list)
	return nil
}

func (a *agent) session(id string) (agentapi.SessionInfo, *apiError) {
	a.mu.Lock()
	defer a.mu.Unlock()
	s, ok := a.sessions[id]
	if !ok {
		return s, errorf(http.StatusNotFound, agentapi.CodeNotFound, "no session %q", id)
	}
	return s, nil
}

func handleSessionClose(a *agent, w http.ResponseWriter, r *http.Request) *apiError {
	s, err := a.session(r.PathValue("id"))
	if err != nil {
		return err
	}
	a.mu.Lock()
	delete(a.sessions, s.ID)
	a.mu.Unlock()
	writeJSON(w, http.StatusOK, s)
	return nil
}

func handleSessionRun(a *agent, w http.ResponseWriter, r *http.Request) *apiError {
	if _, err := a.session(r.PathValue("id")); err != nil {
		return err
	}
	var req agentapi.SessionRunRequest
	if err := decode(w, r, &req); err != nil {
		return err
	}
	if req.Command == "" {
		return errorf(http.StatusBadRequest, agentapi.CodeBadRequest, "command: required")
	}
	writeJSON(w, http.StatusOK, agentapi.SessionRunResult{ExitCode: 0})
	return nil
}

// decode reads a bounded JSON body into v strictly: an unknown field is 400
// naming it, as the agent answers.
func decode(w http.ResponseWriter, r *http.Request, v any) *apiError {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return errorf(http.StatusRequestEntityTooLarge, agentapi.CodeTooLarge, "request body over %d bytes", maxBody)
		}
		return errorf(http.StatusBadRequest, agentapi.CodeBadRequest, "read request body: %s", err)
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return errorf(http.StatusBadRequest, agentapi.CodeBadRequest, "body: a JSON object is required")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return errorf(http.StatusBadRequest, agentapi.CodeBadRequest, "body: %s", err)
	}
	return nil
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		b, _ = json.Marshal(agentapi.ErrorBody{Error: agentapi.ErrorDetail{Code: agentapi.CodeInternal, Message: "encode the answer"}})
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

func writeError(w http.ResponseWriter, e *apiError) {
	writeJSON(w, e.status, agentapi.ErrorBody{Error: agentapi.ErrorDetail{Code: e.code, Message: e.msg}})
}
