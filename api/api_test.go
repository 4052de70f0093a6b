package api_test

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/api"
)

// The JSON below is what the declarations these types replaced produced
// (gateway's sandbox, pool, wireRequest, wireExchange and wireResponse,
// client's Sandbox, CreateSandboxRequest and Pool), captured before they
// were merged; the bodies of the model relay are compact here so that a
// value encodes back to the same bytes (the gateway's verbatim bodies are
// pinned in gateway/wire_test.go). A change to a field name, a tag or a
// type fails these tests.

var (
	t0      = time.Date(2025, 3, 4, 5, 6, 7, 890000000, time.UTC)
	latency = int64(2000)
)

var fullRequest = api.ModelRequest{ID: "r1", SandboxID: "sbx-1", Pool: "default", Labels: map[string]string{"run": "x"},
	Route: "chat/completions", Stream: true, Attempt: 2, ReceivedAt: t0, Deadline: t0.Add(10 * time.Minute)}

var wireTests = []struct {
	name string
	v    any
	json string
	// decodeOnly: a peer sends this JSON (another encoder's), it is not
	// what the value encodes to.
	decodeOnly bool
}{
	{name: "Sandbox", v: api.Sandbox{ID: "sbx-1", Pool: "default", State: api.StateReleased, Reason: "by owner", Generation: 3,
		CreatedAt: t0, ExpiresAt: t0.Add(time.Minute), EndedAt: t0.Add(30 * time.Second), LeaseSeconds: 60,
		Labels: map[string]string{"run": "exp1", "a": "b"}},
		json: `{"id":"sbx-1","pool":"default","state":"released","reason":"by owner","generation":3,"created_at":"2025-03-04T05:06:07.89Z","expires_at":"2025-03-04T05:07:07.89Z","ended_at":"2025-03-04T05:06:37.89Z","lease_seconds":60,"labels":{"a":"b","run":"exp1"}}`},
	{name: "Sandbox/image", v: api.Sandbox{ID: "sbx-2", Pool: "i-abc", Image: "docker.io/library/python:3.11", State: api.StateActive, CreatedAt: t0, ExpiresAt: t0},
		json: `{"id":"sbx-2","pool":"i-abc","image":"docker.io/library/python:3.11","state":"active","generation":0,"created_at":"2025-03-04T05:06:07.89Z","expires_at":"2025-03-04T05:06:07.89Z","lease_seconds":0}`},
	{name: "Sandbox/zero", v: api.Sandbox{},
		json: `{"id":"","pool":"","state":"","generation":0,"created_at":"0001-01-01T00:00:00Z","expires_at":"0001-01-01T00:00:00Z","lease_seconds":0}`},
	{name: "SandboxList", v: api.SandboxList{Sandboxes: []api.Sandbox{{ID: "sbx-1", State: api.StateActive, CreatedAt: t0, ExpiresAt: t0}}},
		json: `{"sandboxes":[{"id":"sbx-1","pool":"","state":"active","generation":0,"created_at":"2025-03-04T05:06:07.89Z","expires_at":"2025-03-04T05:06:07.89Z","lease_seconds":0}]}`},
	{name: "SandboxList/empty", v: api.SandboxList{Sandboxes: []api.Sandbox{}}, json: `{"sandboxes":[]}`},
	{name: "CreateSandboxRequest", v: api.CreateSandboxRequest{Pool: "p", LeaseSeconds: 5, Env: map[string]string{"A": "1"}, Labels: map[string]string{"k": "v"}},
		json: `{"pool":"p","lease_seconds":5,"env":{"A":"1"},"labels":{"k":"v"}}`},
	{name: "CreateSandboxRequest/from checkpoint", v: api.CreateSandboxRequest{Pool: "p", FromCheckpoint: "ckp-a"},
		json: `{"pool":"p","from_checkpoint":"ckp-a"}`},
	{name: "CreateSandboxRequest/zero", v: api.CreateSandboxRequest{}, json: `{}`},
	{name: "CreateSandboxRequest/explicit zeros", v: api.CreateSandboxRequest{},
		json: `{"pool":"","lease_seconds":0,"env":null,"labels":null}`, decodeOnly: true},
	{name: "Pool", v: api.Pool{Name: "default", Provider: "process", Image: "img:1", CPU: 0.5, Memory: 512, MemoryMiB: 512, MinWarm: 2,
		MaxTotal: 10, DefaultLeaseSeconds: 600, MaxLeaseSeconds: 86400, Ready: 1, Launching: 2, Leased: 3, Stopping: 4},
		json: `{"name":"default","provider":"process","image":"img:1","cpu":0.5,"memory":512,"memory_mib":512,"min_warm":2,"max_total":10,"default_lease_seconds":600,"max_lease_seconds":86400,"ready":1,"launching":2,"leased":3,"stopping":4}`},
	{name: "Pool/disk", v: api.Pool{Name: "small", Memory: 64, MemoryMiB: 64, DiskMiB: 2048},
		json: `{"name":"small","provider":"","image":"","cpu":0,"memory":64,"memory_mib":64,"disk_mib":2048,"min_warm":0,"max_total":0,"default_lease_seconds":0,"max_lease_seconds":0,"ready":0,"launching":0,"leased":0,"stopping":0}`},
	{name: "Pool/zero", v: api.Pool{},
		json: `{"name":"","provider":"","image":"","cpu":0,"memory":0,"memory_mib":0,"min_warm":0,"max_total":0,"default_lease_seconds":0,"max_lease_seconds":0,"ready":0,"launching":0,"leased":0,"stopping":0}`},
	{name: "PoolList", v: api.PoolList{Pools: []api.Pool{}}, json: `{"pools":[]}`},
	{name: "PoolList/classes", v: api.PoolList{Pools: []api.Pool{}, Classes: []api.Class{{Name: "swe", Provider: "docker", Images: []string{"*"}, CPU: 1,
		MemoryMiB: 1024, MaxCPU: 2, MaxMemoryMiB: 4096, MaxTotal: 100, MaxPerImage: 8, Tasks: 3}}},
		json: `{"pools":[],"classes":[{"name":"swe","provider":"docker","images":["*"],"cpu":1,"memory_mib":1024,"max_cpu":2,"max_memory_mib":4096,"max_total":100,"max_per_image":8,"tasks":3}]}`},
	{name: "CreateSandboxRequest/image", v: api.CreateSandboxRequest{Image: "python:3.11", Class: "swe", CPU: 2, Memory: 2048, Disk: 512},
		json: `{"image":"python:3.11","class":"swe","cpu":2,"memory":2048,"disk":512}`},
	{name: "CreateSandboxRequest/sizes with units", decodeOnly: true, v: api.CreateSandboxRequest{Image: "x", Memory: 2048, Disk: 1024 * 1024},
		json: `{"image":"x","memory":"2Gi","disk":"1Ti"}`},
	{name: "MiB", v: api.MiB(512), json: `512`},
	{name: "PrefetchRequest", v: api.PrefetchRequest{Images: []string{"a:1", "b:2"}, Class: "swe", Memory: 1024, Warm: 2},
		json: `{"images":["a:1","b:2"],"class":"swe","memory":1024,"warm":2}`},
	{name: "PrefetchResponse", v: api.PrefetchResponse{Images: []api.PrefetchedImage{{Image: "a:1", Ref: "docker.io/library/a:1", Pool: "i-x", State: api.PrefetchQueued},
		{Image: "quay.io/b:2", State: api.PrefetchRefused, Error: &api.ForkError{Status: 403, Code: "image_not_allowed", Message: "no"}}}},
		json: `{"images":[{"image":"a:1","ref":"docker.io/library/a:1","pool":"i-x","state":"queued"},{"image":"quay.io/b:2","state":"refused","error":{"status":403,"code":"image_not_allowed","message":"no"}}]}`},
	{name: "PrefetchedImage/zero", v: api.PrefetchedImage{}, json: `{"image":"","state":""}`},
	{name: "ImageList", v: api.ImageList{Images: []api.Image{{Image: "docker.io/library/python:3.11", Class: "swe", Pool: "i-x", CPU: 1, MemoryMiB: 1024,
		PoolState: "active", State: api.ImagePulling, BytesDone: 10, BytesTotal: 20, Digest: "sha256:a", CreatedAt: t0, LastUsed: t0, Acquires: 3, Warm: 1}}, Next: "i-x"},
		json: `{"images":[{"image":"docker.io/library/python:3.11","class":"swe","pool":"i-x","cpu":1,"memory_mib":1024,"pool_state":"active","state":"pulling","bytes_done":10,"bytes_total":20,"digest":"sha256:a","created_at":"2025-03-04T05:06:07.89Z","last_used":"2025-03-04T05:06:07.89Z","acquires":3,"warm":1}],"next":"i-x"}`},
	{name: "Image/zero", v: api.Image{}, json: `{"image":"","state":""}`},
	{name: "BuildEvent/log", v: api.BuildEvent{Log: "Step 1/2 : FROM x"}, json: `{"log":"Step 1/2 : FROM x"}`},
	{name: "BuildEvent/done", v: api.BuildEvent{Image: "quarry-build/ab/t:1", Digest: "sha256:a", SizeBytes: 5}, json: `{"image":"quarry-build/ab/t:1","digest":"sha256:a","size_bytes":5}`},
	{name: "ClaimedRequest", v: api.ClaimedRequest{ModelRequest: fullRequest, Body: json.RawMessage(`{"messages":[{"role":"user","content":"hi"}]}`)},
		json: `{"id":"r1","sandbox_id":"sbx-1","pool":"default","labels":{"run":"x"},"route":"chat/completions","stream":true,"attempt":2,"received_at":"2025-03-04T05:06:07.89Z","deadline":"2025-03-04T05:16:07.89Z","body":{"messages":[{"role":"user","content":"hi"}]}}`},
	{name: "ClaimedRequest/empty body", v: api.ClaimedRequest{ModelRequest: api.ModelRequest{Labels: map[string]string{}}, Body: json.RawMessage(`""`)},
		json: `{"id":"","sandbox_id":"","pool":"","labels":{},"route":"","stream":false,"attempt":0,"received_at":"0001-01-01T00:00:00Z","deadline":"0001-01-01T00:00:00Z","body":""}`},
	{name: "ClaimedRequests", v: api.ClaimedRequests{Requests: []api.ClaimedRequest{}}, json: `{"requests":[]}`},
	{name: "Exchange", v: api.Exchange{ModelRequest: fullRequest, State: "answered", Reason: "r", Upstream: "http://u",
		ClaimedAt: t0.Add(500 * time.Millisecond), EndedAt: t0.Add(2 * time.Second), LatencyMS: &latency, Truncated: true,
		Request:  json.RawMessage(`{"messages":[{"role":"user","content":"hi"}]}`),
		Response: &api.ExchangeResponse{Status: 200, ContentType: "application/json", AnsweredAt: t0.Add(time.Second), Body: json.RawMessage(`{"ok":true}`)}},
		json: `{"id":"r1","sandbox_id":"sbx-1","pool":"default","labels":{"run":"x"},"route":"chat/completions","stream":true,"attempt":2,"received_at":"2025-03-04T05:06:07.89Z","deadline":"2025-03-04T05:16:07.89Z","state":"answered","reason":"r","upstream":"http://u","claimed_at":"2025-03-04T05:06:08.39Z","ended_at":"2025-03-04T05:06:09.89Z","latency_ms":2000,"truncated":true,"request":{"messages":[{"role":"user","content":"hi"}]},"response":{"status":200,"content_type":"application/json","answered_at":"2025-03-04T05:06:08.89Z","body":{"ok":true}}}`},
	{name: "Exchange/pending", v: api.Exchange{ModelRequest: api.ModelRequest{ID: "r2", Labels: map[string]string{}}, State: "pending", Request: json.RawMessage(`"not json"`)},
		json: `{"id":"r2","sandbox_id":"","pool":"","labels":{},"route":"","stream":false,"attempt":0,"received_at":"0001-01-01T00:00:00Z","deadline":"0001-01-01T00:00:00Z","state":"pending","request":"not json"}`},
	{name: "ExchangeResponse/zero", v: api.ExchangeResponse{}, json: `{"status":0,"content_type":"","answered_at":"0001-01-01T00:00:00Z"}`},
	{name: "Checkpoint", v: api.Checkpoint{ID: "ckp-a", Pool: "default", Image: "img:1", Sandbox: "sbx-1", Paths: []string{"/w", "/etc/x"},
		Exclude: []string{"*.pyc"}, Labels: map[string]string{"step": "3"}, Format: "tar+gzip", SizeBytes: 1234, Files: 12,
		SHA256: "ab12", CreatedAt: t0, ExpiresAt: t0.Add(time.Hour)},
		json: `{"id":"ckp-a","pool":"default","image":"img:1","sandbox":"sbx-1","paths":["/w","/etc/x"],"exclude":["*.pyc"],"labels":{"step":"3"},"format":"tar+gzip","size_bytes":1234,"files":12,"sha256":"ab12","created_at":"2025-03-04T05:06:07.89Z","expires_at":"2025-03-04T06:06:07.89Z"}`},
	{name: "Checkpoint/zero", v: api.Checkpoint{},
		json: `{"id":"","pool":"","image":"","sandbox":"","paths":null,"format":"","size_bytes":0,"files":0,"sha256":"","created_at":"0001-01-01T00:00:00Z","expires_at":"0001-01-01T00:00:00Z"}`},
	{name: "CheckpointList", v: api.CheckpointList{Checkpoints: []api.Checkpoint{}}, json: `{"checkpoints":[]}`},
	{name: "CreateCheckpointRequest", v: api.CreateCheckpointRequest{Paths: []string{"."}, Exclude: []string{".git"}, Labels: map[string]string{"k": "v"}},
		json: `{"paths":["."],"exclude":[".git"],"labels":{"k":"v"}}`},
	{name: "CreateCheckpointRequest/zero", v: api.CreateCheckpointRequest{}, json: `{}`},
	{name: "RestoreRequest", v: api.RestoreRequest{Checkpoint: "ckp-a"}, json: `{"checkpoint":"ckp-a"}`},
	{name: "RestoreResult", v: api.RestoreResult{SandboxID: "sbx-1", Checkpoint: "ckp-a", Files: 3, Bytes: 40, DurationMS: 7},
		json: `{"sandbox_id":"sbx-1","checkpoint":"ckp-a","files":3,"bytes":40,"duration_ms":7}`},
	{name: "ForkRequest", v: api.ForkRequest{Count: 8, LeaseSeconds: 60, Paths: []string{"/w"}, Exclude: []string{"x"}, Labels: map[string]string{"g": "1"}, KeepCheckpoint: true},
		json: `{"count":8,"lease_seconds":60,"paths":["/w"],"exclude":["x"],"labels":{"g":"1"},"keep_checkpoint":true}`},
	{name: "ForkRequest/zero", v: api.ForkRequest{}, json: `{"count":0}`},
	{name: "ForkResult", v: api.ForkResult{Checkpoint: api.Checkpoint{ID: "ckp-a", CreatedAt: t0, ExpiresAt: t0}, Forks: []api.Fork{
		{Sandbox: &api.Sandbox{ID: "sbx-2", State: api.StateActive, CreatedAt: t0, ExpiresAt: t0}},
		{Error: &api.ForkError{Status: 503, Code: "no_capacity", Message: "full"}}}},
		json: `{"checkpoint":{"id":"ckp-a","pool":"","image":"","sandbox":"","paths":null,"format":"","size_bytes":0,"files":0,"sha256":"","created_at":"2025-03-04T05:06:07.89Z","expires_at":"2025-03-04T05:06:07.89Z"},"forks":[{"sandbox":{"id":"sbx-2","pool":"","state":"active","generation":0,"created_at":"2025-03-04T05:06:07.89Z","expires_at":"2025-03-04T05:06:07.89Z","lease_seconds":0}},{"error":{"status":503,"code":"no_capacity","message":"full"}}]}`},
	{name: "Fork/zero", v: api.Fork{}, json: `{}`},
	{name: "ForkError/zero", v: api.ForkError{}, json: `{"status":0,"code":"","message":""}`},
	{name: "Transcript", v: api.Transcript{SandboxID: "sbx-1", Exchanges: []api.Exchange{}, NextAfter: "r1"},
		json: `{"sandbox_id":"sbx-1","exchanges":[],"next_after":"r1"}`},
	{name: "ErrorBody", v: api.ErrorBody{Error: api.ErrorDetail{Code: api.CodeNotFound, Message: "sandbox sbx-1 not found"}},
		json: `{"error":{"code":"not_found","message":"sandbox sbx-1 not found"}}`},
	{name: "ErrorDetail/zero", v: api.ErrorDetail{}, json: `{"code":"","message":""}`},
	{name: "Transcript/last page", v: api.Transcript{SandboxID: "sbx-1", Exchanges: []api.Exchange{}},
		json: `{"sandbox_id":"sbx-1","exchanges":[]}`},
}

func TestWire_JSONIsPinned(t *testing.T) {
	for _, tc := range wireTests {
		t.Run(tc.name, func(t *testing.T) {
			if !tc.decodeOnly {
				b, err := json.Marshal(tc.v)
				require.NoError(t, err)
				assert.JSONEq(t, tc.json, string(b), "fields and values")
				assert.Equal(t, tc.json, string(b), "byte for byte: field order too")
			}
			got := reflect.New(reflect.TypeOf(tc.v))
			require.NoError(t, json.Unmarshal([]byte(tc.json), got.Interface()))
			assert.Equal(t, tc.v, got.Elem().Interface(), "decodes to the value")
		})
	}
}

// TestWire_EveryTypeIsPinned fails when a type is added to the package
// without a case above.
func TestWire_EveryTypeIsPinned(t *testing.T) {
	pinned := map[string]bool{"ModelRequest": true, "Class": true} // inside ClaimedRequest and Exchange; inside PoolList
	for _, tc := range wireTests {
		pinned[reflect.TypeOf(tc.v).Name()] = true
	}
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	declared := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), name, nil, parser.SkipObjectResolution)
		require.NoError(t, err)
		for _, d := range f.Decls {
			if g, ok := d.(*ast.GenDecl); ok && g.Tok == token.TYPE {
				for _, spec := range g.Specs {
					if ts := spec.(*ast.TypeSpec); ts.Name.IsExported() {
						declared++
						assert.True(t, pinned[ts.Name.Name], "%s (%s) has no case in wireTests", ts.Name.Name, name)
					}
				}
			}
		}
	}
	assert.Equal(t, 30, declared, "the package's types")
}
