package gateway

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/quarryhq/quarry/internal/leaktest"
)

// A gateway that proxied commands, streamed one and parked a connection
// stops every goroutine it started when it shuts down (the agents' own are
// ended by their cleanup, within the subtest).
func TestGateway_Shutdown_LeavesNoGoroutine(t *testing.T) {
	defer goleak.VerifyNone(t, append(leaktest.FastHTTP(), goleak.IgnoreCurrent(),
		// net/http's idle client connections to the agents (closed below).
		goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"))...)
	t.Run("serve, then shut down", func(t *testing.T) {
		agent := startAgent(t)
		mgr := newFakeManager(agent.URL)
		mgr.addLease("sbx-1", testKey, agent.URL, 1)
		gw := startGateway(t, mgr, nil)
		for range 3 {
			resp, body := call(t, http.MethodPost, gw.URL+"/v1/sandboxes/sbx-1/exec", testKey, strings.NewReader(`{"command":"echo hi"}`))
			require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
		}
		resp, body := call(t, http.MethodPost, gw.URL+"/v1/sandboxes/sbx-1/exec?stream=true", testKey, strings.NewReader(`{"command":"echo streamed"}`))
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
		http.DefaultClient.CloseIdleConnections()
	})
	http.DefaultClient.CloseIdleConnections()
}
