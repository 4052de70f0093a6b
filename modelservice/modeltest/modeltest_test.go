package modeltest

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestClaimedRequest_DecodesTheGatewaysJSON(t *testing.T) {
	const b = `{"id":"r1","sandbox_id":"sbx-1","pool":"default","labels":{"run":"x"},"route":"chat/completions","stream":true,"attempt":2,"received_at":"2025-03-04T05:06:07.89Z","deadline":"2025-03-04T05:16:07.89Z","body":{"messages": [ {"role":"user","content":"hi"}, {"role":"assistant","content":"a"}, {"role":"user","content":"last"} ]}}`
	var r ClaimedRequest
	require.NoError(t, json.Unmarshal([]byte(b), &r))
	assert.Equal(t, "r1", r.ID)
	assert.Equal(t, "sbx-1", r.SandboxID)
	assert.Equal(t, "default", r.Pool)
	assert.Equal(t, map[string]string{"run": "x"}, r.Labels)
	assert.Equal(t, "chat/completions", r.Route)
	assert.True(t, r.Stream)
	assert.Equal(t, 2, r.Attempt)
	assert.Equal(t, time.Date(2025, 3, 4, 5, 16, 7, 890000000, time.UTC), r.Deadline)
	assert.Equal(t, `{"messages": [ {"role":"user","content":"hi"}, {"role":"assistant","content":"a"}, {"role":"user","content":"last"} ]}`, string(r.Body))
	assert.Equal(t, "last", r.LastUserMessage())
}
