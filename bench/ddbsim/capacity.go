package ddbsim

import (
	"math"
	"time"
)

// Capacity units: a read unit is 4 KB strongly consistent (half for an
// eventually consistent read), a write unit 1 KB; a transaction costs
// twice.
const (
	readUnitBytes  = 4096
	writeUnitBytes = 1024
)

// readUnits is what reading n bytes costs.
func readUnits(n int, consistent bool) float64 {
	u := math.Max(1, math.Ceil(float64(n)/readUnitBytes))
	if !consistent {
		u /= 2
	}
	return u
}

// writeUnits is what writing an item of n bytes costs.
func writeUnits(n int) float64 { return math.Max(1, math.Ceil(float64(n)/writeUnitBytes)) }

// bucket is a token bucket of capacity units that refills at its rate and
// holds at most one second of it. A request may take it below zero (its
// cost is known only after it ran); the next one then waits for the refill.
type bucket struct {
	tokens float64
	last   time.Time
	init   bool
}

// ok refills b and reports whether it has capacity left.
func (b *bucket) ok(rate float64, now time.Time) bool {
	if rate <= 0 {
		return true
	}
	if !b.init {
		b.tokens, b.last, b.init = rate, now, true
	}
	if el := now.Sub(b.last).Seconds(); el > 0 {
		b.tokens = math.Min(rate, b.tokens+el*rate)
		b.last = now
	}
	return b.tokens > 0
}

func (b *bucket) take(rate, units float64, now time.Time) {
	if rate <= 0 {
		return
	}
	b.ok(rate, now)
	b.tokens -= units
}

// full reports whether b has refilled completely by now (nothing to keep).
func (b *bucket) full(rate float64, now time.Time) bool {
	return !b.init || b.tokens+now.Sub(b.last).Seconds()*rate >= rate
}

// buckets are the read and write buckets of a table's or an index's
// partition keys. Idle ones are dropped once there are many, so the map
// grows with the keys in use, not with every key ever seen.
type buckets struct {
	read, write map[string]*bucket
	pruneAt     int
}

func (bs *buckets) get(write bool, henc string) *bucket {
	m := &bs.read
	if write {
		m = &bs.write
	}
	if *m == nil {
		*m = map[string]*bucket{}
	}
	b := (*m)[henc]
	if b == nil {
		b = &bucket{}
		(*m)[henc] = b
	}
	return b
}

// prune drops full buckets when a map has doubled since the last prune:
// amortized O(1) per request.
func (bs *buckets) prune(readRate, writeRate float64, now time.Time) {
	n := len(bs.read) + len(bs.write)
	if n < max(1024, bs.pruneAt) {
		return
	}
	for k, b := range bs.read {
		if b.full(readRate, now) {
			delete(bs.read, k)
		}
	}
	for k, b := range bs.write {
		if b.full(writeRate, now) {
			delete(bs.write, k)
		}
	}
	bs.pruneAt = 2 * (len(bs.read) + len(bs.write))
}
