package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/providers/process"
)

const deadline = 60 * time.Second

func TestConfig_ValidateNamesTheVariable(t *testing.T) {
	valid := func() Config {
		return Config{Addr: "127.0.0.1:8080", DataDir: ".quarry", Provider: "process", Store: "embedded",
			LogLevel: "info", ShutdownTimeout: time.Second, StartTimeout: time.Second}
	}
	tests := []struct {
		name   string
		mutate func(*Config)
		want   string
	}{
		{name: "valid", mutate: func(*Config) {}, want: ""},
		{name: "bad addr", mutate: func(c *Config) { c.Addr = "8080" }, want: "QUARRY_ADDR"},
		{name: "empty data dir", mutate: func(c *Config) { c.DataDir = "" }, want: "QUARRY_DATA_DIR"},
		{name: "unknown store", mutate: func(c *Config) { c.Store = "mysql" }, want: "QUARRY_STORE: unknown store \"mysql\" (known: embedded, dynamodb)"},
		{name: "unknown provider", mutate: func(c *Config) { c.Provider = "vm" }, want: "QUARRY_PROVIDER"},
		{name: "bad log level", mutate: func(c *Config) { c.LogLevel = "loud" }, want: "QUARRY_LOG_LEVEL"},
		{name: "cert without key", mutate: func(c *Config) { c.TLSCertFile = "c.pem" }, want: "QUARRY_TLS_CERT_FILE"},
		{name: "zero shutdown", mutate: func(c *Config) { c.ShutdownTimeout = 0 }, want: "QUARRY_SHUTDOWN_TIMEOUT"},
		{name: "manager config", mutate: func(c *Config) { c.ReapInterval = -time.Second }, want: "QUARRY_REAP_INTERVAL"},
		{name: "dynamodb defaults", mutate: func(c *Config) { c.Store = "dynamodb" }, want: ""},
		{name: "dynamodb named tables", mutate: func(c *Config) { c.Store, c.TasksTable, c.LeasesTable = "dynamodb", "t-tasks", "t-leases" }, want: ""},
		{name: "dynamodb bad table name", mutate: func(c *Config) { c.Store, c.TasksTable = "dynamodb", "a b" }, want: "QUARRY_DYNAMODB_TASKS_TABLE"},
		{name: "dynamodb one table for both", mutate: func(c *Config) { c.Store, c.TasksTable, c.LeasesTable = "dynamodb", "same", "same" }, want: "QUARRY_DYNAMODB_LEASES_TABLE"},
		{name: "dynamodb too many shards", mutate: func(c *Config) { c.Store, c.Shards = "dynamodb", 65 }, want: "QUARRY_DYNAMODB_SHARDS"},
		{name: "dynamodb ended leases gone before their retention", mutate: func(c *Config) { c.Store, c.EndedTTL = "dynamodb", time.Hour }, want: "QUARRY_DYNAMODB_ENDED_TTL"},
		{name: "dynamodb settings unused by the embedded store", mutate: func(c *Config) { c.Shards = 65 }, want: ""},
		{name: "bad replica id", mutate: func(c *Config) { c.ReplicaID = "gw 1" }, want: "QUARRY_REPLICA_ID"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := valid()
			tt.mutate(&c)
			err := c.Validate()
			if tt.want == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
}

func TestLoadOrCreateKey_GeneratesOnceThenReuses(t *testing.T) {
	dir := t.TempDir()
	key, path, err := loadOrCreateKey(dir)
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(dir, "api-key"), path)
	assert.True(t, strings.HasPrefix(key, "qk_"))
	st, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), st.Mode().Perm())

	again, _, err := loadOrCreateKey(dir)
	require.NoError(t, err)
	assert.Equal(t, key, again)
}

// lineWriter passes each write to a channel (run prints one start-up line).
type lineWriter chan string

func (w lineWriter) Write(p []byte) (int, error) {
	w <- string(p)
	return len(p), nil
}

// startRun runs the gateway until the returned stop is called; it returns
// the URL from the start-up line.
func startRun(t *testing.T) (url string, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out := make(lineWriter, 4)
	done := make(chan error, 1)
	go func() { done <- run(ctx, out) }()
	select {
	case line := <-out:
		m := regexp.MustCompile(`serving on (http://\S+) \(API key: (.+)\)`).FindStringSubmatch(line)
		require.Len(t, m, 3, "start-up line %q", line)
		url = m[1]
	case err := <-done:
		cancel()
		require.NoError(t, err)
		require.FailNow(t, "run returned before serving")
	case <-time.After(deadline):
		cancel()
		require.FailNow(t, "no start-up line")
	}
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			assert.NoError(t, err)
		case <-time.After(deadline):
			assert.Fail(t, "run did not return after cancel")
		}
	}
	t.Cleanup(stop)
	return url, stop
}

func do(t *testing.T, method, url, key, body string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Timeout: deadline}).Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, b
}

// TestRun_LeasesSurviveRestart runs the real binary's wiring (embedded
// store, process provider, real agents): a sandbox created before a
// restart is still there and usable after it, with the same generated key.
func TestRun_LeasesSurviveRestart(t *testing.T) {
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", filepath.Join(bin, "execagent"), "./cmd/execagent")
	build.Dir = filepath.Join("..", "..")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	outb, err := build.CombinedOutput()
	require.NoError(t, err, "build execagent: %s", outb)

	data := t.TempDir()
	pools := filepath.Join(data, "pools.yaml")
	require.NoError(t, os.WriteFile(pools, []byte("pools:\n  - name: default\n    min_warm: 1\n    max_total: 3\n"), 0o600))
	t.Setenv("QUARRY_ADDR", "127.0.0.1:0")
	t.Setenv("QUARRY_DATA_DIR", data)
	t.Setenv("QUARRY_POOLS_FILE", pools)
	t.Setenv("QUARRY_AGENT_BINARY", filepath.Join(bin, "execagent"))
	t.Setenv("QUARRY_LOG_LEVEL", "warn")
	t.Setenv("QUARRY_API_KEYS", "")
	t.Cleanup(func() { stopAllTasks(t, filepath.Join(bin, "execagent"), filepath.Join(data, "process")) })

	url, stop := startRun(t)
	keyBytes, err := os.ReadFile(filepath.Join(data, "api-key"))
	require.NoError(t, err)
	key := strings.TrimSpace(string(keyBytes))

	status, body := do(t, http.MethodPost, url+"/v1/sandboxes", key, `{"pool": "default", "lease_seconds": 600}`)
	require.Equal(t, http.StatusCreated, status, "body %s", body)
	var sb struct{ ID string }
	require.NoError(t, json.Unmarshal(body, &sb))

	status, body = do(t, http.MethodPost, url+"/v1/sandboxes/"+sb.ID+"/exec", key, `{"command": "echo hi"}`)
	require.Equal(t, http.StatusOK, status, "body %s", body)
	assert.Contains(t, string(body), `"stdout":"hi\n"`)
	stop()

	url, _ = startRun(t)
	again, err := os.ReadFile(filepath.Join(data, "api-key"))
	require.NoError(t, err)
	assert.Equal(t, keyBytes, again, "the generated key is reused")

	status, body = do(t, http.MethodPost, url+"/v1/sandboxes/"+sb.ID+"/exec", key, `{"command": "echo again"}`)
	assert.Equal(t, http.StatusOK, status, "the lease outlived the gateway; body %s", body)
	assert.Contains(t, string(body), `"stdout":"again\n"`)
	status, body = do(t, http.MethodDelete, url+"/v1/sandboxes/"+sb.ID, key, "")
	assert.Equal(t, http.StatusOK, status, "body %s", body)
	assert.True(t, bytes.Contains(body, []byte(`"state":"released"`)), "body %s", body)
}

// stopAllTasks stops every agent the test's gateway started (sandboxes
// outlive the gateway by design).
func stopAllTasks(t *testing.T, agentBinary, dir string) {
	p, err := process.New(process.Config{AgentBinary: agentBinary, Dir: dir}, nil)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	defer func() { assert.NoError(t, p.Close(ctx)) }()
	tasks, err := p.List(ctx, "")
	require.NoError(t, err)
	for _, task := range tasks {
		assert.NoError(t, p.Stop(ctx, task.ID, "test cleanup"))
	}
}
