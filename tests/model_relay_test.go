//go:build integration

package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/client"
	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/internal/testenv"
	"github.com/quarryhq/quarry/modelservice/modeltest"
)

// The model relay end to end: a gateway binary, real sandboxes (process
// provider), the official openai Python package inside them, and a trainer
// loop answering over HTTP.

// agentScript is the program inside the sandbox: it calls the model the way
// any agent does, through the openai package configured by OPENAI_BASE_URL
// and OPENAI_API_KEY, and prints what it received.
const agentScript = `
import openai
client = openai.OpenAI(timeout=120, max_retries=0)
r = client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hello relay"}])
print("plain:", r.choices[0].message.content)
stream = client.chat.completions.create(model="policy", stream=True,
    messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "stream please"}])
parts = [c.choices[0].delta.content for c in stream if c.choices and c.choices[0].delta.content]
print("stream:", "".join(parts))
try:
    client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "fail please"}])
    print("error: none")
except openai.RateLimitError as e:
    print("error:", e.status_code, e.body.get("message") if isinstance(e.body, dict) else e.body)
print("models:", ",".join(m.id for m in client.models.list().data))
`

// trainerLoop answers every claimed request until ctx ends: "fail please"
// with a 429, anything else with "answer to: <message>". It returns the
// requests it answered.
func trainerLoop(ctx context.Context, t *testing.T, tr *modeltest.Trainer) func() []modeltest.ClaimedRequest {
	var (
		mu   sync.Mutex
		seen []modeltest.ClaimedRequest
		wg   sync.WaitGroup
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			reqs, err := tr.Claim(2*time.Second, 8, "")
			if err != nil {
				if ctx.Err() == nil {
					t.Errorf("trainer claim: %v", err)
				}
				return
			}
			for _, r := range reqs {
				mu.Lock()
				seen = append(seen, r)
				mu.Unlock()
				msg := r.LastUserMessage()
				status, body := 0, modeltest.ChatCompletion("chatcmpl-"+r.ID, "policy", "answer to: "+msg)
				if msg == "fail please" {
					status, body = http.StatusTooManyRequests, []byte(`{"error":{"message":"trainer is busy","type":"rate_limit_error"}}`)
				}
				code, b, err := tr.Respond(r.ID, status, body)
				if err != nil || code != http.StatusOK {
					t.Errorf("trainer answer %s: %d %s %v", r.ID, code, b, err)
				}
			}
		}
	}()
	return func() []modeltest.ClaimedRequest {
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		return seen
	}
}

// transcriptOf reads a sandbox's transcript (first page).
func transcriptOf(t *testing.T, url, key, id string) map[string]any {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url+"/v1/sandboxes/"+id+"/model/transcript", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
	var out map[string]any
	require.NoError(t, json.Unmarshal(b, &out))
	return out
}

// runAgent runs agentScript in sandbox id and returns its output lines.
func runAgent(ctx context.Context, t *testing.T, c *client.Client, id, pythonPath string) string {
	t.Helper()
	res, err := c.Exec(ctx, id, agentapi.ExecRequest{
		Argv: []string{"python3", "-c", agentScript}, TimeoutMS: 120000,
		Env: map[string]string{"PYTHONPATH": pythonPath},
	})
	require.NoError(t, err)
	require.Equal(t, 0, res.ExitCode, "agent failed: stdout %s\nstderr %s", res.Stdout, res.Stderr)
	return res.Stdout
}

func TestModelRelay_OpenAIClientInSandbox_TrainerAnswers(t *testing.T) {
	py := testenv.PythonPath(t, "openai")
	g := startGateway(t, defaultPools)
	c := g.client()
	ctx := ctx(t)
	sbx, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Pool: "default", Labels: map[string]string{"run": "relay-e2e"}})
	require.NoError(t, err)

	tctx, stop := context.WithCancel(ctx)
	answered := trainerLoop(tctx, t, &modeltest.Trainer{URL: g.url(), Key: g.key})
	out := runAgent(ctx, t, c, sbx.ID, py)
	stop()
	reqs := answered()

	assertAgentRun(t, out, reqs, transcriptOf(t, g.url(), g.key, sbx.ID), sbx.ID, "relay-e2e")
}

// assertAgentRun checks one run of agentScript in sandbox sandboxID
// (leased with the label run=run) against trainerLoop: what the agent
// printed, the requests the trainer answered and the sandbox's transcript.
func assertAgentRun(t *testing.T, out string, reqs []modeltest.ClaimedRequest, transcript map[string]any, sandboxID, run string) {
	t.Helper()
	assert.Contains(t, out, "plain: answer to: hello relay\n")
	assert.Contains(t, out, "stream: answer to: stream please\n", "stream=True gets chunks ending with [DONE]")
	assert.Contains(t, out, "error: 429 trainer is busy\n", "an error answer reaches the agent as an HTTP error")
	assert.Contains(t, out, "models: policy\n")
	require.Len(t, reqs, 3)
	for _, r := range reqs {
		assert.Equal(t, sandboxID, r.SandboxID)
		assert.Equal(t, run, r.Labels["run"])
		assert.Equal(t, "chat/completions", r.Route)
	}
	assert.False(t, reqs[0].Stream)
	assert.True(t, reqs[1].Stream)
	assert.Contains(t, string(reqs[1].Body), `"be brief"`, "the trainer sees the prompt as the agent built it")

	exs, _ := transcript["exchanges"].([]any)
	require.Len(t, exs, 3)
	for i, want := range []string{"hello relay", "stream please", "fail please"} {
		ex, ok := exs[i].(map[string]any)
		require.True(t, ok, "exchange %d: %v", i, exs[i])
		assert.Equal(t, "answered", ex["state"])
		req, err := json.Marshal(ex["request"])
		require.NoError(t, err)
		assert.Contains(t, string(req), want)
		_, timed := ex["latency_ms"]
		assert.True(t, timed, "exchanges carry their timings")
		assert.NotEmpty(t, ex["received_at"])
		assert.NotEmpty(t, ex["ended_at"])
		resp, ok := ex["response"].(map[string]any)
		require.True(t, ok, "exchange %d has a response: %v", i, ex)
		wantStatus := 200
		if want == "fail please" {
			wantStatus = 429
		}
		assert.EqualValues(t, wantStatus, resp["status"])
	}
}

// relayTokenOf reads a sandbox's relay URL and token from inside it.
func relayTokenOf(ctx context.Context, t *testing.T, c *client.Client, id string) (string, string) {
	t.Helper()
	res, err := c.Exec(ctx, id, agentapi.ExecRequest{Command: `printf '%s\n%s\n' "$OPENAI_BASE_URL" "$OPENAI_API_KEY"`})
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(res.Stdout), "\n")
	require.Len(t, lines, 2, "%q", res.Stdout)
	return lines[0], lines[1]
}

func httpCall(t *testing.T, method, url, token, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Timeout: time.Minute}).Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestModelRelay_Isolation_TokenOpensOnlyItsOwnRelay(t *testing.T) {
	g := startGateway(t, defaultPools)
	c := g.client()
	ctx := ctx(t)
	a, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{})
	require.NoError(t, err)
	b, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{})
	require.NoError(t, err)
	baseA, tokenA := relayTokenOf(ctx, t, c, a.ID)
	baseB, tokenB := relayTokenOf(ctx, t, c, b.ID)
	assert.Equal(t, g.url()+"/v1/sandboxes/"+a.ID+"/model/v1", baseA)
	require.NotEqual(t, tokenA, tokenB)

	// B's call waits in the queue; A's token can do nothing with it.
	done := make(chan struct{})
	go func() {
		defer close(done)
		httpCall(t, http.MethodPost, baseB+"/chat/completions", tokenB, `{"messages":[]}`)
	}()
	tr := &modeltest.Trainer{URL: g.url(), Key: g.key}
	var rid string
	eventually(t, 30*time.Second, "B's call is queued", func() error {
		reqs, err := tr.Claim(time.Second, 1, "")
		if err != nil || len(reqs) == 0 {
			return fmt.Errorf("nothing claimed (%v)", err)
		}
		rid = reqs[0].ID
		return nil
	})
	tests := []struct{ name, method, url, token string }{
		{"B's relay", http.MethodPost, baseB + "/chat/completions", tokenA},
		{"B's transcript", http.MethodGet, g.url() + "/v1/sandboxes/" + b.ID + "/model/transcript", tokenA},
		{"answering B's request", http.MethodPost, g.url() + "/v1/model/requests/" + rid + "/response", tokenA},
		{"the trainer's claims", http.MethodGet, g.url() + "/v1/model/requests", tokenA},
		{"its own sandbox's exec", http.MethodPost, g.url() + "/v1/sandboxes/" + a.ID + "/exec", tokenA},
		{"the sandbox list", http.MethodGet, g.url() + "/v1/sandboxes", tokenA},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			status, body := httpCall(t, tc.method, tc.url, tc.token, `{"command":"true"}`)
			assert.Equal(t, http.StatusUnauthorized, status, body)
		})
	}
	// Another tenant's API key sees none of it.
	other := &modeltest.Trainer{URL: g.url(), Key: "other-" + g.key}
	reqs, err := other.Claim(0, 10, "")
	require.NoError(t, err)
	assert.Empty(t, reqs)
	code, body, err := other.Respond(rid, 0, modeltest.ChatCompletion("c", "m", "x"))
	require.NoError(t, err)
	assert.Equal(t, http.StatusNotFound, code, "%s", body)

	code, body, err = tr.Respond(rid, 0, modeltest.ChatCompletion("c", "m", "for b"))
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code, "%s", body)
	<-done
	// Once the lease ends, its token opens nothing.
	_, err = c.DeleteSandbox(ctx, a.ID)
	require.NoError(t, err)
	status, body2 := httpCall(t, http.MethodPost, baseA+"/chat/completions", tokenA, `{}`)
	assert.Equal(t, http.StatusGone, status, body2)
}

func TestModelRelay_BadInput(t *testing.T) {
	g := startGateway(t, defaultPools, withEnv("QUARRY_MAX_JSON_BODY=65536"))
	c := g.client()
	ctx := ctx(t)
	sbx, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{})
	require.NoError(t, err)
	base, token := relayTokenOf(ctx, t, c, sbx.ID)
	tests := []struct {
		name, method, url, token, body string
		want                           int
	}{
		{"oversized body", http.MethodPost, base + "/chat/completions", token, `{"x":"` + strings.Repeat("a", 70000) + `"}`, http.StatusRequestEntityTooLarge},
		{"malformed JSON", http.MethodPost, base + "/chat/completions", token, `{"messages": [`, http.StatusBadRequest},
		{"unknown request id", http.MethodPost, g.url() + "/v1/model/requests/mrq-0000000000000000aaaaaaaaaaaaaaaa/response", g.key, string(modeltest.ChatCompletion("c", "m", "x")), http.StatusNotFound},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			status, body := httpCall(t, tc.method, tc.url, tc.token, tc.body)
			assert.Equal(t, tc.want, status, body)
			assert.Contains(t, body, `"error"`)
		})
	}
}
