package e2bcompat

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/internal/badinput"
	"github.com/quarryhq/quarry/warmpool"
)

// fakeLeases is a Leases over one map, without the optional capabilities;
// withPools adds ImagePools, withExpiry Expirer.
type fakeLeases struct {
	mu     sync.Mutex
	leases map[string]warmpool.Lease
	calls  []string
}

func (f *fakeLeases) note(call string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, call)
}

func (f *fakeLeases) Acquire(_ context.Context, req warmpool.AcquireRequest) (warmpool.Lease, bool, error) {
	f.note("Acquire:" + req.Pool)
	now := time.Now()
	l := warmpool.Lease{ID: "sbx-" + req.Pool, Pool: req.Pool, Owner: req.Owner, State: warmpool.LeaseActive,
		Duration: time.Minute, CreatedAt: now, ExpiresAt: now.Add(time.Minute)}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.leases[l.ID] = l
	return l, false, nil
}

func (f *fakeLeases) Get(_ context.Context, id, owner string) (warmpool.Lease, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	l, ok := f.leases[id]
	if !ok || l.Owner != owner {
		return warmpool.Lease{}, warmpool.ErrNotFound
	}
	return l, nil
}

func (f *fakeLeases) Heartbeat(ctx context.Context, id, owner string) (warmpool.Lease, error) {
	f.note("Heartbeat")
	l, err := f.Get(ctx, id, owner)
	l.ExpiresAt = time.Now().Add(l.Duration)
	return l, err
}

func (f *fakeLeases) Release(ctx context.Context, id, owner string) (warmpool.Lease, error) {
	return f.Get(ctx, id, owner)
}

func (f *fakeLeases) List(_ context.Context, lf warmpool.LeaseFilter) ([]warmpool.Lease, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []warmpool.Lease
	for _, l := range f.leases {
		if l.Owner == lf.Owner {
			out = append(out, l)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// withPause adds Pauser: PausedAt set and cleared, as the manager does.
type withPause struct{ *fakeLeases }

func (w withPause) Pause(ctx context.Context, id, owner string) (warmpool.Lease, error) {
	return w.set(ctx, id, owner, true)
}

func (w withPause) Resume(ctx context.Context, id, owner string) (warmpool.Lease, error) {
	return w.set(ctx, id, owner, false)
}

func (w withPause) set(ctx context.Context, id, owner string, pause bool) (warmpool.Lease, error) {
	l, err := w.Get(ctx, id, owner)
	if err != nil {
		return l, err
	}
	if pause == !l.PausedAt.IsZero() {
		return warmpool.Lease{}, warmpool.PausedConflict(id, pause)
	}
	w.note(map[bool]string{true: "Pause", false: "Resume"}[pause])
	l.PausedAt = time.Time{}
	if pause {
		l.PausedAt = time.Now()
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.leases[id] = l
	return l, nil
}

// Pause is 204, then 409; the sandbox says paused in its info and in a
// list of paused sandboxes; connect resumes it (201), after which resume
// is 409. Without the capability both routes are 400.
func TestService_PauseResumeConnect(t *testing.T) {
	f := withPause{&fakeLeases{leases: map[string]warmpool.Lease{}}}
	s := newService(t, f)
	resp, b := serve(t, s, http.MethodPost, "/sandboxes", `{"templateID": "base"}`)
	require.Equal(t, http.StatusCreated, resp.StatusCode, b)
	_, b = serve(t, s, http.MethodPost, "/sandboxes", `{"templateID": "other"}`)
	require.Contains(t, b, "sbx-other")

	resp, b = serve(t, s, http.MethodPost, "/sandboxes/sbx-default/pause", ``)
	require.Equal(t, http.StatusNoContent, resp.StatusCode, b)
	resp, b = serve(t, s, http.MethodPost, "/sandboxes/sbx-default/pause", `{}`)
	assert.Equal(t, http.StatusConflict, resp.StatusCode, b)
	assert.Contains(t, b, "is paused already")

	_, b = serve(t, s, http.MethodGet, "/sandboxes/sbx-default", ``)
	assert.Contains(t, b, `"state":"paused"`)
	_, b = serve(t, s, http.MethodGet, "/v2/sandboxes?state=paused", ``)
	assert.Contains(t, b, "sbx-default")
	assert.NotContains(t, b, "sbx-other")
	_, b = serve(t, s, http.MethodGet, "/v2/sandboxes?state=running", ``)
	assert.NotContains(t, b, "sbx-default")
	assert.Contains(t, b, "sbx-other")
	_, b = serve(t, s, http.MethodGet, "/v2/sandboxes", ``)
	assert.Contains(t, b, "sbx-default")
	assert.Contains(t, b, "sbx-other")

	resp, b = serve(t, s, http.MethodPost, "/sandboxes/sbx-default/connect", `{"timeout": 30}`)
	require.Equal(t, http.StatusCreated, resp.StatusCode, "a paused sandbox is resumed: %s", b)
	assert.Contains(t, b, `"sandboxID":"sbx-default"`)
	resp, b = serve(t, s, http.MethodPost, "/sandboxes/sbx-default/connect", `{}`)
	assert.Equal(t, http.StatusOK, resp.StatusCode, "a running sandbox: %s", b)
	resp, b = serve(t, s, http.MethodPost, "/sandboxes/sbx-default/resume", `{}`)
	assert.Equal(t, http.StatusConflict, resp.StatusCode, b)
	assert.Contains(t, b, "is not paused")
	assert.Equal(t, 1, strings.Count(strings.Join(f.calls, ","), "Resume"))

	resp, _ = serve(t, s, http.MethodPost, "/sandboxes/sbx-default/pause", ``)
	require.Equal(t, http.StatusNoContent, resp.StatusCode)
	resp, b = serve(t, s, http.MethodPost, "/sandboxes/sbx-default/resume", `{"timeout": 60}`)
	require.Equal(t, http.StatusCreated, resp.StatusCode, b)
	assert.Contains(t, b, `"sandboxID":"sbx-default"`)

	plain := newService(t, &fakeLeases{leases: map[string]warmpool.Lease{}})
	resp, b = serve(t, plain, http.MethodPost, "/sandboxes/sbx-default/pause", ``)
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode, b)
}

// withPools adds ImagePools: pools names the pools; images the images
// that images on demand serve.
type withPools struct {
	*fakeLeases
	pools  map[string]warmpool.PoolConfig
	images map[string]string
}

func (w withPools) Pool(_ context.Context, name string) (warmpool.PoolConfig, error) {
	if p, ok := w.pools[name]; ok {
		return p, nil
	}
	return warmpool.PoolConfig{}, warmpool.ErrNotFound
}

func (w withPools) ImagePool(_ context.Context, req warmpool.ImageRequest) (string, error) {
	if p, ok := w.images[req.Image]; ok {
		return p, nil
	}
	return "", badinput.New("image", "no class serves image %q", req.Image)
}

func newService(t *testing.T, l Leases) *Service {
	t.Helper()
	s, err := New(Config{}, Deps{Leases: l, Owner: func(*fiber.Ctx) string { return "alice" },
		Token: func(l warmpool.Lease) string { return "tok-" + l.ID }})
	require.NoError(t, err)
	return s
}

// serve calls s's routes without the gateway.
func serve(t *testing.T, s *Service, method, path, body string) (*http.Response, string) {
	t.Helper()
	app := fiber.New()
	for _, rt := range s.Routes() {
		app.Add(rt.Method, rt.Path, rt.Handler)
	}
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := app.Test(req)
	require.NoError(t, err)
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, string(b)
}

func TestNew_RequiresItsDependencies(t *testing.T) {
	_, err := New(Config{}, Deps{})
	assert.Error(t, err)
}

func TestService_PoolOf(t *testing.T) {
	leases := withPools{fakeLeases: &fakeLeases{leases: map[string]warmpool.Lease{}},
		pools:  map[string]warmpool.PoolConfig{"default": {}, "py": {}, "base": {}},
		images: map[string]string{"python:3.12": "i-abc"}}
	s := newService(t, leases)
	noBase := newService(t, withPools{fakeLeases: leases.fakeLeases, pools: map[string]warmpool.PoolConfig{"default": {}}})
	for _, tc := range []struct {
		name, template, pool, err string
		s                         *Service
	}{
		{name: "a pool", template: "py", pool: "py", s: s},
		{name: "a pool named base", template: "base", pool: "base", s: s},
		{name: "base is the default pool", template: "base", pool: "default", s: noBase},
		{name: "an image on demand", template: "python:3.12", pool: "i-abc", s: s},
		{name: "neither", template: "nope", err: `"nope" names no pool, and no image on demand`, s: s},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.s.poolOf(t.Context(), "alice", tc.template)
			if tc.err != "" {
				var bad *badinput.Error
				require.ErrorAs(t, err, &bad)
				assert.Equal(t, "templateID", bad.Field)
				assert.Contains(t, err.Error(), tc.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.pool, got)
		})
	}
	// Without the capability, a template is a pool's name.
	plain := newService(t, leases.fakeLeases)
	got, err := plain.poolOf(t.Context(), "alice", "base")
	require.NoError(t, err)
	assert.Equal(t, "default", got)
	got, _ = plain.poolOf(t.Context(), "alice", "py")
	assert.Equal(t, "py", got)
}

// TestService_TimeoutHeartbeatsWithoutExpirer: a manager without SetExpiry
// gets the nearest real thing, a heartbeat.
func TestService_TimeoutHeartbeatsWithoutExpirer(t *testing.T) {
	f := &fakeLeases{leases: map[string]warmpool.Lease{}}
	s := newService(t, f)
	require.Nil(t, s.expirer)
	resp, b := serve(t, s, http.MethodPost, "/sandboxes", `{"templateID": "base"}`)
	require.Equal(t, http.StatusCreated, resp.StatusCode, b)
	assert.Contains(t, b, `"envdAccessToken":"tok-sbx-default"`)
	resp, b = serve(t, s, http.MethodPost, "/sandboxes/sbx-default/timeout", `{"timeout": 600}`)
	require.Equal(t, http.StatusNoContent, resp.StatusCode, b)
	assert.Contains(t, f.calls, "Heartbeat")
}

func TestService_Resources(t *testing.T) {
	leases := withPools{fakeLeases: &fakeLeases{leases: map[string]warmpool.Lease{}},
		pools: map[string]warmpool.PoolConfig{"big": {CPU: 2.5, Memory: 4096, Disk: 10240}, "tiny": {CPU: 0.25, Memory: 64}}}
	s := newService(t, leases)
	cpu, mem, disk := s.resources(t.Context(), "big")
	assert.Equal(t, []int{3, 4096, 10240}, []int{cpu, mem, disk})
	cpu, mem, disk = s.resources(t.Context(), "tiny")
	assert.Equal(t, []int{1, 128, 0}, []int{cpu, mem, disk}, "the spec's minimums")
	cpu, mem, _ = s.resources(t.Context(), "gone")
	assert.Equal(t, []int{1, 128}, []int{cpu, mem})
}

func TestMetadataFilter(t *testing.T) {
	got, err := metadataFilter("user=abc&app=prod%26co")
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"user": "abc", "app": "prod&co"}, got)
	_, err = metadataFilter("a=1&a=2")
	assert.Error(t, err)
	got, err = metadataFilter("")
	assert.NoError(t, err)
	assert.Nil(t, got)
	assert.True(t, errors.As(func() error { _, err := metadataFilter("%zz"); return err }(), new(*badinput.Error)))
}
