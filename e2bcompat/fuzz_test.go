package e2bcompat

import (
	"strings"
	"testing"
)

// FuzzRouteOf routes any Host and E2B headers: a routed target always
// names a valid id and a port from 1 to 65535, a Host-routed one comes
// from a first label of at most 63 characters, and nothing panics.
func FuzzRouteOf(f *testing.F) {
	f.Add("49983-sbx-abc.e2b.example.com", "", "")
	f.Add("8000-sbx-1:8080", "", "")
	f.Add("gateway:8080", "sbx-1", "49983")
	f.Add("x", "", "70000")
	f.Add("0-a.b", ".hidden", "0")
	f.Fuzz(func(t *testing.T, host, id, port string) {
		target, ok, err := RouteOf([]byte(host), []byte(id), []byte(port))
		if !ok || err != nil {
			return
		}
		if !validID([]byte(target.ID)) || target.Port < 1 || target.Port > 65535 {
			t.Fatalf("routed to %+v", target)
		}
		if target.ByHost {
			label, _, _ := strings.Cut(host, ".")
			label, _, _ = strings.Cut(label, ":")
			if len(label) > maxLabel || !strings.HasSuffix(label, target.ID) {
				t.Fatalf("host %q routed to %+v", host, target)
			}
		}
	})
}

// FuzzMetadataFilter parses any list query's metadata: an error or a
// filter, never a panic.
func FuzzMetadataFilter(f *testing.F) {
	f.Add("owner%3Dalice%26team%3Dx")
	f.Add("a=1&a=2")
	f.Add("%zz")
	f.Fuzz(func(t *testing.T, q string) {
		_, _ = metadataFilter(q)
		_, _ = statesOf(q)
	})
}
