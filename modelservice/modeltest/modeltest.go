// Package modeltest holds test doubles of the model relay's outside world,
// shared by the gateway's tests, the end-to-end suite and the relay
// benchmark: an OpenAI-compatible upstream that speaks real OpenAI JSON and
// server-sent events (no model server can run here), and builders of
// completions as a trainer sends them.
//
// It imports only the standard library and the gateway's wire types (api);
// it must not import Quarry's server packages.
package modeltest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/quarryhq/quarry/api"
)

// ChatCompletion returns an OpenAI chat completion whose one choice says
// content.
func ChatCompletion(id, model, content string) []byte {
	b, _ := json.Marshal(map[string]any{
		"id": id, "object": "chat.completion", "created": 1700000000, "model": model,
		"choices": []any{map[string]any{
			"index": 0, "finish_reason": "stop", "logprobs": nil,
			"message": map[string]any{"role": "assistant", "content": content},
		}},
		"usage": map[string]any{"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
	})
	return b
}

// TextCompletion returns an OpenAI (legacy) text completion saying text.
func TextCompletion(id, model, text string) []byte {
	b, _ := json.Marshal(map[string]any{
		"id": id, "object": "text_completion", "created": 1700000000, "model": model,
		"choices": []any{map[string]any{"index": 0, "text": text, "finish_reason": "stop", "logprobs": nil}},
	})
	return b
}

// Upstream is a fake OpenAI-compatible server. POST /chat/completions (at
// any path prefix) answers "echo: <last user message>"; with "stream": true
// it sends one chat.completion.chunk per word, flushed one by one, then
// "data: [DONE]". GET /models lists Model. Safe for concurrent use.
type Upstream struct {
	// Model is the model name it reports (default "upstream-model").
	Model string
	// Hold, when set, is received from after the first streamed chunk is
	// flushed and before the rest is sent: a test closes it once it has
	// seen the first chunk, which proves the relay does not buffer.
	Hold chan struct{}
	// Delay is slept before each answer's first byte (benchmarks: none).
	Delay time.Duration

	mu     sync.Mutex
	auth   []string
	bodies [][]byte
}

// Requests returns the Authorization headers and bodies received so far.
func (u *Upstream) Requests() (auth []string, bodies [][]byte) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.auth...), append([][]byte(nil), u.bodies...)
}

func (u *Upstream) model() string {
	if u.Model == "" {
		return "upstream-model"
	}
	return u.Model
}

// ServeHTTP implements http.Handler.
func (u *Upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/models"):
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"object": "list", "data": []any{
			map[string]any{"id": u.model(), "object": "model", "created": 0, "owned_by": "upstream"}}})
		return
	case r.Method != http.MethodPost || !strings.HasSuffix(r.URL.Path, "/chat/completions"):
		http.Error(w, `{"error":{"message":"not found","type":"invalid_request_error"}}`, http.StatusNotFound)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 64<<20))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	u.mu.Lock()
	u.auth = append(u.auth, r.Header.Get("Authorization"))
	u.bodies = append(u.bodies, body)
	u.mu.Unlock()
	var req struct {
		Stream   bool `json:"stream"`
		Messages []struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"messages"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprintf(w, `{"error":{"message":%q,"type":"invalid_request_error"}}`, err.Error())
		return
	}
	last := ""
	for _, m := range req.Messages {
		if m.Role == "user" {
			last = m.Content
		}
	}
	answer := "echo: " + last
	if u.Delay > 0 {
		time.Sleep(u.Delay)
	}
	if !req.Stream {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(ChatCompletion("chatcmpl-up", u.model(), answer))
		return
	}
	u.stream(w, answer)
}

// stream sends answer as OpenAI chat.completion.chunk events.
func (u *Upstream) stream(w http.ResponseWriter, answer string) {
	fl, _ := w.(http.Flusher)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	send := func(delta map[string]any, finish any) {
		b, _ := json.Marshal(map[string]any{
			"id": "chatcmpl-up", "object": "chat.completion.chunk", "created": 1700000000, "model": u.model(),
			"choices": []any{map[string]any{"index": 0, "delta": delta, "logprobs": nil, "finish_reason": finish}},
		})
		fmt.Fprintf(w, "data: %s\n\n", b)
		if fl != nil {
			fl.Flush()
		}
	}
	send(map[string]any{"role": "assistant", "content": ""}, nil)
	if u.Hold != nil {
		<-u.Hold
	}
	words := strings.SplitAfter(answer, " ")
	for _, word := range words {
		send(map[string]any{"content": word}, nil)
	}
	send(map[string]any{}, "stop")
	fmt.Fprint(w, "data: [DONE]\n\n")
	if fl != nil {
		fl.Flush()
	}
}

// ClaimedRequest is a request as GET /v1/model/requests returns it (the
// gateway's api.ClaimedRequest), with test helpers.
type ClaimedRequest struct {
	api.ClaimedRequest
}

// LastUserMessage returns the content of the last user message of a chat
// request body ("" when there is none).
func (r ClaimedRequest) LastUserMessage() string {
	var body struct {
		Messages []struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"messages"`
	}
	_ = json.Unmarshal(r.Body, &body)
	last := ""
	for _, m := range body.Messages {
		if m.Role == "user" {
			last = m.Content
		}
	}
	return last
}

// Trainer is a minimal client of the trainer side of the relay: claim and
// answer. Safe for concurrent use.
type Trainer struct {
	URL  string // the gateway's base URL
	Key  string // an API key
	HTTP *http.Client
}

func (tr *Trainer) do(req *http.Request) ([]byte, int, error) {
	req.Header.Set("Authorization", "Bearer "+tr.Key)
	c := tr.HTTP
	if c == nil {
		c = http.DefaultClient
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 256<<20))
	return b, resp.StatusCode, err
}

// Claim long-polls for up to max requests, waiting up to wait; query adds
// filters ("&pool=p&label=k=v").
func (tr *Trainer) Claim(wait time.Duration, max int, query string) ([]ClaimedRequest, error) {
	req, err := http.NewRequest(http.MethodGet, fmt.Sprintf("%s/v1/model/requests?wait_ms=%d&max=%d%s", tr.URL, wait.Milliseconds(), max, query), nil)
	if err != nil {
		return nil, err
	}
	b, status, err := tr.do(req)
	if err != nil {
		return nil, fmt.Errorf("claim: %w", err)
	}
	if status != http.StatusOK {
		return nil, fmt.Errorf("claim: status %d: %s", status, b)
	}
	var out api.ClaimedRequests
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, fmt.Errorf("claim: %w", err)
	}
	reqs := make([]ClaimedRequest, len(out.Requests))
	for i, r := range out.Requests {
		reqs[i] = ClaimedRequest{r}
	}
	return reqs, nil
}

// Respond answers rid with body (content type JSON) and status (0: 200),
// and returns the gateway's status and body.
func (tr *Trainer) Respond(rid string, status int, body []byte) (int, []byte, error) {
	url := tr.URL + "/v1/model/requests/" + rid + "/response"
	if status != 0 {
		url += fmt.Sprintf("?status=%d", status)
	}
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	b, code, err := tr.do(req)
	return code, b, err
}
