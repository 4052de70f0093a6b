package rockcompat

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"

	"strings"
	"sync"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/internal/clock"
	"github.com/quarryhq/quarry/internal/defaults"
	"github.com/quarryhq/quarry/warmpool"
)

// Prefix is the path prefix of ROCK's sandbox routes.
const Prefix = "/apis/envs/sandbox/v1"

// Leases is what the compatibility layer needs of the warm pool;
// *warmpool.Manager (and the gateway's Manager) implement it. Errors are the
// warmpool sentinels and *badinput.Error. Implementations must be
// safe for concurrent use.
type Leases interface {
	// Acquire leases a sandbox; replayed is true when req.IdempotencyKey was
	// used before by the same owner.
	Acquire(ctx context.Context, req warmpool.AcquireRequest) (lease warmpool.Lease, replayed bool, err error)
	// Get returns the lease in any state; warmpool.ErrNotFound when unknown
	// or owned by another owner.
	Get(ctx context.Context, id, owner string) (warmpool.Lease, error)
	// Heartbeat extends an active lease; warmpool.ErrLeaseEnded once ended.
	Heartbeat(ctx context.Context, id, owner string) (warmpool.Lease, error)
	// Release ends the lease; warmpool.ErrLeaseEnded when it had ended.
	Release(ctx context.Context, id, owner string) (warmpool.Lease, error)
	// List returns the leases matching f.
	List(ctx context.Context, f warmpool.LeaseFilter) ([]warmpool.Lease, error)
	// Pools returns every pool's configuration and counts.
	Pools(ctx context.Context) ([]warmpool.PoolStatus, error)
}

// KeyLookup is an optional Leases capability, discovered by type
// assertion: ByKey returns, in any state, the lease that owner's
// idempotency key names (warmpool.ErrNotFound when none), in O(1) of the
// owner's leases. *warmpool.Manager implements it; without it a chosen
// sandbox id is looked up by listing the owner's leases with its label.
type KeyLookup interface {
	ByKey(ctx context.Context, owner, key string) (warmpool.Lease, error)
}

// ImagePools is an optional Leases capability, discovered by type
// assertion: an image no pool serves gets its on-demand pool (images on
// demand). *warmpool.Manager implements it; without it such an image is
// refused.
type ImagePools interface {
	ImagePool(ctx context.Context, req warmpool.ImageRequest) (string, error)
	Pool(ctx context.Context, name string) (warmpool.PoolConfig, error)
}

// Config is the compatibility layer's configuration; zero fields take the
// defaults stated on each. The gateway fills it from its own Config.
type Config struct {
	// Images maps a ROCK image name to a Quarry pool. An image not listed
	// goes to the pool of that name, else to the pool whose image it is,
	// else — when it is empty or the SDK's default image — to DefaultPool.
	Images map[string]string
	// DefaultPool serves ROCK's default image (default "default").
	DefaultPool string
	// MaxJSONBody bounds a JSON body (default 8 MiB); MaxUploadBody an
	// upload's multipart body (default 1 GiB); MaxReadFile what read_file
	// returns (default 64 MiB).
	MaxJSONBody   int64
	MaxUploadBody int64
	MaxReadFile   int64
	// CreateTimeout bounds start and start_async (default 5m);
	// ManagerTimeout every other lease-store call (default 10s);
	// RequestTimeout an agent call that is not a command (default 30s).
	CreateTimeout  time.Duration
	ManagerTimeout time.Duration
	RequestTimeout time.Duration
	// MaxCommandTimeout caps a command's timeout (default 24h); the agent
	// call is bounded by the command's timeout plus TimeoutMargin (default
	// 10s).
	MaxCommandTimeout time.Duration
	TimeoutMargin     time.Duration
	// RetryAfter is the Retry-After sent with a failure that a retry can
	// fix (default 2s).
	RetryAfter time.Duration
	// StateDir is the directory inside each sandbox where session names and
	// nohup exit codes are kept (default /tmp/.quarry-rock).
	StateDir string
	// PollHold is how long the SDK's "kill -0 PID" check of a nohup job is
	// held until the job ends (default DefaultPollHold; PollHoldOff: not
	// held). See holdPoll and docs/ROCK.md.
	PollHold time.Duration
	// NohupExit is what the read of a finished nohup job's output answers:
	// NohupExitROCK (the default), success whatever the job's exit code,
	// as ROCK answers and as ROCK's own classes expect (RuntimeEnv's
	// "test -x python" fails in every sandbox and passes on ROCK);
	// NohupExitReal, Failed naming the real exit code (ROCK issue #685).
	NohupExit string
}

// Defaults of Config.
const (
	DefaultStateDir = "/tmp/.quarry-rock"
	// SDKDefaultImage is the image the ROCK SDK asks for when its user names
	// none (SandboxConfig.image).
	SDKDefaultImage = "python:3.11"
	// DefaultPollHold is below the SDK's shortest check timeout of a nohup
	// job (10 s, for wait_timeout ≥ 10 s), with 2 s to spare for the check
	// itself and the network.
	DefaultPollHold = 8 * time.Second
	// MaxPollHold bounds PollHold: at most the SDK's longest usual check
	// timeout (2 × a wait_interval of 30 s).
	MaxPollHold = time.Minute
	// PollHoldOff turns the hold off: checks are answered at once.
	PollHoldOff time.Duration = -1
	// NohupExitROCK and NohupExitReal are the values of Config.NohupExit.
	NohupExitROCK = "rock"
	NohupExitReal = "real"
)

// PollHoldSetting is the value of QUARRY_ROCK_POLL_HOLD: a duration of at
// most MaxPollHold, or "off" (or 0) for no hold; unset, DefaultPollHold.
type PollHoldSetting time.Duration

// Decode parses s (envconfig.Decoder).
func (h *PollHoldSetting) Decode(s string) error {
	s = strings.TrimSpace(s)
	if s == "off" {
		*h = PollHoldSetting(PollHoldOff)
		return nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 || d > MaxPollHold {
		return fmt.Errorf("want a duration from 0s to %s, or off; got %q", MaxPollHold, s)
	}
	if d == 0 {
		d = PollHoldOff
	}
	*h = PollHoldSetting(d)
	return nil
}

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	defaults.Set(&c.DefaultPool, "default")
	defaults.Set(&c.MaxJSONBody, 8<<20)
	defaults.Set(&c.MaxUploadBody, 1<<30)
	defaults.Set(&c.MaxReadFile, 64<<20)
	defaults.Set(&c.CreateTimeout, 5*time.Minute)
	defaults.Set(&c.ManagerTimeout, 10*time.Second)
	defaults.Set(&c.RequestTimeout, 30*time.Second)
	defaults.Set(&c.MaxCommandTimeout, 24*time.Hour)
	defaults.Set(&c.TimeoutMargin, 10*time.Second)
	defaults.Set(&c.RetryAfter, 2*time.Second)
	defaults.Set(&c.StateDir, DefaultStateDir)
	defaults.Set(&c.PollHold, DefaultPollHold)
	defaults.Set(&c.NohupExit, NohupExitROCK)
	return c
}

// Validate reports the first bad value, naming its field.
func (c Config) Validate() error {
	for image, pool := range c.Images {
		if image == "" || pool == "" {
			return fmt.Errorf("rockcompat: Images: empty image or pool in %q=%q", image, pool)
		}
	}
	if c.MaxJSONBody < 0 || c.MaxUploadBody < 0 || c.MaxReadFile < 0 {
		return errors.New("rockcompat: body limits must not be negative")
	}
	if c.PollHold > MaxPollHold || c.PollHold < 0 && c.PollHold != PollHoldOff {
		return fmt.Errorf("rockcompat: PollHold must be at most %s (or PollHoldOff), got %s", MaxPollHold, c.PollHold)
	}
	if c.NohupExit != "" && c.NohupExit != NohupExitROCK && c.NohupExit != NohupExitReal {
		return fmt.Errorf("rockcompat: NohupExit (QUARRY_ROCK_NOHUP_EXIT) must be %q or %q, got %q", NohupExitROCK, NohupExitReal, c.NohupExit)
	}
	if c.StateDir != "" && (c.StateDir[0] != '/' || !safePath(c.StateDir)) {
		return fmt.Errorf("rockcompat: StateDir %q must be an absolute path of letters, digits, '.', '_', '-' and '/'", c.StateDir)
	}
	return nil
}

// ParseImages parses an image-to-pool table written as comma-separated
// image=pool pairs ("python:3.11=py,swe/django:1=swe"; empty: none), the
// format of QUARRY_ROCK_IMAGES. An image contains no ',' and its last '='
// separates the pool.
func ParseImages(s string) (map[string]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	out := make(map[string]string)
	for _, pair := range strings.Split(s, ",") {
		pair = strings.TrimSpace(pair)
		i := strings.LastIndexByte(pair, '=')
		if i <= 0 || i == len(pair)-1 {
			return nil, fmt.Errorf("rock images: %q is not image=pool", pair)
		}
		image, pool := pair[:i], pair[i+1:]
		if _, dup := out[image]; dup {
			return nil, fmt.Errorf("rock images: image %q is mapped twice", image)
		}
		out[image] = pool
	}
	return out, nil
}

// Deps are the compatibility layer's dependencies.
type Deps struct {
	// Leases serves leases (required).
	Leases Leases
	// Owner returns the authenticated caller's lease owner (required); the
	// gateway's ROCK middleware sets it.
	Owner func(c *fiber.Ctx) string
	// Body returns a reader of the request body bounded by limit (nil: the
	// body fasthttp read).
	Body func(c *fiber.Ctx, limit int64) (io.Reader, error)
	// Agent returns the client of a lease's agent (required): the
	// gateway's one agent-call path. Every call carries its own deadline.
	Agent func(l warmpool.Lease) *agentapi.Client
	// Logger receives server-side failures (nil: discard).
	Logger *slog.Logger
	// Clock decides whether a lease has expired (nil: clock.System).
	Clock clock.Clock
	// Leave runs leave once if c's client closes its connection before
	// stop is called (nil: a client that leaves is not noticed, and a held
	// poll lasts its hold).
	Leave func(c *fiber.Ctx, leave func()) (stop func())
}

// PoolConfigs is an optional capability of Leases: the configured pools
// without their counts, answered from memory. Without it the service reads
// Pools (which counts every pool's tasks in the store) at most once per
// poolsTTL.
type PoolConfigs interface {
	PoolConfigs() []warmpool.PoolConfig
}

// poolsTTL is how long a Pools answer serves image lookups. Pool
// configurations change only when the gateway restarts; the counts are not
// used.
const poolsTTL = 30 * time.Second

// Service holds ROCK's routes. Safe for concurrent use; its only mutable
// state is a cache of the pools' configurations.
type Service struct {
	cfg    Config
	leases Leases
	owner  func(*fiber.Ctx) string
	body   func(*fiber.Ctx, int64) (io.Reader, error)
	agent  func(l warmpool.Lease) *agentapi.Client
	log    *slog.Logger
	clock  clock.Clock
	leave  func(*fiber.Ctx, func()) func()

	poolsMu sync.Mutex
	pools   []warmpool.PoolConfig
	poolsAt time.Time
}

// poolList returns the configured pools (cached for poolsTTL).
func (s *Service) poolList(ctx context.Context) ([]warmpool.PoolConfig, error) {
	if pc, ok := s.leases.(PoolConfigs); ok {
		return pc.PoolConfigs(), nil
	}
	s.poolsMu.Lock()
	defer s.poolsMu.Unlock()
	if s.pools != nil && time.Since(s.poolsAt) < poolsTTL {
		return s.pools, nil
	}
	ps, err := s.leases.Pools(ctx)
	if err != nil {
		return nil, fmt.Errorf("list pools: %w", err)
	}
	out := make([]warmpool.PoolConfig, 0, len(ps))
	for _, p := range ps {
		out = append(out, p.PoolConfig)
	}
	s.pools, s.poolsAt = out, time.Now()
	return out, nil
}

// New validates cfg and returns the service. It fails on a bad Config or a
// missing required dependency.
func New(cfg Config, deps Deps) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if deps.Leases == nil || deps.Owner == nil || deps.Agent == nil {
		return nil, errors.New("rockcompat: Deps.Leases, Deps.Owner and Deps.Agent are required")
	}
	s := &Service{cfg: cfg.WithDefaults(), leases: deps.Leases, owner: deps.Owner, body: deps.Body,
		agent: deps.Agent, log: deps.Logger, clock: deps.Clock, leave: deps.Leave}
	if s.leave == nil {
		s.leave = func(*fiber.Ctx, func()) func() { return func() {} }
	}
	if s.body == nil {
		s.body = func(c *fiber.Ctx, limit int64) (io.Reader, error) {
			return io.LimitReader(bytesReader(c.Body()), limit+1), nil
		}
	}
	if s.log == nil {
		s.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if s.clock == nil {
		s.clock = clock.System{}
	}
	return s, nil
}

// Route is one ROCK route: method, full path and handler. Every route needs
// an authenticated caller (Deps.Owner).
type Route struct {
	Method  string
	Path    string
	Handler fiber.Handler
	// Upload is true for the multipart route: its body takes upload limits.
	Upload bool
}

// Routes returns ROCK's sandbox routes served by Quarry.
func (s *Service) Routes() []Route {
	post := func(name string, fn handlerFunc) Route {
		return Route{Method: fiber.MethodPost, Path: Prefix + "/" + name, Handler: s.handle(name, fn)}
	}
	get := func(name string, fn handlerFunc) Route {
		return Route{Method: fiber.MethodGet, Path: Prefix + "/" + name, Handler: s.handle(name, fn)}
	}
	up := post("upload", s.upload)
	up.Upload = true
	return []Route{
		post("start", s.start),
		post("start_async", s.start),
		get("get_status", s.getStatus),
		get("is_alive", s.isAlive),
		post("execute", s.execute),
		post("create_session", s.createSession),
		post("run_in_session", s.runInSession),
		post("close_session", s.closeSession),
		post("read_file", s.readFile),
		post("write_file", s.writeFile),
		up,
		post("stop", s.stop),
		post("delete", s.stop),
	}
}
