package boltstore

import (
	"bytes"
	"encoding/binary"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/quarryhq/quarry/warmpool"
)

// Bucket names.
var (
	bucketMeta       = []byte("meta")
	bucketTasks      = []byte("tasks")         // task id → TaskRecord JSON
	bucketTasksPool  = []byte("tasks_by_pool") // lp(pool) id → ""
	bucketTasksReady = []byte("tasks_ready")   // lp(pool) created id → id
	bucketLeases     = []byte("leases")        // lease id → Lease JSON
	bucketOwner      = []byte("leases_owner")  // lp(owner) created id → ""
	bucketExpiry     = []byte("leases_expiry") // expires id → "" (active leases only)
	bucketEnded      = []byte("leases_ended")  // ended id → "" (ended leases only)
	bucketIdem       = []byte("leases_idem")   // lp(owner) key → lease id
	bucketEnv        = []byte("leases_env")    // lease id → env JSON (kept apart from the lease)
	bucketLocks      = []byte("locks")         // lock name → lockRecord JSON
	bucketCounts     = []byte("task_counts")   // lp(pool) state → uint64: the pool's tasks in that state
	allBuckets       = [][]byte{bucketMeta, bucketTasks, bucketTasksPool, bucketTasksReady,
		bucketLeases, bucketOwner, bucketExpiry, bucketEnded, bucketIdem, bucketLocks, bucketCounts, bucketEnv,
		bucketPools, bucketPoolsClass, bucketClassCounts}
	keySchema = []byte("schema")
	// keyCounted marks a file whose task_counts bucket counts its tasks (a
	// file made before the counters is counted once, when it opens).
	keyCounted = []byte("counted")
)

// lp length-prefixes s, so that a prefix scan on lp(s) never matches a
// longer string that starts with s.
func lp(s string) []byte {
	b := binary.AppendUvarint(make([]byte, 0, len(s)+2), uint64(len(s)))
	return append(b, s...)
}

// tsKey encodes t as 8 big-endian bytes of Unix nanoseconds (times before
// 1970, and the zero time, encode as 0), so keys sort by time.
func tsKey(t time.Time) []byte {
	var n int64
	if !t.IsZero() && t.Unix() > 0 {
		n = t.UnixNano()
	}
	return binary.BigEndian.AppendUint64(make([]byte, 0, 8), uint64(n))
}

func readyKey(rec warmpool.TaskRecord) []byte {
	return concat(lp(rec.Pool), tsKey(rec.CreatedAt), []byte(rec.ID))
}

func idemKey(owner, key string) []byte { return concat(lp(owner), []byte(key)) }

func countKey(pool string, state warmpool.TaskState) []byte {
	return concat(lp(pool), []byte(state))
}

func concat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

// reverseScan visits the keys with prefix (every key for nil) from the
// last to the first, until visit returns false or an error.
func reverseScan(c *bolt.Cursor, prefix []byte, visit func(k []byte) (bool, error)) error {
	var k []byte
	if upper := prefixEnd(prefix); upper == nil {
		k, _ = c.Last()
	} else if k, _ = c.Seek(upper); k == nil {
		k, _ = c.Last()
	} else {
		k, _ = c.Prev()
	}
	for ; k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Prev() {
		more, err := visit(k)
		if err != nil || !more {
			return err
		}
	}
	return nil
}

// prefixEnd returns the smallest key greater than every key with prefix,
// or nil when there is none (empty prefix, or all 0xff).
func prefixEnd(prefix []byte) []byte {
	end := bytes.Clone(prefix)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] < 0xff {
			end[i]++
			return end[:i+1]
		}
	}
	return nil
}
