package envs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"time"

	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/internal/badinput"
)

// LabelEnv is the lease label that names the env of a sandbox made by Make.
const LabelEnv = "quarry.env"

// ProcessName is the agent process name of the env program in a sandbox.
const ProcessName = "quarry-env"

const (
	// callMargin is added to an env's step or reset timeout to bound the
	// whole call (lease read, agent round trip), so that the agent's own
	// timeout answers first.
	callMargin = 10 * time.Second
	// closeTimeout bounds the close request to the env program.
	closeTimeout = 5 * time.Second
	// startTimeout bounds starting the env program.
	startTimeout = 30 * time.Second
)

// AcquireRequest asks Sandboxes for a new sandbox.
type AcquireRequest struct {
	// Pool, or Image: the spec's (one of them is set).
	Pool           string
	Image          string
	Owner          string
	LeaseSeconds   int
	Env            map[string]string
	Labels         map[string]string
	IdempotencyKey string
	// FromCheckpoint, when set, is a checkpoint of Owner's that Acquire
	// restores into the sandbox before it returns (the env program starts
	// on the restored files).
	FromCheckpoint string
}

// Sandboxes is what the Service needs of the lease side. The gateway
// implements it over its manager and lease checks; its errors pass through
// the Service unchanged (wrapped), for the caller to map.
type Sandboxes interface {
	// Acquire leases a sandbox and returns its id; a replayed idempotency
	// key returns the earlier sandbox.
	Acquire(ctx context.Context, req AcquireRequest) (string, error)
	// Open returns owner's sandbox id when its lease is active: its labels
	// and a client of its agent.
	Open(ctx context.Context, owner, id string) (Sandbox, error)
	// Release ends the sandbox's lease.
	Release(ctx context.Context, owner, id string) error
}

// Sandbox is an open sandbox.
type Sandbox struct {
	Labels map[string]string
	Agent  Agent
}

// Agent is what the Service calls on a sandbox's agent; *agentapi.Client
// implements it. Refusals by the agent are *agentapi.Error.
type Agent interface {
	StartProcess(ctx context.Context, req agentapi.ProcessStartRequest) (agentapi.ProcessInfo, error)
	CallProcess(ctx context.Context, id string, req agentapi.ProcessCallRequest) (agentapi.ProcessCallResult, error)
}

var _ Agent = (*agentapi.Client)(nil)

// MakeOptions are the optional parts of Make.
type MakeOptions struct {
	// LeaseSeconds overrides the env's lease_seconds (0: keep it).
	LeaseSeconds int
	// Env and Labels are the sandbox lease's env and labels (LabelEnv is
	// set by Make).
	Env    map[string]string
	Labels map[string]string
	// IdempotencyKey makes a retried Make return the same sandbox.
	IdempotencyKey string
	// FromCheckpoint restores a checkpoint into the sandbox before the env
	// program starts (AcquireRequest.FromCheckpoint).
	FromCheckpoint string
}

// Service serves the env API. It keeps no state between calls: the env of
// a sandbox is its LabelEnv label, the env program is the agent's process
// ProcessName. Safe for concurrent use; calls on one sandbox are
// serialized by its agent (a concurrent step is refused as busy).
type Service struct {
	reg *Registry
	sb  Sandboxes
}

// New returns a Service over reg and sb (both required).
func New(reg *Registry, sb Sandboxes) (*Service, error) {
	if reg == nil || sb == nil {
		return nil, errors.New("envs: a registry and sandboxes are required")
	}
	return &Service{reg: reg, sb: sb}, nil
}

// Registry returns the service's registry.
func (s *Service) Registry() *Registry { return s.reg }

// Make leases a sandbox from the env's pool (labelled LabelEnv=envID) and
// starts the env program in it; it returns the sandbox id. An unknown env
// is a *badinput.Error for env_id. When the program cannot be started the
// sandbox is released and the error is an *Error of KindEnv. A replayed
// idempotency key returns the earlier sandbox (its program is left as it
// is); one that made another env's sandbox is a *badinput.Error for
// env_id, and that sandbox is left alone.
func (s *Service) Make(ctx context.Context, owner, envID string, opts MakeOptions) (string, error) {
	spec, ok := s.reg.Get(envID)
	if !ok {
		return "", badinput.New("env_id", "unknown env %q", envID)
	}
	labels := maps.Clone(opts.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	labels[LabelEnv] = envID
	lease := spec.LeaseSeconds
	if opts.LeaseSeconds != 0 {
		lease = opts.LeaseSeconds
	}
	id, err := s.sb.Acquire(ctx, AcquireRequest{
		Pool: spec.Pool, Image: spec.Image, Owner: owner, LeaseSeconds: lease, Env: opts.Env, Labels: labels,
		IdempotencyKey: opts.IdempotencyKey, FromCheckpoint: opts.FromCheckpoint,
	})
	if err != nil {
		return "", fmt.Errorf("acquire sandbox for env %s: %w", envID, err)
	}
	sbx, err := s.sb.Open(ctx, owner, id)
	if err == nil && sbx.Labels[LabelEnv] != envID {
		// A replayed key that made another env's sandbox: that sandbox is
		// not this call's to start or release.
		return "", badinput.New("env_id", "the Idempotency-Key was first used to make env %q (sandbox %s), not %q: a key makes one sandbox; use a new key",
			sbx.Labels[LabelEnv], id, envID)
	}
	if err == nil {
		err = s.start(ctx, sbx.Agent, spec)
	}
	if err != nil {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), startTimeout)
		defer cancel()
		if rerr := s.sb.Release(rctx, owner, id); rerr != nil {
			err = errors.Join(err, fmt.Errorf("release sandbox %s: %w", id, rerr))
		}
		return "", err
	}
	return id, nil
}

// start starts the env program as the rpc process ProcessName. A running
// program of that name (a replayed Make, a concurrent reset) is kept.
func (s *Service) start(ctx context.Context, ag Agent, spec Spec) error {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	_, err := ag.StartProcess(ctx, agentapi.ProcessStartRequest{
		Argv: spec.Command, Env: spec.Env, Cwd: spec.Cwd, Name: ProcessName, RPC: true,
	})
	var ae *agentapi.Error
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ae) && ae.Code == agentapi.CodeNameInUse:
		return nil // already running
	case errors.As(err, &ae) && (ae.Status == http.StatusBadRequest || ae.Status == http.StatusNotFound || ae.Status == http.StatusForbidden):
		return envError(KindEnv, "start the program of env %s (%v): %s", spec.ID, spec.Command, ae.Message)
	default:
		return fmt.Errorf("start the program of env %s: %w", spec.ID, err)
	}
}

// open opens owner's sandbox id and finds its env.
func (s *Service) open(ctx context.Context, owner, id string) (Sandbox, Spec, error) {
	sbx, err := s.sb.Open(ctx, owner, id)
	if err != nil {
		return sbx, Spec{}, err
	}
	envID := sbx.Labels[LabelEnv]
	if envID == "" {
		return sbx, Spec{}, fmt.Errorf("sandbox %s was not made by the env API (it has no %s label): %w", id, LabelEnv, ErrNotEnv)
	}
	spec, ok := s.reg.Get(envID)
	if !ok {
		return sbx, Spec{}, fmt.Errorf("sandbox %s runs env %q, which is not in the registry: %w", id, envID, ErrNotEnv)
	}
	return sbx, spec, nil
}

// Reset starts an episode: it sends reset (with seed, which may be nil, and
// options, or the env's defaults when options is empty) to the env program,
// starting a fresh program first when none is running (never started,
// crashed, killed after a protocol error or timeout). Errors: whatever Open
// returns; ErrNotEnv; *badinput.Error for options; *Error for the
// program's failures and refusals; *agentapi.Error for the agent's other
// refusals (e.g. busy with a concurrent call).
func (s *Service) Reset(ctx context.Context, owner, id string, seed *int64, options json.RawMessage) (ResetResult, error) {
	sbx, spec, err := s.open(ctx, owner, id)
	if err != nil {
		return ResetResult{}, err
	}
	if len(options) == 0 || string(options) == "null" {
		options = spec.defaults
	}
	line, err := EncodeReset(seed, options)
	if err != nil {
		return ResetResult{}, err
	}
	raw, err := s.call(ctx, sbx.Agent, line, spec.ResetTimeout())
	if agentCode(err, agentapi.CodeNotFound) || agentCode(err, agentapi.CodeProcessExited) {
		if err = s.start(ctx, sbx.Agent, spec); err != nil {
			return ResetResult{}, err
		}
		raw, err = s.call(ctx, sbx.Agent, line, spec.ResetTimeout())
	}
	if err != nil {
		return ResetResult{}, callError(OpReset, err)
	}
	return DecodeResetReply(raw)
}

// Step sends action to the env program and returns its answer. Errors are
// Reset's; stepping when no program is running is an *Error of
// KindNotRunning.
func (s *Service) Step(ctx context.Context, owner, id string, action json.RawMessage) (StepResult, error) {
	line, err := EncodeStep(action)
	if err != nil {
		return StepResult{}, err
	}
	sbx, spec, err := s.open(ctx, owner, id)
	if err != nil {
		return StepResult{}, err
	}
	raw, err := s.call(ctx, sbx.Agent, line, spec.StepTimeout())
	if err != nil {
		return StepResult{}, callError(OpStep, err)
	}
	return DecodeStepReply(raw)
}

// Close sends close to the env program (best effort, bounded) and releases
// the sandbox. Errors: Open's, ErrNotEnv, and Release's.
func (s *Service) Close(ctx context.Context, owner, id string) error {
	sbx, _, err := s.open(ctx, owner, id)
	if err != nil {
		return err
	}
	// The program may be gone already; the sandbox is released either way.
	_, _ = s.call(ctx, sbx.Agent, EncodeClose(), closeTimeout)
	if err := s.sb.Release(ctx, owner, id); err != nil {
		return fmt.Errorf("release sandbox %s: %w", id, err)
	}
	return nil
}

// call sends one request line to the env program and returns its reply.
func (s *Service) call(ctx context.Context, ag Agent, line json.RawMessage, timeout time.Duration) (json.RawMessage, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout+callMargin)
	defer cancel()
	res, err := ag.CallProcess(ctx, ProcessName, agentapi.ProcessCallRequest{Request: line, TimeoutMS: timeout.Milliseconds()})
	if err != nil {
		return nil, err
	}
	return res.Reply, nil
}

// agentCode reports whether err is the agent's refusal with code.
func agentCode(err error, code string) bool {
	var ae *agentapi.Error
	return errors.As(err, &ae) && ae.Code == code
}

// callError turns the agent's answer to a failed call into the env API's
// error; other errors pass through.
func callError(op string, err error) error {
	var ae *agentapi.Error
	if !errors.As(err, &ae) {
		return fmt.Errorf("call the env program (%s): %w", op, err)
	}
	switch ae.Code {
	case agentapi.CodeNotFound:
		return envError(KindNotRunning, "no env program is running in the sandbox; call reset")
	case agentapi.CodeProcessExited:
		return envError(KindNotRunning, "the env program has exited; call reset (%s)", ae.Message)
	case agentapi.CodeNoReply:
		return envError(KindEnv, "the env program exited before it replied to %s: %s", op, ae.Message)
	case agentapi.CodeProtocolError:
		return envError(KindEnv, "the env program broke the protocol in its reply to %s: %s", op, ae.Message)
	case agentapi.CodeTimeout:
		return envError(KindTimeout, "the env program did not reply to %s in time: %s", op, ae.Message)
	default:
		return fmt.Errorf("call the env program (%s): %w", op, err)
	}
}
