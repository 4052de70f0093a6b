package modelservice

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/quarryhq/quarry/internal/badinput"
)

// CompletionToSSE turns a whole OpenAI completion (route "chat/completions"
// or "completions") into the server-sent events an OpenAI server streams:
// for chat, per choice a chunk whose delta holds the whole message (tool
// calls numbered by index) and a chunk with its finish_reason; for text
// completions, one chunk per choice; then, with includeUsage and a usage
// in the completion, a chunk with empty choices and the usage; then
// "data: [DONE]". Errors name what is missing from the completion.
func CompletionToSSE(route string, completion []byte, includeUsage bool) ([]byte, error) {
	var c struct {
		ID                json.RawMessage              `json:"id"`
		Created           json.RawMessage              `json:"created"`
		Model             json.RawMessage              `json:"model"`
		SystemFingerprint json.RawMessage              `json:"system_fingerprint"`
		ServiceTier       json.RawMessage              `json:"service_tier"`
		Choices           []map[string]json.RawMessage `json:"choices"`
		Usage             json.RawMessage              `json:"usage"`
	}
	if err := json.Unmarshal(completion, &c); err != nil {
		return nil, fmt.Errorf("parse completion: %w", err)
	}
	if c.Choices == nil {
		return nil, errors.New("the completion has no choices")
	}
	object := "chat.completion.chunk"
	if route == "completions" {
		object = "text_completion"
	}
	head := map[string]json.RawMessage{"object": jsonString(object)}
	for k, v := range map[string]json.RawMessage{"id": c.ID, "created": c.Created, "model": c.Model,
		"system_fingerprint": c.SystemFingerprint, "service_tier": c.ServiceTier} {
		if len(v) > 0 {
			head[k] = v
		}
	}
	var out bytes.Buffer
	emit := func(choices []any, usage json.RawMessage) error {
		chunk := make(map[string]any, len(head)+2)
		for k, v := range head {
			chunk[k] = v
		}
		chunk["choices"] = choices
		if usage != nil {
			chunk["usage"] = usage
		}
		b, err := json.Marshal(chunk)
		if err != nil {
			return fmt.Errorf("encode chunk: %w", err)
		}
		out.WriteString("data: ")
		out.Write(b)
		out.WriteString("\n\n")
		return nil
	}
	for i, ch := range c.Choices {
		index := ch["index"]
		if len(index) == 0 {
			index = json.RawMessage(fmt.Sprint(i))
		}
		finish := ch["finish_reason"]
		if len(finish) == 0 {
			finish = json.RawMessage("null")
		}
		logprobs := ch["logprobs"]
		if len(logprobs) == 0 {
			logprobs = json.RawMessage("null")
		}
		if route == "completions" {
			text := ch["text"]
			if len(text) == 0 {
				text = jsonString("")
			}
			if err := emit([]any{map[string]json.RawMessage{"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}}, nil); err != nil {
				return nil, err
			}
			continue
		}
		delta, err := messageDelta(ch["message"])
		if err != nil {
			return nil, fmt.Errorf("choices[%d].message: %w", i, err)
		}
		if err := emit([]any{map[string]any{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": nil}}, nil); err != nil {
			return nil, err
		}
		if err := emit([]any{map[string]any{"index": index, "delta": map[string]any{}, "finish_reason": finish}}, nil); err != nil {
			return nil, err
		}
	}
	if includeUsage && len(c.Usage) > 0 && string(c.Usage) != "null" {
		if err := emit([]any{}, c.Usage); err != nil {
			return nil, err
		}
	}
	out.WriteString("data: [DONE]\n\n")
	return out.Bytes(), nil
}

// messageDelta turns a chat message into a stream delta: the same fields,
// with nulls dropped and an index on every tool call.
func messageDelta(msg json.RawMessage) (map[string]json.RawMessage, error) {
	if len(msg) == 0 || string(msg) == "null" {
		return nil, errors.New("missing")
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(msg, &m); err != nil {
		return nil, fmt.Errorf("not an object: %w", err)
	}
	delta := make(map[string]json.RawMessage, len(m))
	for k, v := range m {
		if string(v) != "null" {
			delta[k] = v
		}
	}
	if tc, ok := delta["tool_calls"]; ok {
		var calls []map[string]json.RawMessage
		if err := json.Unmarshal(tc, &calls); err != nil {
			return nil, fmt.Errorf("tool_calls: %w", err)
		}
		for i := range calls {
			if _, ok := calls[i]["index"]; !ok {
				calls[i]["index"] = json.RawMessage(fmt.Sprint(i))
			}
		}
		b, err := json.Marshal(calls)
		if err != nil {
			return nil, fmt.Errorf("tool_calls: %w", err)
		}
		delta["tool_calls"] = b
	}
	return delta, nil
}

func jsonString(s string) json.RawMessage {
	b, _ := json.Marshal(s)
	return b
}

// checkEventStream checks that an event stream answer is what an OpenAI
// server streams: "data:" lines (and ":" comments) in events separated by
// blank lines, at least one data line. A *badinput.Error for field "body"
// names the first line that is not.
func checkEventStream(body []byte) error {
	if len(bytes.TrimSpace(body)) == 0 {
		return badinput.New("body", "an event stream answer must not be empty")
	}
	data := false
	for i, line := range bytes.Split(body, []byte("\n")) {
		line = bytes.TrimSuffix(line, []byte("\r"))
		switch {
		case len(line) == 0, line[0] == ':':
		case bytes.HasPrefix(line, []byte("data:")):
			data = true
		default:
			if len(line) > 40 {
				line = append(line[:40:40], "..."...)
			}
			return badinput.New("body", "an event stream answer must be server-sent events of \"data: ...\" lines separated by blank lines; line %d is %q", i+1, line)
		}
	}
	if !data {
		return badinput.New("body", "an event stream answer must hold at least one \"data: ...\" line")
	}
	return nil
}
