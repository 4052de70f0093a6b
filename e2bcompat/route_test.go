package e2bcompat

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/errclass"
)

func TestRouteOf(t *testing.T) {
	long := "sbx-" + strings.Repeat("a", 63-len("49983-sbx-"))
	tests := []struct {
		name           string
		host, id, port string
		want           Target
		routed         bool
		err            string // a 400 naming this
	}{
		{name: "headers", host: "gw:8080", id: "sbx-1", port: "49983", want: Target{ID: "sbx-1", Port: 49983}, routed: true},
		{name: "headers win over the host", host: "8000-sbx-2.e2b.test", id: "sbx-1", port: "49983", want: Target{ID: "sbx-1", Port: 49983}, routed: true},
		{name: "headers on a Quarry-looking host", host: "localhost", id: "sbx-1", port: "8000", want: Target{ID: "sbx-1", Port: 8000}, routed: true},
		{name: "id without port", host: "gw", id: "sbx-1", routed: true, err: HeaderSandboxPort},
		{name: "port without id", host: "gw", port: "49983", routed: true, err: HeaderSandboxID},
		{name: "port 0", host: "gw", id: "sbx-1", port: "0", routed: true, err: HeaderSandboxPort},
		{name: "port 65536", host: "gw", id: "sbx-1", port: "65536", routed: true, err: HeaderSandboxPort},
		{name: "port signed", host: "gw", id: "sbx-1", port: "+80", routed: true, err: HeaderSandboxPort},
		{name: "bad id", host: "gw", id: "../x", port: "80", routed: true, err: HeaderSandboxID},
		{name: "host", host: "49983-sbx-abc.e2b.test", want: Target{ID: "sbx-abc", Port: 49983, ByHost: true}, routed: true},
		{name: "host with port", host: "8000-sbx-abc.e2b.test:443", want: Target{ID: "sbx-abc", Port: 8000, ByHost: true}, routed: true},
		{name: "bare host with port", host: "8000-sbx-abc:8080", want: Target{ID: "sbx-abc", Port: 8000, ByHost: true}, routed: true},
		{name: "split at the first dash", host: "3000-a-b-c.example", want: Target{ID: "a-b-c", Port: 3000, ByHost: true}, routed: true},
		{name: "label of 63", host: "49983-" + long + ".d", want: Target{ID: long, Port: 49983, ByHost: true}, routed: true},
		{name: "label over 63", host: "49983-" + long + "a.d"},
		{name: "port not digits", host: "api-sbx-1.e2b.test"},
		{name: "port 0 in host", host: "0-sbx-1.e2b.test"},
		{name: "port over 65535 in host", host: "70000-sbx-1.e2b.test"},
		{name: "no id", host: "8000-.e2b.test"},
		{name: "no dash", host: "localhost:8080"},
		{name: "ip", host: "127.0.0.1:8080"},
		{name: "ipv6", host: "[::1]:8080"},
		{name: "empty", host: ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, routed, err := RouteOf([]byte(tc.host), []byte(tc.id), []byte(tc.port))
			assert.Equal(t, tc.routed, routed)
			if tc.err != "" {
				require.Error(t, err)
				a := errclass.Of(err)
				assert.Equal(t, 400, a.Status)
				assert.Contains(t, a.Message, tc.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestRouteOf_NotRoutedDoesNotAllocate(t *testing.T) {
	host := []byte("gateway.example:8080")
	n := testing.AllocsPerRun(100, func() {
		_, _, _ = RouteOf(host, nil, nil)
	})
	assert.Zero(t, n)
}
