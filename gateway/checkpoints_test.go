package gateway

import (
	"context"
	"crypto/rand"
	"runtime/debug"

	"fmt"
	"io"
	"io/fs"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/api"
	"github.com/quarryhq/quarry/checkpoints"
	"github.com/quarryhq/quarry/checkpoints/filestore"
	"github.com/quarryhq/quarry/envs"
	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/warmpool"
)

// ckEnv is a gateway with an embedded checkpoint store and a real agent
// behind the lease sbx-1 (pool default, image "host").
type ckEnv struct {
	gw       *testGateway
	mgr      *fakeManager
	agent    *testAgent
	store    *filestore.Store
	storeDir string
}

func startCkEnv(t *testing.T, ckCfg checkpoints.Config, mutate ...func(*fakeManager)) *ckEnv {
	t.Helper()
	agent := startAgent(t)
	dir := t.TempDir()
	store, err := filestore.Open(filestore.Config{Dir: dir, NoSync: true, Budget: ckCfg.Budget(0)})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, store.Close()) })
	mgr := newFakeManager(agent.URL)
	mgr.addLease("sbx-1", testKey, agent.URL, 1)
	for _, m := range mutate {
		m(mgr)
	}
	gw := startGatewayDeps(t, mgr, nil, Deps{Checkpoints: store, CheckpointConfig: ckCfg})
	return &ckEnv{gw: gw, mgr: mgr, agent: agent, store: store, storeDir: dir}
}

// acquireOn makes the manager's acquires lease agents in turn, as
// prefix1, prefix2, ... (with the request's labels, env and duration), and
// refuse with no_capacity once every agent is leased; reset starts again
// from the first.
func (e *ckEnv) acquireOn(prefix string, agents []*testAgent) (reset func()) {
	var (
		mu   sync.Mutex
		next int
	)
	e.mgr.AcquireFn = func(ctx context.Context, req warmpool.AcquireRequest) (warmpool.Lease, bool, error) {
		mu.Lock()
		defer mu.Unlock()
		if next == len(agents) {
			return warmpool.Lease{}, false, fmt.Errorf("pool %s is full: %w", req.Pool, warmpool.ErrNoCapacity)
		}
		a := agents[next]
		next++
		l := e.mgr.addLease(fmt.Sprintf("%s%d", prefix, next), testKey, a.URL, 1)
		l.Labels, l.Env = req.Labels, req.Env
		if req.LeaseSeconds > 0 {
			l.Duration = time.Duration(req.LeaseSeconds) * time.Second
		}
		e.mgr.put(l)
		return l, false, nil
	}
	return func() {
		mu.Lock()
		defer mu.Unlock()
		next = 0
	}
}

// checkpoint takes a checkpoint of sbx over the API and returns it.
func (e *ckEnv) checkpoint(t *testing.T, sbx string, req api.CreateCheckpointRequest) api.Checkpoint {
	t.Helper()
	resp, body := callJSON(t, http.MethodPost, e.gw.URL+"/v1/sandboxes/"+sbx+"/checkpoints", testKey, req)
	require.Equal(t, http.StatusCreated, resp.StatusCode, "%s", body)
	return decode[api.Checkpoint](t, body)
}

// corrupt flips a byte in the middle of the stored blob of ck.
func (e *ckEnv) corrupt(t *testing.T, ck api.Checkpoint) {
	t.Helper()
	p := filepath.Join(e.storeDir, "blobs", ck.SHA256[:2], ck.SHA256)
	b, err := os.ReadFile(p)
	require.NoError(t, err)
	b[len(b)/2] ^= 0xff
	require.NoError(t, os.WriteFile(p, b, 0o600))
}

// ckTree writes a small tree with modes, a symlink and an empty directory.
func ckTree(t *testing.T, dir string) {
	t.Helper()
	for name, mode := range map[string]fs.FileMode{"a.txt": 0o644, "run.sh": 0o755, "sub/deep/b.txt": 0o600} {
		p := filepath.Join(dir, name)
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte("content of "+name), mode))
		require.NoError(t, os.Chmod(p, mode))
	}
	require.NoError(t, os.Symlink("sub/deep/b.txt", filepath.Join(dir, "link")))
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "empty"), 0o700))
}

// snapshot returns every entry below dir: its mode, and its content or
// link target.
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	require.NoError(t, filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		v := fi.Mode().String()
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			l, err := os.Readlink(p)
			if err != nil {
				return err
			}
			v += " -> " + l
		case fi.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			v += " " + string(b)
		}
		out[rel] = v
		return nil
	}))
	return out
}

// mutateTree changes the tree ckTree wrote, and adds to it.
func mutateTree(t *testing.T, dir string) {
	t.Helper()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "a.txt"), []byte("changed"), 0o644))
	require.NoError(t, os.Chmod(filepath.Join(dir, "run.sh"), 0o600))
	require.NoError(t, os.Remove(filepath.Join(dir, "link")))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "new.txt"), []byte("created since"), 0o644))
	require.NoError(t, os.RemoveAll(filepath.Join(dir, "empty")))
}

func TestCheckpoints_CreateListGetDelete(t *testing.T) {
	e := startCkEnv(t, checkpoints.Config{})
	ckTree(t, e.agent.Workdir)

	ck := e.checkpoint(t, "sbx-1", api.CreateCheckpointRequest{Labels: map[string]string{"step": "1"}, Exclude: []string{"*.sh"}})
	assert.True(t, checkpoints.ValidID(ck.ID), ck.ID)
	assert.Equal(t, []string{e.agent.Workdir}, ck.Paths, "no paths: the work dir, absolute")
	assert.Equal(t, []string{"*.sh"}, ck.Exclude)
	assert.Equal(t, "default", ck.Pool)
	assert.Equal(t, "host", ck.Image)
	assert.Equal(t, "sbx-1", ck.Sandbox)
	assert.Equal(t, agentapi.FormatTar, ck.Format, "the default level, none: a plain tar")
	assert.Equal(t, 7, ck.Files, "the root, a.txt, sub, sub/deep, b.txt, link, empty: run.sh excluded")
	assert.Positive(t, ck.SizeBytes)
	assert.Len(t, ck.SHA256, 64)
	assert.True(t, ck.ExpiresAt.Sub(ck.CreatedAt) == checkpoints.DefaultRetention, "retention")

	other := e.checkpoint(t, "sbx-1", api.CreateCheckpointRequest{Paths: []string{"sub"}, Labels: map[string]string{"step": "2"}})
	assert.Equal(t, []string{filepath.Join(e.agent.Workdir, "sub")}, other.Paths, "a relative path resolves against the work dir")

	list := func(key, query string) []string {
		resp, body := call(t, http.MethodGet, e.gw.URL+"/v1/checkpoints"+query, key, nil)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
		var ids []string
		for _, c := range decode[api.CheckpointList](t, body).Checkpoints {
			ids = append(ids, c.ID)
		}
		return ids
	}
	assert.Equal(t, []string{other.ID, ck.ID}, list(testKey, ""), "newest first")
	assert.Equal(t, []string{ck.ID}, list(testKey, "?label=step=1"))
	assert.Empty(t, list(testKey, "?label=step=3"))
	assert.Equal(t, []string{other.ID}, list(testKey, "?limit=1"))
	assert.Empty(t, list(otherKey, ""), "another key's checkpoints are not listed")

	resp, body := call(t, http.MethodGet, e.gw.URL+"/v1/checkpoints/"+ck.ID, testKey, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	assert.Equal(t, ck, decode[api.Checkpoint](t, body))

	for _, m := range []string{http.MethodGet, http.MethodDelete} {
		resp, body = call(t, m, e.gw.URL+"/v1/checkpoints/"+ck.ID, otherKey, nil)
		assert.Equal(t, http.StatusNotFound, resp.StatusCode, "%s another's: %s", m, body)
		assert.Equal(t, agentapi.CodeNotFound, decodeError(t, body).Code)
	}
	resp, body = call(t, http.MethodGet, e.gw.URL+"/v1/checkpoints/"+checkpoints.NewID(), testKey, nil)
	assert.Equal(t, http.StatusNotFound, resp.StatusCode, "unknown: %s", body)
	resp, body = call(t, http.MethodGet, e.gw.URL+"/v1/checkpoints/ckp-short", testKey, nil)
	assert.Equal(t, http.StatusNotFound, resp.StatusCode, "malformed: %s", body)

	for range 2 { // deleting twice is fine
		resp, body = call(t, http.MethodDelete, e.gw.URL+"/v1/checkpoints/"+ck.ID, testKey, nil)
		assert.Equal(t, http.StatusNoContent, resp.StatusCode, "%s", body)
	}
	resp, _ = call(t, http.MethodGet, e.gw.URL+"/v1/checkpoints/"+ck.ID, testKey, nil)
	assert.Equal(t, http.StatusNotFound, resp.StatusCode)
	assert.Equal(t, []string{other.ID}, list(testKey, ""))
}

func TestCheckpoints_CreateRefusals(t *testing.T) {
	e := startCkEnv(t, checkpoints.Config{MaxBytes: 4 << 10})
	big := make([]byte, 64<<10)
	_, _ = rand.Read(big) // incompressible
	require.NoError(t, os.WriteFile(filepath.Join(e.agent.Workdir, "big.bin"), big, 0o644))

	for _, tc := range []struct {
		name   string
		sbx    string
		body   string
		status int
		code   string
	}{
		{name: "over the size limit", sbx: "sbx-1", body: `{}`, status: http.StatusRequestEntityTooLarge, code: agentapi.CodeTooLarge},
		{name: "missing path", sbx: "sbx-1", body: `{"paths": ["nope"]}`, status: http.StatusNotFound, code: agentapi.CodeNotFound},
		{name: "unknown field", sbx: "sbx-1", body: `{"path": "x"}`, status: http.StatusBadRequest, code: agentapi.CodeBadRequest},
		{name: "label with =", sbx: "sbx-1", body: `{"labels": {"a=b": "c"}}`, status: http.StatusBadRequest, code: agentapi.CodeBadRequest},
		{name: "unknown sandbox", sbx: "sbx-none", body: `{}`, status: http.StatusNotFound, code: agentapi.CodeNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := call(t, http.MethodPost, e.gw.URL+"/v1/sandboxes/"+tc.sbx+"/checkpoints", testKey, strings.NewReader(tc.body))
			require.Equal(t, tc.status, resp.StatusCode, "%s", body)
			assert.Equal(t, tc.code, decodeError(t, body).Code)
		})
	}
	cks, err := e.store.List(context.Background(), checkpoints.Filter{Owner: OwnerOf(testKey)})
	require.NoError(t, err)
	assert.Empty(t, cks, "nothing kept")
	assert.Equal(t, 1.0, gatherCounter(t, e.gw.Reg, "quarry_gateway_checkpoint_failures_total", "op", "create"), "the 413 counted")
}

// A take past the key's checkpoint budget is a 429 naming the limit, the
// usage and the variable, and keeps nothing; a fork's take too; a Delete
// makes room, and another key has a budget of its own.
func TestCheckpoints_OverBudgetRefusedKeepsNothing(t *testing.T) {
	e := startCkEnv(t, checkpoints.Config{BudgetPerKey: 100 << 10})
	e.mgr.addLease("sbx-theirs", otherKey, e.agent.URL, 1)
	big := make([]byte, 64<<10)
	_, _ = rand.Read(big) // incompressible
	require.NoError(t, os.WriteFile(filepath.Join(e.agent.Workdir, "big.bin"), big, 0o644))
	first := e.checkpoint(t, "sbx-1", api.CreateCheckpointRequest{})
	_, _ = rand.Read(big)
	require.NoError(t, os.WriteFile(filepath.Join(e.agent.Workdir, "big2.bin"), big, 0o644)) // the next archive: 128 KiB
	owner := OwnerOf(testKey)
	usage := func() checkpoints.Usage {
		u, err := e.store.Usage(context.Background(), owner)
		require.NoError(t, err)
		return u
	}
	require.Equal(t, first.SizeBytes, usage().Owner)

	for _, route := range []struct{ path, body string }{
		{"/v1/sandboxes/sbx-1/checkpoints", `{}`},
		{"/v1/sandboxes/sbx-1/fork", `{"count": 1}`},
	} {
		resp, body := call(t, http.MethodPost, e.gw.URL+route.path, testKey, strings.NewReader(route.body))
		require.Equal(t, http.StatusTooManyRequests, resp.StatusCode, "%s: %s", route.path, body)
		er := decodeError(t, body)
		assert.Equal(t, api.CodeQuotaExceeded, er.Code, route.path)
		assert.Contains(t, er.Message, "this API key's checkpoints take", route.path)
		assert.Contains(t, er.Message, "of the 100.0 KiB allowed (QUARRY_CHECKPOINT_BUDGET_PER_KEY=102400)", route.path)
		assert.Empty(t, resp.Header.Get("Retry-After"), "%s: retrying does not help", route.path)
		assert.True(t, loadDoc(t).opFor(t, http.MethodPost, route.path).declares(resp.StatusCode), "openapi.json declares the 429 of %s", route.path)
	}
	cks, err := e.store.List(context.Background(), checkpoints.Filter{Owner: owner})
	require.NoError(t, err)
	assert.Equal(t, []string{first.ID}, ckIDs(cks), "the refused takes kept nothing")
	assert.Equal(t, first.SizeBytes, usage().Owner, "and counted nothing")
	blobs, err := filepath.Glob(filepath.Join(e.storeDir, "blobs", "*", "*"))
	require.NoError(t, err)
	assert.Len(t, blobs, 1, "one archive on disk")
	tmp, err := os.ReadDir(filepath.Join(e.storeDir, "tmp"))
	require.NoError(t, err)
	assert.Empty(t, tmp, "no temp file left")
	assert.Equal(t, 2.0, gatherCounter(t, e.gw.Reg, "quarry_gateway_checkpoint_budget_refusals_total", "limit", "QUARRY_CHECKPOINT_BUDGET_PER_KEY"))
	assert.Empty(t, e.mgr.Calls("Acquire"), "the refused fork made no sandbox")

	require.NoError(t, os.Remove(filepath.Join(e.agent.Workdir, "big2.bin")))
	resp, body := call(t, http.MethodPost, e.gw.URL+"/v1/sandboxes/sbx-theirs/checkpoints", otherKey, strings.NewReader(`{}`))
	require.Equal(t, http.StatusCreated, resp.StatusCode, "another key has a budget of its own: %s", body)

	resp, _ = call(t, http.MethodDelete, e.gw.URL+"/v1/checkpoints/"+first.ID, testKey, nil)
	require.Equal(t, http.StatusNoContent, resp.StatusCode)
	assert.Zero(t, usage().Owner, "the Delete freed it")
	e.checkpoint(t, "sbx-1", api.CreateCheckpointRequest{})
}

func ckIDs(cks []checkpoints.Checkpoint) []string {
	out := []string{}
	for _, c := range cks {
		out = append(out, c.ID)
	}
	return out
}

func TestCheckpoints_RestoreInPlace(t *testing.T) {
	e := startCkEnv(t, checkpoints.Config{})
	ckTree(t, e.agent.Workdir)
	want := snapshot(t, e.agent.Workdir)
	ck := e.checkpoint(t, "sbx-1", api.CreateCheckpointRequest{})
	mutateTree(t, e.agent.Workdir)
	require.NotEqual(t, want, snapshot(t, e.agent.Workdir))

	resp, body := callJSON(t, http.MethodPost, e.gw.URL+"/v1/sandboxes/sbx-1/restore", testKey, api.RestoreRequest{Checkpoint: ck.ID})
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	res := decode[api.RestoreResult](t, body)
	assert.Equal(t, api.RestoreResult{SandboxID: "sbx-1", Checkpoint: ck.ID, Files: ck.Files, Bytes: res.Bytes, DurationMS: res.DurationMS}, res)
	assert.Equal(t, want, snapshot(t, e.agent.Workdir), "files created since are gone; modes and the symlink are back")
	assert.Equal(t, 1.0, gatherCounter(t, e.gw.Reg, "quarry_gateway_checkpoint_operations_total", "op", "restore"))
}

func TestCheckpoints_RestoreRefusals(t *testing.T) {
	e := startCkEnv(t, checkpoints.Config{}, func(m *fakeManager) {
		m.PoolsFn = func(context.Context) ([]warmpool.PoolStatus, error) {
			return []warmpool.PoolStatus{
				{PoolConfig: warmpool.PoolConfig{Name: "default", Image: "host"}},
				{PoolConfig: warmpool.PoolConfig{Name: "py", Image: "python:3.12"}},
			}, nil
		}
	})
	ckTree(t, e.agent.Workdir)
	ck := e.checkpoint(t, "sbx-1", api.CreateCheckpointRequest{})
	py := e.mgr.addLease("sbx-py", testKey, e.agent.URL, 1)
	py.Pool = "py"
	e.mgr.put(py)
	e.mgr.addLease("sbx-theirs", otherKey, e.agent.URL, 1)

	for _, tc := range []struct {
		name, sbx, key, body string
		status               int
		contains             []string
	}{
		{name: "unknown checkpoint", sbx: "sbx-1", key: testKey, body: `{"checkpoint": "` + checkpoints.NewID() + `"}`, status: http.StatusNotFound},
		{name: "another key's checkpoint", sbx: "sbx-theirs", key: otherKey, body: `{"checkpoint": "` + ck.ID + `"}`, status: http.StatusNotFound},
		{name: "image differs", sbx: "sbx-py", key: testKey, body: `{"checkpoint": "` + ck.ID + `"}`, status: http.StatusBadRequest,
			contains: []string{`"host"`, `"python:3.12"`}},
		{name: "no checkpoint", sbx: "sbx-1", key: testKey, body: `{}`, status: http.StatusBadRequest, contains: []string{"checkpoint"}},
		{name: "unknown sandbox", sbx: "sbx-none", key: testKey, body: `{"checkpoint": "` + ck.ID + `"}`, status: http.StatusNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := call(t, http.MethodPost, e.gw.URL+"/v1/sandboxes/"+tc.sbx+"/restore", tc.key, strings.NewReader(tc.body))
			require.Equal(t, tc.status, resp.StatusCode, "%s", body)
			msg := decodeError(t, body).Message
			for _, s := range tc.contains {
				assert.Contains(t, msg, s)
			}
		})
	}
}

// A corrupt blob is refused and the sandbox is left as it was: the store's
// reader fails before the end of the body, so the agent commits nothing.
func TestCheckpoints_CorruptBlobLeavesTheSandboxUntouched(t *testing.T) {
	e := startCkEnv(t, checkpoints.Config{})
	ckTree(t, e.agent.Workdir)
	big := make([]byte, 256<<10)
	_, _ = rand.Read(big)
	require.NoError(t, os.WriteFile(filepath.Join(e.agent.Workdir, "big.bin"), big, 0o644))
	ck := e.checkpoint(t, "sbx-1", api.CreateCheckpointRequest{})
	mutateTree(t, e.agent.Workdir)
	before := snapshot(t, e.agent.Workdir)
	e.corrupt(t, ck)

	resp, body := callJSON(t, http.MethodPost, e.gw.URL+"/v1/sandboxes/sbx-1/restore", testKey, api.RestoreRequest{Checkpoint: ck.ID})
	assert.Equal(t, http.StatusInternalServerError, resp.StatusCode, "%s", body)
	assert.Equal(t, "checkpoint_corrupt", decodeError(t, body).Code)
	assert.True(t, maps.Equal(before, snapshot(t, e.agent.Workdir)), "nothing restored")
	entries, err := os.ReadDir(e.agent.Workdir)
	require.NoError(t, err)
	for _, en := range entries {
		assert.False(t, strings.HasPrefix(en.Name(), ".quarry-restore"), "staging left: %s", en.Name())
	}

	// from_checkpoint with the same blob: the sandbox is released, not handed out.
	resp, body = callJSON(t, http.MethodPost, e.gw.URL+"/v1/sandboxes", testKey, api.CreateSandboxRequest{FromCheckpoint: ck.ID})
	assert.Equal(t, http.StatusInternalServerError, resp.StatusCode, "%s", body)
	require.Len(t, e.mgr.Calls("Acquire"), 1)
	assert.Len(t, e.mgr.Calls("Release"), 1, "the claimed sandbox is released")
}

func TestCheckpoints_ConcurrentRestoreIs409(t *testing.T) {
	agent := startAgentWrapped(t, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPut && r.URL.Path == agentapi.RouteCheckpoint {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusConflict)
				_, _ = fmt.Fprintf(w, `{"error": {"code": %q, "message": "another restore is running in this sandbox"}}`, agentapi.CodeBusy)
				return
			}
			h.ServeHTTP(w, r)
		})
	})
	store, err := filestore.Open(filestore.Config{Dir: t.TempDir(), NoSync: true})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, store.Close()) })
	mgr := newFakeManager(agent.URL)
	mgr.addLease("sbx-1", testKey, agent.URL, 1)
	gw := startGatewayDeps(t, mgr, nil, Deps{Checkpoints: store})
	e := &ckEnv{gw: gw, mgr: mgr, agent: agent, store: store}
	ck := e.checkpoint(t, "sbx-1", api.CreateCheckpointRequest{})

	resp, body := callJSON(t, http.MethodPost, gw.URL+"/v1/sandboxes/sbx-1/restore", testKey, api.RestoreRequest{Checkpoint: ck.ID})
	assert.Equal(t, http.StatusConflict, resp.StatusCode, "%s", body)
	assert.Equal(t, agentapi.CodeBusy, decodeError(t, body).Code)
}

func TestCheckpoints_FromCheckpoint(t *testing.T) {
	e := startCkEnv(t, checkpoints.Config{})
	ckTree(t, e.agent.Workdir)
	want := snapshot(t, e.agent.Workdir)
	ck := e.checkpoint(t, "sbx-1", api.CreateCheckpointRequest{})
	mutateTree(t, e.agent.Workdir) // the fake manager hands out the same agent

	resp, body := callJSON(t, http.MethodPost, e.gw.URL+"/v1/sandboxes", testKey, api.CreateSandboxRequest{FromCheckpoint: ck.ID, LeaseSeconds: 60})
	require.Equal(t, http.StatusCreated, resp.StatusCode, "%s", body)
	sbx := decode[api.Sandbox](t, body)
	assert.Equal(t, "default", sbx.Pool, "the checkpoint's pool")
	assert.Equal(t, want, snapshot(t, e.agent.Workdir), "restored before it was handed out")
	assert.Empty(t, e.mgr.Calls("Release"))

	for _, tc := range []struct {
		name, key, body string
		status          int
	}{
		{name: "unknown", key: testKey, body: `{"from_checkpoint": "` + checkpoints.NewID() + `"}`, status: http.StatusNotFound},
		{name: "another key's", key: otherKey, body: `{"from_checkpoint": "` + ck.ID + `"}`, status: http.StatusNotFound},
		{name: "unknown pool", key: testKey, body: `{"from_checkpoint": "` + ck.ID + `", "pool": "nope"}`, status: http.StatusBadRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := call(t, http.MethodPost, e.gw.URL+"/v1/sandboxes", tc.key, strings.NewReader(tc.body))
			assert.Equal(t, tc.status, resp.StatusCode, "%s", body)
		})
	}
	assert.Len(t, e.mgr.Calls("Acquire"), 1, "refused before a sandbox was claimed")
}

// Forks: each its own sandbox with the checkpoint restored; the forks past
// the pool's room are 503 no_capacity, and the others succeed.
func TestCheckpoints_Fork(t *testing.T) {
	agents := []*testAgent{startAgent(t), startAgent(t), startAgent(t)}
	e := startCkEnv(t, checkpoints.Config{})
	ckTree(t, e.agent.Workdir)
	want := snapshot(t, e.agent.Workdir)
	reset := e.acquireOn("sbx-fork-", agents)
	src, _ := e.mgr.Get(context.Background(), "sbx-1", OwnerOf(testKey))
	src.Labels, src.Env = map[string]string{"run": "r1"}, map[string]string{"A": "1"}
	e.mgr.put(src)

	resp, body := callJSON(t, http.MethodPost, e.gw.URL+"/v1/sandboxes/sbx-1/fork", testKey, api.ForkRequest{Count: 4, LeaseSeconds: 60})
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	res := decode[api.ForkResult](t, body)
	require.Len(t, res.Forks, 4)
	ids := map[string]bool{}
	failed := 0
	for _, f := range res.Forks {
		if f.Error != nil {
			failed++
			assert.Nil(t, f.Sandbox)
			assert.Equal(t, api.ForkError{Status: http.StatusServiceUnavailable, Code: api.CodeNoCapacity, Message: f.Error.Message}, *f.Error)
			continue
		}
		require.NotNil(t, f.Sandbox)
		ids[f.Sandbox.ID] = true
		assert.Equal(t, map[string]string{"run": "r1"}, f.Sandbox.Labels, "the source's labels")
	}
	assert.Equal(t, 1, failed, "one fork past the pool's room")
	assert.Len(t, ids, 3, "each fork its own sandbox")
	for _, a := range agents {
		assert.Equal(t, want, snapshot(t, a.Workdir), "every fork has the source's files")
	}
	for _, l := range e.mgr.leases {
		if strings.HasPrefix(l.ID, "sbx-fork-") {
			assert.Equal(t, map[string]string{"A": "1"}, l.Env, "the source's env")
		}
	}
	assert.Equal(t, 3.0, gatherCounter(t, e.gw.Reg, "quarry_gateway_forks_total", "outcome", "ok"))
	assert.Equal(t, 1.0, gatherCounter(t, e.gw.Reg, "quarry_gateway_forks_total", "outcome", api.CodeNoCapacity))
	_, err := e.store.Get(context.Background(), res.Checkpoint.ID, OwnerOf(testKey))
	assert.ErrorIs(t, err, checkpoints.ErrNotFound, "the fork's checkpoint is deleted unless kept")

	reset()
	resp, body = callJSON(t, http.MethodPost, e.gw.URL+"/v1/sandboxes/sbx-1/fork", testKey, api.ForkRequest{Count: 1, KeepCheckpoint: true})
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	res = decode[api.ForkResult](t, body)
	_, err = e.store.Get(context.Background(), res.Checkpoint.ID, OwnerOf(testKey))
	assert.NoError(t, err, "kept")

	for _, n := range []int{0, -1, 101} {
		resp, body = callJSON(t, http.MethodPost, e.gw.URL+"/v1/sandboxes/sbx-1/fork", testKey, api.ForkRequest{Count: n})
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "count %d: %s", n, body)
		assert.Contains(t, decodeError(t, body).Message, "count")
	}
}

func TestCheckpoints_Off(t *testing.T) {
	mgr := newFakeManager("")
	mgr.addLease("sbx-1", testKey, refusedURL(t), 1)
	gw := startGateway(t, mgr, nil)
	for _, tc := range []struct{ method, path, body string }{
		{http.MethodGet, "/v1/checkpoints", ""},
		{http.MethodGet, "/v1/checkpoints/" + checkpoints.NewID(), ""},
		{http.MethodDelete, "/v1/checkpoints/" + checkpoints.NewID(), ""},
		{http.MethodPost, "/v1/sandboxes/sbx-1/checkpoints", `{}`},
		{http.MethodPost, "/v1/sandboxes/sbx-1/restore", `{"checkpoint": "` + checkpoints.NewID() + `"}`},
		{http.MethodPost, "/v1/sandboxes/sbx-1/fork", `{"count": 1}`},
		{http.MethodPost, "/v1/sandboxes", `{"from_checkpoint": "` + checkpoints.NewID() + `"}`},
	} {
		resp, body := call(t, tc.method, gw.URL+tc.path, testKey, strings.NewReader(tc.body))
		assert.Equal(t, http.StatusNotFound, resp.StatusCode, "%s %s: %s", tc.method, tc.path, body)
		assert.Contains(t, decodeError(t, body).Message, "checkpoints are off", "%s %s", tc.method, tc.path)
	}
	assert.Empty(t, mgr.Calls("Acquire"))
}

func TestResetCheckpoint_TakesTheCheckpointOutOfTheOptions(t *testing.T) {
	for _, tc := range []struct {
		name, in, out, id string
		bad               bool
	}{
		{name: "none", in: ``, out: ``},
		{name: "no checkpoint", in: `{"level": 2}`, out: `{"level": 2}`},
		{name: "not an object", in: `[1]`, out: `[1]`},
		{name: "only the checkpoint", in: `{"checkpoint": "ckp-x"}`, out: ``, id: "ckp-x"},
		{name: "with more", in: `{"checkpoint": "ckp-x", "level": 2}`, out: `{"level":2}`, id: "ckp-x"},
		{name: "not a string", in: `{"checkpoint": 3}`, bad: true},
		{name: "empty", in: `{"checkpoint": ""}`, bad: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, id, err := resetCheckpoint([]byte(tc.in))
			if tc.bad {
				assert.Error(t, err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.out, string(out))
			assert.Equal(t, tc.id, id)
		})
	}
}

// gatherCounter returns the value of counter name whose label is value
// (0 when there is none).
func gatherCounter(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// The env API: POST /v1/envs from_checkpoint restores before the program
// starts; reset with options.checkpoint restores first and passes the
// other options on.
func TestCheckpoints_EnvAPI(t *testing.T) {
	// "files" answers a reset with the work dir's names and the options it got.
	reg, err := envs.NewRegistry([]envs.Spec{{ID: "files", Pool: "default", Command: []string{"bash", "-c",
		`while read -r l; do printf '{"observation": "%s", "info": {"request": %s}}\n' "$(ls | tr '\n' ' ')" "$l"; done`}}})
	require.NoError(t, err)
	agent := startAgent(t)
	store, err := filestore.Open(filestore.Config{Dir: t.TempDir(), NoSync: true})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, store.Close()) })
	mgr := newFakeManager(agent.URL)
	mgr.addLease("sbx-1", testKey, agent.URL, 1)
	gw := startGatewayDeps(t, mgr, nil, Deps{Envs: reg, Checkpoints: store})
	e := &ckEnv{gw: gw, mgr: mgr, agent: agent, store: store}
	require.NoError(t, os.WriteFile(filepath.Join(agent.Workdir, "task.txt"), []byte("task"), 0o644))
	ck := e.checkpoint(t, "sbx-1", api.CreateCheckpointRequest{})
	require.NoError(t, os.Remove(filepath.Join(agent.Workdir, "task.txt")))
	require.NoError(t, os.WriteFile(filepath.Join(agent.Workdir, "later.txt"), []byte("x"), 0o644))

	resp, body := callJSON(t, http.MethodPost, gw.URL+"/v1/envs", testKey, map[string]any{"env_id": "files", "from_checkpoint": ck.ID})
	require.Equal(t, http.StatusCreated, resp.StatusCode, "%s", body)
	id := decode[madeEnv](t, body).SandboxID
	_, err = os.Stat(filepath.Join(agent.Workdir, "task.txt"))
	assert.NoError(t, err, "restored before the env program started")

	require.NoError(t, os.WriteFile(filepath.Join(agent.Workdir, "step.txt"), []byte("x"), 0o644))
	resp, body = callJSON(t, http.MethodPost, gw.URL+"/v1/sandboxes/"+id+"/env/reset", testKey,
		map[string]any{"options": map[string]any{"checkpoint": ck.ID, "level": 2}})
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	res := decode[envs.ResetResult](t, body)
	assert.JSONEq(t, `"task.txt "`, string(res.Observation), "the program saw the restored work dir")
	assert.JSONEq(t, `{"request": {"op": "reset", "options": {"level": 2}}}`, string(res.Info), "the checkpoint is taken out of the options")

	resp, body = callJSON(t, http.MethodPost, gw.URL+"/v1/sandboxes/"+id+"/env/reset", testKey,
		map[string]any{"options": map[string]any{"checkpoint": checkpoints.NewID()}})
	assert.Equal(t, http.StatusNotFound, resp.StatusCode, "unknown checkpoint: %s", body)
}

// A checkpoint streams: 64 MiB of incompressible files go into the store
// and back while the process's live heap (gateway and in-process agent
// together) stays far below the archive's size. The collector runs at
// GOGC=10 meanwhile, so that the heap it samples is what is live and not
// the garbage of the streams' buffers: at the default 100, a collector
// starved of CPU (make flake-hunt, under stress-ng) let it reach 35 MiB
// once in 20 runs, with nothing held whole.
func TestCheckpoints_StreamNotHeldInMemory(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(10))
	e := startCkEnv(t, checkpoints.Config{})
	const size = 64 << 20
	f, err := os.Create(filepath.Join(e.agent.Workdir, "big.bin"))
	require.NoError(t, err)
	_, err = io.CopyN(f, rand.Reader, size)
	require.NoError(t, err)
	require.NoError(t, f.Close())

	var peak atomic.Uint64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		var ms runtime.MemStats
		for {
			runtime.ReadMemStats(&ms)
			if ms.HeapAlloc > peak.Load() {
				peak.Store(ms.HeapAlloc)
			}
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
		}
	}()
	runtime.GC()
	ck := e.checkpoint(t, "sbx-1", api.CreateCheckpointRequest{})
	require.Greater(t, ck.SizeBytes, int64(size))
	resp, body := callJSON(t, http.MethodPost, e.gw.URL+"/v1/sandboxes/sbx-1/restore", testKey, api.RestoreRequest{Checkpoint: ck.ID})
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	close(stop)
	wg.Wait()
	t.Logf("peak live heap %d MiB for a %d MiB archive", peak.Load()>>20, ck.SizeBytes>>20)
	assert.Less(t, peak.Load(), uint64(size/2), "the archive is not held whole")
}
