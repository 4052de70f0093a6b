package storetest

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/warmpool"
)

func testLock(t *testing.T, s warmpool.Store) {
	ctx := t.Context()
	now := time.Now().UTC().Truncate(time.Millisecond)
	const ttl = 10 * time.Second
	name := "pool/" + uniq("lock")

	ok, err := s.TryLock(ctx, name, "a", ttl, now)
	require.NoError(t, err)
	assert.True(t, ok, "a free lock is taken")
	ok, err = s.TryLock(ctx, name, "b", ttl, now.Add(time.Second))
	require.NoError(t, err)
	assert.False(t, ok, "another holder's unexpired lock stands")
	ok, err = s.TryLock(ctx, name, "a", ttl, now.Add(5*time.Second))
	require.NoError(t, err)
	assert.True(t, ok, "the holder renews")
	ok, err = s.TryLock(ctx, name, "b", ttl, now.Add(12*time.Second))
	require.NoError(t, err)
	assert.False(t, ok, "the renewal moved the expiry")
	ok, err = s.TryLock(ctx, name, "b", ttl, now.Add(16*time.Second))
	require.NoError(t, err)
	assert.True(t, ok, "an expired lock passes to another holder")

	require.NoError(t, s.Unlock(ctx, name, "a"), "unlock by a non-holder is a no-op")
	ok, err = s.TryLock(ctx, name, "a", ttl, now.Add(17*time.Second))
	require.NoError(t, err)
	assert.False(t, ok, "b still holds it")
	require.NoError(t, s.Unlock(ctx, name, "b"))
	require.NoError(t, s.Unlock(ctx, name, "b"), "unlock is idempotent")
	ok, err = s.TryLock(ctx, name, "a", ttl, now.Add(17*time.Second))
	require.NoError(t, err)
	assert.True(t, ok, "a released lock is free")
}

func testRaceLock(t *testing.T, s warmpool.Store, opts Options) {
	ctx := t.Context()
	now := time.Now().UTC()
	name := "pool/" + uniq("race-lock")
	stores := replicas(t, s, opts)
	var held atomic.Int32
	var wg sync.WaitGroup
	for i := range opts.RaceClaimers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ok, err := stores[i%len(stores)].TryLock(ctx, name, fmt.Sprintf("holder-%d", i), time.Minute, now)
			assert.NoError(t, err)
			if ok {
				held.Add(1)
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, int32(1), held.Load(), "exactly one holder wins a free lock")
}
