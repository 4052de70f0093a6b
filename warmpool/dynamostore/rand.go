package dynamostore

import (
	"math/rand/v2"
	"time"
)

// randIntN returns a uniform int in [0, n) from the runtime's goroutine-safe
// generator.
func randIntN(n int) int { return rand.IntN(n) }

// randSortKey draws a ready task's place in its shard of the ready index
// (a non-negative int64 as a number attribute).
func randSortKey() int64 { return rand.Int64() }

// randDuration returns a uniform duration in [0, d).
func randDuration(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return time.Duration(rand.Int64N(int64(d)))
}

// randPerm returns a random permutation of [0, n).
func randPerm(n int) []int { return rand.Perm(n) }
