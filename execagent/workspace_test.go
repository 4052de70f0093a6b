package execagent

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// workspace describes a generated tree: about Bytes of regular files in
// Files files, 32 to a directory.
type workspace struct {
	Files int
	Bytes int64
}

// The benchmark workspaces of issue 14.
var (
	workspace10MB  = workspace{Files: 1000, Bytes: 10 << 20}
	workspace100MB = workspace{Files: 10000, Bytes: 100 << 20}
)

// makeWorkspace writes w below dir, the same tree for the same seed: a
// source-like tree where three files in four are text (lines of words from
// a small vocabulary, compressing about as well as code does) and one in
// four is random bytes (packed git objects, images: incompressible). File
// sizes vary from a tenth to twice the mean.
func makeWorkspace(t testing.TB, dir string, w workspace, seed uint64) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	vocab := make([]string, 4096)
	for i := range vocab {
		n := 2 + rng.IntN(9)
		var b strings.Builder
		for range n {
			b.WriteByte("abcdefghijklmnopqrstuvwxyz_"[rng.IntN(27)])
		}
		vocab[i] = b.String()
	}
	mean := w.Bytes / int64(w.Files)
	var left = w.Bytes
	for i := range w.Files {
		sub := filepath.Join(dir, fmt.Sprintf("d%03d", i/32), fmt.Sprintf("e%d", i%4))
		require.NoError(t, os.MkdirAll(sub, 0o755))
		size := mean/10 + rng.Int64N(mean*19/10+1)
		if i == w.Files-1 {
			size = max(left, 0)
		}
		size = min(size, max(left, 0))
		left -= size
		buf := make([]byte, 0, size)
		if i%4 == 3 {
			buf = buf[:size]
			for j := range buf {
				buf[j] = byte(rng.Uint32())
			}
		} else {
			for int64(len(buf)) < size {
				indent := rng.IntN(4)
				for range indent {
					buf = append(buf, '\t')
				}
				for k := range 3 + rng.IntN(8) {
					if k > 0 {
						buf = append(buf, ' ')
					}
					buf = append(buf, vocab[int(rng.ExpFloat64()*300)%len(vocab)]...)
				}
				buf = append(buf, '\n')
			}
			buf = buf[:size]
		}
		require.NoError(t, os.WriteFile(filepath.Join(sub, fmt.Sprintf("f%05d.txt", i)), buf, 0o644))
	}
}
