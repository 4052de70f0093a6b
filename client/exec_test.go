package client

import (
	"encoding/json"
	"io"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

// With encoding base64 the client hands back the exact bytes, in the JSON
// answer and in every stream event.
func TestClient_Exec_Base64DecodedToExactBytes(t *testing.T) {
	var body agentapi.ExecRequest
	c := newTestClient(t, func(w http.ResponseWriter, r *http.Request) {
		assert.NoError(t, json.NewDecoder(r.Body).Decode(&body))
		_, _ = io.WriteString(w, `{"exit_code":0,"stdout":"AAH/","stderr":"/wA=","truncated":true}`)
	})
	res, err := c.Exec(testCtx(t), "sbx-1", agentapi.ExecRequest{Command: "x", Encoding: agentapi.EncodingBase64, StdinBase64: "AP8="})
	require.NoError(t, err)
	assert.Equal(t, agentapi.ExecRequest{Command: "x", Encoding: agentapi.EncodingBase64, StdinBase64: "AP8="}, body)
	assert.Equal(t, "\x00\x01\xff", res.Stdout)
	assert.Equal(t, "\xff\x00", res.Stderr)
	assert.True(t, res.Truncated)
}

func TestClient_Exec_Base64NotBase64Fails(t *testing.T) {
	c := newTestClient(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, `{"exit_code":0,"stdout":"not base64!"}`)
	})
	_, err := c.Exec(testCtx(t), "sbx-1", agentapi.ExecRequest{Command: "x", Encoding: agentapi.EncodingBase64})
	assert.ErrorContains(t, err, "decode base64 output")
}

func TestClient_ExecStream_Base64DecodedToExactBytes(t *testing.T) {
	c := newTestClient(t, sseHandler(
		"event: stdout\ndata: {\"data\":\"AAH/\"}\n\n",
		"event: stderr\ndata: {\"data\":\"4oI=\"}\n\n", // half of a UTF-8 character
		"event: stdout\ndata: {\"data\":\"\"}\n\n",
		"event: exit\ndata: {\"exit_code\":0,\"truncated\":true}\n\n"))
	s, err := c.ExecStream(testCtx(t), "sbx-1", agentapi.ExecRequest{Command: "x", Encoding: agentapi.EncodingBase64})
	require.NoError(t, err)
	defer s.Close()
	evs, err := drain(s)
	assert.ErrorIs(t, err, io.EOF)
	assert.Equal(t, []ExecEvent{{Type: "stdout", Data: "\x00\x01\xff"}, {Type: "stderr", Data: "\xe2\x82"}, {Type: "stdout"},
		{Type: "exit", Result: agentapi.ExecResult{Truncated: true}}}, evs)

	// Without base64 the data is the agent's text, as it was.
	c = newTestClient(t, sseHandler("event: stdout\ndata: {\"data\":\"AAH/\"}\n\n", "event: exit\ndata: {}\n\n"))
	s, err = c.ExecStream(testCtx(t), "sbx-1", agentapi.ExecRequest{Command: "x"})
	require.NoError(t, err)
	defer s.Close()
	evs, err = drain(s)
	assert.ErrorIs(t, err, io.EOF)
	assert.Equal(t, []ExecEvent{{Type: "stdout", Data: "AAH/"}, {Type: "exit"}}, evs)
}

func TestClient_ExecStream_Base64NotBase64Fails(t *testing.T) {
	c := newTestClient(t, sseHandler("event: stdout\ndata: {\"data\":\"%%%\"}\n\n", "event: exit\ndata: {}\n\n"))
	s, err := c.ExecStream(testCtx(t), "sbx-1", agentapi.ExecRequest{Command: "x", Encoding: agentapi.EncodingBase64})
	require.NoError(t, err)
	defer s.Close()
	_, err = s.Next()
	assert.ErrorContains(t, err, "decode base64 output")
	_, err = s.Next()
	assert.ErrorIs(t, err, io.EOF, "a broken stream is finished")
}
