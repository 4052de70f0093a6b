package modelservice

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/quarryhq/quarry/internal/badinput"
	"github.com/quarryhq/quarry/internal/clock"
	"github.com/quarryhq/quarry/warmpool"
)

// Errors of the Service beyond the broker's sentinels.
var (
	// ErrBadToken: the relay token is missing or is not this lease's.
	ErrBadToken = errors.New("invalid relay token")
	// ErrTimeout: no answer arrived within the request's timeout.
	ErrTimeout = errors.New("no answer within the model request's timeout")
	// ErrUpstreamNotAllowed: the lease's model.upstream_url label names an
	// upstream that is not allowed.
	ErrUpstreamNotAllowed = errors.New("upstream not allowed")
	// ErrShuttingDown: the caller's context ended with this cause because
	// the gateway is shutting down. A waiting Relay or Claim returns it
	// (wrapped) at once and leaves the broker's requests as they are, so
	// that another replica (shared broker) can still serve them.
	ErrShuttingDown = errors.New("the gateway is shutting down; retry")
	// ErrLeaseEnded: the sandbox's lease ended while its call waited for a
	// trainer; the request was cancelled. It wraps warmpool.ErrLeaseEnded.
	ErrLeaseEnded = fmt.Errorf("the sandbox's lease ended while its model call waited: %w", warmpool.ErrLeaseEnded)
)

// shuttingDown reports whether ctx ended because the gateway is shutting
// down (its cause is ErrShuttingDown).
func shuttingDown(ctx context.Context) bool {
	return ctx.Err() != nil && errors.Is(context.Cause(ctx), ErrShuttingDown)
}

// UpstreamError: a passthrough upstream could not be reached or failed.
type UpstreamError struct {
	URL string
	Err error
}

func (e *UpstreamError) Error() string { return fmt.Sprintf("upstream %s: %v", e.URL, e.Err) }
func (e *UpstreamError) Unwrap() error { return e.Err }

// LeaseReader reads leases by id, whoever owns them; warmpool.Store
// implements it.
type LeaseReader interface {
	GetLease(ctx context.Context, id string) (warmpool.Lease, error)
}

// Deps are the Service's collaborators.
type Deps struct {
	Broker Broker
	Leases LeaseReader
	Tokens *Tokens
	// Pools are the configured pools (their model.* options).
	Pools []warmpool.PoolConfig
	// HTTP is the client of passthrough upstreams (nil: a client with
	// default transport settings and no total timeout: streams may be
	// long; each call is bounded by its request's timeout).
	HTTP   *http.Client
	Logger *slog.Logger // nil discards
	Clock  clock.Clock  // nil is clock.System
}

// Service is the model relay: it gives each lease its relay URL and token,
// queues agents' calls for trainers (or forwards them to an upstream), and
// hands trainers' answers back. All state lives in the Broker, so any
// replica serves any call. Safe for concurrent use.
type Service struct {
	cfg    Config
	broker Broker
	leases LeaseReader
	tokens *Tokens
	pools  map[string]poolSettings
	http   *http.Client
	log    *slog.Logger
	clock  clock.Clock

	mu      sync.Mutex
	started bool
	closed  bool
	stop    chan struct{}
	wg      sync.WaitGroup
}

// New validates cfg and deps and builds a Service. It starts nothing.
func New(cfg Config, deps Deps) (*Service, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("model relay config: %w", err)
	}
	switch {
	case deps.Broker == nil:
		return nil, errors.New("model relay: Deps.Broker is nil")
	case deps.Leases == nil:
		return nil, errors.New("model relay: Deps.Leases is nil")
	case deps.Tokens == nil:
		return nil, errors.New("model relay: Deps.Tokens is nil")
	}
	pools, err := parsePoolOptions(deps.Pools, cfg.Timeout)
	if err != nil {
		return nil, fmt.Errorf("model relay: %w", err)
	}
	s := &Service{
		cfg: cfg, broker: deps.Broker, leases: deps.Leases, tokens: deps.Tokens, pools: pools,
		http: deps.HTTP, log: deps.Logger, clock: deps.Clock, stop: make(chan struct{}),
	}
	if s.http == nil {
		s.http = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: 90 * time.Second}}
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.clock == nil {
		s.clock = clock.System{}
	}
	return s, nil
}

// Config returns the configuration in force (defaults applied).
func (s *Service) Config() Config { return s.cfg }

// LeaseEnv returns the variables that point a lease's commands at its
// relay: OPENAI_BASE_URL and OPENAI_API_KEY (the lease's relay token). It
// is warmpool.Deps.LeaseEnv. relayURL is where the lease's sandbox reaches
// the relay from inside (its agent's forwarder, providers.SandboxRelay);
// "" means Config.SandboxURL, the gateway's address. With
// Config.SandboxURLFixed, Config.SandboxURL is used whatever relayURL says.
func (s *Service) LeaseEnv(leaseID, relayURL string) map[string]string {
	base := s.cfg.SandboxURL
	if relayURL != "" && !s.cfg.SandboxURLFixed {
		base = relayURL
	}
	return map[string]string{
		"OPENAI_BASE_URL": base + fmt.Sprintf(sandboxRelayPathPattern, leaseID),
		"OPENAI_API_KEY":  s.tokens.Token(leaseID),
	}
}

// Lease checks token against leaseID (in constant time, before any read)
// and returns the lease, in any state: the caller refuses an ended one.
// ErrBadToken for a wrong token; the store's errors otherwise.
func (s *Service) Lease(ctx context.Context, leaseID, token string) (warmpool.Lease, error) {
	if !s.tokens.Verify(leaseID, token) {
		return warmpool.Lease{}, ErrBadToken
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.BrokerTimeout)
	defer cancel()
	l, err := s.leases.GetLease(ctx, leaseID)
	if err != nil {
		return warmpool.Lease{}, fmt.Errorf("read lease: %w", err)
	}
	return l, nil
}

// Upstream returns the passthrough upstream of lease l and its bearer
// token, or "" when a trainer answers its calls. The lease label
// model.upstream_url overrides the pool's option when allowed
// (ErrUpstreamNotAllowed otherwise).
func (s *Service) Upstream(l warmpool.Lease) (url, key string, err error) {
	ps := s.pools[l.Pool]
	if u, ok := l.Labels[LabelUpstreamURL]; ok {
		u = trimSlash(u)
		if u != ps.upstream && !slices.Contains(s.allowed(), u) {
			return "", "", fmt.Errorf("%w: the label %s names %q, which is not in QUARRY_RELAY_ALLOWED_UPSTREAMS", ErrUpstreamNotAllowed, LabelUpstreamURL, u)
		}
		if u != ps.upstream {
			return u, "", nil
		}
	}
	return ps.upstream, ps.upstreamKey, nil
}

func (s *Service) allowed() []string {
	out := make([]string, 0, len(s.cfg.AllowedUpstreams))
	for _, u := range s.cfg.AllowedUpstreams {
		out = append(out, trimSlash(u))
	}
	return out
}

func trimSlash(u string) string {
	for len(u) > 0 && u[len(u)-1] == '/' {
		u = u[:len(u)-1]
	}
	return u
}

// Models returns the GET /models answer of a lease in trainer mode: the
// pool's model.name.
func (s *Service) Models(l warmpool.Lease) []byte {
	name := s.pools[l.Pool].model
	if name == "" {
		name = DefaultModelName
	}
	b, _ := json.Marshal(map[string]any{"object": "list", "data": []any{
		map[string]any{"id": name, "object": "model", "created": 0, "owned_by": "quarry"},
	}})
	return b
}

// callBody is what the relay reads of an agent's request body.
type callBody struct {
	Stream        bool `json:"stream"`
	StreamOptions struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

// parseCall checks that body is a JSON object and reads its stream flags.
func parseCall(body []byte) (callBody, error) {
	var cb callBody
	return cb, decodeObject(body, "an OpenAI request", &cb)
}

// decodeObject decodes body, which must be a JSON object (what names what
// it should be), into v. A *badinput.Error says what is wrong: where its
// JSON is malformed (badinput.JSON, as on every route), not an object, or a
// field of the wrong type.
func decodeObject(body []byte, what string, v any) error {
	trimmed := bytes.TrimSpace(body)
	notObject := badinput.New("body", "must be a JSON object (%s)", what)
	if len(trimmed) == 0 {
		return notObject
	}
	if err := json.Unmarshal(trimmed, v); err != nil {
		var typ *json.UnmarshalTypeError
		if errors.As(err, &typ) && typ.Field == "" {
			return notObject
		}
		return badinput.JSON(err)
	}
	if trimmed[0] != '{' { // null
		return notObject
	}
	return nil
}

// Relay queues an agent's call (route "chat/completions" or "completions",
// body verbatim) for the lease owner's trainers and waits for the answer,
// up to the pool's timeout. A call with "stream": true whose answer is a
// whole completion gets it as server-sent-event chunks. When ctx ends
// (the agent disconnected), the request is cancelled and ctx's error is
// returned; when ctx ends with cause ErrShuttingDown, ErrShuttingDown is
// returned and the request stays in the broker as it is; when the timeout
// passes first, the request expires and ErrTimeout is returned.
//
// Errors: *badinput.Error for a body that is not a JSON object; broker
// errors (ErrFull, ErrUnavailable, ErrClosed).
func (s *Service) Relay(ctx context.Context, l warmpool.Lease, route string, body []byte) (Response, string, error) {
	cb, err := parseCall(body)
	if err != nil {
		return Response{}, "", err
	}
	if shuttingDown(ctx) {
		return Response{}, "", fmt.Errorf("relay model call: %w", ErrShuttingDown)
	}
	now := s.clock.Now()
	timeout := s.pools[l.Pool].timeout
	if timeout <= 0 {
		timeout = s.cfg.Timeout
	}
	req := Request{
		ID: NewRequestID(now), LeaseID: l.ID, Owner: l.Owner, Pool: l.Pool, Labels: maps.Clone(l.Labels),
		Route: route, Stream: cb.Stream, Body: body, ReceivedAt: now, Deadline: now.Add(timeout),
	}
	bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.BrokerTimeout)
	err = s.broker.Submit(bctx, req)
	cancel()
	if err != nil {
		return Response{}, req.ID, err
	}
	resp, err, expired, ended := s.await(ctx, l, req)
	switch {
	case ended != "":
		resp, err = s.end(ctx, req.ID, End{State: StateCancelled, Reason: ended}, fmt.Errorf("%w (%s)", ErrLeaseEnded, ended))
	case expired:
		resp, err = s.end(ctx, req.ID, End{State: StateExpired, Reason: fmt.Sprintf("no answer within %s", timeout)}, ErrTimeout)
	case err != nil && shuttingDown(ctx):
		// Only this wait ends: the request stays queued (a shared broker
		// lets another replica's trainers answer it until its deadline).
		return Response{}, req.ID, fmt.Errorf("await model request %s: %w", req.ID, ErrShuttingDown)
	case err != nil && ctx.Err() != nil:
		_, cerr := s.end(ctx, req.ID, End{State: StateCancelled, Reason: disconnectedReason}, nil)
		if cerr != nil {
			s.log.Warn("cancel model request", "request", req.ID, "err", cerr)
		}
		return Response{}, req.ID, ctx.Err()
	}
	if err != nil {
		return Response{}, req.ID, err
	}
	if cb.Stream {
		resp = s.asStream(req, resp, cb.StreamOptions.IncludeUsage)
	}
	return resp, req.ID, nil
}

// await waits for req's answer until its deadline or ctx's end (the
// broker's error), re-reading lease l every LeaseCheck meanwhile: when the
// lease has ended it stops and returns why (ended).
func (s *Service) await(ctx context.Context, l warmpool.Lease, req Request) (resp Response, err error, expired bool, ended string) {
	for {
		until, last := s.clock.Now().Add(s.cfg.LeaseCheck), false
		if !until.Before(req.Deadline) {
			until, last = req.Deadline, true
		}
		wctx, cancel := context.WithDeadline(ctx, until)
		resp, err = s.broker.Await(wctx, req.ID)
		timedOut := err != nil && ctx.Err() == nil && wctx.Err() != nil
		cancel()
		if !timedOut || last {
			return resp, err, timedOut, ""
		}
		if why := s.leaseEnded(ctx, l.ID); why != "" {
			return Response{}, err, false, why
		}
	}
}

// leaseEnded re-reads lease id and says how it ended ("" while it is
// active, or when it cannot be read: the next check tries again).
func (s *Service) leaseEnded(ctx context.Context, id string) string {
	rctx, cancel := context.WithTimeout(ctx, s.cfg.BrokerTimeout)
	defer cancel()
	l, err := s.leases.GetLease(rctx, id)
	switch {
	case err != nil:
		return ""
	case l.State != warmpool.LeaseActive:
		if l.Reason != "" {
			return fmt.Sprintf("lease %s was %s: %s", id, l.State, l.Reason)
		}
		return fmt.Sprintf("lease %s was %s", id, l.State)
	case !s.clock.Now().Before(l.ExpiresAt):
		return fmt.Sprintf("lease %s expired", id)
	}
	return ""
}

// end cancels request id; an answer that won the race is returned instead
// of failWith.
func (s *Service) end(ctx context.Context, id string, end End, failWith error) (Response, error) {
	bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.BrokerTimeout)
	defer cancel()
	resp, err := s.broker.Cancel(bctx, id, end)
	switch {
	case errors.Is(err, ErrAnswered):
		return resp, nil
	case err != nil:
		return Response{}, errors.Join(failWith, err)
	default:
		return Response{}, failWith
	}
}

// asStream converts a whole 200 JSON completion into server-sent events;
// other answers pass unchanged.
func (s *Service) asStream(req Request, resp Response, includeUsage bool) Response {
	if resp.Status != http.StatusOK || resp.ContentType == ContentTypeSSE {
		return resp
	}
	sse, err := CompletionToSSE(req.Route, resp.Body, includeUsage)
	if err != nil {
		s.log.Warn("stream a trainer's answer", "request", req.ID, "err", err)
		return resp // answered as JSON: better than nothing
	}
	resp.Body, resp.ContentType = sse, ContentTypeSSE
	return resp
}

// Content types of answers.
const (
	ContentTypeJSON = "application/json"
	ContentTypeSSE  = "text/event-stream"
)

// ClaimParams are a trainer's claim: filters, batch size and wait.
type ClaimParams struct {
	Pool   string
	Labels map[string]string
	Max    int
	Wait   time.Duration
}

// Claim claims up to p.Max pending requests of owner (bounded by
// Config.MaxClaim and Config.MaxClaimBytes), waiting up to p.Wait (at most
// Config.MaxWait) for the first. *badinput.Error for bad bounds;
// ErrShuttingDown when ctx ended with that cause before any request was
// claimed (requests claimed by then are returned).
func (s *Service) Claim(ctx context.Context, owner string, p ClaimParams) ([]Request, error) {
	if p.Max < 1 || p.Max > s.cfg.MaxClaim {
		return nil, badinput.New("max", "must be between 1 and %d", s.cfg.MaxClaim)
	}
	if p.Wait < 0 || p.Wait > s.cfg.MaxWait {
		return nil, badinput.New("wait_ms", "must be between 0 and %d", s.cfg.MaxWait.Milliseconds())
	}
	ctx, cancel := context.WithTimeout(ctx, p.Wait+s.cfg.BrokerTimeout)
	defer cancel()
	reqs, err := s.broker.Claim(ctx, ClaimQuery{
		Owner: owner, Pool: p.Pool, Labels: p.Labels, Max: p.Max, MaxBytes: s.cfg.MaxClaimBytes,
		Wait: p.Wait, Visibility: s.cfg.Visibility,
	})
	if err == nil && len(reqs) == 0 && shuttingDown(ctx) {
		return nil, fmt.Errorf("claim model requests: %w", ErrShuttingDown)
	}
	return reqs, err
}

// Respond answers request id of owner with status (200, or 400-599 for an
// error the agent receives), contentType (JSON or text/event-stream) and
// body. A 200 JSON answer must be a completion object with a "choices"
// array; an error answer with an empty body gets an OpenAI-shaped error
// body; an event stream answer must be "data:" lines (checkEventStream).
// Errors: *badinput.Error; ErrNotFound, ErrAnswered, ErrGone.
func (s *Service) Respond(ctx context.Context, owner, id string, status int, contentType string, body []byte) error {
	if err := CheckRequestID(id); err != nil {
		return badinput.New("rid", "%s", err.Error())
	}
	if status != http.StatusOK && (status < 400 || status > 599) {
		return badinput.New("status", "must be 200 or an error status between 400 and 599, got %d", status)
	}
	switch contentType {
	case ContentTypeJSON:
		if err := checkAnswer(status, body); err != nil {
			return err
		}
		if len(bytes.TrimSpace(body)) == 0 {
			body = errorBody(status, "the trainer answered with an error")
		}
	case ContentTypeSSE:
		if err := checkEventStream(body); err != nil {
			return err
		}
	default:
		return badinput.New("Content-Type", "must be application/json or text/event-stream, got %q", contentType)
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.BrokerTimeout)
	defer cancel()
	return s.broker.Respond(ctx, id, owner, Response{Status: status, ContentType: contentType, Body: body, AnsweredAt: s.clock.Now()})
}

// checkAnswer validates a JSON answer body.
func checkAnswer(status int, body []byte) error {
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) == 0 {
		if status == http.StatusOK {
			return badinput.New("body", "a 200 answer must be an OpenAI completion object")
		}
		return nil
	}
	var c struct {
		Choices json.RawMessage `json:"choices"`
	}
	if err := decodeObject(trimmed, "an OpenAI completion or error", &c); err != nil {
		return err
	}
	if status != http.StatusOK {
		return nil
	}
	if len(c.Choices) == 0 || c.Choices[0] != '[' {
		return badinput.New("body.choices", "a 200 answer must be an OpenAI completion object with a \"choices\" array")
	}
	return nil
}

// errorBody is an OpenAI-shaped error body.
func errorBody(status int, msg string) []byte {
	b, _ := json.Marshal(map[string]any{"error": map[string]any{
		"message": msg, "type": http.StatusText(status), "code": status,
	}})
	return b
}

// Transcript returns a page (at most limit, 1-1000, default 100) of lease
// leaseID's exchanges after the id after, oldest first, and whether more
// follow. The caller has checked that owner holds the lease.
func (s *Service) Transcript(ctx context.Context, leaseID, owner, after string, limit int) ([]Exchange, bool, error) {
	if limit == 0 {
		limit = defaultTranscriptLimit
	}
	if limit < 1 || limit > MaxTranscriptLimit {
		return nil, false, badinput.New("limit", "must be between 1 and %d", MaxTranscriptLimit)
	}
	if after != "" {
		if err := CheckRequestID(after); err != nil {
			return nil, false, badinput.New("after", "%s", err.Error())
		}
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.BrokerTimeout)
	defer cancel()
	page, more, err := s.broker.Transcript(ctx, TranscriptQuery{LeaseID: leaseID, Owner: owner, After: after, Limit: limit, MaxBytes: s.cfg.TranscriptBytes})
	if err != nil {
		return nil, false, fmt.Errorf("read transcript of %s: %w", leaseID, err)
	}
	return page, more, nil
}

// Start starts the janitor that purges exchanges past their retention, when
// the broker needs it (Purger). Start succeeds once.
func (s *Service) Start(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.started {
		return errors.New("start model relay: already started or closed")
	}
	s.started = true
	p, ok := s.broker.(Purger)
	if !ok {
		return nil
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		t := time.NewTicker(s.cfg.PurgeInterval)
		defer t.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-t.C:
			}
			ctx, cancel := context.WithTimeout(context.Background(), s.cfg.BrokerTimeout)
			n, err := p.Purge(ctx)
			cancel()
			if err != nil {
				s.log.Warn("purge model relay transcripts", "err", err)
			} else if n > 0 {
				s.log.Debug("purged model relay exchanges", "count", n)
			}
		}
	}()
	return nil
}

// Close stops the janitor and waits for it (or ctx). It does not close the
// broker (its opener does). Idempotent.
func (s *Service) Close(ctx context.Context) error {
	s.mu.Lock()
	if !s.closed {
		s.closed = true
		close(s.stop)
	}
	s.mu.Unlock()
	done := make(chan struct{})
	go func() {
		s.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("close model relay: %w", ctx.Err())
	}
}
