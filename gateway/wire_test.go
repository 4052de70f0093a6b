package gateway

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/valyala/bytebufferpool"

	"github.com/quarryhq/quarry/api"
	"github.com/quarryhq/quarry/modelservice"
	"github.com/quarryhq/quarry/warmpool"
)

// The JSON below is what the gateway wrote before its wire types moved to
// package api (captured from its own sandbox, wireRequest, wireExchange
// and wireResponse declarations): these tests pin that the gateway's
// answers did not change by a byte, and that the api types read them back.

var wireT0 = time.Date(2025, 3, 4, 5, 6, 7, 890000000, time.UTC)

type fixedClock time.Time

func (c fixedClock) Now() time.Time { return time.Time(c) }

func TestWire_SandboxUnchanged(t *testing.T) {
	g := &Gateway{clock: fixedClock(wireT0.Add(time.Hour))}
	l := warmpool.Lease{ID: "sbx-1", Pool: "default", TaskID: "tsk-1", Owner: "o", State: warmpool.LeaseReleased, Reason: "by owner",
		Generation: 3, AgentURL: "http://10.0.0.1:1", AgentToken: "secret", Labels: map[string]string{"run": "exp1", "a": "b"},
		Env: map[string]string{"A": "1"}, Duration: time.Minute, CreatedAt: wireT0, ExpiresAt: wireT0.Add(time.Minute),
		EndedAt: wireT0.Add(30 * time.Second), Version: 4}
	const want = `{"id":"sbx-1","pool":"default","state":"released","reason":"by owner","generation":3,"created_at":"2025-03-04T05:06:07.89Z","expires_at":"2025-03-04T05:07:07.89Z","ended_at":"2025-03-04T05:06:37.89Z","lease_seconds":60,"labels":{"a":"b","run":"exp1"}}`
	b, err := json.Marshal(g.toSandbox(l))
	require.NoError(t, err)
	assert.Equal(t, want, string(b))

	var back api.Sandbox
	require.NoError(t, json.Unmarshal(b, &back))
	assert.Equal(t, g.toSandbox(l), back)
}

func TestWire_ModelRelayUnchanged(t *testing.T) {
	body := []byte(`{"messages": [ {"role":"user","content":"hi"} ]}`)
	req := modelservice.Request{ID: "r1", LeaseID: "sbx-1", Owner: "o", Pool: "default", Labels: map[string]string{"run": "x"},
		Route: "chat/completions", Stream: true, Body: body, ReceivedAt: wireT0, Deadline: wireT0.Add(10 * time.Minute), Attempt: 2}
	answered := modelservice.Exchange{Request: req, State: modelservice.StateAnswered, Reason: "r", Upstream: "http://u",
		Response:  &modelservice.Response{Status: 200, ContentType: "application/json", Body: []byte(`{"ok": true}`), AnsweredAt: wireT0.Add(time.Second)},
		ClaimedAt: wireT0.Add(500 * time.Millisecond), EndedAt: wireT0.Add(2 * time.Second), Truncated: true}
	pending := modelservice.Exchange{Request: modelservice.Request{ID: "r2", Body: []byte("not json")}, State: modelservice.StatePending}
	tests := []struct {
		name   string
		write  func(*bytebufferpool.ByteBuffer) error
		want   string
		decode any // a pointer to the api type that reads it
		check  func(t *testing.T, v any)
	}{
		{name: "claimed request", write: func(out *bytebufferpool.ByteBuffer) error { return appendClaimed(out, req) },
			want:   `{"id":"r1","sandbox_id":"sbx-1","pool":"default","labels":{"run":"x"},"route":"chat/completions","stream":true,"attempt":2,"received_at":"2025-03-04T05:06:07.89Z","deadline":"2025-03-04T05:16:07.89Z","body":{"messages": [ {"role":"user","content":"hi"} ]}}`,
			decode: &api.ClaimedRequest{},
			check: func(t *testing.T, v any) {
				r := v.(*api.ClaimedRequest)
				assert.Equal(t, modelRequest(req), r.ModelRequest)
				assert.Equal(t, string(body), string(r.Body), "the body byte for byte")
			}},
		{name: "claimed request without labels or body", write: func(out *bytebufferpool.ByteBuffer) error { return appendClaimed(out, modelservice.Request{}) },
			want:   `{"id":"","sandbox_id":"","pool":"","labels":{},"route":"","stream":false,"attempt":0,"received_at":"0001-01-01T00:00:00Z","deadline":"0001-01-01T00:00:00Z","body":""}`,
			decode: &api.ClaimedRequest{},
			check: func(t *testing.T, v any) {
				assert.Equal(t, `""`, string(v.(*api.ClaimedRequest).Body), "an empty body is a JSON string")
			}},
		{name: "answered exchange", write: func(out *bytebufferpool.ByteBuffer) error { return appendExchange(out, answered) },
			want:   `{"id":"r1","sandbox_id":"sbx-1","pool":"default","labels":{"run":"x"},"route":"chat/completions","stream":true,"attempt":2,"received_at":"2025-03-04T05:06:07.89Z","deadline":"2025-03-04T05:16:07.89Z","state":"answered","reason":"r","upstream":"http://u","claimed_at":"2025-03-04T05:06:08.39Z","ended_at":"2025-03-04T05:06:09.89Z","latency_ms":2000,"truncated":true,"request":{"messages": [ {"role":"user","content":"hi"} ]},"response":{"status":200,"content_type":"application/json","answered_at":"2025-03-04T05:06:08.89Z","body":{"ok": true}}}`,
			decode: &api.Exchange{},
			check: func(t *testing.T, v any) {
				ex := v.(*api.Exchange)
				assert.Equal(t, modelRequest(req), ex.ModelRequest)
				assert.Equal(t, "answered", ex.State)
				require.NotNil(t, ex.LatencyMS)
				assert.Equal(t, int64(2000), *ex.LatencyMS)
				assert.Equal(t, string(body), string(ex.Request))
				require.NotNil(t, ex.Response)
				assert.Equal(t, `{"ok": true}`, string(ex.Response.Body))
				assert.True(t, wireT0.Add(time.Second).Equal(ex.Response.AnsweredAt))
			}},
		{name: "pending exchange", write: func(out *bytebufferpool.ByteBuffer) error { return appendExchange(out, pending) },
			want:   `{"id":"r2","sandbox_id":"","pool":"","labels":{},"route":"","stream":false,"attempt":0,"received_at":"0001-01-01T00:00:00Z","deadline":"0001-01-01T00:00:00Z","state":"pending","request":"not json"}`,
			decode: &api.Exchange{},
			check: func(t *testing.T, v any) {
				ex := v.(*api.Exchange)
				assert.Equal(t, `"not json"`, string(ex.Request), "a body that is not JSON is a JSON string")
				assert.Nil(t, ex.Response)
				assert.Nil(t, ex.LatencyMS)
			}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out bytebufferpool.ByteBuffer
			require.NoError(t, tc.write(&out))
			assert.Equal(t, tc.want, string(out.B))
			require.NoError(t, json.Unmarshal(out.B, tc.decode))
			tc.check(t, tc.decode)
		})
	}
}
