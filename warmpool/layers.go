package warmpool

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"strings"
	"time"

	"github.com/quarryhq/quarry/providers"
)

// Tasks started on a layer (docs/ARCHITECTURE.md, "Copy-on-write forks on
// Docker"): a provider that implements providers.Layers unpacks a
// checkpoint once (PrepareLayer), and an acquire that names the layer
// (AcquireRequest.Layer) gets a new task of its pool started on it, whose
// work directory is a copy-on-write view of the checkpoint. Such a task is
// the lease's from its launch: it is recorded with its pool's digest and
// the layer's key (layerDigest), claimed by its id while launching, and so
// never marked ready, never claimed by another acquire, and stopped when
// its lease ends like every task.

// layerSep joins a pool's digest and a layer's key in the digest of a task
// started on that layer.
const layerSep = "+layer:"

// layerDigest is the digest recorded for a task of p started on layer key.
func (p *pool) layerDigest(key string) string { return p.digest + layerSep + key }

// onLayer reports whether rec is a task of p's current configuration
// started on a layer.
func (p *pool) onLayer(rec TaskRecord) bool { return strings.HasPrefix(rec.Spec, p.digest+layerSep) }

// specOf is the spec the provider launches rec with: the pool's, with the
// layer of a task started on one.
func (p *pool) specOf(rec TaskRecord) providers.Spec {
	_, key, ok := strings.Cut(rec.Spec, layerSep)
	if !ok {
		return p.spec
	}
	spec := p.spec
	spec.Options = maps.Clone(spec.Options)
	if spec.Options == nil {
		spec.Options = map[string]string{}
	}
	spec.Options[providers.OptionLayer] = key
	return spec
}

// LayerRequest asks for a layer of a checkpoint for the tasks of a pool
// (PrepareLayer).
type LayerRequest struct {
	Pool string
	// Key, Roots and Open: providers.LayerRequest's.
	Key   string
	Roots []string
	Open  func(ctx context.Context) (io.ReadCloser, error)
}

// PrepareLayer makes the layer req.Key for the tasks of req.Pool
// (providers.Layers.PrepareLayer). An error wrapping providers.ErrNoLayer
// says that the pool's provider cannot (it has no layers, or not for this
// pool or archive): the caller copies instead.
func (m *Manager) PrepareLayer(ctx context.Context, req LayerRequest) error {
	p := m.lookupPool(ctx, req.Pool)
	if p == nil {
		return fmt.Errorf("pool %q: %w", req.Pool, ErrNotFound)
	}
	l, ok := p.provider.(providers.Layers)
	if !ok {
		return fmt.Errorf("provider %s of pool %s has no copy-on-write layers: %w", p.cfg.Provider, p.cfg.Name, providers.ErrNoLayer)
	}
	return l.PrepareLayer(ctx, providers.LayerRequest{Spec: p.spec, Key: req.Key, Roots: req.Roots, Open: req.Open})
}

// DropLayer tells every provider with layers that layer key's checkpoint
// is gone: each removes it once no task uses it.
func (m *Manager) DropLayer(ctx context.Context, key string) error {
	var errs []error
	for _, prov := range m.providers {
		if l, ok := prov.(providers.Layers); ok {
			errs = append(errs, l.DropLayer(ctx, key))
		}
	}
	return errors.Join(errs...)
}

// ErrLayerFull: an acquire on a layer found its pool at max_total with
// ready tasks, which cannot start on a layer; the caller may restore into
// one of them instead (an acquire without a layer). It comes with
// ErrNoCapacity.
var ErrLayerFull = errors.New("the pool is full of ready tasks, which cannot start on a layer")

// acquireOnLayer is the acquire of a request that names a layer: a new
// task of p started on it, leased from its launch (coldStart), after
// waiting for room when p is at max_total; at once ErrLayerFull when the
// full pool has ready tasks (a slot frees only when one is leased).
func (m *Manager) acquireOnLayer(ctx context.Context, p *pool, req AcquireRequest, dur time.Duration) (Lease, string, error) {
	var lastErr error
	for attempt := 0; attempt < m.cfg.AcquireAttempts; {
		l, outcome, full, err := m.coldStart(ctx, p, req, dur)
		switch {
		case err == nil:
			return l, outcome, nil
		case full:
			if c, err := m.countTasks(ctx, p); err == nil && c.Ready > 0 {
				return Lease{}, outcomeError, fmt.Errorf("pool %s is at max_total %d with %d ready: %w: %w", p.cfg.Name, p.cfg.MaxTotal, c.Ready, ErrLayerFull, ErrNoCapacity)
			}
			if err := m.waitForRoom(ctx, p); err != nil {
				return Lease{}, outcomeError, err
			}
		case errors.Is(err, providers.ErrInvalidSpec) || errors.Is(err, providers.ErrNotFound) ||
			errors.Is(err, ErrUnavailable) || errors.Is(err, ErrClosed) || ctx.Err() != nil:
			return Lease{}, outcomeError, err // retrying would not help
		default:
			lastErr = err
			attempt++
		}
	}
	return Lease{}, outcomeError, fmt.Errorf("%d tasks failed to start on layer %s, the last: %w", m.cfg.AcquireAttempts, shortKey(req.Layer), lastErr)
}

// shortKey is the head of a layer's key, for messages.
func shortKey(key string) string { return key[:min(12, len(key))] }
