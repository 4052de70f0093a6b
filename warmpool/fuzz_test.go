package warmpool

import "testing"

// FuzzParsePoolsFile parses any bytes as a pools file: an error, or pools
// that validate and a second parse of nothing else; never a panic.
func FuzzParsePoolsFile(f *testing.F) {
	f.Add([]byte("pools:\n  - name: default\n    image: host\n    min_warm: 2\n    max_total: 8\n"))
	f.Add([]byte(`{"pools":[{"name":"a","image":"x","cpu":0.5,"memory":"256Mi","disk":"1Gi","options":{"user":"1000:1000"}}]}`))
	f.Add([]byte("pools: []\nclasses:\n  - name: c\n    images: [\"docker.io/library/**\"]\n    max_total: 4\n"))
	f.Add([]byte("pools:\n  - name: a\n    image: x\n    memory: 99999999999Ti\n"))
	f.Add([]byte("pools: &a [*a]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		doc, err := ParsePoolsFile(data)
		if err != nil {
			return
		}
		for _, p := range doc.Pools {
			if p.Name == "" {
				t.Fatalf("a pool without a name passed: %+v", p)
			}
		}
	})
}
