package warmpool

import (
	"sync"
	"time"
)

const (
	// maxLeaseCacheTTL bounds Config.LeaseCacheTTL.
	maxLeaseCacheTTL = time.Minute
	// leaseCacheSize bounds how many leases one replica caches.
	leaseCacheSize = 16384
)

// leaseCache keeps active leases that this replica read or wrote recently,
// so that the calls of a busy sandbox (one lease lookup each) do not each
// read the store. It is safe because a cached lease is only ever a way to
// reach an agent, and an ended lease cannot be used through it:
//
//   - an entry is never used past the lease's ExpiresAt (nor past the
//     cache TTL, so another replica's heartbeat is seen within it);
//   - this replica drops (or replaces) the entry whenever it ends or
//     renews the lease (release, reaper, lost task, heartbeat), and keeps
//     it out of the cache while that write is in flight (writeLease);
//   - a lease that another replica ended has had its agent fenced with a
//     higher generation (or its task stopped): a call made with the cached
//     lease's generation gets stale_generation, and a stopped task is
//     unreachable, which makes the gateway ask CheckTask, which reads the
//     store. Both answer 410.
//
// Only active leases are cached. Safe for concurrent use; a TTL <= 0
// disables it.
type leaseCache struct {
	ttl time.Duration // real time; <= 0 disables

	mu      sync.Mutex
	entries map[string]cachedLease
	writing map[string]int // leases this replica is ending or renewing: not cached meanwhile
	writes  uint64         // counts the starts and ends of those writes
}

type cachedLease struct {
	lease Lease
	until time.Time // real (monotonic) time after which the entry is stale
}

func newLeaseCache(ttl time.Duration) *leaseCache {
	return &leaseCache{ttl: ttl, entries: map[string]cachedLease{}, writing: map[string]int{}}
}

// get returns the cached lease id if it is fresh, active, and not expired
// at now (the manager's clock).
func (c *leaseCache) get(id string, now time.Time) (Lease, bool) {
	if c.ttl <= 0 {
		return Lease{}, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[id]
	if !ok {
		return Lease{}, false
	}
	if time.Now().After(e.until) || !now.Before(e.lease.ExpiresAt) || e.lease.State != LeaseActive {
		delete(c.entries, id)
		return Lease{}, false
	}
	return e.lease, true
}

// put caches l if it is active and unexpired at now; otherwise it drops
// any entry for l.ID.
func (c *leaseCache) put(l Lease, now time.Time) {
	c.putRead(l, now, c.reading())
}

// reading returns the mark a store read passes to putRead: taken before
// the read, it tells whether a write of this replica started or ended
// while the read was in flight (its answer may then be older than it).
func (c *leaseCache) reading() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.writes
}

// putRead is put for a lease read from the store since mark (reading): it
// caches nothing if a write started or ended meanwhile.
func (c *leaseCache) putRead(l Lease, now time.Time, mark uint64) {
	if c.ttl <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if l.State != LeaseActive || !now.Before(l.ExpiresAt) || c.writing[l.ID] > 0 || c.writes != mark {
		delete(c.entries, l.ID)
		return
	}
	if _, ok := c.entries[l.ID]; !ok && len(c.entries) >= leaseCacheSize {
		c.evictLocked()
	}
	c.entries[l.ID] = cachedLease{lease: l, until: time.Now().Add(c.ttl)}
}

// writeLease drops lease id and keeps it out of the cache until the
// returned function is called: call it before a write that ends or renews
// the lease, and the function after it, so that no lookup racing the write
// caches what the write replaces. Every later lookup reads the store or
// what the caller puts back.
func (c *leaseCache) writeLease(id string) (done func()) {
	if c.ttl <= 0 {
		return func() {}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.entries, id)
	c.writing[id]++
	c.writes++
	return func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.writes++
		if c.writing[id]--; c.writing[id] <= 0 {
			delete(c.writing, id)
		}
	}
}

// evictLocked makes room: stale entries go, and if none was stale, an
// eighth of the cache (map order is random).
func (c *leaseCache) evictLocked() {
	now := time.Now()
	for id, e := range c.entries {
		if now.After(e.until) {
			delete(c.entries, id)
		}
	}
	for id := range c.entries {
		if len(c.entries) < leaseCacheSize*7/8 {
			return
		}
		delete(c.entries, id)
	}
}
