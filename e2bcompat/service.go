package e2bcompat

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/quarryhq/quarry/internal/badinput"
	"github.com/quarryhq/quarry/internal/clock"
	"github.com/quarryhq/quarry/internal/defaults"
	"github.com/quarryhq/quarry/warmpool"
)

// Leases is what the control plane needs of the warm pool; *warmpool.Manager
// (and the gateway's Manager) implement it. Errors are the warmpool
// sentinels and *badinput.Error. Implementations must be safe for
// concurrent use.
type Leases interface {
	// Acquire leases a sandbox.
	Acquire(ctx context.Context, req warmpool.AcquireRequest) (lease warmpool.Lease, replayed bool, err error)
	// Get returns the lease in any state; warmpool.ErrNotFound when unknown
	// or owned by another owner.
	Get(ctx context.Context, id, owner string) (warmpool.Lease, error)
	// Heartbeat extends an active lease by its duration;
	// warmpool.ErrLeaseEnded once ended.
	Heartbeat(ctx context.Context, id, owner string) (warmpool.Lease, error)
	// Release ends the lease; warmpool.ErrLeaseEnded when it had ended.
	Release(ctx context.Context, id, owner string) (warmpool.Lease, error)
	// List returns the leases matching f, newest first.
	List(ctx context.Context, f warmpool.LeaseFilter) ([]warmpool.Lease, error)
}

// Expirer is an optional Leases capability, discovered by type assertion:
// SetExpiry moves an active lease's expiry to expiresAt, earlier or later
// (*warmpool.Manager.SetExpiry). Without it a timeout or a connect
// heartbeats the lease (its expiry moves to now + its own duration).
type Expirer interface {
	SetExpiry(ctx context.Context, id, owner string, expiresAt time.Time) (warmpool.Lease, error)
}

// Pauser is an optional Leases capability, discovered by type assertion:
// Pause freezes a sandbox where its provider can (Docker), Resume thaws it
// (*warmpool.Manager). A *badinput.Error when the provider cannot; a
// *warmpool.PauseStateError when it is so already. Without it, pause and
// resume are 400.
type Pauser interface {
	Pause(ctx context.Context, id, owner string) (warmpool.Lease, error)
	Resume(ctx context.Context, id, owner string) (warmpool.Lease, error)
}

// ImagePools is an optional Leases capability, discovered by type
// assertion: a pool's configuration (what a sandbox's detail reports) and,
// for a templateID that names no pool, the on-demand pool of that image
// (images on demand). *warmpool.Manager implements it.
type ImagePools interface {
	// Pool returns a pool's configuration; warmpool.ErrNotFound for none.
	Pool(ctx context.Context, name string) (warmpool.PoolConfig, error)
	// ImagePool returns the on-demand pool of an image, made when needed.
	ImagePool(ctx context.Context, req warmpool.ImageRequest) (string, error)
}

// Config is the control plane's configuration; zero fields take the
// defaults stated on each. The gateway fills it from its own Config.
type Config struct {
	// DefaultPool serves E2B's default template, "base", when no pool has
	// that name (default "default").
	DefaultPool string
	// Domain is the sandboxes' domain answered to the SDK (Sandbox.domain),
	// which then reaches envd at https://49983-{id}.{Domain} unless
	// E2B_SANDBOX_URL is set; "" answers null.
	Domain string
	// MaxJSONBody bounds a request body (default 8 MiB).
	MaxJSONBody int64
	// MaxTimeout bounds a timeout in seconds (default 30 days).
	MaxTimeout int
	// CreateTimeout bounds a create (default 5m); ManagerTimeout every other
	// lease-store call (default 10s).
	CreateTimeout  time.Duration
	ManagerTimeout time.Duration
	// RetryAfter is the Retry-After of a retryable 503 (default 2s).
	RetryAfter time.Duration
}

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	defaults.Set(&c.DefaultPool, "default")
	defaults.Set(&c.MaxJSONBody, 8<<20)
	defaults.Set(&c.MaxTimeout, 30*24*3600)
	defaults.Set(&c.CreateTimeout, 5*time.Minute)
	defaults.Set(&c.ManagerTimeout, 10*time.Second)
	defaults.Set(&c.RetryAfter, 2*time.Second)
	return c
}

// Deps are the control plane's dependencies.
type Deps struct {
	// Leases serves leases (required).
	Leases Leases
	// Owner returns the owner the gateway authenticated (required).
	Owner func(c *fiber.Ctx) string
	// Token returns a lease's envdAccessToken (required): a pure function
	// of the lease, so that every call answers the same token.
	Token func(l warmpool.Lease) string
	// Body returns c's request body bounded by limit (nil: c.Body()).
	Body func(c *fiber.Ctx, limit int64) (io.Reader, error)
	// Checkpoints serves fork and snapshots (snapshots.go); nil: their
	// routes answer 404.
	Checkpoints Checkpoints
	// Logger receives failures (nil: discard); Clock says what time it is
	// (nil: clock.System).
	Logger *slog.Logger
	Clock  clock.Clock
}

// Service serves E2B's control plane. It keeps nothing in memory and is
// safe for concurrent use.
type Service struct {
	cfg     Config
	leases  Leases
	expirer Expirer     // nil: heartbeats
	pauser  Pauser      // nil: pause and resume are 400
	pools   ImagePools  // nil: templates name pools only
	ck      Checkpoints // nil: no fork or snapshots
	owner   func(*fiber.Ctx) string
	token   func(warmpool.Lease) string
	body    func(*fiber.Ctx, int64) (io.Reader, error)
	log     *slog.Logger
	clock   clock.Clock
}

// New builds the control plane; it fails without a required dependency.
func New(cfg Config, deps Deps) (*Service, error) {
	if deps.Leases == nil || deps.Owner == nil || deps.Token == nil {
		return nil, errors.New("e2bcompat: Deps.Leases, Owner and Token are required")
	}
	s := &Service{cfg: cfg.WithDefaults(), leases: deps.Leases, owner: deps.Owner, token: deps.Token,
		body: deps.Body, ck: deps.Checkpoints, log: deps.Logger, clock: deps.Clock}
	s.expirer, _ = deps.Leases.(Expirer)
	s.pauser, _ = deps.Leases.(Pauser)
	s.pools, _ = deps.Leases.(ImagePools)
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.clock == nil {
		s.clock = clock.System{}
	}
	return s, nil
}

// Route is one route of the control plane; the gateway puts its credential
// check (X-API-KEY) before Handler.
type Route struct {
	Method, Path string
	Handler      fiber.Handler
}

// Routes lists the control plane's routes (docs/ARCHITECTURE.md, "E2B's
// routes").
func (s *Service) Routes() []Route {
	const sbx = "/sandboxes/:id"
	return []Route{
		{fiber.MethodPost, "/sandboxes", s.handle(s.create)},
		{fiber.MethodPost, "/v2/sandboxes", s.handle(s.create)},
		{fiber.MethodGet, "/v2/sandboxes", s.handle(s.list)},
		{fiber.MethodGet, sbx, s.handle(s.sandbox(s.get))},
		{fiber.MethodDelete, sbx, s.handle(s.sandbox(s.kill))},
		{fiber.MethodPost, sbx + "/connect", s.handle(s.sandbox(s.connect))},
		{fiber.MethodPost, "/v2" + sbx + "/connect", s.handle(s.sandbox(s.connect))},
		{fiber.MethodPost, sbx + "/timeout", s.handle(s.sandbox(s.setTimeout))},
		{fiber.MethodPost, sbx + "/refreshes", s.handle(s.sandbox(s.refresh))},
		{fiber.MethodGet, sbx + "/logs", s.handle(s.sandbox(s.logs))},
		{fiber.MethodGet, "/v2" + sbx + "/logs", s.handle(s.sandbox(s.logs))},
		{fiber.MethodGet, sbx + "/metrics", s.handle(s.sandbox(s.metrics))},
		{fiber.MethodPost, sbx + "/fork", s.handle(s.sandbox(s.fork))},
		{fiber.MethodPost, sbx + "/snapshots", s.handle(s.sandbox(s.snapshot))},
		{fiber.MethodGet, "/snapshots", s.handle(s.snapshots)},
		{fiber.MethodDelete, "/templates/:id", s.handle(s.deleteSnapshot)},
		{fiber.MethodPost, sbx + "/pause", s.handle(s.ifPauser("pause", s.pause))},
		{fiber.MethodPost, sbx + "/resume", s.handle(s.ifPauser("resume", s.resume))},
	}
}

// ifPauser serves fn when the leases can pause, else answers unsupported.
func (s *Service) ifPauser(op string, fn sandboxFunc) handlerFunc {
	if s.pauser == nil {
		return s.unsupported(op)
	}
	return s.sandbox(fn)
}

// handlerFunc serves one route for an authenticated owner; it writes its
// answer, or returns the error WriteError renders.
type handlerFunc func(c *fiber.Ctx, owner string) error

// handle wraps fn: an error is answered in E2B's Error body, and a server
// failure logged.
func (s *Service) handle(fn handlerFunc) fiber.Handler {
	return func(c *fiber.Ctx) error {
		if err := fn(c, s.owner(c)); err != nil {
			if a := WriteError(c, err, s.cfg.RetryAfter); a.Status >= 500 {
				s.log.Warn("e2b call failed", "method", c.Method(), "path", c.Path(), "status", a.Status, "err", err)
			}
		}
		return nil
	}
}

// decode reads c's JSON body (bounded by MaxJSONBody) into v; an empty body
// leaves v as it is unless required.
func (s *Service) decode(c *fiber.Ctx, v any, required bool) error {
	var b []byte
	if s.body == nil {
		b = c.Body()
	} else {
		r, err := s.body(c, s.cfg.MaxJSONBody)
		if err != nil {
			return err
		}
		if b, err = io.ReadAll(r); err != nil {
			return err
		}
	}
	if len(b) == 0 {
		if required {
			return badinput.New("body", "a JSON object is required")
		}
		return nil
	}
	return badinput.JSON(json.Unmarshal(b, v))
}

// timeoutOf checks a timeout in seconds (a field of a body).
func (s *Service) timeoutOf(field string, v int) error {
	if v < 0 || v > s.cfg.MaxTimeout {
		return badinput.New(field, "must be from 0 to %d seconds, got %d", s.cfg.MaxTimeout, v)
	}
	return nil
}

// withTimeout bounds a lease-store call.
func (s *Service) withTimeout(c *fiber.Ctx) (context.Context, context.CancelFunc) {
	return context.WithTimeout(c.UserContext(), s.cfg.ManagerTimeout)
}

// unsupported answers a route Quarry does not serve: 400 naming it, once
// its body (optional) is read as every route's.
func (s *Service) unsupported(op string) handlerFunc {
	return func(c *fiber.Ctx, _ string) error {
		var body json.RawMessage
		if err := s.decode(c, &body, false); err != nil {
			return err
		}
		return badinput.New(op, "%s", fmt.Sprintf("Quarry does not %s sandboxes: a sandbox runs until it is killed or its timeout passes", op))
	}
}
