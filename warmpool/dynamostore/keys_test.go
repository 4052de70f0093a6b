package dynamostore

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestShardOf_StableAndSpread(t *testing.T) {
	const shards, n = 8, 8000
	counts := make([]int, shards)
	for i := range n {
		id := fmt.Sprintf("tsk-%d", i)
		s := shardOf(id, shards)
		require.Equal(t, s, shardOf(id, shards), "the same id lands in the same shard on every call")
		counts[s]++
	}
	for i, c := range counts {
		assert.InDelta(t, n/shards, c, n/shards/5, "shard %d holds %d of %d ids", i, c, n)
	}
}

func TestKeys_NoCollisions(t *testing.T) {
	tests := []struct {
		name string
		a, b string
	}{
		{name: "shard key: pool with # vs shard digits", a: shardKey("a#1", 2), b: shardKey("a", 12)},
		{name: "idempotency: owner/key split", a: idemPK("ab", "c"), b: idemPK("a", "bc")},
		{name: "idempotency: # in owner", a: idemPK("a#b", "c"), b: idemPK("a", "b#c")},
		{name: "capacity: pools", a: capPK("p", 1), b: capPK("p#1", 0)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.NotEqual(t, tc.a, tc.b)
		})
	}
	assert.Equal(t, "task#tsk-1", taskPK("tsk-1"))
	id, ok := idFromPK(leasePK("sbx-1"), prefixLease)
	assert.True(t, ok)
	assert.Equal(t, "sbx-1", id)
	_, ok = idFromPK(taskPK("x"), prefixLease)
	assert.False(t, ok)
}

func TestQuotas_AddUpToMaxTotal(t *testing.T) {
	tests := []struct {
		name     string
		maxTotal int
		shards   int
		want     []int64
	}{
		{name: "fewer than shards", maxTotal: 3, shards: 8, want: []int64{1, 1, 1, 0, 0, 0, 0, 0}},
		{name: "even", maxTotal: 16, shards: 8, want: []int64{2, 2, 2, 2, 2, 2, 2, 2}},
		{name: "remainder first", maxTotal: 10, shards: 4, want: []int64{3, 3, 2, 2}},
		{name: "zero", maxTotal: 0, shards: 2, want: []int64{0, 0}},
		{name: "negative", maxTotal: -1, shards: 2, want: []int64{0, 0}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			q := quotas(tc.maxTotal, tc.shards)
			assert.Equal(t, tc.want, q)
			assert.Equal(t, int64(max(0, tc.maxTotal)), sum(q))
		})
	}
}

func TestAllocate(t *testing.T) {
	tests := []struct {
		name   string
		quota  []int64
		count  []int64
		k      int
		start  int
		want   []int64
		noRoom bool
	}{
		{name: "one shard has room", quota: []int64{2, 2, 2}, count: []int64{2, 1, 2}, k: 1, start: 0, want: []int64{0, 1, 0}},
		{name: "spread over shards from start", quota: []int64{2, 2, 2}, count: []int64{0, 1, 0}, k: 4, start: 1, want: []int64{1, 1, 2}},
		{name: "exactly the room", quota: []int64{1, 1}, count: []int64{0, 0}, k: 2, start: 1, want: []int64{1, 1}},
		{name: "over quota counts as no room", quota: []int64{1, 1}, count: []int64{3, 0}, k: 2, noRoom: true},
		{name: "full", quota: []int64{1, 1}, count: []int64{1, 1}, k: 1, noRoom: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := allocate(tc.quota, tc.count, tc.k, tc.start)
			if tc.noRoom {
				assert.Nil(t, got)
				return
			}
			assert.Equal(t, tc.want, got)
			for i := range got {
				assert.LessOrEqual(t, tc.count[i]+got[i], tc.quota[i], "shard %d stays within its quota", i)
			}
			assert.Equal(t, int64(tc.k), sum(got))
		})
	}
}

func TestAssignShards(t *testing.T) {
	tests := []struct {
		name   string
		quota  []int64
		counts []int64 // nil: not read
		own    []int
		want   []int
	}{
		{name: "blind: each in its own shard", quota: []int64{3, 3, 3}, own: []int{1, 1, 2}, want: []int{1, 1, 2}},
		{name: "blind: a shard's quota cannot hold them", quota: []int64{3, 2, 3}, own: []int{1, 1, 1}, want: nil},
		{name: "own shard while it has room, the rest spread from start", quota: []int64{2, 2, 2}, counts: []int64{0, 1, 2},
			own: []int{1, 1, 2}, want: []int{1, 0, 0}},
		{name: "exactly the room", quota: []int64{1, 1}, counts: []int64{0, 0}, own: []int{0, 0}, want: []int{0, 1}},
		{name: "full", quota: []int64{1, 1}, counts: []int64{1, 1}, own: []int{0}, want: nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := assignShards(tc.quota, tc.counts, tc.own, 0)
			assert.Equal(t, tc.want, got)
			used := make([]int64, len(tc.quota))
			copy(used, tc.counts)
			for _, i := range got {
				used[i]++
			}
			for i := range used {
				assert.LessOrEqual(t, used[i], tc.quota[i], "shard %d stays within its quota", i)
			}
		})
	}
}

func TestPoolKeys_ApartFromTasks(t *testing.T) {
	tests := []struct {
		name string
		a, b string
	}{
		{name: "a class's index key vs a pool's", a: poolIndexKey("c", 1), b: shardKey("c", 1)},
		{name: "a class's counter vs a pool's", a: classCapPK("c", 1), b: capPK("c", 1)},
		{name: "a pool record vs a task", a: poolPK("x"), b: taskPK("x")},
		{name: "class with # vs shard digits", a: classCapPK("a#1", 2), b: classCapPK("a", 12)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.NotEqual(t, tc.a, tc.b)
		})
	}
	assert.Equal(t, []string{"task#a", "task#b"}, ofKind([]string{"task#a", "pool#p", "task#b"}, prefixTask))
	assert.Empty(t, ofKind([]string{"pool#p"}, prefixTask))
}

func TestMaxReserve_FitsOneTransaction(t *testing.T) {
	tests := []struct {
		name   string
		shards int
		want   int
	}{
		{name: "one shard", shards: 1, want: 97},
		{name: "the default", shards: 8, want: 83},
		{name: "the most", shards: maxShards, want: 24},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, MaxReserve(tc.shards))
		})
	}
	// A class reservation of k records touches at most k records, two
	// pool shards per record, the pool's record and one class shard per
	// record; k = MaxReserve fits, one more would not.
	worst := func(k, shards int) int { return k + min(shards, 2*k) + 1 + min(shards, k) }
	for shards := 1; shards <= maxShards; shards++ {
		k := MaxReserve(shards)
		require.Positive(t, k, "%d shards", shards)
		assert.LessOrEqual(t, worst(k, shards), maxTransactItems, "%d shards", shards)
		assert.Greater(t, worst(k+1, shards), maxTransactItems, "%d shards", shards)
	}
}
