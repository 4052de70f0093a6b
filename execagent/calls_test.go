package execagent

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

// postWithCallID posts body to path with a call id and returns the answer's
// status and body once it arrives.
func postWithCallID(t *testing.T, a *testAgent, path, callID string, body any) <-chan [2]any {
	t.Helper()
	b, err := json.Marshal(body)
	require.NoError(t, err)
	req, err := a.client.NewRequest(context.Background(), http.MethodPost, path, bytes.NewReader(b))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(agentapi.HeaderCallID, callID)
	out := make(chan [2]any, 1)
	go func() {
		resp, err := a.client.HTTP.Do(req)
		if err != nil {
			out <- [2]any{0, err.Error()}
			return
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		out <- [2]any{resp.StatusCode, string(raw)}
	}()
	return out
}

// A call canceled by id ends like one whose client left: the command is
// killed (exec) or interrupted (session run, and the session stays usable),
// long before its own timeout.
func TestCalls_CancelByID(t *testing.T) {
	a := newTestAgent(t, nil)
	ctx := context.Background()
	sid := newSession(t, a, agentapi.SessionCreateRequest{})
	tests := []struct {
		name string
		path string
		body any
	}{
		{name: "exec", path: agentapi.RouteExec, body: agentapi.ExecRequest{Command: "sleep 60", TimeoutMS: 120000}},
		{name: "session run", path: "/v1/sessions/" + sid + "/run", body: agentapi.SessionRunRequest{Command: "sleep 60", TimeoutMS: 120000}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := "call-" + tt.name[:4]
			answer := postWithCallID(t, a, tt.path, id, tt.body)
			eventually(t, func() bool { return a.client.CancelCall(ctx, id) == nil }, "call %s never in flight", id)
			select {
			case got := <-answer:
				assert.NotZero(t, got[0], "the call answered: %v", got[1])
			case <-time.After(waitLong):
				t.Fatal("the canceled call did not end")
			}
			err := a.client.CancelCall(ctx, id)
			assert.Equal(t, http.StatusNotFound, apiError(t, err).Status, "a finished call is gone")
		})
	}
	assert.Equal(t, "ok\n", run(t, a, sid, "echo ok", 0).Output, "the session is usable after its run was canceled")
}

func TestCalls_BadAndDuplicateIDs(t *testing.T) {
	a := newTestAgent(t, nil)
	got := <-postWithCallID(t, a, agentapi.RouteExec, "bad id!", agentapi.ExecRequest{Command: "true"})
	assert.Equal(t, http.StatusBadRequest, got[0], got[1])
	assert.Contains(t, got[1], agentapi.HeaderCallID)

	marker := filepath.Join(t.TempDir(), "running")
	first := postWithCallID(t, a, agentapi.RouteExec, "dup", agentapi.ExecRequest{Command: "touch " + marker + "; sleep 60"})
	eventually(t, func() bool { _, err := os.Stat(marker); return err == nil }, "the first call runs")
	dup := <-postWithCallID(t, a, agentapi.RouteExec, "dup", agentapi.ExecRequest{Command: "true"})
	assert.Equal(t, http.StatusConflict, dup[0], "a second call with an id in flight is refused: %v", dup[1])
	require.NoError(t, a.client.CancelCall(context.Background(), "dup"))
	<-first
	err := a.client.CancelCall(context.Background(), "never-seen")
	assert.Equal(t, http.StatusNotFound, apiError(t, err).Status)
}
