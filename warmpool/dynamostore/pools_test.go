package dynamostore

import (
	"fmt"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/warmpool"
)

func TestPoolItem_RoundTrip(t *testing.T) {
	tests := []struct {
		name string
		rec  warmpool.PoolRecord
		lack []string
	}{
		{name: "every field", rec: warmpool.PoolRecord{
			Name: "i-abc", Class: "default", Image: "docker.io/library/python:3.11", CPU: 0.25, MemoryMiB: 512, DiskMiB: 2048,
			Digest: "sha256:abc", Ref: "arn:aws:ecs:td/1", State: warmpool.PoolEnded, CreatedAt: t0, LastUsed: t0.Add(time.Minute),
			EndedAt: t0.Add(time.Hour), Acquires: 42, WarmFloor: 3, WarmUntil: t0.Add(2 * time.Hour), Version: 7,
		}},
		{name: "zero fields are absent", rec: warmpool.PoolRecord{Name: "i-b", Class: "c", Image: "img", State: warmpool.PoolActive, Version: 1},
			lack: []string{fCPU, fMemoryMiB, fDiskMiB, fDigest, fRef, fCreatedAt, fLastUsed, fEndedAt, fWarmFloor, fWarmUntil}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			it := poolItem(tc.rec, 8)
			assert.Equal(t, avS("pool#"+tc.rec.Name), it[attrPK])
			assert.Equal(t, avS("@"+tc.rec.Class+"#"+fmt.Sprint(shardOf(tc.rec.Name, 8))), it[attrPoolPK], "listed by class in tasks-by-pool")
			assert.Contains(t, it, fAcquires, "a counter from the start")
			for _, a := range tc.lack {
				assert.NotContains(t, it, a)
			}
			got, err := decodePool(it)
			require.NoError(t, err)
			assert.Equal(t, tc.rec, got)
		})
	}
	_, err := decodePool(item{fClass: avS("c")})
	assert.ErrorContains(t, err, "name", "a record without a name")
	_, err = decodePool(item{fName: avS("x"), fCPU: avS("1")})
	assert.ErrorContains(t, err, "cpu")
}

func TestTaskItem_ClassAndItsShard(t *testing.T) {
	rec := warmpool.TaskRecord{ID: "tsk-c", Pool: "i-a", Class: "c", State: warmpool.TaskLaunching, Version: 1}
	it := taskItem(rec, 8, 3, 5)
	assert.Equal(t, avN(5), it[attrGShard])
	got, err := decodeTask(it)
	require.NoError(t, err)
	assert.Equal(t, rec, got, "the class is part of the record")
	assert.NotContains(t, taskItem(warmpool.TaskRecord{ID: "tsk-p", Pool: "p"}, 8, 3, -1), attrGShard, "no class, no class shard")
}

// placed returns a counter whose records are placed in shards.
func placed(what string, maxTotal int, pk func(int) string, shards ...int) *shardedCount {
	c := newShardedCount(what, maxTotal, pk)
	c.shards = shards
	return c
}

func TestReserveItems_ClassReservation(t *testing.T) {
	cfg := Config{TasksTable: "tasks"}.WithDefaults()
	recs := []warmpool.TaskRecord{{ID: "tsk-1", Class: "c"}, {ID: "tsk-2", Class: "c"}}
	own := []int{shardOf("tsk-1", cfg.Shards), shardOf("tsk-2", cfg.Shards)}
	capacity := placed(`pool "i-a"`, 10, func(i int) string { return capPK("i-a", i) }, 0, 0)
	class := placed(`class "c"`, 20, func(i int) string { return classCapPK("c", i) }, 1, 2)
	class.class = "c"
	items, roles := reserveItems(cfg, "i-a", recs, own, []*shardedCount{capacity, class})
	require.Len(t, roles, len(items))

	var puts, checks, poolShards, classShards int
	for i, it := range items {
		switch {
		case it.Put != nil:
			puts++
			assert.Equal(t, reserveRole{}, roles[i])
			got, err := decodeTask(it.Put.Item)
			require.NoError(t, err)
			assert.Equal(t, recs[i].ID, got.ID, "reason i names record i")
			assert.Equal(t, "c", got.Class)
			assert.Equal(t, avN(int64(class.shards[i])), it.Put.Item[attrGShard], "the class shard that counts it")
			assert.Equal(t, avN(0), it.Put.Item[attrCShard])
		case it.ConditionCheck != nil:
			checks++
			assert.True(t, roles[i].pool)
			assert.Equal(t, key(poolPK("i-a")), it.ConditionCheck.Key)
			assert.Contains(t, *it.ConditionCheck.ConditionExpression, "#state = ")
			assert.Contains(t, *it.ConditionCheck.ConditionExpression, "#class = ")
			assert.Equal(t, types.ReturnValuesOnConditionCheckFailureAllOld, it.ConditionCheck.ReturnValuesOnConditionCheckFailure)
		case it.Update != nil:
			pk := pkOf(it.Update.Key)
			switch roles[i].counter {
			case capacity:
				poolShards++
				assert.Regexp(t, `^cap#i-a#\d$`, pk)
			case class:
				classShards++
				assert.Regexp(t, `^ccap#c#[12]$`, pk)
				assert.Equal(t, "#max = :v2 AND #room >= :v3", *it.Update.ConditionExpression, "stamped for the class's total, with room")
				assert.Equal(t, avN(20), it.Update.ExpressionAttributeValues[":v2"])
			default:
				t.Fatalf("item %d: an update of no counter", i)
			}
		}
	}
	assert.Equal(t, 2, puts)
	assert.Equal(t, 1, checks, "the pool's record is checked once")
	assert.Equal(t, 2, classShards, "one update per class shard touched")
	assert.GreaterOrEqual(t, poolShards, 1)

	plain, roles := reserveItems(cfg, "p", recs[:1], own[:1], []*shardedCount{placed(`pool "p"`, 10, func(i int) string { return capPK("p", i) }, own[0])})
	assert.Len(t, plain, 2, "ReserveTasks: the record and its shard")
	assert.False(t, roles[1].pool)
}

func TestStampItems_RoomsAddUpToTheTotal(t *testing.T) {
	cfg := Config{TasksTable: "tasks", Shards: 4}.WithDefaults()
	c := newShardedCount(`pool "p"`, 10, func(i int) string { return capPK("p", i) })
	c.read = []counterShard{{n: 3, room: 9, max: 100, stamped: true}, {n: 0}, {n: 1, room: 0, max: 100, stamped: true}, {}}
	items, after := stampItems(cfg, c)
	require.Len(t, items, cfg.Shards, "every shard at once")
	var room int64
	for i, it := range items {
		require.NotNil(t, it.Update)
		assert.Equal(t, key(capPK("p", i)), it.Update.Key)
		assert.Equal(t, "attribute_not_exists(#n) OR #n <= :v2", *it.Update.ConditionExpression, "no shard grew since the read")
		assert.Equal(t, avN(c.read[i].n), it.Update.ExpressionAttributeValues[":v2"])
		assert.True(t, after[i].stamped)
		assert.Equal(t, int64(10), after[i].max)
		assert.Equal(t, c.read[i].n, after[i].n)
		room += after[i].room
	}
	assert.Equal(t, int64(10-4), room, "the counts and the rooms add up to the total")
	assert.True(t, stampedFor(after, 10))
	assert.False(t, stampedFor(c.read, 10))
}

func TestEndPoolItems_ChecksEveryCapacityShard(t *testing.T) {
	cfg := Config{TasksTable: "tasks"}.WithDefaults()
	rec := warmpool.PoolRecord{Name: "i-e", Class: "c", Version: 4}
	items := endPoolItems(cfg, rec, t0)
	require.Len(t, items, 1+cfg.Shards)
	upd := items[0].Update
	require.NotNil(t, upd)
	assert.Equal(t, key(poolPK("i-e")), upd.Key)
	assert.Equal(t, "#version = :v3 AND #state = :v4", *upd.ConditionExpression)
	assert.Equal(t, avN(4), upd.ExpressionAttributeValues[":v3"])
	assert.Equal(t, avS("active"), upd.ExpressionAttributeValues[":v4"])
	assert.Equal(t, types.ReturnValuesOnConditionCheckFailureAllOld, upd.ReturnValuesOnConditionCheckFailure)
	for i, it := range items[1:] {
		require.NotNil(t, it.ConditionCheck, "shard %d", i)
		assert.Equal(t, key(capPK("i-e", i)), it.ConditionCheck.Key)
		assert.Equal(t, "attribute_not_exists(#n) OR #n = :v0", *it.ConditionCheck.ConditionExpression)
	}
}
