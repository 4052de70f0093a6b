package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/api"
	"github.com/quarryhq/quarry/execagent/agentapi"
)

// ckGateway answers the checkpoint routes and records each request's
// method, path, query and body.
type ckGateway struct {
	url string
	mu  sync.Mutex
	got []string
}

func newCkGateway(t *testing.T) *ckGateway {
	t.Helper()
	g := &ckGateway{}
	t0 := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	ck := api.Checkpoint{ID: "ckp-1", Pool: "default", Sandbox: "sbx-1", Paths: []string{"/w"}, Format: "tar+gzip",
		SizeBytes: 2048, Files: 12, CreatedAt: t0, ExpiresAt: t0.Add(time.Hour), Labels: map[string]string{"s": "1"}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/sandboxes/{id}/checkpoints", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusCreated, ck)
	})
	mux.HandleFunc("GET /v1/checkpoints", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, api.CheckpointList{Checkpoints: []api.Checkpoint{ck}})
	})
	mux.HandleFunc("DELETE /v1/checkpoints/{id}", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("id") == "ckp-theirs" {
			writeError(w, http.StatusNotFound, agentapi.CodeNotFound, "checkpoint not found")
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /v1/sandboxes/{id}/restore", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, api.RestoreResult{SandboxID: r.PathValue("id"), Checkpoint: "ckp-1", Files: 12, Bytes: 900, DurationMS: 31})
	})
	mux.HandleFunc("POST /v1/sandboxes/{id}/fork", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, api.ForkResult{Checkpoint: ck, Forks: []api.Fork{
			{Sandbox: &api.Sandbox{ID: "sbx-2"}}, {Sandbox: &api.Sandbox{ID: "sbx-3"}},
			{Error: &api.ForkError{Status: 503, Code: api.CodeNoCapacity, Message: "no sandbox available"}},
		}})
	})
	mux.HandleFunc("POST /v1/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusCreated, api.Sandbox{ID: "sbx-9"})
	})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		g.mu.Lock()
		g.got = append(g.got, r.Method+" "+r.URL.Path+"?"+r.URL.RawQuery+" "+string(b))
		g.mu.Unlock()
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	g.url = srv.URL
	return g
}

func (g *ckGateway) cli(t *testing.T, args ...string) result {
	t.Helper()
	g.mu.Lock()
	g.got = nil
	g.mu.Unlock()
	return runCLI(t, "", append([]string{"--url", g.url, "--api-key", "k"}, args...)...)
}

// request returns the only request sent: method, path, query and body.
func (g *ckGateway) request(t *testing.T) string {
	t.Helper()
	g.mu.Lock()
	defer g.mu.Unlock()
	require.Len(t, g.got, 1)
	return g.got[0]
}

func TestRun_Checkpoint_CreateLsRm(t *testing.T) {
	g := newCkGateway(t)
	res := g.cli(t, "checkpoint", "create", "--path", ".", "--path", "/etc/app", "--exclude", "*.pyc", "--label", "s=1", "sbx-1")
	assert.Equal(t, result{"ckp-1\n", "", 0}, res)
	assert.Equal(t, `POST /v1/sandboxes/sbx-1/checkpoints? {"paths":[".","/etc/app"],"exclude":["*.pyc"],"labels":{"s":"1"}}`, g.request(t))

	res = g.cli(t, "checkpoint", "create", "sbx-1")
	require.Equal(t, 0, res.code, res.stderr)
	assert.Equal(t, `POST /v1/sandboxes/sbx-1/checkpoints? {}`, g.request(t), "no paths: the work dir")

	res = g.cli(t, "checkpoint", "ls", "--label", "s=1", "--limit", "5")
	assert.Equal(t, result{"ID     SANDBOX  POOL     SIZE  FILES  CREATED               EXPIRES               LABELS\n" +
		"ckp-1  sbx-1    default  2048  12     2026-03-04T05:06:07Z  2026-03-04T06:06:07Z  s=1\n", "", 0}, res)
	assert.Equal(t, `GET /v1/checkpoints?label=s%3D1&limit=5 `, g.request(t))

	res = g.cli(t, "checkpoint", "ls", "--json")
	require.Equal(t, 0, res.code, res.stderr)
	var cks []api.Checkpoint
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &cks))
	assert.Equal(t, "ckp-1", cks[0].ID)

	res = g.cli(t, "checkpoint", "rm", "ckp-1", "ckp-theirs")
	assert.Equal(t, 1, res.code)
	assert.Equal(t, "ckp-1\n", res.stdout)
	assert.Contains(t, res.stderr, "delete ckp-theirs: checkpoint not found")

	res = g.cli(t, "checkpoint", "create")
	assert.Equal(t, 1, res.code)
	assert.Contains(t, res.stderr, "missing arguments")
}

func TestRun_SandboxRestoreForkFromCheckpoint(t *testing.T) {
	g := newCkGateway(t)
	res := g.cli(t, "sandbox", "restore", "sbx-1", "ckp-1")
	assert.Equal(t, result{"sbx-1: restored ckp-1 (12 entries, 900 bytes) in 31 ms\n", "", 0}, res)
	assert.Equal(t, `POST /v1/sandboxes/sbx-1/restore? {"checkpoint":"ckp-1"}`, g.request(t))

	res = g.cli(t, "sandbox", "fork", "-n", "3", "--lease-seconds", "60", "sbx-1")
	assert.Equal(t, "sbx-2\nsbx-3\n", res.stdout, "one id per fork that was made")
	assert.Equal(t, "fork 3: no sandbox available (503 no_capacity)\nquarry: fork sbx-1: 1 of 3 forks failed\n", res.stderr)
	assert.Equal(t, 1, res.code)
	assert.Equal(t, `POST /v1/sandboxes/sbx-1/fork? {"count":3,"lease_seconds":60}`, g.request(t))

	res = g.cli(t, "sandbox", "create", "--from-checkpoint", "ckp-1")
	assert.Equal(t, result{"sbx-9\n", "", 0}, res)
	assert.Equal(t, `POST /v1/sandboxes? {"from_checkpoint":"ckp-1"}`, g.request(t), "the checkpoint's pool")
	res = g.cli(t, "sandbox", "create", "--from-checkpoint", "ckp-1", "--pool", "gpu")
	require.Equal(t, 0, res.code, res.stderr)
	assert.Equal(t, `POST /v1/sandboxes? {"pool":"gpu","from_checkpoint":"ckp-1"}`, g.request(t))
}
