package dynamostore

import (
	"hash/fnv"
	"strconv"
	"strings"
)

// Key and index attribute names. Every item of both tables has the string
// partition key attrPK, prefixed by its kind (task#, cap#, pool#, ccap#,
// meta#, lease#, idem#, lock#, env#). Index attributes are present only on
// the items an index should hold (sparse indexes).
const (
	attrPK = "pk"

	// Tasks table indexes.
	attrPoolPK  = "pool_pk"  // index tasks-by-pool: "<pool>#<shard of id>" on every task; "@<class>#<shard of name>" on every pool record
	attrReadyPK = "ready_pk" // index ready-tasks: "<pool>#<shard of id>"; ready tasks only
	attrReadySK = "ready_sk" // a random number drawn when the task becomes ready
	attrCapN    = "n"        // capacity counter item: tasks counted in this shard
	attrRoom    = "room"     // capacity counter item: how many more this shard may count
	attrCapMax  = "max"      // capacity counter item: the total (max_total, a class's) its room was stamped for
	attrCountP  = "c_"       // + state: capacity counter item: tasks in that state whose id hashes to this shard
	attrCShard  = "cshard"   // task: the capacity shard that counts it
	attrGShard  = "gshard"   // task of a class: the shard of its class's counter that counts it
	attrShards  = "shards"   // schema item: Config.Shards the tables were made with

	// Leases table indexes.
	attrOwnerPK  = "owner_pk"  // index leases-by-owner: "<owner>#<shard of id>"; every lease
	attrOwnerSK  = "owner_sk"  // created_at (Unix ns)
	attrExpiryPK = "expiry_pk" // index active-by-expiry: "x#<shard of id>"; active leases only
	attrExpirySK = "expiry_sk" // expires_at (Unix ns)
	attrEndedPK  = "ended_pk"  // index ended-by-time: "e#<shard of id>"; ended leases only
	attrEndedSK  = "ended_sk"  // ended_at (Unix ns)
	attrTTL      = "ttl"       // Unix seconds; DynamoDB's TTL attribute (garbage collection only)

	// Index names.
	indexTasksByPool = "tasks-by-pool"
	indexReady       = "ready-tasks"
	indexByOwner     = "leases-by-owner"
	indexByExpiry    = "active-by-expiry"
	indexByEnd       = "ended-by-time"
)

// Partition key prefixes.
const (
	prefixTask  = "task#"
	prefixCap   = "cap#"
	prefixPool  = "pool#"
	prefixCCap  = "ccap#"
	prefixLease = "lease#"
	prefixIdem  = "idem#"
	prefixLock  = "lock#"
	prefixEnv   = "env#"
	schemaPK    = "meta#schema"
)

func taskPK(id string) string   { return prefixTask + id }
func leasePK(id string) string  { return prefixLease + id }
func lockPK(name string) string { return prefixLock + name }
func envPK(id string) string    { return prefixEnv + id }
func poolPK(name string) string { return prefixPool + name }

// classCapPK is the key of shard shard of class's task counter (the tasks
// of every pool of the class).
func classCapPK(class string, shard int) string { return prefixCCap + shardKey(class, shard) }

// poolIndexKey is a pool record's key in tasks-by-pool: its class's shard
// shard, after '@', which no pool name starts with (warmpool's pool names
// are lowercase letters, digits and '-'), so that a class's records never
// share a partition with a pool's tasks; readers of the index check the
// kind of every key anyway.
func poolIndexKey(class string, shard int) string { return "@" + shardKey(class, shard) }

// capPK is the key of shard shard of pool's capacity counter.
func capPK(pool string, shard int) string { return prefixCap + shardKey(pool, shard) }

// idemPK is the key of owner's idempotency key: the owner is length
// prefixed, so that no (owner, key) pair collides with another.
func idemPK(owner, key string) string {
	return prefixIdem + strconv.Itoa(len(owner)) + "#" + owner + "#" + key
}

// shardKey is the partition key of one shard of a sharded index: a prefix
// (a pool, an owner, or a fixed letter) and the shard number. The number
// is last and never contains '#', so two (prefix, shard) pairs never
// build the same key.
func shardKey(prefix string, shard int) string {
	return prefix + "#" + strconv.Itoa(shard)
}

// shardOf spreads ids evenly over n shards (FNV-1a), the same way on every
// replica.
func shardOf(id string, n int) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(id)) // a hash never fails
	return int(h.Sum32() % uint32(n))
}

// idFromPK strips a kind prefix from a partition key; false when pk is of
// another kind.
func idFromPK(pk, prefix string) (string, bool) {
	return strings.CutPrefix(pk, prefix)
}

// quotas splits maxTotal over n capacity shards: each shard may count at
// most its quota, and the quotas add up to maxTotal, so the pool's total
// stays within maxTotal however the reservations spread.
func quotas(maxTotal, n int) []int64 {
	q := make([]int64, n)
	if maxTotal <= 0 {
		return q
	}
	for i := range q {
		q[i] = int64(maxTotal / n)
		if i < maxTotal%n {
			q[i]++
		}
	}
	return q
}

// countAttr is the attribute of a counter item that counts the tasks in
// state whose ids hash to its shard.
func countAttr(state string) string { return attrCountP + state }

// assignShards picks the capacity shard of each record, given the shards
// its id hashes to (own). Without counts (nil: not read) each record goes
// to its own shard, and nil is returned when some shard's quota cannot
// hold its records. With counts, records go to their own shard while it
// has room and the rest are spread by allocate; nil when the shards
// together have less room than len(own).
func assignShards(quota, counts []int64, own []int, start int) []int {
	used := make([]int64, len(quota))
	if counts != nil {
		copy(used, counts)
	}
	out := make([]int, len(own))
	var spill []int
	for j, h := range own {
		if used[h] < quota[h] {
			used[h]++
			out[j] = h
			continue
		}
		if counts == nil {
			return nil
		}
		spill = append(spill, j)
	}
	if len(spill) == 0 {
		return out
	}
	alloc := allocate(quota, used, len(spill), start)
	if alloc == nil {
		return nil
	}
	for i, a := range alloc {
		for ; a > 0; a-- {
			out[spill[0]] = i
			spill = spill[1:]
		}
	}
	return out
}

// allocate spreads k reservations over the shards with room (quota minus
// count), starting at shard start and wrapping. It returns the count per
// shard, or nil when the shards together have less than k of room.
func allocate(quota, count []int64, k int, start int) []int64 {
	n := len(quota)
	var room int64
	for i := range quota {
		room += max(0, quota[i]-count[i])
	}
	if room < int64(k) {
		return nil
	}
	alloc := make([]int64, n)
	left := int64(k)
	for j := 0; j < n && left > 0; j++ {
		i := (start + j) % n
		take := min(left, max(0, quota[i]-count[i]))
		alloc[i] = take
		left -= take
	}
	return alloc
}
