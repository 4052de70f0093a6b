package filestore

import (
	"crypto/rand"
	"io"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/internal/stats"
)

// The bytes written through a writeback are the file's, whatever the
// sizes of the writes.
func TestWriteback_WritesEverything(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "wb-")
	require.NoError(t, err)
	defer f.Close()
	data := make([]byte, 3*writebackEvery+12345)
	_, err = rand.Read(data)
	require.NoError(t, err)
	w := newWriteback(f)
	for rest := data; len(rest) > 0; {
		n := min(len(rest), 1<<20+7)
		m, err := w.Write(rest[:n])
		require.NoError(t, err)
		require.Equal(t, n, m)
		rest = rest[n:]
	}
	require.Equal(t, int64(len(data)), w.off)
	require.GreaterOrEqual(t, w.started, int64(3*writebackEvery), "writeback started after each writebackEvery bytes")
	require.Less(t, w.started, int64(3*writebackEvery+(1<<20+7)))
	got, err := os.ReadFile(f.Name())
	require.NoError(t, err)
	require.Equal(t, data, got)
}

// BenchmarkWriteback writes 100 MB to a temp file on disk and fsyncs it,
// plainly and through a writeback, in turns; reported: the whole write,
// and the fsync alone, p50 in ms.
func BenchmarkWriteback(b *testing.B) {
	data := make([]byte, 100<<20)
	_, err := rand.Read(data)
	require.NoError(b, err)
	for _, mode := range []string{"plain", "writeback"} {
		b.Run(mode, func(b *testing.B) {
			var total, syncs []time.Duration
			for b.Loop() {
				f, err := os.CreateTemp(b.TempDir(), "wb-")
				require.NoError(b, err)
				var w io.Writer = struct{ io.Writer }{f}
				if mode == "writeback" {
					w = newWriteback(f)
				}
				t0 := time.Now()
				for off := 0; off < len(data); off += copyBuffer {
					_, err := w.Write(data[off:min(off+copyBuffer, len(data))])
					require.NoError(b, err)
				}
				t1 := time.Now()
				require.NoError(b, f.Sync())
				total, syncs = append(total, time.Since(t0)), append(syncs, time.Since(t1))
				require.NoError(b, f.Close())
				require.NoError(b, os.Remove(f.Name()))
			}
			b.ReportMetric(float64(stats.Percentile(total, 50).Milliseconds()), "p50-ms")
			b.ReportMetric(float64(stats.Percentile(syncs, 50).Milliseconds()), "fsync-p50-ms")
		})
	}
}
