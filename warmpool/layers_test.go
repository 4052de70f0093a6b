package warmpool_test

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/internal/syncbuf"
	"github.com/quarryhq/quarry/providers"
	"github.com/quarryhq/quarry/warmpool"
)

// layeredProvider is the fake provider with layers: it records the layers
// prepared and dropped, and the layer of every launch.
type layeredProvider struct {
	*fakeProvider
	mu       sync.Mutex
	prepared []providers.LayerRequest
	dropped  []string
	launched map[string]string // task name -> its spec's layer
}

func (p *layeredProvider) PrepareLayer(_ context.Context, req providers.LayerRequest) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.prepared = append(p.prepared, req)
	return nil
}

func (p *layeredProvider) DropLayer(_ context.Context, key string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dropped = append(p.dropped, key)
	return nil
}

func (p *layeredProvider) layerOf(name string) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	l, ok := p.launched[name]
	return l, ok
}

func TestManager_AcquireOnLayer_StartsItsOwnTaskOnTheLayer(t *testing.T) {
	var lp *layeredProvider
	var logs syncbuf.Buffer
	e := newEnvSetup(t, fastConfig(), func(e *env) {
		e.logger = slog.New(slog.NewTextHandler(&logs, nil))
		lp = &layeredProvider{fakeProvider: e.prov, launched: map[string]string{}}
		e.prov.setOnLaunch(func(_ context.Context, spec providers.Spec, names []string) error {
			lp.mu.Lock()
			defer lp.mu.Unlock()
			for _, n := range names {
				lp.launched[n] = spec.Options[providers.OptionLayer]
			}
			return nil
		})
		e.provider = lp
	}, testPool(2, 5))
	e.waitReady(2)
	key := strings.Repeat("ab", 32)

	require.NoError(t, e.m.PrepareLayer(t.Context(), warmpool.LayerRequest{Pool: "default", Key: key, Roots: []string{"/w"},
		Open: func(context.Context) (io.ReadCloser, error) { return io.NopCloser(strings.NewReader("")), nil }}))
	require.Len(t, lp.prepared, 1)
	assert.Equal(t, key, lp.prepared[0].Key)
	assert.Equal(t, "default", lp.prepared[0].Spec.Pool, "the pool's spec")

	l, replayed, err := e.m.Acquire(t.Context(), warmpool.AcquireRequest{Pool: "default", Owner: "o", Layer: key})
	require.NoError(t, err)
	require.False(t, replayed)
	layer, ok := lp.layerOf(l.TaskID)
	require.True(t, ok, "the lease's task was launched for it, not taken from the ready ones")
	assert.Equal(t, key, layer, "launched on the layer")
	rec, ok := e.taskRecord(l.TaskID)
	require.True(t, ok)
	assert.Equal(t, warmpool.TaskLeased, rec.State)
	assert.Equal(t, testPool(2, 5).SpecDigest()+"+layer:"+key, rec.Spec)
	assert.Equal(t, 2, e.status().Ready, "the ready tasks are left for other acquires")

	// A plain acquire never gets a task launched on a layer.
	plain := e.acquire("p")
	layer, _ = lp.layerOf(plain.TaskID)
	assert.Empty(t, layer)

	// The reconciler's walks take the leased task for the pool's own (no
	// note of a lease on another configuration), and its release stops it
	// like any other.
	require.Never(t, func() bool {
		r, ok := e.taskRecord(l.TaskID)
		return !ok || r.State != warmpool.TaskLeased || strings.Contains(logs.String(), "another configuration")
	}, 20*tick, tick, "a lease on a layer is the pool's own")
	_, err = e.m.Release(t.Context(), l.ID, "o")
	require.NoError(t, err)
	require.Eventually(t, func() bool { _, ok := e.prov.task(l.TaskID); return !ok }, waitFor, tick, "its task stops")

	require.NoError(t, e.m.DropLayer(t.Context(), key))
	assert.Equal(t, []string{key}, lp.dropped)
}

func TestManager_PrepareLayer_WithoutLayersIsErrNoLayer(t *testing.T) {
	e := newEnv(t, fastConfig(), testPool(0, 2))
	err := e.m.PrepareLayer(t.Context(), warmpool.LayerRequest{Pool: "default", Key: strings.Repeat("0", 64)})
	assert.ErrorIs(t, err, providers.ErrNoLayer)
	assert.NoError(t, e.m.DropLayer(t.Context(), strings.Repeat("0", 64)), "no provider has layers: nothing to drop")
}

func TestPoolConfig_RefusesTheGatewaysOptions(t *testing.T) {
	p := testPool(0, 2)
	p.Options = map[string]string{providers.OptionLayer: strings.Repeat("0", 64)}
	err := p.Validate()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "the gateway's own")
}

func TestManager_AcquireOnLayer_AFullPoolOfReadyTasksIsErrLayerFull(t *testing.T) {
	e := newEnvSetup(t, fastConfig(), func(e *env) {
		e.provider = &layeredProvider{fakeProvider: e.prov, launched: map[string]string{}}
	}, testPool(2, 2))
	e.waitReady(2)
	_, _, err := e.m.Acquire(t.Context(), warmpool.AcquireRequest{Pool: "default", Owner: "o", Layer: strings.Repeat("ab", 32)})
	require.ErrorIs(t, err, warmpool.ErrLayerFull, "at once, not after the acquire's timeout")
	assert.ErrorIs(t, err, warmpool.ErrNoCapacity)
	assert.Equal(t, 2, e.status().Ready, "the ready tasks are left as they were")
}
