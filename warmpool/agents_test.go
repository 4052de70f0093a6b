package warmpool_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/warmpool"
)

// agentStub is a real HTTP server speaking the agent's /healthz and /v1/init.
func agentStub(t *testing.T, token string) (*httptest.Server, func() []agentapi.InitRequest) {
	t.Helper()
	var mu sync.Mutex
	var inits []agentapi.InitRequest
	var gen int64
	mux := http.NewServeMux()
	auth := func(w http.ResponseWriter, r *http.Request) bool {
		if r.Header.Get("Authorization") != "Bearer "+token {
			w.WriteHeader(http.StatusUnauthorized)
			_ = json.NewEncoder(w).Encode(agentapi.ErrorBody{Error: agentapi.ErrorDetail{Code: agentapi.CodeUnauthorized, Message: "bad token"}})
			return false
		}
		return true
	}
	mux.HandleFunc("GET "+agentapi.RouteHealth, func(w http.ResponseWriter, r *http.Request) {
		if auth(w, r) {
			mu.Lock()
			defer mu.Unlock()
			_ = json.NewEncoder(w).Encode(agentapi.Health{Status: "ok", Version: agentapi.Version, Generation: gen})
		}
	})
	mux.HandleFunc("POST "+agentapi.RouteInit, func(w http.ResponseWriter, r *http.Request) {
		if !auth(w, r) {
			return
		}
		var req agentapi.InitRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if req.Generation < gen {
			w.WriteHeader(http.StatusConflict)
			_ = json.NewEncoder(w).Encode(agentapi.ErrorBody{Error: agentapi.ErrorDetail{Code: agentapi.CodeStaleGeneration, Message: "stale"}})
			return
		}
		gen = req.Generation
		inits = append(inits, req)
		_ = json.NewEncoder(w).Encode(agentapi.Health{Status: "ok", Version: agentapi.Version, LeaseID: req.LeaseID, Generation: gen})
	})
	srv := httptest.NewServer(mux) // listens on 127.0.0.1
	t.Cleanup(srv.Close)
	return srv, func() []agentapi.InitRequest {
		mu.Lock()
		defer mu.Unlock()
		return append([]agentapi.InitRequest(nil), inits...)
	}
}

func TestHTTPAgents_HealthAndInit(t *testing.T) {
	srv, inits := agentStub(t, "secret")
	a := warmpool.NewHTTPAgents(&http.Client{Timeout: 10 * time.Second})

	h, err := a.Health(t.Context(), srv.URL, "secret")
	require.NoError(t, err)
	assert.Equal(t, "ok", h.Status)

	h, err = a.Init(t.Context(), srv.URL, "secret", agentapi.InitRequest{LeaseID: "sbx-1", Generation: 3, Env: map[string]string{"A": "1"}})
	require.NoError(t, err)
	assert.Equal(t, int64(3), h.Generation)
	require.Len(t, inits(), 1)
	assert.Equal(t, map[string]string{"A": "1"}, inits()[0].Env)

	_, err = a.Init(t.Context(), srv.URL, "secret", agentapi.InitRequest{LeaseID: "sbx-0", Generation: 2})
	var ae *agentapi.Error
	require.ErrorAs(t, err, &ae)
	assert.Equal(t, agentapi.CodeStaleGeneration, ae.Code, "a lower generation is refused")

	_, err = a.Health(t.Context(), srv.URL, "wrong")
	require.ErrorAs(t, err, &ae)
	assert.Equal(t, http.StatusUnauthorized, ae.Status)
}
