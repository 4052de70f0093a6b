package gateway

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/quarryhq/quarry/checkpoints/ckflow"
	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/internal/badinput"
	"github.com/quarryhq/quarry/providers"
	"github.com/quarryhq/quarry/warmpool"
)

// The gateway's sides of the checkpoint workflows (package ckflow): each
// adapter calls the gateway's own lease and agent handling, as the proxy
// uses it.

// ckLeases is the lease side (ckflow.Leases): the manager, the pools'
// images and the proxy's check of a failed agent call.
type ckLeases struct{ g *Gateway }

var _ ckflow.Leases = ckLeases{}

func (l ckLeases) Acquire(ctx context.Context, req warmpool.AcquireRequest) (warmpool.Lease, bool, error) {
	return l.g.mgr.Acquire(ctx, req)
}

// Release ends lease as DELETE /v1/sandboxes/{id} does (its agent's client
// is dropped).
func (l ckLeases) Release(ctx context.Context, lease warmpool.Lease) error {
	ended, err := l.g.mgr.Release(ctx, lease.ID, lease.Owner)
	if err == nil {
		l.g.leaseGone(ended)
	}
	return err
}

func (l ckLeases) Image(ctx context.Context, pool string) (string, error) {
	return l.g.poolImage(ctx, pool)
}

func (l ckLeases) CallFailed(ctx context.Context, lease warmpool.Lease, err error) error {
	return l.g.ckAgentFailed(ctx, lease, err)
}

// PrepareLayer is the manager's (Layers); a manager without layers has
// none to make (providers.ErrNoLayer: the checkpoint is copied).
func (l ckLeases) PrepareLayer(ctx context.Context, req warmpool.LayerRequest) error {
	if m, ok := l.g.mgr.(Layers); ok {
		return m.PrepareLayer(ctx, req)
	}
	return fmt.Errorf("the gateway's manager has no layers: %w", providers.ErrNoLayer)
}

func (l ckLeases) DropLayer(ctx context.Context, key string) error {
	if m, ok := l.g.mgr.(Layers); ok {
		return m.DropLayer(ctx, key)
	}
	return nil
}

// ckSandboxes is the sandbox side (ckflow.Sandboxes): the agent of a lease.
type ckSandboxes struct{ g *Gateway }

var _ ckflow.Sandboxes = ckSandboxes{}

func (s ckSandboxes) Agent(lease warmpool.Lease) ckflow.Agent { return s.g.agentClient(lease) }

// ckMetrics records the workflows' outcomes (ckflow.Metrics).
type ckMetrics struct{ m *metrics }

var _ ckflow.Metrics = ckMetrics{}

func (m ckMetrics) Taken(bytes int64, d time.Duration)    { m.m.checkpointTaken(bytes, d) }
func (m ckMetrics) Restored(bytes int64, d time.Duration) { m.m.checkpointRestored(bytes, d) }
func (m ckMetrics) Failed(op string)                      { m.m.checkpointFailed(op) }
func (m ckMetrics) Refused(variable string)               { m.m.checkpointRefused(variable) }

// ckAgentFailed turns a failed checkpoint or restore call into its error:
// the agent's answers pass as they are; a call without an answer is
// checked as the proxy checks it (the task may be dead).
func (g *Gateway) ckAgentFailed(ctx context.Context, lease warmpool.Lease, err error) error {
	var ae *agentapi.Error
	if errors.As(err, &ae) {
		if ae.Code == agentapi.CodeStaleGeneration {
			g.agents.evict(lease.AgentURL)
		}
		return err
	}
	var ce *agentapi.CallError
	if errors.As(err, &ce) {
		err = ce.Err
	}
	return g.agentCallFailed(ctx, lease, err)
}

// imagesRefresh is how often, at most, the pool images are read again when
// a pool is not among them (pools are configured at start-up).
const imagesRefresh = 30 * time.Second

// poolImage returns pool's image. Images are read from Manager.Pools once,
// and again (at most every imagesRefresh) when a pool is missing, so that a
// request does not list every pool's tasks; a read holds the others
// waiting (bounded by ManagerTimeout). An unknown pool is bad input.
func (g *Gateway) poolImage(ctx context.Context, pool string) (string, error) {
	if im := g.images(); im != nil && strings.HasPrefix(pool, warmpool.OnDemandPrefix) {
		ctx, cancel := context.WithTimeout(ctx, g.cfg.ManagerTimeout)
		defer cancel()
		pc, err := im.Pool(ctx, pool)
		if err != nil {
			return "", badinput.New("pool", "unknown pool %q", pool)
		}
		return pc.Image, nil // an on-demand pool's image never changes
	}
	s := g.ck
	s.mu.Lock()
	defer s.mu.Unlock()
	if img, ok := s.images[pool]; ok {
		return img, nil
	}
	if s.images == nil || time.Since(s.read) >= imagesRefresh {
		ctx, cancel := context.WithTimeout(ctx, g.cfg.ManagerTimeout)
		defer cancel()
		ps, err := g.mgr.Pools(ctx)
		if err != nil {
			return "", err
		}
		s.images, s.read = make(map[string]string, len(ps)), time.Now()
		for _, p := range ps {
			s.images[p.Name] = p.Image
		}
	}
	img, ok := s.images[pool]
	if !ok {
		return "", badinput.New("pool", "unknown pool %q", pool)
	}
	return img, nil
}
