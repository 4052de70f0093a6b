package modelservice

import (
	"net/http"
	"testing"
)

// FuzzRelayBodies reads any bytes as what the relay parses from outside: an
// agent's call (parseCall), a trainer's answer (checkAnswer, checkEventStream)
// and a whole completion turned into the stream an agent asked for
// (CompletionToSSE). Each is an error or a value, never a panic, and a
// completion the relay accepts for a 200 becomes a stream that the relay's
// own check of a streamed answer accepts.
func FuzzRelayBodies(f *testing.F) {
	f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true}}`))
	f.Add([]byte(`{"id":"c1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hello","tool_calls":[{"id":"t","type":"function","function":{"name":"f","arguments":"{}"}}]},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`))
	f.Add([]byte(`{"id":"c2","object":"text_completion","choices":[{"index":0,"text":"x","finish_reason":"length"}]}`))
	f.Add([]byte("data: {\"choices\":[]}\n\ndata: [DONE]\n\n"))
	f.Add([]byte(`{"choices":"not an array"}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, body []byte) {
		_, _ = parseCall(body)
		_ = checkEventStream(body)
		if checkAnswer(http.StatusOK, body) != nil {
			return
		}
		for _, route := range []string{"chat/completions", "completions"} {
			for _, usage := range []bool{false, true} {
				stream, err := CompletionToSSE(route, body, usage)
				if err != nil {
					continue
				}
				if err := checkEventStream(stream); err != nil {
					t.Fatalf("%s (usage %v): the stream made of %q is refused: %v\n%s", route, usage, body, err, stream)
				}
			}
		}
	})
}
