package agentapi

import (
	"bytes"
	"testing"
)

// FuzzSSEReader reads any bytes as an event stream: it ends, every event it
// returns is within the bound, and it never panics.
func FuzzSSEReader(f *testing.F) {
	f.Add([]byte("event: output\ndata: {\"stream\":\"stdout\"}\n\n: keep-alive\n\n"))
	f.Add([]byte("data: a\ndata: b\r\n\r\nid: 1\nretry: x\n\n"))
	f.Add([]byte("data: cut off"))
	f.Add([]byte("\r\r\n\n:\n" + string(bytes.Repeat([]byte("x"), 300))))
	f.Fuzz(func(t *testing.T, stream []byte) {
		const max = 256
		r := NewSSEReader(bytes.NewReader(stream), max)
		for range len(stream) + 1 {
			ev, err := r.Next()
			if err != nil {
				return
			}
			if len(ev.Data) > max {
				t.Fatalf("an event of %d bytes passed the bound of %d", len(ev.Data), max)
			}
		}
		t.Fatalf("more events than bytes in %q", stream)
	})
}
