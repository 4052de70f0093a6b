package gateway

import (
	"bytes"
	"testing"
)

// FuzzLabelFilter parses any list query's label=k=v values (split at
// '&'): an error, or labels whose keys pass the label-key check; never a
// panic.
func FuzzLabelFilter(f *testing.F) {
	f.Add([]byte("run=r1&team=a=b"))
	f.Add([]byte("=v"))
	f.Add([]byte("k"))
	f.Add([]byte("ok.example/k-1=v&"))
	f.Fuzz(func(t *testing.T, q []byte) {
		labels, err := labelFilter(bytes.Split(q, []byte("&")))
		if err != nil {
			return
		}
		for k := range labels {
			if checkName(k) != nil {
				t.Fatalf("key %q passed the filter: %v", k, checkName(k))
			}
		}
	})
}
