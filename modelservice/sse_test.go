package modelservice

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/internal/badinput"
)

// events splits a stream into its data payloads.
func events(t *testing.T, stream []byte) []string {
	t.Helper()
	s := string(stream)
	require.True(t, strings.HasSuffix(s, "data: [DONE]\n\n"), "%q", s)
	var out []string
	for _, ev := range strings.Split(strings.TrimSpace(s), "\n\n") {
		data, ok := strings.CutPrefix(ev, "data: ")
		require.True(t, ok, "%q", ev)
		out = append(out, data)
	}
	return out
}

func TestCompletionToSSE_Shapes(t *testing.T) {
	chat := `{"id":"c1","object":"chat.completion","created":7,"model":"m","system_fingerprint":"fp",
		"choices":[{"index":0,"finish_reason":"tool_calls","message":{"role":"assistant","content":null,
		"tool_calls":[{"id":"t1","type":"function","function":{"name":"ls","arguments":"{}"}}]}}],
		"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}`
	tests := []struct {
		name         string
		route        string
		completion   string
		includeUsage bool
		want         []string
	}{
		{
			name: "chat with a tool call", route: "chat/completions", completion: chat,
			want: []string{
				`{"choices":[{"delta":{"role":"assistant","tool_calls":[{"function":{"arguments":"{}","name":"ls"},"id":"t1","index":0,"type":"function"}]},"finish_reason":null,"index":0,"logprobs":null}],"created":7,"id":"c1","model":"m","object":"chat.completion.chunk","system_fingerprint":"fp"}`,
				`{"choices":[{"delta":{},"finish_reason":"tool_calls","index":0}],"created":7,"id":"c1","model":"m","object":"chat.completion.chunk","system_fingerprint":"fp"}`,
				"[DONE]",
			},
		},
		{
			name: "chat with usage asked for", route: "chat/completions", includeUsage: true,
			completion: `{"id":"c2","choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":"hi"}}],"usage":{"total_tokens":3}}`,
			want: []string{
				`{"choices":[{"delta":{"content":"hi","role":"assistant"},"finish_reason":null,"index":0,"logprobs":null}],"id":"c2","object":"chat.completion.chunk"}`,
				`{"choices":[{"delta":{},"finish_reason":"stop","index":0}],"id":"c2","object":"chat.completion.chunk"}`,
				`{"choices":[],"id":"c2","object":"chat.completion.chunk","usage":{"total_tokens":3}}`,
				"[DONE]",
			},
		},
		{
			name: "text completion", route: "completions",
			completion: `{"id":"t","object":"text_completion","choices":[{"index":0,"text":"abc","finish_reason":"length"}]}`,
			want: []string{
				`{"choices":[{"finish_reason":"length","index":0,"logprobs":null,"text":"abc"}],"id":"t","object":"text_completion"}`,
				"[DONE]",
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, err := CompletionToSSE(tc.route, []byte(tc.completion), tc.includeUsage)
			require.NoError(t, err)
			got := events(t, out)
			require.Len(t, got, len(tc.want))
			for i := range got {
				if tc.want[i] == "[DONE]" {
					assert.Equal(t, "[DONE]", got[i])
					continue
				}
				assert.JSONEq(t, tc.want[i], got[i])
			}
		})
	}
}

func TestCompletionToSSE_RefusesWhatIsNoCompletion(t *testing.T) {
	tests := []struct{ name, body string }{
		{"not JSON", `{`},
		{"no choices", `{"id":"x"}`},
		{"chat choice without a message", `{"choices":[{"index":0}]}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := CompletionToSSE("chat/completions", []byte(tc.body), false)
			assert.Error(t, err)
		})
	}
}

func TestTokens_VerifyOnlyTheLeasesToken(t *testing.T) {
	tok, err := NewTokens([]byte(strings.Repeat("s", MinSecretLen)))
	require.NoError(t, err)
	other, err := NewTokens([]byte(strings.Repeat("t", MinSecretLen)))
	require.NoError(t, err)
	a := tok.Token("sbx-a")
	tests := []struct {
		name  string
		lease string
		token string
		want  bool
	}{
		{"own token", "sbx-a", a, true},
		{"another lease", "sbx-b", a, false},
		{"another secret", "sbx-a", other.Token("sbx-a"), false},
		{"no prefix", "sbx-a", strings.TrimPrefix(a, TokenPrefix), false},
		{"truncated", "sbx-a", a[:len(a)-1], false},
		{"empty", "sbx-a", "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, tok.Verify(tc.lease, tc.token))
		})
	}
	_, err = NewTokens([]byte("short"))
	assert.Error(t, err)
}

func TestNewRequestID_SortsByTimeAndChecks(t *testing.T) {
	a := NewRequestID(mustTime(t, "2030-01-01T00:00:00Z"))
	b := NewRequestID(mustTime(t, "2030-01-01T00:00:01Z"))
	assert.Less(t, a, b)
	require.NoError(t, CheckRequestID(a))
	for _, bad := range []string{"", "mrq-", "mrq-UPPER" + strings.Repeat("a", 23), "sbx-" + a[4:], a + "x"} {
		assert.Error(t, CheckRequestID(bad), bad)
	}
}

func TestConfig_PoolOptionsAndValidate(t *testing.T) {
	tests := []struct {
		name    string
		options map[string]string
		field   string
	}{
		{"timeout not a number", map[string]string{OptionTimeout: "soon"}, "pools[0].options.model.timeout_seconds"},
		{"timeout zero", map[string]string{OptionTimeout: "0"}, "pools[0].options.model.timeout_seconds"},
		{"upstream not http", map[string]string{OptionUpstreamURL: "ftp://x"}, "pools[0].options.model.upstream_url"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(Config{SandboxURL: "http://127.0.0.1:1"}, depsWithPool(t, tc.options))
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.field)
		})
	}
	_, err := New(Config{}, depsWithPool(t, nil))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "QUARRY_SANDBOX_GATEWAY_URL")
	_, err = New(Config{SandboxURL: "http://127.0.0.1:1", Visibility: -1}, depsWithPool(t, nil))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "QUARRY_RELAY_VISIBILITY_TIMEOUT")
	s, err := New(Config{SandboxURL: "http://127.0.0.1:1"}, depsWithPool(t, map[string]string{OptionTimeout: "5"}))
	require.NoError(t, err)
	assert.Equal(t, int64(5), int64(s.pools["p"].timeout.Seconds()))
}

func TestModelsList_IsJSON(t *testing.T) {
	s, err := New(Config{SandboxURL: "http://127.0.0.1:1"}, depsWithPool(t, map[string]string{OptionModelName: "pi"}))
	require.NoError(t, err)
	var out struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	require.NoError(t, json.Unmarshal(s.Models(leaseOf("p")), &out))
	require.Len(t, out.Data, 1)
	assert.Equal(t, "pi", out.Data[0].ID)
}

func TestCheckEventStream(t *testing.T) {
	tests := []struct {
		name string
		body string
		err  string // "" when accepted
	}{
		{name: "data lines", body: "data: {}\n\ndata: [DONE]\n\n"},
		{name: "CRLF and comments", body: ": hi\r\ndata: {}\r\n\r\n"},
		{name: "empty", body: " \n", err: "must not be empty"},
		{name: "JSON", body: `{"choices":[]}`, err: `line 1 is "{\"choices\":[]}"`},
		{name: "event field", body: "event: x\ndata: {}\n\n", err: `line 1 is "event: x"`},
		{name: "comments only", body: ":a\n\n", err: `at least one "data: ..." line`},
		{name: "long line cut", body: "data: {}\n" + strings.Repeat("x", 100), err: `line 2 is "` + strings.Repeat("x", 40) + `..."`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := checkEventStream([]byte(tt.body))
			if tt.err == "" {
				assert.NoError(t, err)
				return
			}
			var bad *badinput.Error
			require.ErrorAs(t, err, &bad)
			assert.Equal(t, "body", bad.Field)
			assert.Contains(t, bad.Message, tt.err)
		})
	}
}
