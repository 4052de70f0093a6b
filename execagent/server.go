package execagent

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/websocket"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

// Server is the exec agent. Create it with New, serve with Serve, stop with
// Close. Its methods are safe for concurrent use.
type Server struct {
	cfg      Config
	log      *slog.Logger
	children *childTable // the OS children: process groups, signals, the reaper
	shell    shellInfo
	started  time.Time
	handler  http.Handler
	authHdr  []byte // "Bearer <token>"
	ownsDir  bool   // StateDir was created by New and is removed by Close

	sessions  *sessionTable
	processes *processTable
	ptys      *ptyTable      // PTY sessions (pty.go)
	envdProcs *envdProcTable // E2B's envd processes (envd_process.go)
	watchers  *watcherTable  // E2B's envd directory watchers (envd_watch.go)
	calls     callTable      // requests in flight that carry a call id
	// ckMu: checkpoints hold it shared, a restore exclusively; neither
	// waits (TryRLock, TryLock): the loser answers 409 busy.
	ckMu sync.RWMutex
	// rename is os.Rename; tests of a restore's undo replace it.
	rename func(oldpath, newpath string) error
	// stagedFile is the writer of a file the agent stages before renaming
	// it into place (a restore's files, a file write or upload): the file
	// itself; tests of a full disk wrap it.
	stagedFile func(f *os.File) io.Writer
	orphan     *orphanWatch

	leaseMu    sync.Mutex
	generation int64
	leaseID    string
	initDone   bool
	leaseEnded bool     // the last init ended the lease (initEndsLease)
	leaseEnv   []string // "K=V" from the latest init

	ctx    context.Context // canceled by Close; parent of every long-lived goroutine
	cancel context.CancelFunc
	wg     sync.WaitGroup // goroutines owned by the server (reaper, session owners, process waiters)

	srvMu     sync.Mutex
	servers   []*http.Server
	closeOnce sync.Once
}

// New validates cfg and returns a server that is not serving yet. It starts
// the zombie reaper (and makes the process a child subreaper unless
// cfg.NoSubreaper); Close stops it. The reaper reaps every zombie child of
// the process that the server does not track, so a process must run one
// Server at a time and start no children of its own meanwhile. log may be
// nil (slog.Default()).
func New(cfg Config, log *slog.Logger) (*Server, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("validate agent config: %w", err)
	}
	if log == nil {
		log = slog.Default()
	}
	sh, err := detectShell(cfg.Shell)
	if err != nil {
		return nil, err
	}
	cfg.Env = childEnv(cfg.Env)
	ownsDir := false
	if cfg.StateDir == "" {
		d, err := os.MkdirTemp("/dev/shm", "quarry-agent-") // tmpfs: cheap command-file rewrites
		if err != nil {
			d, err = os.MkdirTemp("", "quarry-agent-")
		}
		if err != nil {
			return nil, fmt.Errorf("create agent state dir: %w", err)
		}
		cfg.StateDir, ownsDir = d, true
	} else if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("create agent state dir: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{
		cfg:        cfg,
		log:        log,
		children:   newChildTable(log),
		shell:      sh,
		started:    time.Now(),
		authHdr:    []byte("Bearer " + cfg.Token),
		ownsDir:    ownsDir,
		ctx:        ctx,
		cancel:     cancel,
		orphan:     newOrphanWatch(time.Now()),
		rename:     os.Rename,
		stagedFile: func(f *os.File) io.Writer { return f },
	}
	s.sessions = newSessionTable(s)
	s.processes = newProcessTable(s)
	s.ptys = newPTYTable(s)
	s.envdProcs = newEnvdProcTable(s)
	s.watchers = newWatcherTable(s)
	s.handler = s.routes()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.children.runReaper(ctx, cfg.ReapInterval, cfg.NoSubreaper)
	}()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.watchOwner(ctx)
	}()
	return s, nil
}

// Handler returns the agent's HTTP handler (authentication and generation
// fencing included).
func (s *Server) Handler() http.Handler { return s.handler }

// Serve serves HTTP on ln until Close (it then returns nil) or until the
// listener fails. ctx only scopes the call; cancel it and call Close to stop.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	hs := &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       5 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
		BaseContext:       func(net.Listener) context.Context { return ctx },
	}
	s.srvMu.Lock()
	if s.ctx.Err() != nil {
		s.srvMu.Unlock()
		return errClosed
	}
	s.servers = append(s.servers, hs)
	s.srvMu.Unlock()
	err := hs.Serve(ln)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return fmt.Errorf("serve agent: %w", err)
}

// Close kills every process group the agent started, closes sessions and
// processes, stops the HTTP servers started by Serve (waiting for handlers
// until ctx is done) and the reaper, reaps the killed processes (until ctx
// is done), and removes a StateDir it created. It is idempotent; later calls
// return nil.
func (s *Server) Close(ctx context.Context) error {
	var err error
	s.closeOnce.Do(func() {
		s.srvMu.Lock()
		s.cancel()
		servers := s.servers
		s.srvMu.Unlock()
		// Kill first: streams and runs end when their commands die.
		s.children.killAll()
		s.sessions.closeAll()
		s.processes.closeAll()
		s.ptys.reset(websocket.CloseGoingAway, "the agent is shutting down")
		for _, hs := range servers {
			if e := hs.Shutdown(ctx); e != nil {
				_ = hs.Close()
				err = errors.Join(err, fmt.Errorf("shut down agent http server: %w", e))
			}
		}
		s.wg.Wait()
		s.children.settle(ctx)
		if s.ownsDir {
			if e := os.RemoveAll(s.cfg.StateDir); e != nil {
				err = errors.Join(err, fmt.Errorf("remove agent state dir: %w", e))
			}
		}
	})
	return err
}

// closing reports whether Close has begun. Close cancels s.ctx before it
// kills any process, so a command whose end is observed (after its wait
// returned) while closing is true may have been killed by Close, and one
// killed by Close always observes closing as true: callers check it after
// the wait, never before.
func (s *Server) closing() bool { return s.ctx.Err() != nil }

// handlerFunc is a handler that returns its error; wrap answers it.
type handlerFunc func(w http.ResponseWriter, r *http.Request) error

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	fenced := func(pattern string, h handlerFunc) {
		mux.Handle(pattern, s.wrap(h, true))
	}
	mux.Handle("GET "+agentapi.RouteHealth, s.wrap(s.handleHealth, false))
	mux.Handle("POST "+agentapi.RouteInit, s.wrap(s.handleInit, false))
	fenced("POST "+agentapi.RouteExec, s.handleExec)
	fenced("POST "+agentapi.RouteSessions, s.handleSessionCreate)
	fenced("GET "+agentapi.RouteSessions, s.handleSessionList)
	fenced("DELETE "+agentapi.RouteSession, s.handleSessionClose)
	fenced("POST "+agentapi.RouteSessionRun, s.handleSessionRun)
	fenced("POST "+agentapi.RouteProcesses, s.handleProcessStart)
	fenced("GET "+agentapi.RouteProcesses, s.handleProcessList)
	fenced("GET "+agentapi.RouteProcess, s.handleProcessGet)
	fenced("DELETE "+agentapi.RouteProcess, s.handleProcessKill)
	fenced("GET "+agentapi.RouteProcessOutput, s.handleProcessOutput)
	fenced("POST "+agentapi.RouteProcessSignal, s.handleProcessSignal)
	fenced("POST "+agentapi.RouteProcessStdin, s.handleProcessStdin)
	fenced("POST "+agentapi.RouteProcessCall, s.handleProcessCall)
	fenced("DELETE "+agentapi.RouteCall, s.handleCallCancel)
	fenced("GET "+agentapi.RouteFiles, s.handleFileRead)
	fenced("PUT "+agentapi.RouteFiles, s.handleFileWrite)
	fenced("DELETE "+agentapi.RouteFiles, s.handleFileDelete)
	fenced("GET "+agentapi.RouteFileStat, s.handleFileStat)
	fenced("GET "+agentapi.RouteFileList, s.handleFileList)
	fenced("GET "+agentapi.RouteFileArchive, s.handleArchiveDownload)
	fenced("PUT "+agentapi.RouteFileArchive, s.handleArchiveUpload)
	fenced("POST "+agentapi.RouteKillAll, s.handleKillAll)
	fenced("POST "+agentapi.RoutePidWait, s.handlePidWait) // pidwait.go
	fenced("GET "+agentapi.RouteCheckpoint, s.handleCheckpoint)
	fenced("POST "+agentapi.RoutePTYs, s.handlePTYCreate)
	fenced("GET "+agentapi.RoutePTYs, s.handlePTYList)
	fenced("GET "+agentapi.RoutePTY, s.handlePTYGet)
	fenced("DELETE "+agentapi.RoutePTY, s.handlePTYKill)
	fenced("POST "+agentapi.RoutePTYResize, s.handlePTYResize)
	fenced("GET "+agentapi.RoutePTYAttach, s.handlePTYAttach)
	fenced("PUT "+agentapi.RouteCheckpoint, s.handleRestore)
	fenced(agentapi.RoutePort, s.handlePort(newPortProxy(s)))     // every method (ports.go)
	fenced("GET "+agentapi.RoutePortForward, s.handlePortForward) // portforward.go
	s.envdRoutes(mux)                                             // E2B's envd (envd.go)
	// Unknown routes and wrong methods: authenticate first, then answer in
	// the ErrorBody shape (the mux's own 404/405 are plain text).
	notFound := s.wrap(func(w http.ResponseWriter, r *http.Request) error {
		return statusError(errNotFound, http.StatusNotFound, agentapi.CodeNotFound, "no route %s %s", r.Method, r.URL.Path)
	}, false)
	mux.Handle("/", notFound)
	if s.cfg.RelaySocket != "" {
		relay := newRelayForwarder(s.cfg.RelaySocket)
		mux.Handle(agentapi.RelayPathPrefix, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if !agentapi.IsRelayPath(r.URL.Path) {
				notFound.ServeHTTP(w, r)
				return
			}
			relay.ServeHTTP(w, r)
		}))
	}
	return mux
}

// wrap authenticates, fences stale generations (when fenced) and answers a
// handler's error in the ErrorBody shape.
func (s *Server) wrap(h handlerFunc, fenced bool) http.Handler {
	return s.wrapAs(h, fenced, func(w http.ResponseWriter, _ *http.Request, err error) { writeError(w, err) })
}

// errorRenderer answers an error of a request in its surface's shape: the
// agent's ErrorBody, or E2B's (envd.go). It renders classify's answer and
// decides nothing.
type errorRenderer func(w http.ResponseWriter, r *http.Request, err error)

// wrapAs is wrap with the errors, its own refusals included, answered by
// render.
func (s *Server) wrapAs(h handlerFunc, fenced bool, render errorRenderer) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := s.authenticate(r); err != nil {
			render(w, r, err)
			return
		}
		defer s.orphan.call()()
		if fenced {
			if err := s.checkGeneration(r); err != nil {
				render(w, r, err)
				return
			}
		}
		r, done, err := s.calls.begin(r)
		if err != nil {
			render(w, r, err)
			return
		}
		defer done()
		if err := h(w, r); err != nil {
			render(w, r, err)
		}
	})
}

// authenticate compares the Authorization header with the token in
// constant time.
func (s *Server) authenticate(r *http.Request) error {
	got := r.Header.Get("Authorization")
	if got == "" {
		return statusError(nil, http.StatusUnauthorized, agentapi.CodeUnauthorized, "missing bearer token (Authorization: Bearer <token>)")
	}
	if subtle.ConstantTimeCompare([]byte(got), s.authHdr) != 1 {
		return statusError(nil, http.StatusUnauthorized, agentapi.CodeUnauthorized, "wrong bearer token")
	}
	return nil
}

// requestGeneration parses HeaderGeneration (absent means 0).
func requestGeneration(r *http.Request) (int64, error) {
	v := r.Header.Get(agentapi.HeaderGeneration)
	if v == "" {
		return 0, nil
	}
	g, err := strconv.ParseInt(v, 10, 64)
	if err != nil || g < 0 {
		return 0, invalid(agentapi.HeaderGeneration, "must be a non-negative integer, got %q", v)
	}
	return g, nil
}

// checkGeneration refuses requests of a generation older than the current one.
func (s *Server) checkGeneration(r *http.Request) error {
	g, err := requestGeneration(r)
	if err != nil {
		return err
	}
	s.leaseMu.Lock()
	cur := s.generation
	s.leaseMu.Unlock()
	if g < cur {
		return fmt.Errorf("request generation %d is older than the agent's generation %d: %w", g, cur, errStaleGeneration)
	}
	return nil
}

func (s *Server) health() agentapi.Health {
	s.leaseMu.Lock()
	defer s.leaseMu.Unlock()
	return agentapi.Health{
		Status:     "ok",
		Version:    agentapi.Version,
		LeaseID:    s.leaseID,
		Generation: s.generation,
		UptimeMS:   time.Since(s.started).Milliseconds(),
	}
}

// handleHealth answers GET /healthz. It is authenticated but never fenced:
// it reports liveness and the current lease and generation to anyone holding
// the token.
func (s *Server) handleHealth(w http.ResponseWriter, r *http.Request) error {
	writeJSON(w, http.StatusOK, s.health())
	return nil
}

// handleInit answers POST /v1/init. A generation lower than the current one
// is refused with stale_generation; the same generation is accepted only as
// a retry of the same lease id (or as the first init); a higher generation
// replaces the lease id and the lease env.
func (s *Server) handleInit(w http.ResponseWriter, r *http.Request) error {
	var req agentapi.InitRequest
	if err := s.decodeJSON(w, r, &req); err != nil {
		return err
	}
	if req.Generation < 0 {
		return invalid("generation", "must be non-negative, got %d", req.Generation)
	}
	env, err := envList("env", req.Env)
	if err != nil {
		return err
	}
	s.leaseMu.Lock()
	switch {
	case req.Generation < s.generation:
		cur := s.generation
		s.leaseMu.Unlock()
		return fmt.Errorf("init generation %d is older than the agent's generation %d: %w", req.Generation, cur, errStaleGeneration)
	case req.Generation == s.generation && s.initDone && req.LeaseID != s.leaseID:
		cur := s.leaseID
		s.leaseMu.Unlock()
		return fmt.Errorf("generation %d is already initialized for lease %q, not %q: %w", req.Generation, cur, req.LeaseID, errConflict)
	}
	newLease := s.initDone && req.Generation > s.generation
	s.leaseEnded = s.initEndsLease(req.LeaseID, req.Generation)
	s.generation, s.leaseID, s.leaseEnv, s.initDone = req.Generation, req.LeaseID, env, true
	s.leaseMu.Unlock()
	if newLease {
		// The previous lease's terminals end with it: a new lease never
		// sees them, and their clients are told the lease is gone.
		s.ptys.reset(closeLeaseGone, agentapi.ReasonLeaseGone)
	}
	s.log.Info("init", "lease", req.LeaseID, "generation", req.Generation)
	writeJSON(w, http.StatusOK, s.health())
	return nil
}

// decodeJSON decodes a bounded JSON body into v, a pointer to a struct of
// agentapi. An empty body is an error, and so is a field v does not have
// (400 naming it), so a misspelled option is never silently ignored.
func (s *Server) decodeJSON(w http.ResponseWriter, r *http.Request, v any) error {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxJSONBody))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return err
		}
		return fmt.Errorf("read request body: %w", err)
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return invalid("body", "a JSON object is required")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var se *json.SyntaxError
		var ute *json.UnmarshalTypeError
		if errors.As(err, &se) || errors.As(err, &ute) {
			return err
		}
		if name := unknownField(body, v); name != "" {
			return invalid(name, "unknown field (known: %s)", strings.Join(jsonFields(v), ", "))
		}
		return invalid("body", "invalid JSON: %s", err.Error())
	}
	return nil
}

// unknownField returns the first key (in sorted order) of the JSON object
// body that no field of the struct v points to accepts, or "". Keys match
// field names case-insensitively, as encoding/json does.
func unknownField(body []byte, v any) string {
	var obj map[string]json.RawMessage
	if json.Unmarshal(body, &obj) != nil {
		return ""
	}
	known := jsonFields(v)
	for _, k := range slices.Sorted(maps.Keys(obj)) {
		if !slices.ContainsFunc(known, func(f string) bool { return strings.EqualFold(f, k) }) {
			return k
		}
	}
	return ""
}

// jsonFields lists the JSON names of the fields of the struct v points to.
func jsonFields(v any) []string {
	t := reflect.TypeOf(v)
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return nil
	}
	var names []string
	for f := range t.Fields() {
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch name {
		case "-":
			continue
		case "":
			name = f.Name
		}
		names = append(names, name)
	}
	return names
}

// envList validates env (field names the request field) and returns it as
// "K=V" entries, sorted by key. It is the one env check of init, exec,
// sessions and processes: names are shell identifiers (letters, digits and
// '_', not starting with a digit), values hold no NUL byte, and each entry
// fits the kernel's limit for one variable of a new process. Values are
// passed on exactly (newlines included).
func envList(field string, env map[string]string) ([]string, error) {
	if len(env) == 0 {
		return nil, nil
	}
	out := make([]string, 0, len(env))
	for _, k := range slices.Sorted(maps.Keys(env)) {
		v := env[k]
		if !isIdentifier(k) {
			return nil, invalid(field, "%q is not a variable name (letters, digits and _, not starting with a digit)", k)
		}
		if strings.ContainsRune(v, 0) {
			return nil, invalid(field, "value of %s contains a NUL byte", k)
		}
		kv := k + "=" + v
		if msg := argTooLong(len(kv)); msg != "" {
			return nil, invalid(field, "%s: %s", k, msg)
		}
		out = append(out, kv)
	}
	return out, nil
}

// isIdentifier reports whether name is a shell variable name.
func isIdentifier(name string) bool {
	if name == "" || (name[0] >= '0' && name[0] <= '9') {
		return false
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; !isAlnumByte(c) && c != '_' {
			return false
		}
	}
	return true
}

// commandEnv composes the environment of a child: the base environment, then
// the lease env from init, then the request's env (later entries win).
func (s *Server) commandEnv(extra []string) []string {
	s.leaseMu.Lock()
	lease := s.leaseEnv
	s.leaseMu.Unlock()
	return mergeEnv(s.cfg.Env, lease, extra)
}

// mergeEnv merges "K=V" lists; a key in a later list replaces the same key
// of an earlier one, keeping the earlier position.
func mergeEnv(lists ...[]string) []string {
	n := 0
	for _, l := range lists {
		n += len(l)
	}
	out := make([]string, 0, n)
	index := make(map[string]int, n)
	for _, l := range lists {
		for _, kv := range l {
			k, _, _ := strings.Cut(kv, "=")
			if i, ok := index[k]; ok {
				out[i] = kv
				continue
			}
			index[k] = len(out)
			out = append(out, kv)
		}
	}
	return out
}
