package execagent

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

// echoRPC replies {"got": <request>} to every line and logs to stderr.
const echoRPC = `while IFS= read -r l; do echo "log $l" >&2; printf '{"got":%s}\n' "$l"; done`

func TestProcess_Call_RepliesLineByLineAndKeepsStderrInRing(t *testing.T) {
	a := newTestAgent(t, nil)
	ctx := context.Background()
	p, err := a.client.StartProcess(ctx, agentapi.ProcessStartRequest{Command: echoRPC, Name: "env", RPC: true})
	require.NoError(t, err)
	assert.Equal(t, "env", p.Name)
	assert.True(t, p.RPC)

	for _, id := range []string{p.ID, "env", "env"} {
		res, err := a.client.CallProcess(ctx, id, agentapi.ProcessCallRequest{Request: json.RawMessage(`{"op": "step",
			"n": 1}`)})
		require.NoError(t, err)
		assert.JSONEq(t, `{"got":{"op":"step","n":1}}`, string(res.Reply))
	}
	eventually(t, func() bool {
		out, err := a.client.ProcessOutput(ctx, "env", 0, 0)
		require.NoError(t, err)
		return out.Data == `log {"op":"step","n":1}`+"\n"+`log {"op":"step","n":1}`+"\n"+`log {"op":"step","n":1}`+"\n"
	}, "stderr did not reach the output ring")
	info, err := a.client.GetProcess(ctx, "env")
	require.NoError(t, err)
	assert.Equal(t, p.ID, info.ID)
}

func TestProcess_Start_NameUniqueAmongRunning(t *testing.T) {
	a := newTestAgent(t, nil)
	ctx := context.Background()
	first, err := a.client.StartProcess(ctx, agentapi.ProcessStartRequest{Command: "sleep 100", Name: "svc"})
	require.NoError(t, err)

	_, err = a.client.StartProcess(ctx, agentapi.ProcessStartRequest{Command: "sleep 100", Name: "svc"})
	ae := apiError(t, err)
	assert.Equal(t, http.StatusConflict, ae.Status)
	assert.Equal(t, agentapi.CodeNameInUse, ae.Code)
	assert.Contains(t, ae.Message, first.ID)

	_, err = a.client.SignalProcess(ctx, "svc", "KILL")
	require.NoError(t, err)
	waitProcessExited(t, a, "svc")
	second, err := a.client.StartProcess(ctx, agentapi.ProcessStartRequest{Command: "sleep 100", Name: "svc"})
	require.NoError(t, err, "an exited process's name is free")
	_, err = a.client.GetProcess(ctx, first.ID)
	assert.Equal(t, http.StatusNotFound, apiError(t, err).Status, "the exited process was replaced")

	_, err = a.client.KillProcess(ctx, "svc")
	require.NoError(t, err)
	_, err = a.client.GetProcess(ctx, second.ID)
	assert.Equal(t, http.StatusNotFound, apiError(t, err).Status)
}

func TestProcess_Start_BadName(t *testing.T) {
	a := newTestAgent(t, nil)
	for _, name := range []string{"-x", "proc-1", "a b", "x/y", string(make([]byte, 64))} {
		t.Run(name, func(t *testing.T) {
			_, err := a.client.StartProcess(context.Background(), agentapi.ProcessStartRequest{Command: "true", Name: name})
			ae := apiError(t, err)
			assert.Equal(t, http.StatusBadRequest, ae.Status)
			assert.Contains(t, ae.Message, "name")
		})
	}
}

func TestProcess_Call_Failures(t *testing.T) {
	a := newTestAgent(t, nil)
	ctx := context.Background()
	tests := []struct {
		name     string
		command  string
		req      agentapi.ProcessCallRequest
		status   int
		code     string
		contains []string
	}{
		{name: "exits before replying", command: "read -r l; echo bye >&2; exit 3",
			status: http.StatusConflict, code: agentapi.CodeNoReply, contains: []string{"exit code 3", "bye"}},
		{name: "malformed reply", command: "read -r l; echo oops >&2; echo not json; sleep 100",
			status: http.StatusConflict, code: agentapi.CodeProtocolError, contains: []string{"not json", "oops", "killed"}},
		{name: "oversized reply", command: "read -r l; head -c 3000 /dev/zero | tr '\\0' 7; echo; sleep 100",
			req:    agentapi.ProcessCallRequest{MaxReplyBytes: 1000},
			status: http.StatusConflict, code: agentapi.CodeProtocolError, contains: []string{"over 1000 bytes"}},
		{name: "no reply in time", command: "read -r l; sleep 100",
			req:    agentapi.ProcessCallRequest{TimeoutMS: 300},
			status: http.StatusGatewayTimeout, code: agentapi.CodeTimeout, contains: []string{"killed"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := a.client.StartProcess(ctx, agentapi.ProcessStartRequest{Command: tt.command, RPC: true})
			require.NoError(t, err)
			req := tt.req
			req.Request = json.RawMessage(`{"op":"reset"}`)
			_, err = a.client.CallProcess(ctx, p.ID, req)
			ae := apiError(t, err)
			assert.Equal(t, tt.status, ae.Status)
			assert.Equal(t, tt.code, ae.Code)
			for _, s := range tt.contains {
				assert.Contains(t, ae.Message, s)
			}
			info := waitProcessExited(t, a, p.ID)
			assert.Equal(t, agentapi.ProcessExited, info.State)

			_, err = a.client.CallProcess(ctx, p.ID, req)
			ae = apiError(t, err)
			assert.Equal(t, http.StatusConflict, ae.Status)
			assert.Equal(t, agentapi.CodeProcessExited, ae.Code, "a later call names the exit")
		})
	}
}

func TestProcess_Call_BadRequests(t *testing.T) {
	a := newTestAgent(t, nil)
	ctx := context.Background()
	plain, err := a.client.StartProcess(ctx, agentapi.ProcessStartRequest{Command: "sleep 100", Stdin: true})
	require.NoError(t, err)
	rpc, err := a.client.StartProcess(ctx, agentapi.ProcessStartRequest{Command: echoRPC, RPC: true})
	require.NoError(t, err)
	tests := []struct {
		name   string
		id     string
		req    agentapi.ProcessCallRequest
		status int
		field  string
	}{
		{"not an rpc process", plain.ID, agentapi.ProcessCallRequest{Request: json.RawMessage(`{}`)}, http.StatusConflict, "rpc"},
		{"no request", rpc.ID, agentapi.ProcessCallRequest{}, http.StatusBadRequest, "request"},
		{"negative timeout", rpc.ID, agentapi.ProcessCallRequest{Request: json.RawMessage(`1`), TimeoutMS: -1}, http.StatusBadRequest, "timeout_ms"},
		{"reply limit too big", rpc.ID, agentapi.ProcessCallRequest{Request: json.RawMessage(`1`), MaxReplyBytes: 1 << 40}, http.StatusBadRequest, "max_reply_bytes"},
		{"unknown process", "nope", agentapi.ProcessCallRequest{Request: json.RawMessage(`1`)}, http.StatusNotFound, "nope"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := a.client.CallProcess(ctx, tt.id, tt.req)
			ae := apiError(t, err)
			assert.Equal(t, tt.status, ae.Status)
			assert.Contains(t, ae.Message, tt.field)
		})
	}
	res, err := a.client.CallProcess(ctx, rpc.ID, agentapi.ProcessCallRequest{Request: json.RawMessage(`"still fine"`)})
	require.NoError(t, err)
	assert.JSONEq(t, `{"got":"still fine"}`, string(res.Reply))
}
