package ecssim

import (
	"bytes"
	"container/heap"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

// targetPrefix starts the X-Amz-Target of every ECS operation.
const targetPrefix = "AmazonEC2ContainerServiceV20141113."

// statsPath answers GET with Stats as JSON.
const statsPath = "/ecssim/stats"

// maxBody bounds a request body (a task definition is the largest).
const maxBody = 4 << 20

// opOther counts requests for operations the simulator does not serve.
const opOther = "other"

// Capacity providers with their own launch bucket.
const (
	capacityFargate = "FARGATE"
	capacitySpot    = "FARGATE_SPOT"
)

// tokenTTL is how long a RunTask clientToken is remembered (simulated).
const tokenTTL = 10 * time.Minute

// Server is the simulator. Every operation runs under one mutex (decoding,
// encoding and agent calls run outside it). Safe for concurrent use.
type Server struct {
	cfg Config

	mu        sync.Mutex
	rng       *rand.Rand
	tasks     map[string]*task // by id
	order     []*task          // by seq; forgotten tasks are dropped lazily
	forgotten int              // forgotten tasks still in order
	seq       uint64
	defs      map[string][]*taskDef // family → revisions, revision i at [i-1]
	defByArn  map[string]*taskDef
	tokens    map[string]clientToken
	addrs     addrs
	events    eventHeap
	evSeq     uint64
	calls     *rate.Limiter
	registers *rate.Limiter            // RegisterTaskDefinition and DeregisterTaskDefinition calls
	launches  map[string]*rate.Limiter // by capacity provider
	byStatus  map[string]int           // tasks by lastStatus, forgotten ones excluded
	logged    map[string]time.Time     // when each refusal was last logged

	ops      map[string]*opCounters
	refused  refusals
	launched atomic.Int64
	failed   atomic.Int64
	pulled   atomic.Int64 // bytes of the images tasks pulled
	pullFail atomic.Int64 // tasks whose image the registry does not hold
	maxRun   int

	wake     chan struct{}
	stop     chan struct{}
	loopDone chan struct{}
	reqID    atomic.Int64

	lmu     sync.Mutex
	srv     *http.Server
	srvDone chan struct{}
	closed  bool
}

type clientToken struct {
	ids     []string
	expires time.Time
}

type opCounters struct{ requests, errors, throttled atomic.Int64 }

type refusals struct{ callRate, launchRate, registerRate atomic.Int64 }

// operationNames are the operations served.
var operationNames = []string{"RunTask", "StopTask", "DescribeTasks", "TagResource", "ListTasks",
	"RegisterTaskDefinition", "DescribeTaskDefinition", "DeregisterTaskDefinition"}

// New returns a simulator with no tasks and starts its lifecycle
// goroutine (Close stops it). It fails when cfg is invalid.
func New(cfg Config) (*Server, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	seed := cfg.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	s := &Server{
		cfg: cfg, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		tasks: map[string]*task{}, defs: map[string][]*taskDef{}, defByArn: map[string]*taskDef{},
		tokens:    map[string]clientToken{},
		addrs:     addrs{base: cfg.AddrBase, size: cfg.AddrBlocks * addrsPerBlock},
		calls:     rate.NewLimiter(rate.Limit(cfg.wallRate(cfg.RunTaskRate)), cfg.RunTaskBurst),
		registers: rate.NewLimiter(rate.Limit(cfg.wallRate(cfg.RegisterRate)), cfg.RegisterBurst),
		launches:  map[string]*rate.Limiter{},
		byStatus:  map[string]int{}, logged: map[string]time.Time{}, ops: map[string]*opCounters{},
		wake: make(chan struct{}, 1), stop: make(chan struct{}), loopDone: make(chan struct{}),
	}
	for _, c := range []string{capacityFargate, capacitySpot} {
		s.launches[c] = rate.NewLimiter(rate.Limit(cfg.wallRate(cfg.LaunchRate)), cfg.LaunchBurst)
	}
	for _, name := range append(operationNames, opOther) {
		s.ops[name] = &opCounters{}
	}
	go s.lifecycle()
	return s, nil
}

// Config returns the simulator's configuration (with defaults).
func (s *Server) Config() Config { return s.cfg }

// Start serves the simulator on addr, which must be a loopback address
// ("127.0.0.1:0" picks a port), until Close. It returns the endpoint URL
// (AWS_ENDPOINT_URL_ECS).
func (s *Server) Start(addr string) (string, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("start ECS simulator: %w", err)
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return "", fmt.Errorf("start ECS simulator: %q is not a loopback address; the simulator listens on 127.0.0.1 only", addr)
	}
	s.lmu.Lock()
	defer s.lmu.Unlock()
	if s.srv != nil || s.closed {
		return "", errors.New("start ECS simulator: already started or closed")
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("start ECS simulator: %w", err)
	}
	s.srv = &http.Server{Handler: s, ReadHeaderTimeout: time.Minute, IdleTimeout: 2 * time.Minute}
	s.srvDone = make(chan struct{})
	go func() {
		defer close(s.srvDone)
		_ = s.srv.Serve(ln)
	}()
	return "http://" + ln.Addr().String(), nil
}

// Close stops serving (bounded by ctx) and the lifecycle goroutine, and
// takes down every agent still up. Idempotent.
func (s *Server) Close(ctx context.Context) error {
	s.lmu.Lock()
	if s.closed {
		s.lmu.Unlock()
		return nil
	}
	s.closed = true
	srv, done := s.srv, s.srvDone
	s.lmu.Unlock()
	var errs []error
	if srv != nil {
		if err := srv.Shutdown(ctx); err != nil {
			_ = srv.Close()
			errs = append(errs, fmt.Errorf("close ECS simulator: %w", err))
		}
		<-done
	}
	close(s.stop)
	<-s.loopDone
	s.mu.Lock()
	var up []string
	for _, t := range s.tasks {
		if t.agentUp {
			t.agentUp = false
			up = append(up, hostPort(t.ip, s.cfg.AgentPort))
		}
	}
	s.mu.Unlock()
	if s.cfg.Agents != nil {
		for _, a := range up {
			if err := s.cfg.Agents.Down(a); err != nil {
				errs = append(errs, fmt.Errorf("take agent %s down: %w", a, err))
			}
		}
	}
	return errors.Join(errs...)
}

// ServeHTTP implements http.Handler: POST / with X-Amz-Target
// AmazonEC2ContainerServiceV20141113.<Operation>, and GET /ecssim/stats.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet && r.URL.Path == statsPath {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(s.Stats())
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	status, out, code := s.handle(r.Method == http.MethodPost, r.Header.Get("X-Amz-Target"), body, err)
	h := w.Header()
	h.Set("Content-Type", "application/x-amz-json-1.1")
	h.Set("X-Amzn-Requestid", "ecssim-"+strconv.FormatInt(s.reqID.Add(1), 10))
	if code != "" {
		h.Set("X-Amzn-Errortype", code)
	}
	h.Set("Content-Length", strconv.Itoa(len(out)))
	w.WriteHeader(status)
	_, _ = w.Write(out)
}

// apiError is an error answer in ECS's shape.
type apiError struct {
	status int
	code   string
	msg    string
}

func (e *apiError) body() []byte {
	b, _ := json.Marshal(map[string]string{"__type": e.code, "message": e.msg})
	return b
}

func clientError(code, format string, args ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, code: code, msg: fmt.Sprintf(format, args...)}
}

func invalidParam(format string, args ...any) *apiError {
	return clientError("InvalidParameterException", format, args...)
}

const (
	codeThrottling = "ThrottlingException"
	codeClient     = "ClientException"
)

// handlers by operation.
var handlers = map[string]func(*Server, []byte) (any, *apiError){
	"RunTask":                  (*Server).runTask,
	"StopTask":                 (*Server).stopTask,
	"DescribeTasks":            (*Server).describeTasks,
	"TagResource":              (*Server).tagResource,
	"ListTasks":                (*Server).listTasks,
	"RegisterTaskDefinition":   (*Server).registerTaskDefinition,
	"DescribeTaskDefinition":   (*Server).describeTaskDefinition,
	"DeregisterTaskDefinition": (*Server).deregisterTaskDefinition,
}

// handle answers one request: its status, body and error code ("" on
// success).
func (s *Server) handle(post bool, target string, body []byte, readErr error) (int, []byte, string) {
	name, ok := strings.CutPrefix(target, targetPrefix)
	h := handlers[name]
	if !post || !ok || h == nil {
		s.ops[opOther].requests.Add(1)
		return s.reply(opOther, nil, clientError("UnknownOperationException", "ecssim (a simulator of ECS) does not serve %q", target))
	}
	s.ops[name].requests.Add(1)
	if readErr != nil {
		return s.reply(name, nil, clientError("SerializationException", "read the request: %s", readErr))
	}
	if len(body) > maxBody {
		return s.reply(name, nil, invalidParam("request larger than %d bytes", maxBody))
	}
	out, aerr := h(s, body)
	return s.reply(name, out, aerr)
}

func (s *Server) reply(op string, out any, aerr *apiError) (int, []byte, string) {
	if aerr != nil {
		c := s.ops[op]
		c.errors.Add(1)
		if aerr.code == codeThrottling || strings.Contains(aerr.msg, "Rate exceeded") {
			c.throttled.Add(1)
		}
		return aerr.status, aerr.body(), aerr.code
	}
	b, err := json.Marshal(out)
	if err != nil {
		e := &apiError{status: http.StatusInternalServerError, code: "ServerException", msg: "encode the answer: " + err.Error()}
		return e.status, e.body(), e.code
	}
	return http.StatusOK, b, ""
}

// decode reads a JSON request strictly: a member the simulator does not
// simulate is refused, naming it.
func decode(body []byte, v any) *apiError {
	if len(bytes.TrimSpace(body)) == 0 {
		body = []byte("{}")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if f, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
			return invalidParam("ecssim (a simulator of ECS) does not simulate the parameter %s", f)
		}
		return clientError("SerializationException", "%s", err)
	}
	return nil
}

// logRefusal logs a refusal by limit, at most once a second each. Called
// under s.mu.
func (s *Server) logRefusal(limit, msg string, args ...any) {
	now := time.Now()
	if now.Sub(s.logged[limit]) < time.Second {
		return
	}
	s.logged[limit] = now
	s.cfg.Log.Warn(msg, append([]any{"limit", limit}, args...)...)
}

// schedule queues a lifecycle event of t after wall-clock d. Called under
// s.mu.
func (s *Server) schedule(t *task, kind eventKind, d time.Duration) {
	s.evSeq++
	heap.Push(&s.events, event{at: time.Now().Add(d), seq: s.evSeq, kind: kind, t: t})
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// draw returns a wall-clock duration drawn uniformly from [lo, hi]
// (simulated). Called under s.mu.
func (s *Server) draw(lo, hi time.Duration) time.Duration {
	d := lo
	if hi > lo {
		d += time.Duration(s.rng.Int64N(int64(hi - lo + 1)))
	}
	return s.cfg.wall(d)
}

// setStatus changes t's lastStatus, keeping the counts. Called under s.mu.
func (s *Server) setStatus(t *task, last string) {
	if t.last != "" {
		s.byStatus[t.last]--
	}
	t.last = last
	s.byStatus[last]++
	t.version++
	if n := s.byStatus[statusRunning]; n > s.maxRun {
		s.maxRun = n
	}
}

// change returns t's Change for OnChange, or nil when there is no hook.
// Called under s.mu.
func (s *Server) change(t *task) *Change {
	if s.cfg.OnChange == nil {
		return nil
	}
	b, _ := json.Marshal(t.wire(true))
	return &Change{TaskArn: t.arn, LastStatus: t.last, DesiredStatus: t.desired, Task: b, Time: time.Now()}
}

func (s *Server) notify(chs ...*Change) {
	for _, c := range chs {
		if c != nil {
			s.cfg.OnChange(*c)
		}
	}
}

// lifecycle applies due events until Close.
func (s *Server) lifecycle() {
	defer close(s.loopDone)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		s.mu.Lock()
		var due []event
		now := time.Now()
		for len(s.events) > 0 && !s.events[0].at.After(now) {
			due = append(due, heap.Pop(&s.events).(event))
		}
		next := time.Hour
		if len(s.events) > 0 {
			next = time.Until(s.events[0].at)
		}
		s.mu.Unlock()
		for _, e := range due {
			s.apply(e)
		}
		if len(due) > 0 {
			continue // more may be due by now
		}
		timer.Reset(next)
		select {
		case <-s.stop:
			return
		case <-s.wake: // an earlier event may have been queued
		case <-timer.C:
		}
	}
}

// apply runs one lifecycle event.
func (s *Server) apply(e event) {
	t := e.t
	switch e.kind {
	case evPending:
		s.mu.Lock()
		if t.last != statusProvisioning || t.desired != statusRunning {
			s.mu.Unlock()
			return
		}
		s.setStatus(t, statusPending)
		t.pullStartedAt = time.Now()
		t.ip = s.addrs.ip(t.addr) // the ENI is attached
		ch := s.change(t)
		s.mu.Unlock()
		s.notify(ch)
	case evRunning:
		s.run(t)
	case evPullFailed:
		s.mu.Lock()
		if t.last != statusPending || t.desired != statusRunning {
			s.mu.Unlock()
			return
		}
		s.pullFail.Add(1)
		s.failed.Add(1)
		t.desired, t.stopCode = statusStopped, stopFailedToStart
		t.stoppedReason = truncate(pullNotFound(t.def.image), MaxStopReason)
		t.stoppingAt = time.Now()
		s.setStatus(t, statusDeprovisioning)
		s.schedule(t, evStopped, s.draw(s.cfg.StopMin, s.cfg.StopMax))
		ch := s.change(t)
		s.mu.Unlock()
		s.notify(ch)
	case evDeprovision:
		s.mu.Lock()
		if t.last == statusStopped || t.last == statusDeprovisioning {
			s.mu.Unlock()
			return
		}
		s.setStatus(t, statusDeprovisioning)
		ch := s.change(t)
		s.mu.Unlock()
		s.notify(ch)
	case evStopped:
		s.mu.Lock()
		if t.last == statusStopped {
			s.mu.Unlock()
			return
		}
		s.setStatus(t, statusStopped)
		t.stoppedAt = time.Now()
		if t.addr >= 0 {
			s.addrs.release(t.addr)
			t.addr = -1
		}
		s.schedule(t, evForget, s.cfg.wall(s.cfg.StoppedRetention))
		ch := s.change(t)
		s.mu.Unlock()
		s.notify(ch)
	case evForget:
		s.mu.Lock()
		if s.tasks[t.id] == t {
			delete(s.tasks, t.id)
			s.byStatus[t.last]--
			s.forgotten++
			if s.forgotten > len(s.order)/2 {
				s.compact()
			}
		}
		s.mu.Unlock()
	}
}

// compact drops forgotten tasks from s.order. Called under s.mu.
func (s *Server) compact() {
	kept := s.order[:0]
	for _, t := range s.order {
		if s.tasks[t.id] == t {
			kept = append(kept, t)
		}
	}
	clear(s.order[len(kept):])
	s.order, s.forgotten = kept, 0
}

// run brings t's agent up and marks it RUNNING; a task stopped meanwhile
// has its agent taken down again, and one whose agent cannot come up
// stops as failed to start.
func (s *Server) run(t *task) {
	s.mu.Lock()
	if t.last != statusPending || t.desired != statusRunning {
		s.mu.Unlock()
		return
	}
	addr := hostPort(t.ip, s.cfg.AgentPort)
	token := ""
	if s.cfg.Agents != nil {
		token = agentapi.DeriveToken(s.cfg.TokenKey, t.arn)
	}
	s.mu.Unlock()

	var upErr error
	if s.cfg.Agents != nil {
		upErr = s.cfg.Agents.Up(addr, token)
	}

	s.mu.Lock()
	if upErr != nil {
		s.failed.Add(1)
		s.cfg.Log.Warn("a task's simulated agent did not come up; the task stops as failed to start", "task", t.arn, "addr", addr, "err", upErr)
		t.desired, t.stopCode = statusStopped, stopFailedToStart
		t.stoppedReason = truncate(stoppedReasonAgent+upErr.Error(), MaxStopReason)
		t.stoppingAt = time.Now()
		code := int32(1)
		t.sandboxExitCode = &code
		s.setStatus(t, statusDeprovisioning)
		s.schedule(t, evStopped, s.draw(s.cfg.StopMin, s.cfg.StopMax))
		ch := s.change(t)
		s.mu.Unlock()
		s.notify(ch)
		return
	}
	t.agentUp = s.cfg.Agents != nil
	if t.desired != statusRunning { // StopTask came while the agent came up
		down := t.agentUp
		t.agentUp = false
		s.mu.Unlock()
		if down {
			s.down(addr)
		}
		return
	}
	s.setStatus(t, statusRunning)
	t.startedAt = time.Now()
	ch := s.change(t)
	s.mu.Unlock()
	s.notify(ch)
}

// down takes the agent on addr down, logging a failure.
func (s *Server) down(addr string) {
	if err := s.cfg.Agents.Down(addr); err != nil {
		s.cfg.Log.Warn("take a task's simulated agent down", "addr", addr, "err", err)
	}
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// Stats are the simulator's counters since New (simulated figures).
type Stats struct {
	// Simulated is always true: these are a simulator's counts, not ECS's.
	Simulated bool    `json:"simulated"`
	TimeScale float64 `json:"time_scale"`
	// Operations holds, by operation name, the requests, the error answers
	// among them and the throttled ones among those ("other": operations
	// the simulator does not serve).
	Operations map[string]OpStats `json:"operations"`
	// Tasks counts the tasks by lastStatus now (stopped ones while they are
	// describable); MaxRunning is the most RUNNING at once.
	Tasks      map[string]int `json:"tasks"`
	MaxRunning int            `json:"max_running"`
	// Launched counts tasks RunTask started; FailedToStart the ones whose
	// agent did not come up.
	Launched      int64 `json:"launched"`
	FailedToStart int64 `json:"failed_to_start"`
	// RefusedCallRate and RefusedLaunchRate count RunTask calls refused
	// by the call bucket and by the launch bucket; RefusedRegisterRate the
	// RegisterTaskDefinition and DeregisterTaskDefinition calls refused by
	// theirs.
	RefusedCallRate     int64 `json:"refused_call_rate"`
	RefusedLaunchRate   int64 `json:"refused_launch_rate"`
	RefusedRegisterRate int64 `json:"refused_register_rate"`
	// TaskDefinitions counts the revisions registered; PulledBytes the
	// bytes of the images tasks pulled (each task pulls its image);
	// PullNotFound the tasks that stopped because the registry does not
	// hold their image.
	TaskDefinitions int   `json:"task_definitions"`
	PulledBytes     int64 `json:"pulled_bytes"`
	PullNotFound    int64 `json:"pull_not_found"`
}

// OpStats counts one operation's requests.
type OpStats struct {
	Requests  int64 `json:"requests"`
	Errors    int64 `json:"errors"`
	Throttled int64 `json:"throttled"`
}

// Stats returns the counters. Safe for concurrent use.
func (s *Server) Stats() Stats {
	st := Stats{Simulated: true, TimeScale: s.cfg.TimeScale, Operations: map[string]OpStats{}, Tasks: map[string]int{},
		Launched: s.launched.Load(), FailedToStart: s.failed.Load(),
		RefusedCallRate: s.refused.callRate.Load(), RefusedLaunchRate: s.refused.launchRate.Load(),
		RefusedRegisterRate: s.refused.registerRate.Load(), PulledBytes: s.pulled.Load(), PullNotFound: s.pullFail.Load()}
	for name, c := range s.ops {
		st.Operations[name] = OpStats{Requests: c.requests.Load(), Errors: c.errors.Load(), Throttled: c.throttled.Load()}
	}
	s.mu.Lock()
	for k, v := range s.byStatus {
		if v != 0 {
			st.Tasks[k] = v
		}
	}
	st.MaxRunning = s.maxRun
	st.TaskDefinitions = len(s.defByArn)
	s.mu.Unlock()
	return st
}
