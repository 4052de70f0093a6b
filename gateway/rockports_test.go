package gateway

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/errclass"
	"github.com/quarryhq/quarry/rockcompat"
)

func TestRockTargetPort(t *testing.T) {
	tests := []struct {
		name         string
		path, header string
		query        string
		port         int
		rest         string
		err          string
	}{
		{name: "path", path: "port/8000/a/b", port: 8000, rest: "/a/b"},
		{name: "path without rest", path: "port/8000", port: 8000, rest: "/"},
		{name: "header", path: "a/b", header: "9000", port: 9000, rest: "/a/b"},
		{name: "query", path: "", query: "9001", port: 9001, rest: "/"},
		{name: "path and header", path: "port/8000/x", header: "9000", err: "multiple sources: path, header X-ROCK-Target-Port"},
		{name: "header and query", header: "1", query: "2", err: "multiple sources"},
		{name: "none", path: "x", err: "name the sandbox port"},
		{name: "bad path port", path: "port/0/x", err: "port"},
		{name: "bad header port", header: "70000", err: "70000"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			port, rest, err := rockTargetPort(tc.path, tc.header, tc.query)
			if tc.err == "" {
				require.NoError(t, err)
				assert.Equal(t, tc.port, port)
				assert.Equal(t, tc.rest, rest)
			} else {
				require.Error(t, err)
				assert.Equal(t, 400, errclass.Of(err).Status)
				assert.Contains(t, err.Error(), tc.err)
			}
		})
	}
}

func TestRockPorts_ProxyForms(t *testing.T) {
	s := newPortSetup(t)
	base := s.gw.URL + rockcompat.Prefix + "/sandboxes/" + s.lease.ID
	forms := []struct {
		name string
		url  string
		hdr  []string
	}{
		{name: "path", url: fmt.Sprintf("%s/proxy/port/%d/echo/x?q=1", base, s.port)},
		{name: "header", url: base + "/proxy/echo/x?q=1", hdr: []string{"X-ROCK-Target-Port", fmt.Sprint(s.port)}},
		{name: "query", url: fmt.Sprintf("%s/proxy/echo/x?q=1&rock_target_port=%d", base, s.port)},
	}
	for _, f := range forms {
		t.Run(f.name, func(t *testing.T) {
			hdr := append([]string{"X-Key", testKey}, f.hdr...)
			resp, b := call(t, http.MethodPost, f.url, "", strings.NewReader("rock body"), hdr...)
			require.Equal(t, http.StatusOK, resp.StatusCode, string(b))
			var e echoed
			require.NoError(t, json.Unmarshal(b, &e))
			assert.Equal(t, "/echo/x", e.Path)
			assert.Equal(t, "q=1", e.Query, "ROCK's port selector is not forwarded")
			assert.Equal(t, "rock body", e.Body)
			for _, h := range []string{"X-Key", "X-Rock-Target-Port", "Authorization"} {
				assert.NotContains(t, e.Headers, h)
			}
		})
	}
	resp, b := call(t, http.MethodGet, fmt.Sprintf("%s/proxy/port/%d/echo/x", base, s.port), "", nil)
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode, "ROCK's auth: %s", b)
	resp, b = call(t, http.MethodGet, fmt.Sprintf("%s/proxy/port/%d/echo/x", base, s.port), otherKey, nil)
	assert.Equal(t, http.StatusNotFound, resp.StatusCode, "another key's sandbox: %s", b)
}
