package gateway

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

// streamExec posts req to the gateway's exec route as an event stream and
// returns the decoded bytes of its stdout and stderr events and the result.
func streamExec(t *testing.T, gw *testGateway, req agentapi.ExecRequest) (stdout, stderr []byte, res agentapi.ExecResult) {
	t.Helper()
	b, err := json.Marshal(req)
	require.NoError(t, err)
	resp := openStream(t, http.MethodPost, gw.URL+"/v1/sandboxes/sbx-1/exec", bytes.NewReader(b),
		"Accept", "text/event-stream", "Content-Type", "application/json")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	st := agentapi.NewEventStream(resp.Body)
	for {
		ev, err := st.Next()
		require.NoError(t, err)
		switch ev.Name {
		case agentapi.EventExit:
			require.NoError(t, ev.Decode(&res))
			_, err := st.Next()
			require.True(t, errors.Is(err, io.EOF), "exit is the last event, got %v", err)
			return stdout, stderr, res
		case agentapi.EventStdout, agentapi.EventStderr:
			var c agentapi.StreamChunk
			require.NoError(t, ev.Decode(&c))
			data, err := agentapi.DecodeOutput(req.Encoding, c.Data)
			require.NoError(t, err)
			if ev.Name == agentapi.EventStdout {
				stdout = append(stdout, data...)
			} else {
				stderr = append(stderr, data...)
			}
		default:
			require.Failf(t, "unexpected event", "%s: %s", ev.Name, ev.Data)
		}
	}
}

// Bytes reach the client exactly through the gateway: base64 output in the
// JSON answer and in stream events, stdin_base64 in.
func TestProxy_ExecBase64ByteExact_RealAgent(t *testing.T) {
	gw, agent, _ := withAgent(t, nil)
	data := make([]byte, 300<<10)
	_, _ = rand.Read(data)
	require.NoError(t, os.WriteFile(filepath.Join(agent.Workdir, "data.bin"), data, 0o644))
	url := gw.URL + "/v1/sandboxes/sbx-1/exec"

	resp, body := callJSON(t, http.MethodPost, url, testKey, agentapi.ExecRequest{
		Command: `printf '\000\001\377'; cat >&2`, StdinBase64: base64.StdEncoding.EncodeToString([]byte{0xff, 0, 0xfe}),
		Encoding: agentapi.EncodingBase64})
	require.Equal(t, http.StatusOK, resp.StatusCode, "body %s", body)
	res := decode[agentapi.ExecResult](t, body)
	assert.Equal(t, base64.StdEncoding.EncodeToString([]byte{0, 1, 0xff}), res.Stdout)
	assert.Equal(t, base64.StdEncoding.EncodeToString([]byte{0xff, 0, 0xfe}), res.Stderr, "stdin_base64 reached the command")

	out, errOut, res := streamExec(t, gw, agentapi.ExecRequest{Command: "cat data.bin; printf '\\377' >&2",
		Encoding: agentapi.EncodingBase64, MaxOutputBytes: 1 << 20})
	assert.True(t, bytes.Equal(data, out), "stdout: %d bytes, want %d", len(out), len(data))
	assert.Equal(t, []byte{0xff}, errOut)
	assert.False(t, res.Truncated)

	out, _, res = streamExec(t, gw, agentapi.ExecRequest{Command: "cat data.bin", Encoding: agentapi.EncodingBase64, MaxOutputBytes: 1000})
	assert.True(t, bytes.Equal(data[:1000], out), "the cap counts bytes: %d, want 1000", len(out))
	assert.True(t, res.Truncated)
}

// unlimited_output streams past the agent's default cap through the
// gateway; the agent's 400s for bad encodings pass through.
func TestProxy_ExecUnlimitedOutputStreams_RealAgent(t *testing.T) {
	gw, _, _ := withAgent(t, nil)
	const n = 3 << 20 // over the agent's default cap (1 MiB)
	out, _, res := streamExec(t, gw, agentapi.ExecRequest{Command: "head -c 3145728 /dev/zero",
		Encoding: agentapi.EncodingBase64, UnlimitedOutput: true})
	assert.True(t, bytes.Equal(make([]byte, n), out), "%d bytes, want %d", len(out), n)
	assert.False(t, res.Truncated)

	for _, req := range []agentapi.ExecRequest{
		{Command: "true", Encoding: "hex"},
		{Command: "true", UnlimitedOutput: true}, // JSON answers are bounded
		{Command: "cat", StdinBase64: "%%%"},
	} {
		resp, body := callJSON(t, http.MethodPost, gw.URL+"/v1/sandboxes/sbx-1/exec", testKey, req)
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "body %s", body)
		assert.Equal(t, agentapi.CodeBadRequest, decodeError(t, body).Code)
	}
}
