package gateway

import (
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// liveBytes is the heap and the stacks in use after the pools were emptied.
func liveBytes() uint64 {
	runtime.GC()
	runtime.GC() // pooled objects survive one collection
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse + ms.StackInuse
}

func newTestAgentClients(max int) *agentClients {
	return newAgentClients(Config{MaxAgentClients: max}.WithDefaults(), slog.New(slog.NewTextHandler(io.Discard, nil)))
}

func counterValue(t testing.TB, c prometheus.Counter) float64 {
	var m dto.Metric
	require.NoError(t, c.Write(&m))
	return m.GetCounter().GetValue()
}

func agentURL(i int) string {
	return fmt.Sprintf("http://127.%d.%d.%d:7070", i>>16&255, i>>8&255, i&255+1)
}

// The default holds the agents of 10,000 leases; it held 4,096.
func TestAgentClients_DefaultHoldsTenThousandAgents(t *testing.T) {
	a := newTestAgentClients(0)
	first := make([]*agentClient, 10000)
	for i := range first {
		ac, err := a.get(agentURL(i))
		require.NoError(t, err)
		first[i] = ac
	}
	assert.Equal(t, 10000, a.len())
	assert.Zero(t, counterValue(t, a.dropped))
	for i, want := range first {
		ac, err := a.get(agentURL(i))
		require.NoError(t, err)
		require.Same(t, want, ac, "agent %d is served from the cache", i)
	}
}

// At the limit, an insert drops the least recently used client of its
// shard, counted.
func TestAgentClients_LimitDropsLeastRecentlyUsed(t *testing.T) {
	a := newTestAgentClients(4)
	var same []string // five URLs of one shard
	for i := 0; len(same) < 5; i++ {
		if u := agentURL(i); a.shard(u) == a.shard(agentURL(0)) {
			same = append(same, u)
		}
	}
	got := map[string]*agentClient{}
	for _, u := range same[:4] {
		ac, err := a.get(u)
		require.NoError(t, err)
		got[u] = ac
	}
	_, err := a.get(same[0]) // used again: now same[1] is the least recent
	require.NoError(t, err)
	_, err = a.get(same[4])
	require.NoError(t, err)
	assert.Equal(t, 4, a.len())
	assert.Equal(t, 1.0, counterValue(t, a.dropped))
	for _, u := range []string{same[0], same[2], same[3]} {
		ac, err := a.get(u)
		require.NoError(t, err)
		assert.Same(t, got[u], ac, "%s stays", u)
	}
	ac, err := a.get(same[1])
	require.NoError(t, err)
	assert.NotSame(t, got[same[1]], ac, "the least recently used was dropped and is built again")
	assert.Equal(t, 4, a.len())

	a.evict(same[1])
	a.evict("http://never-cached:1")
	assert.Equal(t, 3, a.len())
	assert.Equal(t, 2.0, counterValue(t, a.dropped), "a lease's end is no drop")
	a.closeIdle()
}

func TestAgentClients_RefusesBadURLs(t *testing.T) {
	a := newTestAgentClients(0)
	for _, u := range []string{"", "ftp://a:1", "http://a:1/path", "http://a:1?q=1", "http://u:p@a:1", "http://"} {
		_, err := a.get(u)
		assert.Error(t, err, "%q", u)
	}
	assert.Zero(t, a.len())
}

// A cached client is small: its memory is in the docs' table of what
// 10,000 cost (docs/BENCHMARKS.md).
func TestAgentClients_MemoryPerClient(t *testing.T) {
	a := newTestAgentClients(0)
	const n = 2000
	before := liveBytes()
	for i := range n {
		_, err := a.get(agentURL(i))
		require.NoError(t, err)
	}
	per := float64(int64(liveBytes())-int64(before)) / n
	runtime.KeepAlive(a)
	t.Logf("%.0f bytes per cached agent client", per)
	assert.Less(t, per, float64(4<<10))
}

// BenchmarkAgentClients_ChurnAtLimit inserts new agents into a full cache:
// the cost of an insert (and its drop) does not grow with the cache.
func BenchmarkAgentClients_ChurnAtLimit(b *testing.B) {
	for _, size := range []int{1 << 10, 16 << 10, 128 << 10} {
		b.Run(fmt.Sprint(size), func(b *testing.B) {
			a := newTestAgentClients(size)
			for i := range size {
				_, _ = a.get(agentURL(i))
			}
			b.ResetTimer()
			for i := range b.N {
				if _, err := a.get(agentURL(size + i%(1<<23))); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
