package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

func TestRun_DerivesTokenFromKeyAndNonce(t *testing.T) {
	keyHex := strings.Repeat("5a", 32)
	key, err := agentapi.ParseTokenKey(keyHex)
	require.NoError(t, err)
	p := startAgent(t, "QUARRY_AGENT_TOKEN_KEY="+keyHex, "QUARRY_AGENT_TOKEN_NONCE=nonce-1")
	ctx := context.Background()

	_, err = agentapi.New("http://"+p.addr, agentapi.DeriveToken(key, "nonce-2"), nil).Health(ctx)
	var ae *agentapi.Error
	require.ErrorAs(t, err, &ae, "a token of another nonce must be refused")
	assert.Equal(t, http.StatusUnauthorized, ae.Status)

	c := agentapi.New("http://"+p.addr, agentapi.DeriveToken(key, "nonce-1"), nil)
	_, err = c.Health(ctx)
	require.NoError(t, err)
	environ := assertKeyHidden(t, p, c, keyHex, "QUARRY_AGENT_TOKEN_KEY", "nonce-1")
	m := regexp.MustCompile(`QUARRY_AGENT_TOKEN_FD=(\d+)`).FindStringSubmatch(environ)
	require.NotNil(t, m, "the re-executed agent got its token on a pipe")
	res, err := c.Exec(ctx, agentapi.ExecRequest{Command: "ls -l /proc/self/fd/"})
	require.NoError(t, err)
	assert.NotRegexp(t, " "+m[1]+" -> pipe:", res.Stdout, "the token pipe is closed, not inherited by commands")
}

// metadataServer stands in for the ECS task metadata endpoint v4 on
// 127.0.0.1: GET <base>/task answers with the task's metadata after
// failFirst failed tries (the endpoint lagging at container start).
func metadataServer(t *testing.T, taskARN string, failFirst int) (base string, calls *atomic.Int32) {
	t.Helper()
	calls = &atomic.Int32{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		if r.URL.Path != "/v4/0123abcd-container/task" {
			http.NotFound(w, r)
			return
		}
		if int(n) <= failFirst {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"Cluster": "quarry", "TaskARN": %q, "Family": "quarry-py-0123", "Revision": "1", "Containers": []}`, taskARN)
	}))
	t.Cleanup(srv.Close)
	return srv.URL + "/v4/0123abcd-container", calls
}

func TestRun_DerivesTokenFromTaskARN(t *testing.T) {
	keyHex := strings.Repeat("5a", 32)
	key, err := agentapi.ParseTokenKey(keyHex)
	require.NoError(t, err)
	const arn = "arn:aws:ecs:us-east-1:123456789012:task/quarry/0123456789abcdef0123456789abcdef"
	base, calls := metadataServer(t, arn, 1)
	p := startAgent(t, "QUARRY_AGENT_TOKEN_KEY="+keyHex, "QUARRY_AGENT_TOKEN_NONCE_FROM=ecs-task-arn",
		"ECS_CONTAINER_METADATA_URI_V4="+base)
	ctx := context.Background()
	assert.Equal(t, int32(2), calls.Load(), "a failed read is retried")

	_, err = agentapi.New("http://"+p.addr, agentapi.DeriveToken(key, arn+"0"), nil).Health(ctx)
	var ae *agentapi.Error
	require.ErrorAs(t, err, &ae, "a token of another task must be refused")
	assert.Equal(t, http.StatusUnauthorized, ae.Status)

	c := agentapi.New("http://"+p.addr, agentapi.DeriveToken(key, arn), nil)
	environ := assertKeyHidden(t, p, c, keyHex, "QUARRY_AGENT_TOKEN_KEY", "QUARRY_AGENT_TOKEN_NONCE_FROM")
	assert.Contains(t, environ, "QUARRY_AGENT_TOKEN_FD=")
}

// assertKeyHidden checks that the agent's commands see no QUARRY_AGENT_*
// variable and not the key, and that the agent re-executed itself without
// the key: its initial environment (what /proc/<pid>/environ shows)
// holds neither keyHex nor any of gone. It returns that environment.
func assertKeyHidden(t *testing.T, p *agentProc, c *agentapi.Client, keyHex string, gone ...string) string {
	t.Helper()
	res, err := c.Exec(context.Background(), agentapi.ExecRequest{Command: "env"})
	require.NoError(t, err)
	assert.NotContains(t, res.Stdout, "QUARRY_AGENT_", "the key and nonce are scrubbed from children")
	assert.NotContains(t, res.Stdout, keyHex)
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", p.cmd.Process.Pid))
	require.NoError(t, err)
	environ := string(b)
	assert.NotContains(t, environ, keyHex, "re-executed without the key")
	for _, g := range gone {
		assert.NotContains(t, environ, g)
	}
	return environ
}

func TestMetadataClient_TaskARN(t *testing.T) {
	const arn = "arn:aws:ecs:us-east-1:123456789012:task/quarry/0123456789abcdef0123456789abcdef"
	serve := func(status int, body string) http.HandlerFunc {
		return func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(status)
			_, _ = io.WriteString(w, body)
		}
	}
	tests := []struct {
		name    string
		handler http.HandlerFunc
		want    string // the ARN, or a part of the error
		wantErr bool
	}{
		{name: "task metadata", handler: serve(200, `{"TaskARN": "`+arn+`", "Cluster": "quarry"}`), want: arn},
		{name: "endpoint failing", handler: serve(500, "boom"), want: "3 tries: status 500", wantErr: true},
		{name: "not json", handler: serve(200, "<html>"), want: "decode the answer", wantErr: true},
		{name: "no TaskARN", handler: serve(200, `{"Cluster": "quarry"}`), want: `TaskARN "" is not a task ARN`, wantErr: true},
		{name: "not a task ARN", handler: serve(200, `{"TaskARN": "arn:aws:ecs:us-east-1:1:cluster/quarry"}`), want: "is not a task ARN", wantErr: true},
		{name: "oversized answer", handler: serve(200, `{"TaskARN": "`+arn+`", "x": "`+strings.Repeat("x", maxMetadataBytes)+`"}`), want: "exceeds", wantErr: true},
		{name: "hanging endpoint", handler: func(_ http.ResponseWriter, r *http.Request) { <-r.Context().Done() }, want: "Timeout exceeded", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var calls atomic.Int32
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				calls.Add(1)
				assert.Equal(t, "/v4/c/task", r.URL.Path)
				tt.handler(w, r)
			}))
			defer srv.Close()
			m := metadataClient{attempts: 3, timeout: 200 * time.Millisecond, backoff: time.Millisecond}
			got, err := m.taskARN(context.Background(), srv.URL+"/v4/c/")
			if !tt.wantErr {
				require.NoError(t, err)
				assert.Equal(t, tt.want, got)
				assert.Equal(t, int32(1), calls.Load())
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
			assert.Contains(t, err.Error(), "ECS_CONTAINER_METADATA_URI_V4", "the error names the variable")
			assert.Equal(t, int32(3), calls.Load(), "every failure is retried")
		})
	}
}

func TestMetadataClient_TaskARN_StopsWhenCancelled(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "not ready", http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	m := metadataClient{attempts: 1000, timeout: time.Second, backoff: time.Hour}
	_, err := m.taskARN(ctx, srv.URL+"/v4/c")
	require.ErrorIs(t, err, context.Canceled)
}
