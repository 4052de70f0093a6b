package ckflow

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/checkpoints"
	"github.com/quarryhq/quarry/checkpoints/filestore"
	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/providers"
	"github.com/quarryhq/quarry/warmpool"
)

// fakeLeases is a scriptable Leases: each nil function field has a
// default (Acquire: a new lease of the request; Release: nil; Image: the
// images map, unknown pools failing with errUnknownPool; CallFailed: err
// wrapped in errCallFailed). It records the calls.
type fakeLeases struct {
	AcquireFn    func(ctx context.Context, req warmpool.AcquireRequest) (warmpool.Lease, bool, error)
	ReleaseFn    func(ctx context.Context, lease warmpool.Lease) error
	ImageFn      func(ctx context.Context, pool string) (string, error)
	CallFailedFn func(ctx context.Context, lease warmpool.Lease, err error) error
	// PrepareLayerFn: nil has no layers (providers.ErrNoLayer).
	PrepareLayerFn func(ctx context.Context, req warmpool.LayerRequest) error

	images map[string]string

	mu         sync.Mutex
	acquired   []warmpool.AcquireRequest
	released   []warmpool.Lease
	callFailed []error
	prepared   []warmpool.LayerRequest
	dropped    []string
}

var errUnknownPool = errors.New("unknown pool")

// callFailedError is the default CallFailed's answer.
type callFailedError struct{ err error }

func (e *callFailedError) Error() string { return "call failed: " + e.err.Error() }
func (e *callFailedError) Unwrap() error { return e.err }

func (f *fakeLeases) Acquire(ctx context.Context, req warmpool.AcquireRequest) (warmpool.Lease, bool, error) {
	f.mu.Lock()
	f.acquired = append(f.acquired, req)
	n := len(f.acquired)
	f.mu.Unlock()
	if f.AcquireFn != nil {
		return f.AcquireFn(ctx, req)
	}
	return warmpool.Lease{ID: fmt.Sprintf("sbx-new-%d", n), Pool: req.Pool, Owner: req.Owner, Env: req.Env, Labels: req.Labels}, false, nil
}

func (f *fakeLeases) Release(ctx context.Context, lease warmpool.Lease) error {
	f.mu.Lock()
	f.released = append(f.released, lease)
	f.mu.Unlock()
	if f.ReleaseFn != nil {
		return f.ReleaseFn(ctx, lease)
	}
	return nil
}

func (f *fakeLeases) Image(ctx context.Context, pool string) (string, error) {
	if f.ImageFn != nil {
		return f.ImageFn(ctx, pool)
	}
	img, ok := f.images[pool]
	if !ok {
		return "", errUnknownPool
	}
	return img, nil
}

func (f *fakeLeases) PrepareLayer(ctx context.Context, req warmpool.LayerRequest) error {
	f.mu.Lock()
	f.prepared = append(f.prepared, req)
	f.mu.Unlock()
	if f.PrepareLayerFn != nil {
		return f.PrepareLayerFn(ctx, req)
	}
	return fmt.Errorf("fake leases: %w", providers.ErrNoLayer)
}

func (f *fakeLeases) DropLayer(_ context.Context, key string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.dropped = append(f.dropped, key)
	return nil
}

func (f *fakeLeases) CallFailed(ctx context.Context, lease warmpool.Lease, err error) error {
	f.mu.Lock()
	f.callFailed = append(f.callFailed, err)
	f.mu.Unlock()
	if f.CallFailedFn != nil {
		return f.CallFailedFn(ctx, lease, err)
	}
	return &callFailedError{err: err}
}

// fakeAgent is a scriptable Agent. Without CheckpointFn it streams
// archive; without RestoreFn it reads the whole body and, as the real
// agent, refuses a body that does not hash to sha256 (400) and otherwise
// keeps it in restored.
type fakeAgent struct {
	CheckpointFn func(ctx context.Context, paths, exclude []string, compression string) (io.ReadCloser, agentapi.CheckpointInfo, error)
	RestoreFn    func(ctx context.Context, sha256 string, r io.Reader) (agentapi.RestoreResult, error)

	archive []byte

	mu          sync.Mutex
	compression string
	restored    [][]byte
}

func (a *fakeAgent) CheckpointLevel(ctx context.Context, paths, exclude []string, compression string) (io.ReadCloser, agentapi.CheckpointInfo, error) {
	a.mu.Lock()
	a.compression = compression
	a.mu.Unlock()
	if a.CheckpointFn != nil {
		return a.CheckpointFn(ctx, paths, exclude, compression)
	}
	return io.NopCloser(bytes.NewReader(a.archive)), agentapi.CheckpointInfo{Format: agentapi.FormatTarGzip, Roots: []string{"/work"}, Files: 3}, nil
}

func (a *fakeAgent) Restore(ctx context.Context, sum string, r io.Reader) (agentapi.RestoreResult, error) {
	if a.RestoreFn != nil {
		return a.RestoreFn(ctx, sum, r)
	}
	b, err := io.ReadAll(r)
	if err != nil {
		return agentapi.RestoreResult{}, &agentapi.CallError{Err: err}
	}
	if h := sha256.Sum256(b); hex.EncodeToString(h[:]) != sum {
		return agentapi.RestoreResult{}, &agentapi.Error{Status: http.StatusBadRequest, Code: agentapi.CodeBadRequest, Message: "the archive does not hash to sha256"}
	}
	a.mu.Lock()
	a.restored = append(a.restored, b)
	a.mu.Unlock()
	return agentapi.RestoreResult{Files: 3, Bytes: int64(len(b))}, nil
}

// fakeSandboxes hands out agents: AgentFn, or one agent for every lease.
type fakeSandboxes struct {
	AgentFn func(lease warmpool.Lease) Agent
	agent   *fakeAgent
}

func (s *fakeSandboxes) Agent(lease warmpool.Lease) Agent {
	if s.AgentFn != nil {
		return s.AgentFn(lease)
	}
	return s.agent
}

// fakeMetrics counts what the Service records.
type fakeMetrics struct {
	mu       sync.Mutex
	taken    int
	restored int
	failed   map[string]int
	refused  map[string]int
}

func (m *fakeMetrics) Taken(int64, time.Duration) { m.mu.Lock(); m.taken++; m.mu.Unlock() }
func (m *fakeMetrics) Restored(int64, time.Duration) {
	m.mu.Lock()
	m.restored++
	m.mu.Unlock()
}
func (m *fakeMetrics) Failed(op string)    { m.mu.Lock(); m.failed[op]++; m.mu.Unlock() }
func (m *fakeMetrics) Refused(name string) { m.mu.Lock(); m.refused[name]++; m.mu.Unlock() }

// fixedClock is a Clock stopped at t.
type fixedClock struct{ t time.Time }

func (c fixedClock) Now() time.Time { return c.t }

// owner, pool and image of the source lease of every test.
const (
	owner = "owner-a"
	pool  = "default"
	image = "img:1"
)

// env is a Service over an embedded store, with fakes for the rest.
type env struct {
	svc     *Service
	store   *filestore.Store
	leases  *fakeLeases
	agent   *fakeAgent
	metrics *fakeMetrics
	lease   warmpool.Lease // the source lease
	now     time.Time
}

// newEnv builds an env; budget bounds the store, mutate changes the
// Config.
func newEnv(t *testing.T, budget checkpoints.Budget, mutate ...func(*Config, *Deps)) *env {
	t.Helper()
	store, err := filestore.Open(filestore.Config{Dir: t.TempDir(), NoSync: true, Budget: budget})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, store.Close()) })
	e := &env{
		store:   store,
		leases:  &fakeLeases{images: map[string]string{pool: image, "py": "python:3.12"}},
		agent:   &fakeAgent{archive: bytes.Repeat([]byte("archive "), 1024)},
		metrics: &fakeMetrics{failed: map[string]int{}, refused: map[string]int{}},
		lease: warmpool.Lease{ID: "sbx-1", Pool: pool, Owner: owner,
			Env: map[string]string{"A": "1"}, Labels: map[string]string{"run": "r1"}},
		now: time.Now().UTC().Truncate(time.Second), // the store hides expired checkpoints by its own clock
	}
	cfg := Config{Compression: agentapi.CompressionFast, StreamTimeout: time.Minute, CallTimeout: time.Minute, ForkTimeout: time.Minute}
	deps := Deps{Store: store, Leases: e.leases, Sandboxes: &fakeSandboxes{agent: e.agent}, Metrics: e.metrics, Clock: fixedClock{e.now}}
	for _, m := range mutate {
		m(&cfg, &deps)
	}
	e.svc, err = New(cfg, deps)
	require.NoError(t, err)
	return e
}

// kept returns the ids of owner's checkpoints in the store.
func (e *env) kept(t *testing.T) []string {
	t.Helper()
	cks, err := e.store.List(context.Background(), checkpoints.Filter{Owner: owner})
	require.NoError(t, err)
	ids := []string{}
	for _, ck := range cks {
		ids = append(ids, ck.ID)
	}
	return ids
}

// take takes a checkpoint of the source lease and requires it to succeed.
func (e *env) take(t *testing.T) checkpoints.Checkpoint {
	t.Helper()
	ck, err := e.svc.Take(context.Background(), e.lease, TakeRequest{})
	require.NoError(t, err)
	return ck
}

// brokenReader returns data, then err.
type brokenReader struct {
	data []byte
	err  error
}

func (r *brokenReader) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, r.err
	}
	n := copy(p, r.data)
	r.data = r.data[n:]
	return n, nil
}

func (r *brokenReader) Close() error { return nil }

// corruptStore is a store whose Open streams the first half of the blob
// and then fails with checkpoints.ErrCorrupt, as a damaged blob does.
type corruptStore struct{ checkpoints.Store }

func (s corruptStore) Open(ctx context.Context, id, owner string) (io.ReadCloser, checkpoints.Checkpoint, error) {
	rc, ck, err := s.Store.Open(ctx, id, owner)
	if err != nil {
		return nil, ck, err
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		return nil, ck, err
	}
	return &brokenReader{data: b[:len(b)/2], err: fmt.Errorf("blob of %s: %w", id, checkpoints.ErrCorrupt)}, ck, nil
}
