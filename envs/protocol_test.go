package envs

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/internal/badinput"
)

func TestEncode_Requests(t *testing.T) {
	seed := int64(42)
	tests := []struct {
		name     string
		encode   func() (json.RawMessage, error)
		want     string
		errField string
	}{
		{name: "reset with seed and options", encode: func() (json.RawMessage, error) { return EncodeReset(&seed, json.RawMessage(`{"level": 2}`)) },
			want: `{"op":"reset","seed":42,"options":{"level":2}}`},
		{name: "reset without either", encode: func() (json.RawMessage, error) { return EncodeReset(nil, nil) }, want: `{"op":"reset"}`},
		{name: "reset with non-object options", encode: func() (json.RawMessage, error) { return EncodeReset(nil, json.RawMessage(`[1]`)) }, errField: "options"},
		{name: "step with a string", encode: func() (json.RawMessage, error) { return EncodeStep(json.RawMessage(`"ls -l"`)) }, want: `{"op":"step","action":"ls -l"}`},
		{name: "step with an object", encode: func() (json.RawMessage, error) { return EncodeStep(json.RawMessage(`{"move": [1, 2]}`)) }, want: `{"op":"step","action":{"move":[1,2]}}`},
		{name: "step without action", encode: func() (json.RawMessage, error) { return EncodeStep(nil) }, errField: "action"},
		{name: "step with invalid JSON", encode: func() (json.RawMessage, error) { return EncodeStep(json.RawMessage(`{`)) }, errField: "action"},
		{name: "close", encode: func() (json.RawMessage, error) { return EncodeClose(), nil }, want: `{"op":"close"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.encode()
			if tt.errField != "" {
				var ve *badinput.Error
				require.ErrorAs(t, err, &ve)
				assert.Equal(t, tt.errField, ve.Field)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, string(got))
		})
	}
}

func TestDecodeStepReply(t *testing.T) {
	tests := []struct {
		name     string
		reply    string
		want     StepResult
		kind     Kind
		contains string
	}{
		{name: "full", reply: `{"observation":"o","reward":1.5,"terminated":true,"truncated":false,"info":{"k":1}}`,
			want: StepResult{Observation: json.RawMessage(`"o"`), Reward: 1.5, Terminated: true, Info: json.RawMessage(`{"k":1}`)}},
		{name: "truncated and info absent", reply: `{"observation":null,"reward":0,"terminated":false}`,
			want: StepResult{Observation: json.RawMessage(`null`), Info: json.RawMessage(`{}`)}},
		{name: "extra fields ignored", reply: `{"observation":[1],"reward":-2,"terminated":false,"truncated":true,"debug":"x"}`,
			want: StepResult{Observation: json.RawMessage(`[1]`), Reward: -2, Truncated: true, Info: json.RawMessage(`{}`)}},
		{name: "not an object", reply: `[1,2]`, kind: KindEnv, contains: "must be a JSON object"},
		{name: "no observation", reply: `{"reward":1,"terminated":true}`, kind: KindEnv, contains: "observation is missing"},
		{name: "reward a string", reply: `{"observation":1,"reward":"1","terminated":true}`, kind: KindEnv, contains: "reward must be a number"},
		{name: "reward missing", reply: `{"observation":1,"terminated":true}`, kind: KindEnv, contains: "reward must be a number, got nothing"},
		{name: "reward null", reply: `{"observation":1,"reward":null,"terminated":true}`, kind: KindEnv, contains: "reward must be a number"},
		{name: "terminated a number", reply: `{"observation":1,"reward":1,"terminated":1}`, kind: KindEnv, contains: "terminated must be true or false"},
		{name: "truncated a string", reply: `{"observation":1,"reward":1,"terminated":false,"truncated":"no"}`, kind: KindEnv, contains: "truncated must be"},
		{name: "info a list", reply: `{"observation":1,"reward":1,"terminated":false,"info":[]}`, kind: KindEnv, contains: "info must be a JSON object"},
		{name: "error reply", reply: `{"error":"boom"}`, kind: KindEnv, contains: "boom"},
		{name: "invalid action", reply: `{"error":"bad move","code":"invalid_action"}`, kind: KindInvalidAction, contains: "bad move"},
		{name: "not running", reply: `{"error":"episode over","code":"episode_not_running"}`, kind: KindNotRunning, contains: "episode over"},
		{name: "unknown code", reply: `{"error":"x","code":"weird"}`, kind: KindEnv},
		{name: "error not a string", reply: `{"error":{"m":1}}`, kind: KindEnv, contains: "error must be a string"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := DecodeStepReply(json.RawMessage(tt.reply))
			if tt.kind != "" {
				var ee *Error
				require.ErrorAs(t, err, &ee)
				assert.Equal(t, tt.kind, ee.Kind)
				assert.Contains(t, ee.Message, tt.contains)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestDecodeResetReply(t *testing.T) {
	tests := []struct {
		name  string
		reply string
		want  ResetResult
		kind  Kind
	}{
		{name: "with info", reply: `{"observation":{"board":[0,1]},"info":{"seed":3}}`,
			want: ResetResult{Observation: json.RawMessage(`{"board":[0,1]}`), Info: json.RawMessage(`{"seed":3}`)}},
		{name: "info null", reply: `{"observation":"start","info":null}`,
			want: ResetResult{Observation: json.RawMessage(`"start"`), Info: json.RawMessage(`{}`)}},
		{name: "no observation", reply: `{"info":{}}`, kind: KindEnv},
		{name: "a bare string", reply: `"hello"`, kind: KindEnv},
		{name: "error reply with options refused", reply: `{"error":"bad options","code":"invalid_action"}`, kind: KindInvalidAction},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := DecodeResetReply(json.RawMessage(tt.reply))
			if tt.kind != "" {
				var ee *Error
				require.ErrorAs(t, err, &ee)
				assert.Equal(t, tt.kind, ee.Kind)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}
