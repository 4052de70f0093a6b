package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/quarryhq/quarry/execagent"
	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/warmpool"
)

const (
	testKey      = "test-key-0123456789"
	otherKey     = "other-key-0123456789"
	agentToken   = "agent-token-0123456789"
	testDeadline = 30 * time.Second
)

// fakeManager is an in-memory Manager: leases in a map, owner checks as the
// contract states. The function fields, when set, replace an operation
// (error injection); calls records every operation as "Op:arg".
type fakeManager struct {
	AcquireFn   func(ctx context.Context, req warmpool.AcquireRequest) (warmpool.Lease, bool, error)
	GetFn       func(ctx context.Context, id, owner string) (warmpool.Lease, error)
	HeartbeatFn func(ctx context.Context, id, owner string) (warmpool.Lease, error)
	ReleaseFn   func(ctx context.Context, id, owner string) (warmpool.Lease, error)
	ListFn      func(ctx context.Context, f warmpool.LeaseFilter) ([]warmpool.Lease, error)
	PoolsFn     func(ctx context.Context) ([]warmpool.PoolStatus, error)
	CheckTaskFn func(ctx context.Context, l warmpool.Lease) (warmpool.Lease, error)
	SetExpiryFn func(ctx context.Context, id, owner string, at time.Time) (warmpool.Lease, error)

	// AgentURL and Generation are given to leases created by Acquire.
	AgentURL   string
	Generation int64

	mu     sync.Mutex
	leases map[string]warmpool.Lease
	next   int
	calls  []string
}

var _ Manager = (*fakeManager)(nil)

func newFakeManager(agentURL string) *fakeManager {
	return &fakeManager{AgentURL: agentURL, Generation: 1, leases: make(map[string]warmpool.Lease)}
}

func (m *fakeManager) record(op, arg string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.calls = append(m.calls, op+":"+arg)
}

// Calls returns the recorded calls of op.
func (m *fakeManager) Calls(op string) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for _, c := range m.calls {
		if strings.HasPrefix(c, op+":") {
			out = append(out, c)
		}
	}
	return out
}

// put stores a lease as the store would.
func (m *fakeManager) put(l warmpool.Lease) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.leases[l.ID] = l
}

// addLease stores an active lease of owner for key's owner, reaching agentURL.
func (m *fakeManager) addLease(id, key, agentURL string, gen int64) warmpool.Lease {
	now := time.Now()
	l := warmpool.Lease{
		ID: id, Pool: "default", TaskID: "task-" + id, Owner: OwnerOf(key), State: warmpool.LeaseActive,
		Generation: gen, AgentURL: agentURL, AgentToken: agentToken, Duration: 10 * time.Minute,
		CreatedAt: now, ExpiresAt: now.Add(10 * time.Minute),
	}
	m.put(l)
	return l
}

func (m *fakeManager) Acquire(ctx context.Context, req warmpool.AcquireRequest) (warmpool.Lease, bool, error) {
	m.record("Acquire", req.Pool)
	if m.AcquireFn != nil {
		return m.AcquireFn(ctx, req)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if req.IdempotencyKey != "" {
		for _, l := range m.leases {
			if l.Owner == req.Owner && l.IdempotencyKey == req.IdempotencyKey {
				return l, true, nil
			}
		}
	}
	m.next++
	d := time.Duration(req.LeaseSeconds) * time.Second
	if d == 0 {
		d = 10 * time.Minute
	}
	now := time.Now()
	l := warmpool.Lease{
		ID: fmt.Sprintf("sbx-%d", m.next), Pool: req.Pool, TaskID: fmt.Sprintf("task-%d", m.next),
		Owner: req.Owner, State: warmpool.LeaseActive, Generation: m.Generation,
		AgentURL: m.AgentURL, AgentToken: agentToken, Labels: req.Labels, Env: req.Env,
		IdempotencyKey: req.IdempotencyKey, Duration: d, CreatedAt: now, ExpiresAt: now.Add(d),
	}
	m.leases[l.ID] = l
	return l, false, nil
}

func (m *fakeManager) Get(ctx context.Context, id, owner string) (warmpool.Lease, error) {
	m.record("Get", id)
	if m.GetFn != nil {
		return m.GetFn(ctx, id, owner)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.ownLease(id, owner)
}

// ownLease returns owner's lease id; m.mu is held.
func (m *fakeManager) ownLease(id, owner string) (warmpool.Lease, error) {
	l, ok := m.leases[id]
	if !ok || l.Owner != owner {
		return warmpool.Lease{}, warmpool.ErrNotFound
	}
	return l, nil
}

func (m *fakeManager) Heartbeat(ctx context.Context, id, owner string) (warmpool.Lease, error) {
	m.record("Heartbeat", id)
	if m.HeartbeatFn != nil {
		return m.HeartbeatFn(ctx, id, owner)
	}
	// An ended lease answers as the store's RenewLease: the sentinel only.
	return m.change(id, owner, warmpool.Lease{}, func(l *warmpool.Lease) { l.ExpiresAt = time.Now().Add(l.Duration) })
}

// SetExpiry is warmpool.Manager.SetExpiry's (an optional capability).
func (m *fakeManager) SetExpiry(ctx context.Context, id, owner string, at time.Time) (warmpool.Lease, error) {
	m.record("SetExpiry", id)
	if m.SetExpiryFn != nil {
		return m.SetExpiryFn(ctx, id, owner, at)
	}
	return m.change(id, owner, warmpool.Lease{}, func(l *warmpool.Lease) { l.ExpiresAt = at })
}

func (m *fakeManager) Release(ctx context.Context, id, owner string) (warmpool.Lease, error) {
	m.record("Release", id)
	if m.ReleaseFn != nil {
		return m.ReleaseFn(ctx, id, owner)
	}
	m.mu.Lock()
	l := m.leases[id]
	m.mu.Unlock()
	// An ended lease comes back with the sentinel, as the contract says.
	return m.change(id, owner, l, func(l *warmpool.Lease) { l.State, l.EndedAt = warmpool.LeaseReleased, time.Now() })
}

// change applies f to owner's active lease id and stores it; an ended lease
// returns ifEnded with warmpool.ErrLeaseEnded.
func (m *fakeManager) change(id, owner string, ifEnded warmpool.Lease, f func(*warmpool.Lease)) (warmpool.Lease, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	l, err := m.ownLease(id, owner)
	switch {
	case err != nil:
		return l, err
	case l.State != warmpool.LeaseActive:
		return ifEnded, fmt.Errorf("change lease: %w", warmpool.ErrLeaseEnded)
	}
	f(&l)
	m.leases[id] = l
	return l, nil
}

func (m *fakeManager) List(ctx context.Context, f warmpool.LeaseFilter) ([]warmpool.Lease, error) {
	m.record("List", f.Owner)
	if m.ListFn != nil {
		return m.ListFn(ctx, f)
	}
	return m.listLeases(f), nil
}

// listLeases is List's answer without ListFn.
func (m *fakeManager) listLeases(f warmpool.LeaseFilter) []warmpool.Lease {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []warmpool.Lease
	for _, l := range m.leases {
		if l.Owner != f.Owner || (f.Pool != "" && l.Pool != f.Pool) || (f.State != "" && l.State != f.State) {
			continue
		}
		match := true
		for k, v := range f.Labels {
			match = match && l.Labels[k] == v
		}
		if match {
			out = append(out, l)
		}
	}
	sort.Slice(out, func(i, j int) bool { // newest first, as the contract says
		if !out[i].CreatedAt.Equal(out[j].CreatedAt) {
			return out[i].CreatedAt.After(out[j].CreatedAt)
		}
		return out[i].ID > out[j].ID
	})
	if f.Limit > 0 && len(out) > f.Limit {
		out = out[:f.Limit]
	}
	return out
}

func (m *fakeManager) Pools(ctx context.Context) ([]warmpool.PoolStatus, error) {
	m.record("Pools", "")
	if m.PoolsFn != nil {
		return m.PoolsFn(ctx)
	}
	return []warmpool.PoolStatus{{
		PoolConfig: warmpool.PoolConfig{Name: "default", Provider: "process", Image: "host", MinWarm: 2, MaxTotal: 16,
			Memory: 512, DefaultLeaseSeconds: 600, MaxLeaseSeconds: 3600, Env: map[string]string{"SECRET": "x"}},
		Ready: 2, Leased: 1,
	}}, nil
}

func (m *fakeManager) CheckTask(ctx context.Context, l warmpool.Lease) (warmpool.Lease, error) {
	m.record("CheckTask", l.ID)
	if m.CheckTaskFn != nil {
		return m.CheckTaskFn(ctx, l)
	}
	return l, nil
}

// testGateway is a gateway served on a real 127.0.0.1 listener.
type testGateway struct {
	*Gateway
	URL string
	Reg *prometheus.Registry
}

// startGateway serves a gateway over mgr; mutate adjusts the config. The
// gateway is shut down when the test ends.
func startGateway(t testing.TB, mgr Manager, mutate func(*Config)) *testGateway {
	t.Helper()
	return startGatewayDeps(t, mgr, mutate, Deps{})
}

// startGatewayDeps is startGateway with more dependencies (deps' Manager,
// Metrics and Logger are set by it).
func startGatewayDeps(t testing.TB, mgr Manager, mutate func(*Config), deps Deps) *testGateway {
	t.Helper()
	cfg := Config{APIKeys: []string{testKey, otherKey}}
	if mutate != nil {
		mutate(&cfg)
	}
	reg := prometheus.NewRegistry()
	deps.Manager, deps.Metrics, deps.Logger = mgr, reg, testLogger()
	g, err := New(cfg, deps)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- g.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
		defer cancel()
		assert.NoError(t, g.Shutdown(ctx))
		assert.NoError(t, <-done)
	})
	return &testGateway{Gateway: g, URL: "http://" + ln.Addr().String(), Reg: reg}
}

func testLogger() *slog.Logger {
	if os.Getenv("QUARRY_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// testAgent is a real exec agent served in-process on 127.0.0.1.
type testAgent struct {
	URL     string
	Workdir string
	Srv     *execagent.Server
}

// startAgent runs a real exec agent; it is closed when the test ends.
// mutate, when given, adjusts its config.
func startAgent(t testing.TB, mutate ...func(*execagent.Config)) *testAgent {
	t.Helper()
	return startAgentWrapped(t, nil, mutate...)
}

// startAgentWrapped runs a real exec agent whose handler is wrapped by wrap
// (nil: served by the agent's own Serve); it is closed when the test ends.
// mutate, when given, adjusts its config.
func startAgentWrapped(t testing.TB, wrap func(http.Handler) http.Handler, mutate ...func(*execagent.Config)) *testAgent {
	t.Helper()
	dir := t.TempDir()
	cfg := execagent.Config{
		Token: agentToken, Workdir: dir, Env: []string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir},
		NoSubreaper: true,
	}
	for _, m := range mutate {
		m(&cfg)
	}
	srv, err := execagent.New(cfg, testLogger())
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	serve := func() error { return srv.Serve(context.Background(), ln) }
	stop := func(context.Context) error { return nil }
	if wrap != nil {
		hs := &http.Server{Handler: wrap(srv.Handler())}
		serve = func() error {
			if err := hs.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		}
		stop = hs.Shutdown
	}
	done := make(chan error, 1)
	go func() { done <- serve() }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
		defer cancel()
		assert.NoError(t, srv.Close(ctx)) // kills what the test left running
		assert.NoError(t, stop(ctx))
		assert.NoError(t, <-done)
	})
	return &testAgent{URL: "http://" + ln.Addr().String(), Workdir: dir, Srv: srv}
}

// httpClient is the tests' client: bounded, keep-alive.
var httpClient = &http.Client{Timeout: testDeadline}

// call sends a request with key (none when empty) and the headers hdr
// (name, value pairs; "Host" sets the request's Host) and returns the
// answer with its body read.
func call(t testing.TB, method, url, key string, body io.Reader, hdr ...string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	require.NoError(t, err)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i] == "Host" {
			req.Host = hdr[i+1]
			continue
		}
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := httpClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, b
}

// openStream sends a request and returns the answer with its body unread
// (closed when the test ends).
func openStream(t testing.TB, method, url string, body io.Reader, hdr ...string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+testKey)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := httpClient.Do(req)
	require.NoError(t, err)
	t.Cleanup(func() { _ = resp.Body.Close() })
	return resp
}

// callJSON sends v as JSON.
func callJSON(t testing.TB, method, url, key string, v any, hdr ...string) (*http.Response, []byte) {
	t.Helper()
	var body io.Reader
	if v != nil {
		b, err := json.Marshal(v)
		require.NoError(t, err)
		body = bytes.NewReader(b)
		hdr = append(hdr, "Content-Type", "application/json")
	}
	return call(t, method, url, key, body, hdr...)
}

// jsonDecode decodes an answer's JSON body into v.
func jsonDecode(resp *http.Response, v any) error {
	return json.NewDecoder(resp.Body).Decode(v)
}

// decodeError decodes the one error shape and checks it is complete.
func decodeError(t testing.TB, b []byte) agentapi.ErrorDetail {
	t.Helper()
	var eb agentapi.ErrorBody
	require.NoError(t, json.Unmarshal(b, &eb), "body %s", b)
	assert.NotEmpty(t, eb.Error.Code, "body %s", b)
	assert.NotEmpty(t, eb.Error.Message, "body %s", b)
	return eb.Error
}

// decode decodes a JSON answer into a new T.
func decode[T any](t testing.TB, b []byte) T {
	t.Helper()
	var v T
	require.NoError(t, json.Unmarshal(b, &v), "body %s", b)
	return v
}

// eventually polls cond until it holds or the test deadline passes.
func eventually(t testing.TB, cond func() bool, msg string) {
	t.Helper()
	deadline := time.Now().Add(testDeadline)
	for !cond() {
		if time.Now().After(deadline) {
			require.FailNow(t, "condition not met within the deadline", msg)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// refusedURL returns a loopback URL whose connections are refused, for as long
// as the test runs: its port is bound by a socket that never listens, so no
// other test's listener can take it over (a closed listener's port can be).
func refusedURL(t testing.TB) string {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	t.Cleanup(func() { _ = unix.Close(fd) })
	require.NoError(t, unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}))
	sa, err := unix.Getsockname(fd)
	require.NoError(t, err)
	return fmt.Sprintf("http://127.0.0.1:%d", sa.(*unix.SockaddrInet4).Port)
}
