package docker

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/client"
	"github.com/stretchr/testify/require"
)

// fakeAPI is the engine's image calls as function fields; the methods it
// does not set panic (the embedded dockerAPI is nil).
type fakeAPI struct {
	dockerAPI
	inspect func(ctx context.Context, ref string) (image.InspectResponse, error)
	pull    func(ctx context.Context, ref string, opts image.PullOptions) (io.ReadCloser, error)
	remove  func(ctx context.Context, ref string) error
	list    func(ctx context.Context, opts container.ListOptions) ([]container.Summary, error)
}

func (f *fakeAPI) ImageInspect(ctx context.Context, ref string, _ ...client.ImageInspectOption) (image.InspectResponse, error) {
	return f.inspect(ctx, ref)
}

func (f *fakeAPI) ImagePull(ctx context.Context, ref string, opts image.PullOptions) (io.ReadCloser, error) {
	return f.pull(ctx, ref, opts)
}

func (f *fakeAPI) ImageRemove(ctx context.Context, ref string, _ image.RemoveOptions) ([]image.DeleteResponse, error) {
	return nil, f.remove(ctx, ref)
}

func (f *fakeAPI) ContainerList(ctx context.Context, opts container.ListOptions) ([]container.Summary, error) {
	return f.list(ctx, opts)
}

// fakeEngine is an engine's images: what it has, what its registry
// serves, and the pulls it was asked for. Pulls of a gated image wait
// until the test opens the gate.
type fakeEngine struct {
	mu       sync.Mutex
	has      map[string]image.InspectResponse // by normalized ref
	registry map[string]image.InspectResponse // what a pull brings
	used     map[string]bool                  // image ids a container uses
	pulls    map[string]int
	removed  []string
	gate     chan struct{} // nil: pulls do not wait
	running  int           // pulls under way now
	maxRun   int           // the most at once
	started  chan string   // each pull's ref, as it starts (when not nil)
}

func newFakeEngine() *fakeEngine {
	return &fakeEngine{has: map[string]image.InspectResponse{}, registry: map[string]image.InspectResponse{}, used: map[string]bool{}, pulls: map[string]int{}}
}

// serve puts an image of size bytes in the registry under ref.
func (e *fakeEngine) serve(ref string, size int64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.registry[ref] = image.InspectResponse{ID: "sha256:" + strings.Repeat(fmt.Sprint(len(e.registry)%10), 64), Size: size}
}

func (e *fakeEngine) api() *fakeAPI {
	notFound := func(ref string) error { return fmt.Errorf("no such image: %s: %w", ref, cerrdefs.ErrNotFound) }
	return &fakeAPI{
		inspect: func(_ context.Context, ref string) (image.InspectResponse, error) {
			e.mu.Lock()
			defer e.mu.Unlock()
			if ins, ok := e.has[ref]; ok {
				return ins, nil
			}
			return image.InspectResponse{}, notFound(ref)
		},
		pull: func(ctx context.Context, ref string, _ image.PullOptions) (io.ReadCloser, error) {
			e.mu.Lock()
			e.pulls[ref]++
			e.running++
			e.maxRun = max(e.maxRun, e.running)
			gate, started := e.gate, e.started
			e.mu.Unlock()
			defer func() {
				e.mu.Lock()
				e.running--
				e.mu.Unlock()
			}()
			if started != nil {
				started <- ref
			}
			if gate != nil {
				select {
				case <-gate:
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}
			e.mu.Lock()
			defer e.mu.Unlock()
			ins, ok := e.registry[ref]
			if !ok {
				return nil, fmt.Errorf("Error response from daemon: manifest for %s not found: manifest unknown: manifest unknown", ref)
			}
			e.has[ref] = ins
			return io.NopCloser(strings.NewReader(`{"status":"Pulling from x","id":"1"}` + "\n" +
				`{"status":"Downloading","id":"l1","progressDetail":{"current":5,"total":10}}` + "\n" +
				`{"status":"Pull complete","id":"l1"}` + "\n")), nil
		},
		remove: func(_ context.Context, ref string) error {
			e.mu.Lock()
			defer e.mu.Unlock()
			if _, ok := e.has[ref]; !ok {
				return notFound(ref)
			}
			delete(e.has, ref)
			e.removed = append(e.removed, ref)
			return nil
		},
		list: func(_ context.Context, opts container.ListOptions) ([]container.Summary, error) {
			e.mu.Lock()
			defer e.mu.Unlock()
			for _, id := range opts.Filters.Get("ancestor") {
				if e.used[id] {
					return []container.Summary{{ID: "c-" + id, ImageID: id}}, nil
				}
			}
			return nil, nil
		},
	}
}

// pullsOf returns how many pulls of ref the engine was asked for.
func (e *fakeEngine) pullsOf(ref string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.pulls[ref]
}

// newTestCache returns an image cache on api with cfg's image settings
// (defaults for the rest), closed when the test ends.
func newTestCache(t *testing.T, api dockerAPI, modify ...func(*Config)) *imageCache {
	t.Helper()
	cfg := Config{AgentBinary: "/a", TokenKeyFile: "/k"}.WithDefaults()
	for _, m := range modify {
		m(&cfg)
	}
	c, err := newImageCache(cfg, api, slog.New(slog.NewTextHandler(t.Output(), nil)))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.close()) })
	return c
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
