package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"

	"github.com/quarryhq/quarry/api"
	"github.com/quarryhq/quarry/modelservice"
	"github.com/quarryhq/quarry/modelservice/membroker"
	"github.com/quarryhq/quarry/modelservice/modeltest"
	"github.com/quarryhq/quarry/warmpool"
)

// leaseReaderFunc adapts a function to modelservice.LeaseReader.
type leaseReaderFunc func(ctx context.Context, id string) (warmpool.Lease, error)

func (f leaseReaderFunc) GetLease(ctx context.Context, id string) (warmpool.Lease, error) {
	return f(ctx, id)
}

// relayEnv is a gateway with a model relay on a memory broker, over a fake
// manager whose leases the relay reads.
type relayEnv struct {
	*testGateway
	mgr *fakeManager
	svc *modelservice.Service
}

// startRelay serves a gateway with a model relay; pools configure the
// relay's pool options (nil: one pool "default").
func startRelay(t *testing.T, pools []warmpool.PoolConfig, mutate func(*Config), cfg modelservice.Config) *relayEnv {
	t.Helper()
	mgr := newFakeManager("")
	svc := newRelayService(t, mgr, pools, cfg)
	gw := startGatewayDeps(t, mgr, mutate, Deps{Model: svc})
	return &relayEnv{testGateway: gw, mgr: mgr, svc: svc}
}

// newRelayService builds a model relay on a memory broker that reads the
// leases of mgr.
func newRelayService(t *testing.T, mgr *fakeManager, pools []warmpool.PoolConfig, cfg modelservice.Config) *modelservice.Service {
	t.Helper()
	tokens, err := modelservice.NewTokens([]byte("0123456789abcdef0123456789abcdef"))
	require.NoError(t, err)
	b := membroker.New(membroker.Config{})
	t.Cleanup(func() { _ = b.Close(context.Background()) })
	if pools == nil {
		pools = []warmpool.PoolConfig{{Name: "default"}}
	}
	if cfg.SandboxURL == "" {
		cfg.SandboxURL = "http://127.0.0.1:1"
	}
	reader := leaseReaderFunc(func(_ context.Context, id string) (warmpool.Lease, error) {
		mgr.mu.Lock()
		defer mgr.mu.Unlock()
		l, ok := mgr.leases[id]
		if !ok {
			return warmpool.Lease{}, warmpool.ErrNotFound
		}
		return l, nil
	})
	svc, err := modelservice.New(cfg, modelservice.Deps{Broker: b, Leases: reader, Tokens: tokens, Pools: pools, Logger: testLogger()})
	require.NoError(t, err)
	return svc
}

// sandbox adds an active lease of key in pool and returns its id and relay
// token.
func (e *relayEnv) sandbox(id, key, pool string, labels map[string]string) (string, string) {
	l := e.mgr.addLease(id, key, "", 1)
	l.Pool, l.Labels = pool, labels
	e.mgr.put(l)
	return id, e.svc.LeaseEnv(id, "")["OPENAI_API_KEY"]
}

func (e *relayEnv) relayURL(id, route string) string {
	return e.URL + "/v1/sandboxes/" + id + "/model/v1/" + route
}

// agentResult is what an agent's call received.
type agentResult struct {
	status int
	header http.Header
	body   []byte
	err    error
}

// agentCall makes an agent's call in the background.
func agentCall(ctx context.Context, url, token string, body []byte) <-chan agentResult {
	return callAsync(ctx, http.MethodPost, url, token, bytes.NewReader(body), "Content-Type", "application/json")
}

// callAsync sends a request in the background, with a bearer token when
// token is set, and delivers its answer with its body read.
func callAsync(ctx context.Context, method, url, token string, body io.Reader, hdr ...string) <-chan agentResult {
	out := make(chan agentResult, 1)
	go func() {
		req, err := http.NewRequestWithContext(ctx, method, url, body)
		if err != nil {
			out <- agentResult{err: err}
			return
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := httpClient.Do(req)
		if err != nil {
			out <- agentResult{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		out <- agentResult{status: resp.StatusCode, header: resp.Header, body: b, err: err}
	}()
	return out
}

// claim long-polls for n requests with key.
func (e *relayEnv) claim(t *testing.T, key string, n int, query string) []api.ClaimedRequest {
	t.Helper()
	var got []api.ClaimedRequest
	eventually(t, func() bool {
		resp, b := call(t, http.MethodGet, fmt.Sprintf("%s/v1/model/requests?wait_ms=1000&max=%d%s", e.URL, n-len(got), query), key, nil)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
		var out api.ClaimedRequests
		require.NoError(t, json.Unmarshal(b, &out), "%s", b)
		got = append(got, out.Requests...)
		return len(got) >= n
	}, "claim requests")
	return got
}

// respond answers rid with body as key.
func (e *relayEnv) respond(t *testing.T, key, rid, query, contentType string, body []byte) (*http.Response, []byte) {
	t.Helper()
	return call(t, http.MethodPost, e.URL+"/v1/model/requests/"+rid+"/response"+query, key, bytes.NewReader(body), "Content-Type", contentType)
}

func TestModel_ChatCompletion_TrainerAnswerReachesTheAgent(t *testing.T) {
	e := startRelay(t, nil, nil, modelservice.Config{})
	id, token := e.sandbox("sbx-a", testKey, "default", map[string]string{"run": "r1"})
	body := []byte("{\"model\": \"policy\",\n \"messages\": [{\"role\": \"user\", \"content\": \"caf\u00e9 \\u00e9 <b>\"}]}")
	res := agentCall(context.Background(), e.relayURL(id, "chat/completions"), token, body)

	reqs := e.claim(t, testKey, 1, "")
	require.Len(t, reqs, 1)
	r := reqs[0]
	assert.Equal(t, string(body), string(r.Body), "the trainer receives the body byte for byte")
	assert.Equal(t, id, r.SandboxID)
	assert.Equal(t, "default", r.Pool)
	assert.Equal(t, map[string]string{"run": "r1"}, r.Labels)
	assert.Equal(t, "chat/completions", r.Route)
	assert.False(t, r.Stream)
	assert.Equal(t, 1, r.Attempt)

	answer := modeltest.ChatCompletion("chatcmpl-1", "policy", "hello agent")
	resp, b := e.respond(t, testKey, r.ID, "", "application/json", answer)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)

	got := <-res
	require.NoError(t, got.err)
	assert.Equal(t, http.StatusOK, got.status)
	assert.Equal(t, string(answer), string(got.body), "the agent receives the answer byte for byte")
	assert.Equal(t, r.ID, got.header.Get(headerRequestID))
	assert.Contains(t, got.header.Get("Content-Type"), "application/json")
}

// sseContent reassembles the content of chat chunks and checks the stream's
// shape.
func sseContent(t *testing.T, stream string) string {
	t.Helper()
	require.True(t, strings.HasSuffix(stream, "data: [DONE]\n\n"), "the stream ends with [DONE]: %q", stream)
	var content strings.Builder
	for _, ev := range strings.Split(strings.TrimSpace(stream), "\n\n") {
		data, ok := strings.CutPrefix(ev, "data: ")
		require.True(t, ok, "event %q", ev)
		if data == "[DONE]" {
			continue
		}
		var chunk struct {
			Object  string `json:"object"`
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
				Text string `json:"text"`
			} `json:"choices"`
		}
		require.NoError(t, json.Unmarshal([]byte(data), &chunk), "%s", data)
		for _, c := range chunk.Choices {
			content.WriteString(c.Delta.Content + c.Text)
		}
	}
	return content.String()
}

func TestModel_Stream_AnswersAsServerSentEvents(t *testing.T) {
	tests := []struct {
		name        string
		route       string
		contentType string
		answer      []byte
		want        string
	}{
		{name: "chat completion becomes chunks", route: "chat/completions", contentType: "application/json",
			answer: modeltest.ChatCompletion("c1", "policy", "streamed hello"), want: "streamed hello"},
		{name: "text completion becomes chunks", route: "completions", contentType: "application/json",
			answer: modeltest.TextCompletion("c2", "policy", "text hello"), want: "text hello"},
		{name: "trainer chunks pass as they are", route: "chat/completions", contentType: "text/event-stream",
			answer: []byte("data: {\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"own \"}}]}\n\n" +
				"data: {\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"chunks\"}}]}\n\ndata: [DONE]\n\n"),
			want: "own chunks"},
	}
	e := startRelay(t, nil, nil, modelservice.Config{})
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			id, token := e.sandbox(fmt.Sprintf("sbx-s%d", i), testKey, "default", nil)
			res := agentCall(context.Background(), e.relayURL(id, tc.route), token, []byte(`{"model":"policy","stream":true,"prompt":"p","messages":[]}`))
			reqs := e.claim(t, testKey, 1, "")
			require.True(t, reqs[0].Stream)
			resp, b := e.respond(t, testKey, reqs[0].ID, "", tc.contentType, tc.answer)
			require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
			got := <-res
			require.NoError(t, got.err)
			assert.Equal(t, http.StatusOK, got.status)
			assert.Contains(t, got.header.Get("Content-Type"), "text/event-stream")
			assert.Equal(t, tc.want, sseContent(t, string(got.body)))
		})
	}
}

func TestModel_ErrorAnswer_AgentReceivesHTTPError(t *testing.T) {
	e := startRelay(t, nil, nil, modelservice.Config{})
	tests := []struct {
		name     string
		body     []byte
		wantBody string
	}{
		{name: "with the trainer's body", body: []byte(`{"error":{"message":"slow down","type":"rate_limit_error"}}`), wantBody: "slow down"},
		{name: "empty body gets an OpenAI error", body: nil, wantBody: "the trainer answered with an error"},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			id, token := e.sandbox(fmt.Sprintf("sbx-e%d", i), testKey, "default", nil)
			res := agentCall(context.Background(), e.relayURL(id, "chat/completions"), token, []byte(`{"stream":true}`))
			reqs := e.claim(t, testKey, 1, "")
			resp, b := e.respond(t, testKey, reqs[0].ID, "?status=429", "application/json", tc.body)
			require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
			got := <-res
			require.NoError(t, got.err)
			assert.Equal(t, http.StatusTooManyRequests, got.status, "an error answer is an HTTP error, streamed call or not")
			assert.Contains(t, string(got.body), tc.wantBody)
		})
	}
}

func TestModel_Answer_TwiceConflictsAfterGiveUpGone(t *testing.T) {
	e := startRelay(t, nil, nil, modelservice.Config{})
	id, token := e.sandbox("sbx-a", testKey, "default", nil)

	res := agentCall(context.Background(), e.relayURL(id, "chat/completions"), token, []byte(`{}`))
	r := e.claim(t, testKey, 1, "")[0]
	answer := modeltest.ChatCompletion("c", "m", "once")
	resp, _ := e.respond(t, testKey, r.ID, "", "application/json", answer)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.NoError(t, (<-res).err)
	resp, b := e.respond(t, testKey, r.ID, "", "application/json", answer)
	assert.Equal(t, http.StatusConflict, resp.StatusCode, "%s", b)
	assert.Equal(t, "conflict", decodeError(t, b).Code)

	// The agent disconnects: its request is cancelled, and an answer is 410.
	ctx, cancel := context.WithCancel(context.Background())
	res = agentCall(ctx, e.relayURL(id, "chat/completions"), token, []byte(`{}`))
	r = e.claim(t, testKey, 1, "")[0]
	cancel()
	<-res
	var page []modelservice.Exchange
	eventually(t, func() bool {
		var err error
		page, _, err = e.svc.Transcript(context.Background(), id, OwnerOf(testKey), "", 10)
		require.NoError(t, err)
		return len(page) == 2 && page[1].State.Ended()
	}, "the gateway notices that the agent left")
	assert.Equal(t, modelservice.StateCancelled, page[1].State)
	assert.Equal(t, "the agent disconnected", page[1].Reason)
	resp, b = e.respond(t, testKey, r.ID, "", "application/json", answer)
	assert.Equal(t, http.StatusGone, resp.StatusCode, "%s", b)
	assert.Equal(t, "gone", decodeError(t, b).Code)
}

func TestModel_Timeout_PoolOptionExpiresOnBothSides(t *testing.T) {
	pools := []warmpool.PoolConfig{{Name: "fast", Options: map[string]string{modelservice.OptionTimeout: "1"}}}
	e := startRelay(t, pools, nil, modelservice.Config{})
	id, token := e.sandbox("sbx-a", testKey, "fast", nil)
	res := agentCall(context.Background(), e.relayURL(id, "chat/completions"), token, []byte(`{}`))
	r := e.claim(t, testKey, 1, "")[0]
	got := <-res
	require.NoError(t, got.err)
	assert.Equal(t, http.StatusGatewayTimeout, got.status, "%s", got.body)
	assert.Equal(t, "timeout", decodeError(t, got.body).Code)
	resp, b := e.respond(t, testKey, r.ID, "", "application/json", modeltest.ChatCompletion("c", "m", "late"))
	assert.Equal(t, http.StatusGone, resp.StatusCode, "%s", b)
}

func TestModel_Isolation_TokenOpensOnlyItsOwnRelay(t *testing.T) {
	e := startRelay(t, nil, nil, modelservice.Config{})
	a, tokenA := e.sandbox("sbx-a", testKey, "default", nil)
	b, tokenB := e.sandbox("sbx-b", testKey, "default", nil)
	require.NotEqual(t, tokenA, tokenB)

	// A call from B waits in the queue for the isolation checks below.
	res := agentCall(context.Background(), e.relayURL(b, "chat/completions"), tokenB, []byte(`{"from":"b"}`))
	t.Cleanup(func() { <-res })
	rid := e.claim(t, testKey, 1, "")[0].ID

	tests := []struct {
		name, method, path, key string
		want                    int
	}{
		{"A's token on B's relay", http.MethodPost, "/v1/sandboxes/" + b + "/model/v1/chat/completions", tokenA, http.StatusUnauthorized},
		{"A's token on B's models", http.MethodGet, "/v1/sandboxes/" + b + "/model/v1/models", tokenA, http.StatusUnauthorized},
		{"no token", http.MethodPost, "/v1/sandboxes/" + a + "/model/v1/chat/completions", "", http.StatusUnauthorized},
		{"an API key is not a relay token", http.MethodPost, "/v1/sandboxes/" + a + "/model/v1/chat/completions", testKey, http.StatusUnauthorized},
		{"A's token on B's transcript", http.MethodGet, "/v1/sandboxes/" + b + "/model/transcript", tokenA, http.StatusUnauthorized},
		{"A's token on its own transcript", http.MethodGet, "/v1/sandboxes/" + a + "/model/transcript", tokenA, http.StatusUnauthorized},
		{"A's token on the claim route", http.MethodGet, "/v1/model/requests", tokenA, http.StatusUnauthorized},
		{"A's token answering", http.MethodPost, "/v1/model/requests/" + rid + "/response", tokenA, http.StatusUnauthorized},
		{"A's token on its sandbox's exec", http.MethodPost, "/v1/sandboxes/" + a + "/exec", tokenA, http.StatusUnauthorized},
		{"A's token on sandbox lists", http.MethodGet, "/v1/sandboxes", tokenA, http.StatusUnauthorized},
		{"another API key's answer", http.MethodPost, "/v1/model/requests/" + rid + "/response", otherKey, http.StatusNotFound},
		{"another API key's transcript", http.MethodGet, "/v1/sandboxes/" + b + "/model/transcript", otherKey, http.StatusNotFound},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := call(t, tc.method, e.URL+tc.path, tc.key, strings.NewReader(string(modeltest.ChatCompletion("c", "m", "x"))), "Content-Type", "application/json")
			assert.Equal(t, tc.want, resp.StatusCode, "%s", body)
			decodeError(t, body)
		})
	}
	// Another API key claims nothing of this key's sandboxes.
	resp, body := call(t, http.MethodGet, e.URL+"/v1/model/requests?max=10", otherKey, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.JSONEq(t, `{"requests":[]}`, string(body))
	resp, body = e.respond(t, testKey, rid, "", "application/json", modeltest.ChatCompletion("c", "m", "done"))
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
}

func TestModel_BadInput_ClearErrors(t *testing.T) {
	e := startRelay(t, nil, func(c *Config) { c.MaxJSONBody = 4096 }, modelservice.Config{})
	id, token := e.sandbox("sbx-a", testKey, "default", nil)
	res := agentCall(context.Background(), e.relayURL(id, "chat/completions"), token, []byte(`{"stream":false}`))
	t.Cleanup(func() { <-res })
	rid := e.claim(t, testKey, 1, "")[0].ID
	unknown := modelservice.NewRequestID(time.Now())

	tests := []struct {
		name, method, path, key, contentType string
		body                                 string
		want                                 int
		field                                string
	}{
		{"malformed JSON", http.MethodPost, "/v1/sandboxes/" + id + "/model/v1/chat/completions", token, "application/json", `{"model":`, 400, "body"},
		{"not an object", http.MethodPost, "/v1/sandboxes/" + id + "/model/v1/chat/completions", token, "application/json", `[1,2]`, 400, "body"},
		{"oversized body", http.MethodPost, "/v1/sandboxes/" + id + "/model/v1/chat/completions", token, "application/json", `{"x":"` + strings.Repeat("a", 5000) + `"}`, 413, ""},
		{"unknown request id", http.MethodPost, "/v1/model/requests/" + unknown + "/response", testKey, "application/json", string(modeltest.ChatCompletion("c", "m", "x")), 404, ""},
		{"malformed request id", http.MethodPost, "/v1/model/requests/nope/response", testKey, "application/json", `{}`, 400, "rid"},
		{"answer without choices", http.MethodPost, "/v1/model/requests/" + rid + "/response", testKey, "application/json", `{"id":"x"}`, 400, "body.choices"},
		{"malformed answer", http.MethodPost, "/v1/model/requests/" + rid + "/response", testKey, "application/json", `{"id":`, 400, "body"},
		{"bad status", http.MethodPost, "/v1/model/requests/" + rid + "/response?status=302", testKey, "application/json", `{}`, 400, "status"},
		{"bad content type", http.MethodPost, "/v1/model/requests/" + rid + "/response", testKey, "text/plain", `hi`, 400, "Content-Type"},
		{"oversized answer", http.MethodPost, "/v1/model/requests/" + rid + "/response", testKey, "application/json", `{"x":"` + strings.Repeat("a", 5000) + `"}`, 413, ""},
		{"max zero", http.MethodGet, "/v1/model/requests?max=0", testKey, "", "", 400, "max"},
		{"wait too long", http.MethodGet, "/v1/model/requests?wait_ms=999999", testKey, "", "", 400, "wait_ms"},
		{"bad label", http.MethodGet, "/v1/model/requests?label=nokey", testKey, "", "", 400, "label"},
		{"transcript limit", http.MethodGet, "/v1/sandboxes/" + id + "/model/transcript?limit=5000", testKey, "", "", 400, "limit"},
		{"transcript after", http.MethodGet, "/v1/sandboxes/" + id + "/model/transcript?after=zzz", testKey, "", "", 400, "after"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var body io.Reader
			if tc.body != "" {
				body = strings.NewReader(tc.body)
			}
			resp, b := call(t, tc.method, e.URL+tc.path, tc.key, body, "Content-Type", tc.contentType)
			assert.Equal(t, tc.want, resp.StatusCode, "%s", b)
			d := decodeError(t, b)
			if tc.field != "" {
				assert.True(t, strings.HasPrefix(d.Message, tc.field+":"), "the message names %s: %s", tc.field, d.Message)
			}
		})
	}
	resp, b := e.respond(t, testKey, rid, "", "application/json", modeltest.ChatCompletion("c", "m", "fine"))
	require.Equal(t, http.StatusOK, resp.StatusCode, "the request is still answerable: %s", b)
}

func TestModel_Transcript_PairsWithTimingsInPages(t *testing.T) {
	e := startRelay(t, nil, nil, modelservice.Config{})
	id, token := e.sandbox("sbx-t", testKey, "default", nil)
	var bodies []string
	for i := 0; i < 3; i++ {
		body := fmt.Sprintf(`{"messages":[{"role":"user","content":"turn %d"}]}`, i)
		bodies = append(bodies, body)
		res := agentCall(context.Background(), e.relayURL(id, "chat/completions"), token, []byte(body))
		r := e.claim(t, testKey, 1, "")[0]
		resp, b := e.respond(t, testKey, r.ID, "", "application/json", modeltest.ChatCompletion("c", "m", fmt.Sprintf("answer %d", i)))
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
		require.NoError(t, (<-res).err)
	}
	var all []string
	after := ""
	for pages := 0; pages < 5; pages++ {
		resp, b := call(t, http.MethodGet, e.URL+"/v1/sandboxes/"+id+"/model/transcript?limit=2&after="+after, testKey, nil)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
		page := decode[api.Transcript](t, b)
		assert.Equal(t, id, page.SandboxID)
		for _, ex := range page.Exchanges {
			assert.Equal(t, "answered", ex.State)
			assert.Equal(t, "chat/completions", ex.Route)
			require.NotNil(t, ex.Response)
			assert.Equal(t, 200, ex.Response.Status)
			assert.False(t, ex.ReceivedAt.IsZero())
			assert.False(t, ex.ClaimedAt.Before(ex.ReceivedAt))
			assert.False(t, ex.EndedAt.Before(ex.ClaimedAt))
			require.NotNil(t, ex.LatencyMS)
			all = append(all, string(ex.Request))
			assert.Contains(t, string(ex.Response.Body), fmt.Sprintf("answer %d", len(all)-1))
		}
		if page.NextAfter == "" {
			break
		}
		after = page.NextAfter
	}
	assert.Equal(t, bodies, all, "every request, verbatim, oldest first")
}

func TestModel_EndedLease_RelayAnswersGone(t *testing.T) {
	e := startRelay(t, nil, nil, modelservice.Config{})
	id, token := e.sandbox("sbx-a", testKey, "default", nil)
	l := e.mgr.leases[id]
	l.State, l.Reason = warmpool.LeaseReleased, "released by its owner"
	e.mgr.put(l)
	resp, b := call(t, http.MethodPost, e.relayURL(id, "chat/completions"), token, strings.NewReader(`{}`))
	assert.Equal(t, http.StatusGone, resp.StatusCode, "%s", b)
	assert.Contains(t, decodeError(t, b).Message, "released")
}

func TestModel_Models_ListsThePoolModel(t *testing.T) {
	pools := []warmpool.PoolConfig{{Name: "default", Options: map[string]string{modelservice.OptionModelName: "my-policy"}}}
	e := startRelay(t, pools, nil, modelservice.Config{})
	id, token := e.sandbox("sbx-a", testKey, "default", nil)
	resp, b := call(t, http.MethodGet, e.relayURL(id, "models"), token, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
	assert.JSONEq(t, `{"object":"list","data":[{"id":"my-policy","object":"model","created":0,"owned_by":"quarry"}]}`, string(b))
}

func TestModel_LeaseEnv_PointsAtTheRelay(t *testing.T) {
	svc := newRelayService(t, newFakeManager(""), nil, modelservice.Config{SandboxURL: "http://10.1.2.3:8080/"})
	env := svc.LeaseEnv("sbx-x", "")
	assert.Equal(t, "http://10.1.2.3:8080/v1/sandboxes/sbx-x/model/v1", env["OPENAI_BASE_URL"])
	assert.True(t, strings.HasPrefix(env["OPENAI_API_KEY"], modelservice.TokenPrefix))
}

func TestModel_NotConfigured_RoutesAnswer404(t *testing.T) {
	gw := startGateway(t, newFakeManager(""), nil)
	for _, path := range []string{"/v1/model/requests", "/v1/sandboxes/sbx-a/model/transcript"} {
		resp, b := call(t, http.MethodGet, gw.URL+path, testKey, nil)
		assert.Equal(t, http.StatusNotFound, resp.StatusCode, "%s", b)
		assert.Contains(t, decodeError(t, b).Message, "model relay is not configured")
	}
}

func TestModel_Passthrough_StreamsWithoutBufferingAndRecords(t *testing.T) {
	up := &modeltest.Upstream{Hold: make(chan struct{})}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	pools := []warmpool.PoolConfig{{Name: "eval", Options: map[string]string{
		modelservice.OptionUpstreamURL: srv.URL + "/v1", modelservice.OptionUpstreamKey: "upstream-secret"}}}
	e := startRelay(t, pools, nil, modelservice.Config{})
	id, token := e.sandbox("sbx-p", testKey, "eval", nil)

	body := `{"model":"m","stream":true,"messages":[{"role":"user","content":"one two three"}]}`
	req, err := http.NewRequest(http.MethodPost, e.relayURL(id, "chat/completions"), strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := httpClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Contains(t, resp.Header.Get("Content-Type"), "text/event-stream")
	rd := bufio.NewReader(resp.Body)
	first, err := rd.ReadString('\n')
	require.NoError(t, err, "the first chunk arrives while the upstream holds the rest")
	assert.True(t, strings.HasPrefix(first, "data: {"), first)
	close(up.Hold)
	rest, err := io.ReadAll(rd)
	require.NoError(t, err)
	stream := first + string(rest)
	assert.Equal(t, "echo: one two three", sseContent(t, stream))

	auth, bodies := up.Requests()
	require.Len(t, bodies, 1)
	assert.Equal(t, body, string(bodies[0]), "the upstream receives the body byte for byte")
	assert.Equal(t, "Bearer upstream-secret", auth[0], "the relay token never reaches the upstream")

	var page api.Transcript
	eventually(t, func() bool {
		_, b := call(t, http.MethodGet, e.URL+"/v1/sandboxes/"+id+"/model/transcript", testKey, nil)
		page = decode[api.Transcript](t, b)
		return len(page.Exchanges) == 1
	}, "the exchange is recorded once the stream ends")
	ex := page.Exchanges[0]
	assert.Equal(t, "answered", ex.State)
	assert.Equal(t, srv.URL+"/v1", ex.Upstream)
	require.NotNil(t, ex.Response)
	var recorded string
	require.NoError(t, json.Unmarshal(ex.Response.Body, &recorded), "an event stream is recorded as a string")
	assert.Equal(t, stream, recorded)

	// GET /models is forwarded too.
	resp2, b := call(t, http.MethodGet, e.relayURL(id, "models"), token, nil)
	require.Equal(t, http.StatusOK, resp2.StatusCode, "%s", b)
	assert.Contains(t, string(b), "upstream-model")
}

func TestModel_Passthrough_UpstreamDownIs502(t *testing.T) {
	pools := []warmpool.PoolConfig{{Name: "eval", Options: map[string]string{modelservice.OptionUpstreamURL: refusedURL(t)}}}
	e := startRelay(t, pools, nil, modelservice.Config{})
	id, token := e.sandbox("sbx-p", testKey, "eval", nil)
	resp, b := call(t, http.MethodPost, e.relayURL(id, "chat/completions"), token, strings.NewReader(`{"messages":[]}`))
	assert.Equal(t, http.StatusBadGateway, resp.StatusCode, "%s", b)
	assert.Equal(t, api.CodeUpstreamUnreachable, decodeError(t, b).Code)
	page, _, err := e.svc.Transcript(context.Background(), id, OwnerOf(testKey), "", 10)
	require.NoError(t, err)
	require.Len(t, page, 1)
	assert.Equal(t, modelservice.StateFailed, page[0].State)
}

func TestModel_Passthrough_LeaseLabelNeedsAnAllowedUpstream(t *testing.T) {
	up := &modeltest.Upstream{}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	e := startRelay(t, nil, nil, modelservice.Config{AllowedUpstreams: []string{srv.URL}})
	allowed, tokenA := e.sandbox("sbx-a", testKey, "default", map[string]string{modelservice.LabelUpstreamURL: srv.URL})
	refused, tokenB := e.sandbox("sbx-b", testKey, "default", map[string]string{modelservice.LabelUpstreamURL: "http://127.0.0.1:9/v1"})

	resp, b := call(t, http.MethodPost, e.relayURL(allowed, "chat/completions"), tokenA, strings.NewReader(`{"messages":[{"role":"user","content":"hi"}]}`))
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
	assert.Contains(t, string(b), "echo: hi")
	resp, b = call(t, http.MethodPost, e.relayURL(refused, "chat/completions"), tokenB, strings.NewReader(`{}`))
	assert.Equal(t, http.StatusForbidden, resp.StatusCode, "%s", b)
}

func TestModel_LongWait_OutlivesTheIdleTimeout(t *testing.T) {
	e := startRelay(t, nil, func(c *Config) { c.IdleTimeout = time.Second }, modelservice.Config{})
	id, token := e.sandbox("sbx-a", testKey, "default", nil)
	res := agentCall(context.Background(), e.relayURL(id, "chat/completions"), token, []byte(`{}`))
	r := e.claim(t, testKey, 1, "")[0]
	time.Sleep(2500 * time.Millisecond) // the trainer thinks longer than the idle timeout
	resp, b := e.respond(t, testKey, r.ID, "", "application/json", modeltest.ChatCompletion("c", "m", "slow"))
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
	got := <-res
	require.NoError(t, got.err, "a waiting call is not an idle connection")
	assert.Equal(t, http.StatusOK, got.status)
	assert.Contains(t, string(got.body), "slow")
}

// Pooled answer buffers must not be handed to the server: it writes the
// body after the handler (and its deferred return of the buffer) finished,
// so concurrent requests would send each other's bytes.
func TestModel_Transcript_ConcurrentReadsGetWholeBodies(t *testing.T) {
	e := startRelay(t, nil, nil, modelservice.Config{})
	var ids []string
	for i := range 4 {
		id, token := e.sandbox(fmt.Sprintf("sbx-c%d", i), testKey, "default", nil)
		res := agentCall(context.Background(), e.relayURL(id, "chat/completions"), token, []byte(fmt.Sprintf(`{"messages":[{"role":"user","content":"%s %s"}]}`, id, strings.Repeat("x", 20000*(i+1)))))
		r := e.claim(t, testKey, 1, "")[0]
		resp, b := e.respond(t, testKey, r.ID, "", "application/json", modeltest.ChatCompletion("c", "m", "answer for "+id))
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
		require.NoError(t, (<-res).err)
		ids = append(ids, id)
	}
	var g errgroup.Group
	for w := range 64 {
		g.Go(func() error {
			for n := range 60 {
				id := ids[(w+n)%len(ids)]
				req, _ := http.NewRequest(http.MethodGet, e.URL+"/v1/sandboxes/"+id+"/model/transcript", nil)
				req.Header.Set("Authorization", "Bearer "+testKey)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					return err
				}
				b, err := io.ReadAll(resp.Body)
				_ = resp.Body.Close()
				if err != nil {
					return err
				}
				var page api.Transcript
				if err := json.Unmarshal(b, &page); err != nil {
					return fmt.Errorf("transcript of %s: %w: %q", id, err, b)
				}
				if page.SandboxID != id || len(page.Exchanges) != 1 || !strings.Contains(string(page.Exchanges[0].Request), id) {
					return fmt.Errorf("transcript of %s carries another sandbox's bytes: %q", id, b)
				}
			}
			return nil
		})
	}
	require.NoError(t, g.Wait())
}

func TestModel_Shutdown_EndsWaitingRelayCallsAndClaimsWith503(t *testing.T) {
	// The relay timeout and the trainer's wait are far longer than the
	// shutdown deadline: before the gateway drained them, Shutdown waited
	// for them and failed.
	pools := []warmpool.PoolConfig{{Name: "slow", Options: map[string]string{modelservice.OptionTimeout: "600"}}}
	e := startRelay(t, pools, nil, modelservice.Config{})
	id, token := e.sandbox("sbx-a", testKey, "slow", nil)
	res := agentCall(context.Background(), e.relayURL(id, "chat/completions"), token, []byte(`{"model":"m"}`))
	var rid string
	eventually(t, func() bool {
		page, _, err := e.svc.Transcript(context.Background(), id, OwnerOf(testKey), "", 10)
		require.NoError(t, err)
		if len(page) == 1 {
			rid = page[0].ID
		}
		return rid != ""
	}, "the agent's call is queued")

	// A trainer long-polls with a filter that matches nothing.
	claimRes := callAsync(context.Background(), http.MethodGet, e.URL+"/v1/model/requests?wait_ms=30000&pool=other", testKey, nil)
	eventually(t, func() bool {
		// Both connections reached the app, and the claim has no answer:
		// its handler waits.
		return e.conns.Served() >= 2 && len(claimRes) == 0
	}, "the trainer's long-poll waits")

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, e.Shutdown(ctx), "shutdown does not wait for the relay's waits")

	for name, got := range map[string]agentResult{"relay call": <-res, "trainer claim": <-claimRes} {
		require.NoError(t, got.err, name)
		assert.Equal(t, http.StatusServiceUnavailable, got.status, "%s: %s", name, got.body)
		d := decodeError(t, got.body)
		assert.Equal(t, "unavailable", d.Code, name)
		assert.Equal(t, "the gateway is shutting down; retry", d.Message, name)
		assert.NotEmpty(t, got.header.Get("Retry-After"), name)
	}
	page, _, err := e.svc.Transcript(context.Background(), id, OwnerOf(testKey), "", 10)
	require.NoError(t, err)
	require.Len(t, page, 1)
	assert.Equal(t, modelservice.StatePending, page[0].State, "the request stays in the broker for another replica")
}

func TestModel_BadInput_MessagesSayWhatIsWrong(t *testing.T) {
	e := startRelay(t, nil, nil, modelservice.Config{})
	id, token := e.sandbox("sbx-a", testKey, "default", nil)
	res := agentCall(context.Background(), e.relayURL(id, "chat/completions"), token, []byte(`{"stream":true}`))
	rid := e.claim(t, testKey, 1, "")[0].ID
	answer := "/v1/model/requests/" + rid + "/response"

	tests := []struct {
		name, method, path, contentType, body string
		message                               string
	}{
		{"malformed answer", http.MethodPost, answer, "application/json", `{"id":`, "body: malformed JSON at byte"},
		{"malformed error answer", http.MethodPost, answer + "?status=500", "application/json", `{"error": }`, "body: malformed JSON at byte"},
		{"answer not an object", http.MethodPost, answer, "application/json", `[1]`, "body: must be a JSON object"},
		{"event stream answer that is JSON", http.MethodPost, answer, "text/event-stream", string(modeltest.ChatCompletion("c", "m", "x")),
			`body: an event stream answer must be server-sent events of "data: ..." lines`},
		{"event stream answer with a stray line", http.MethodPost, answer, "text/event-stream", "data: {}\n\nhello\n\n", "line 3 is \"hello\""},
		{"event stream answer of comments only", http.MethodPost, answer, "text/event-stream", ": hi\n\n", `at least one "data: ..." line`},
		{"wait_ms far too large", http.MethodGet, "/v1/model/requests?wait_ms=99999999", "", "", `wait_ms: must be a whole number between 0 and 30000, got "99999999"`},
		{"wait_ms too large", http.MethodGet, "/v1/model/requests?wait_ms=40000", "", "", `wait_ms: must be a whole number between 0 and 30000, got "40000"`},
		{"wait_ms negative", http.MethodGet, "/v1/model/requests?wait_ms=-1", "", "", `wait_ms: must be a whole number between 0 and 30000`},
		{"wait_ms not a number", http.MethodGet, "/v1/model/requests?wait_ms=soon", "", "", `wait_ms: must be a whole number between 0 and 30000, got "soon"`},
		{"max beyond int64", http.MethodGet, "/v1/model/requests?max=99999999999999999999", "", "", `max: must be a whole number between 1 and 1000`},
		{"max too large", http.MethodGet, "/v1/model/requests?max=1001", "", "", `max: must be a whole number between 1 and 1000`},
		{"transcript limit beyond int64", http.MethodGet, "/v1/sandboxes/" + id + "/model/transcript?limit=99999999999999999999", "", "", `limit: must be a whole number between 1 and 1000`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var body io.Reader
			if tc.body != "" {
				body = strings.NewReader(tc.body)
			}
			resp, b := call(t, tc.method, e.URL+tc.path, testKey, body, "Content-Type", tc.contentType)
			assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "%s", b)
			assert.Contains(t, decodeError(t, b).Message, tc.message)
		})
	}
	stream := "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"ok\"}}]}\r\n\r\n: comment\n\ndata: [DONE]\n\n"
	resp, b := e.respond(t, testKey, rid, "", "text/event-stream", []byte(stream))
	require.Equal(t, http.StatusOK, resp.StatusCode, "a real event stream is accepted: %s", b)
	got := <-res
	require.NoError(t, got.err)
	assert.Equal(t, stream, string(got.body), "delivered verbatim")
}

// The README's trainer answer, curl -d @completion.json, sends curl's
// default Content-Type (a form): it is JSON, as on every JSON route.
func TestModel_Answer_CurlDefaultContentTypeIsJSON(t *testing.T) {
	e := startRelay(t, nil, nil, modelservice.Config{})
	id, token := e.sandbox("sbx-a", testKey, "default", nil)
	res := agentCall(context.Background(), e.relayURL(id, "chat/completions"), token, []byte(`{}`))
	r := e.claim(t, testKey, 1, "")[0]
	resp, b := e.respond(t, testKey, r.ID, "", "application/x-www-form-urlencoded", modeltest.ChatCompletion("c", "m", "from curl"))
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
	got := <-res
	require.NoError(t, got.err)
	assert.Equal(t, http.StatusOK, got.status)
	assert.Contains(t, string(got.body), "from curl")
}
