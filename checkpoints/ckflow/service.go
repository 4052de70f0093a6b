package ckflow

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/quarryhq/quarry/checkpoints"
	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/internal/clock"
	"github.com/quarryhq/quarry/warmpool"
)

// Leases is what the Service needs of the warm pool side. The gateway
// implements it over its manager and lease checks. Implementations must be
// safe for concurrent use.
type Leases interface {
	// Acquire leases a sandbox (warmpool.Manager.Acquire): replayed is
	// true when req.IdempotencyKey was used before by the same owner, and
	// the earlier lease is returned.
	Acquire(ctx context.Context, req warmpool.AcquireRequest) (lease warmpool.Lease, replayed bool, err error)
	// Release ends lease and stops its task.
	Release(ctx context.Context, lease warmpool.Lease) error
	// Image returns the image pool runs; an unknown pool is a
	// *badinput.Error.
	Image(ctx context.Context, pool string) (string, error)
	// CallFailed returns the error of a call to lease's agent that failed
	// with err, or of its archive stream that broke with err: an answer of
	// the agent (*agentapi.Error) as it is; without one, the lease's task is
	// checked, and a dead task's lease answers how it ended
	// (*warmpool.LeaseEndedError), a live one an *agentapi.CallError.
	CallFailed(ctx context.Context, lease warmpool.Lease, err error) error
	// PrepareLayer makes a copy-on-write layer of a checkpoint for the
	// sandboxes of req.Pool (warmpool.Manager.PrepareLayer); an error
	// wrapping providers.ErrNoLayer says the pool's provider cannot.
	PrepareLayer(ctx context.Context, req warmpool.LayerRequest) error
	// DropLayer says that the checkpoint of layer key is gone
	// (warmpool.Manager.DropLayer).
	DropLayer(ctx context.Context, key string) error
}

// Sandboxes is the sandbox side: the agent of a lease. Implementations
// must be safe for concurrent use.
type Sandboxes interface {
	// Agent returns a client of lease's agent that streams archives (it
	// sends the lease's token and generation).
	Agent(lease warmpool.Lease) Agent
}

// Agent is what the Service calls on a lease's agent; *agentapi.Client
// implements it. Its errors go through Leases.CallFailed.
type Agent interface {
	// CheckpointLevel streams an archive of paths (nil: the work dir), less
	// exclude, at the compression level compression ("": the agent's
	// default). The caller closes the body.
	CheckpointLevel(ctx context.Context, paths, exclude []string, compression string) (io.ReadCloser, agentapi.CheckpointInfo, error)
	// Restore streams r, an archive whose SHA-256 is sha256, into the
	// sandbox; the agent commits only after a clean end of r that hashes
	// to sha256.
	Restore(ctx context.Context, sha256 string, r io.Reader) (agentapi.RestoreResult, error)
}

var _ Agent = (*agentapi.Client)(nil)

// Operations, as Metrics.Failed names them.
const (
	OpCreate  = "create"
	OpRestore = "restore"
)

// Metrics records the Service's outcomes. Implementations must be safe for
// concurrent use.
type Metrics interface {
	// Taken records a checkpoint taken: its archive's bytes and how long
	// the agent and the store took.
	Taken(bytes int64, d time.Duration)
	// Restored records a checkpoint restored.
	Restored(bytes int64, d time.Duration)
	// Failed records a take (OpCreate) that the store refused or whose
	// stream broke, or a restore (OpRestore) that the agent refused or
	// whose stream broke.
	Failed(op string)
	// Refused records a take refused for the budget of variable
	// (checkpoints.BudgetError.Variable); Failed is recorded too.
	Refused(variable string)
}

// nopMetrics records nothing.
type nopMetrics struct{}

func (nopMetrics) Taken(int64, time.Duration)    {}
func (nopMetrics) Restored(int64, time.Duration) {}
func (nopMetrics) Failed(string)                 {}
func (nopMetrics) Refused(string)                {}

// Config holds the Service's limits.
type Config struct {
	// Checkpoints holds the retention and the archives' size limit (zero
	// fields: the defaults).
	Checkpoints checkpoints.Config
	// Compression is the level agents compress archives at
	// (agentapi.Compression*; "": the agent's default).
	Compression string
	// StreamTimeout bounds taking or restoring one checkpoint, agent and
	// store together (the gateway's QUARRY_UPLOAD_TIMEOUT).
	StreamTimeout time.Duration
	// CallTimeout bounds each store read and delete, and the release of a
	// sandbox whose restore failed (the gateway's QUARRY_MANAGER_TIMEOUT).
	CallTimeout time.Duration
	// ForkTimeout bounds a fork's leases and restores, all together (the
	// gateway's QUARRY_CREATE_TIMEOUT).
	ForkTimeout time.Duration
	// CowMinBytes: a checkpoint of at least this many bytes starts forks
	// and sandboxes made from it on a copy-on-write layer where the pool's
	// provider can (Leases.PrepareLayer), instead of restoring it into
	// each; 0: every checkpoint; negative: none.
	CowMinBytes int64
}

// Validate checks c: Checkpoints (each error names its variable) and
// positive timeouts.
func (c Config) Validate() error {
	errs := []error{c.Checkpoints.Validate()}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"StreamTimeout", c.StreamTimeout}, {"CallTimeout", c.CallTimeout}, {"ForkTimeout", c.ForkTimeout}} {
		if d.v <= 0 {
			errs = append(errs, fmt.Errorf("%s: %s is not a positive duration", d.name, d.v))
		}
	}
	return errors.Join(errs...)
}

// Deps are the Service's dependencies.
type Deps struct {
	// Store keeps the checkpoints (required).
	Store checkpoints.Store
	// Leases and Sandboxes are the caller's lease and agent sides
	// (required).
	Leases    Leases
	Sandboxes Sandboxes
	// Metrics records outcomes (nil: none).
	Metrics Metrics
	// Clock stamps new checkpoints (nil: clock.System).
	Clock clock.Clock
	// Logger receives what fails after a workflow's answer is decided: a
	// release after a failed restore, a fork's checkpoint delete (nil:
	// discard).
	Logger *slog.Logger
}

// Service runs the checkpoint workflows over a store, a lease side and a
// sandbox side. It keeps no state of its own. Safe for concurrent use.
type Service struct {
	cfg       Config
	store     checkpoints.Store
	leases    Leases
	sandboxes Sandboxes
	metrics   Metrics
	clock     clock.Clock
	log       *slog.Logger
}

// New validates cfg and returns a Service over deps; it fails on a bad
// Config or a missing required dependency.
func New(cfg Config, deps Deps) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("checkpoint workflows: %w", err)
	}
	if deps.Store == nil || deps.Leases == nil || deps.Sandboxes == nil {
		return nil, errors.New("checkpoint workflows: Deps.Store, Leases and Sandboxes are required")
	}
	cfg.Checkpoints = cfg.Checkpoints.WithDefaults()
	s := &Service{cfg: cfg, store: deps.Store, leases: deps.Leases, sandboxes: deps.Sandboxes,
		metrics: deps.Metrics, clock: deps.Clock, log: deps.Logger}
	if s.metrics == nil {
		s.metrics = nopMetrics{}
	}
	if s.clock == nil {
		s.clock = clock.System{}
	}
	if s.log == nil {
		s.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return s, nil
}

// Get returns owner's checkpoint id: checkpoints.ErrNotFound when it is
// unknown, another owner's, expired or malformed.
func (s *Service) Get(ctx context.Context, id, owner string) (checkpoints.Checkpoint, error) {
	if err := checkID(id); err != nil {
		return checkpoints.Checkpoint{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.CallTimeout)
	defer cancel()
	return s.store.Get(ctx, id, owner)
}

// List returns the checkpoints f matches, newest first (Store.List).
func (s *Service) List(ctx context.Context, f checkpoints.Filter) ([]checkpoints.Checkpoint, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.CallTimeout)
	defer cancel()
	return s.store.List(ctx, f)
}

// Delete deletes owner's checkpoint id. Idempotent: an id owner deleted
// before is nil; a malformed id is checkpoints.ErrNotFound.
func (s *Service) Delete(ctx context.Context, id, owner string) error {
	if err := checkID(id); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.CallTimeout)
	defer cancel()
	ck, gerr := s.store.Get(ctx, id, owner)
	if err := s.store.Delete(ctx, id, owner); err != nil {
		return err
	}
	if gerr == nil {
		s.dropLayer(ctx, ck)
	}
	return nil
}

// checkID refuses a malformed id as not found.
func checkID(id string) error {
	if !checkpoints.ValidID(id) {
		return fmt.Errorf("checkpoint %q: %w", id, checkpoints.ErrNotFound)
	}
	return nil
}
