package main

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

func TestAgentAddr(t *testing.T) {
	a, err := agentAddr(77, 0, 7070)
	require.NoError(t, err)
	assert.Equal(t, "127.77.0.1:7070", a)
	a, err = agentAddr(77, 9999, 7070)
	require.NoError(t, err)
	assert.Equal(t, "127.77.39.250:7070", a)
	_, err = agentAddr(77, 250*256, 7070)
	assert.Error(t, err)
}

func TestAgentFarm_Protocol(t *testing.T) {
	f, err := newAgentFarm(10)
	require.NoError(t, err)
	addr := &net.TCPAddr{IP: net.IPv4(127, 77, 0, 1), Port: 7070}
	f.byAddr[addr.String()] = &endpoint{token: "tok"}
	call := func(method, path, token, gen, body string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(method, path, strings.NewReader(body))
		r = r.WithContext(contextWithLocalAddr(r, addr))
		if token != "" {
			r.Header.Set("Authorization", "Bearer "+token)
		}
		if gen != "" {
			r.Header.Set(agentapi.HeaderGeneration, gen)
		}
		w := httptest.NewRecorder()
		f.ServeHTTP(w, r)
		return w
	}
	assert.Equal(t, http.StatusUnauthorized, call("GET", "/healthz", "bad", "", "").Code)
	w := call("POST", "/v1/init", "tok", "", `{"lease_id":"l1","generation":3}`)
	require.Equal(t, http.StatusOK, w.Code, w.Body.String())
	var h agentapi.Health
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &h))
	assert.Equal(t, agentapi.Health{Status: "ok", Version: agentapi.Version, LeaseID: "l1", Generation: 3}, h)
	assert.Equal(t, http.StatusConflict, call("POST", "/v1/init", "tok", "", `{"lease_id":"l0","generation":2}`).Code)

	w = call("POST", "/v1/exec", "tok", "3", `{"command":"true"}`)
	require.Equal(t, http.StatusOK, w.Code)
	var res agentapi.ExecResult
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &res))
	assert.Len(t, res.Stdout, 10)
	w = call("POST", "/v1/exec", "tok", "2", `{"command":"true"}`)
	assert.Equal(t, http.StatusConflict, w.Code)
	assert.Contains(t, w.Body.String(), agentapi.CodeStaleGeneration)
	assert.Equal(t, http.StatusNoContent, call("DELETE", "/v1/calls/x", "tok", "3", "").Code)
	assert.Equal(t, http.StatusNotFound, call("GET", "/v1/files", "tok", "3", "").Code)
}

func contextWithLocalAddr(r *http.Request, a net.Addr) context.Context {
	return context.WithValue(r.Context(), http.LocalAddrContextKey, a)
}
