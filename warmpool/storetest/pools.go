package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/warmpool"
)

// poolTests are the conformance tests of warmpool.PoolStore (on-demand
// pools and their classes).
func poolTests(opts Options) []struct {
	name string
	fn   func(t *testing.T, s warmpool.Store)
} {
	return []struct {
		name string
		fn   func(t *testing.T, s warmpool.Store)
	}{
		{"Pools_CreateOnceThenConflicts", testPoolCreate},
		{"Pools_UpdateIsVersionedAndKeepsIdentity", testPoolUpdate},
		{"Pools_TouchCountsWithoutAVersion", testPoolTouch},
		{"Pools_EndOnlyWithoutTasks", testPoolEnd},
		{"Pools_DeleteOnlyEnded", testPoolDelete},
		{"Pools_ListPagesByClass", testPoolList},
		{"ReserveClassTasks_WithinPoolAndClassTotals", testReserveClass},
		{"ReserveClassTasks_OnlyForAnActivePool", testReserveClassActive},
		{"ReserveClassTasks_ArgumentsChecked", testReserveClassArgs},
		{"Race_ClassTotalNeverExceeded", func(t *testing.T, s warmpool.Store) { testRaceClassTotal(t, s, opts) }},
		{"Race_EndPoolNeverLeavesTasks", func(t *testing.T, s warmpool.Store) { testRaceEndPool(t, s, opts) }},
	}
}

func newPoolRecord(name, class string) warmpool.PoolRecord {
	return warmpool.PoolRecord{
		Name: name, Class: class, Image: "registry.test/" + name + ":1", CPU: 1, MemoryMiB: 512,
		CreatedAt: base, LastUsed: base,
	}
}

func createPool(t *testing.T, s warmpool.Store, name, class string) warmpool.PoolRecord {
	t.Helper()
	rec, err := s.CreatePool(t.Context(), newPoolRecord(name, class))
	require.NoError(t, err)
	return rec
}

// reserveClass reserves n launching tasks of an on-demand pool.
func reserveClass(t *testing.T, s warmpool.Store, class string, classMax int, pool string, n int) []warmpool.TaskRecord {
	t.Helper()
	recs := make([]warmpool.TaskRecord, n)
	for i := range recs {
		recs[i] = newTask(pool)
	}
	require.NoError(t, s.ReserveClassTasks(t.Context(), class, classMax, pool, 100, recs))
	for i := range recs {
		recs[i].State, recs[i].Version, recs[i].Class = warmpool.TaskLaunching, 1, class
	}
	return recs
}

func countClass(t *testing.T, s warmpool.Store, class string) int {
	t.Helper()
	n, err := s.CountClass(t.Context(), class)
	require.NoError(t, err)
	return n
}

func testPoolCreate(t *testing.T, s warmpool.Store) {
	ctx := t.Context()
	rec := newPoolRecord("i-a", "default")
	rec.Digest, rec.Ref = "sha256:abc", "arn:td/1"
	got, err := s.CreatePool(ctx, rec)
	require.NoError(t, err)
	assert.Equal(t, warmpool.PoolActive, got.State, "a new record is active")
	assert.Equal(t, int64(1), got.Version)
	stored, err := s.GetPool(ctx, "i-a")
	require.NoError(t, err)
	assert.Equal(t, "default", stored.Class)
	assert.Equal(t, rec.Image, stored.Image)
	assert.Equal(t, 512, stored.MemoryMiB)
	assert.Equal(t, "sha256:abc", stored.Digest)
	assert.Equal(t, "arn:td/1", stored.Ref)
	assertTime(t, base, stored.CreatedAt, "created_at")
	assertTime(t, base, stored.LastUsed, "last_used")

	_, err = s.CreatePool(ctx, newPoolRecord("i-a", "other"))
	require.ErrorIs(t, err, warmpool.ErrConflict, "a name is created once")
	again, err := s.GetPool(ctx, "i-a")
	require.NoError(t, err)
	assert.Equal(t, "default", again.Class, "the loser wrote nothing")

	_, err = s.GetPool(ctx, "i-nope")
	require.ErrorIs(t, err, warmpool.ErrNotFound)
}

func testPoolUpdate(t *testing.T, s warmpool.Store) {
	ctx := t.Context()
	rec := createPool(t, s, "i-u", "default")
	rec.Ref = "arn:td/2"
	rec.LastUsed = base.Add(time.Minute)
	got, err := s.UpdatePool(ctx, rec)
	require.NoError(t, err)
	assert.Equal(t, int64(2), got.Version)
	assert.Equal(t, "arn:td/2", got.Ref)

	_, err = s.UpdatePool(ctx, rec) // version 1 again
	require.ErrorIs(t, err, warmpool.ErrConflict, "a stale version")

	other := got
	other.Class = "big"
	_, err = s.UpdatePool(ctx, other)
	require.Error(t, err, "the class never changes")
	ending := got
	ending.State = warmpool.PoolEnded
	_, err = s.UpdatePool(ctx, ending)
	require.Error(t, err, "UpdatePool does not end a pool")

	missing := newPoolRecord("i-missing", "default")
	missing.Version = 1
	_, err = s.UpdatePool(ctx, missing)
	require.ErrorIs(t, err, warmpool.ErrNotFound)

	// LastUsed never goes back; Acquires stay TouchPool's.
	require.NoError(t, s.TouchPool(ctx, "i-u", base.Add(time.Hour), 3))
	older := got
	older.LastUsed, older.Acquires = base, 100
	got, err = s.UpdatePool(ctx, older)
	require.NoError(t, err)
	assertTime(t, base.Add(time.Hour), got.LastUsed, "last_used is the later one")
	assert.Equal(t, int64(3), got.Acquires, "acquires are counted by TouchPool only")
	stored, err := s.GetPool(ctx, "i-u")
	require.NoError(t, err)
	assert.Equal(t, got, stored)
}

func testPoolTouch(t *testing.T, s warmpool.Store) {
	ctx := t.Context()
	rec := createPool(t, s, "i-t", "default")
	require.NoError(t, s.TouchPool(ctx, "i-t", base.Add(time.Minute), 2))
	require.NoError(t, s.TouchPool(ctx, "i-t", base.Add(30*time.Second), 5)) // an older batch arrives late
	got, err := s.GetPool(ctx, "i-t")
	require.NoError(t, err)
	assert.Equal(t, int64(7), got.Acquires)
	assertTime(t, base.Add(time.Minute), got.LastUsed, "last_used is the latest")
	assert.Equal(t, rec.Version, got.Version, "a touch leaves the version alone")
	require.ErrorIs(t, s.TouchPool(ctx, "i-none", base, 1), warmpool.ErrNotFound)

	var wg sync.WaitGroup
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			assert.NoError(t, s.TouchPool(context.Background(), "i-t", base, 1))
		}()
	}
	wg.Wait()
	got, err = s.GetPool(ctx, "i-t")
	require.NoError(t, err)
	assert.Equal(t, int64(23), got.Acquires, "concurrent touches add up")
}

func testPoolEnd(t *testing.T, s warmpool.Store) {
	ctx := t.Context()
	rec := createPool(t, s, "i-e", "default")
	recs := reserveClass(t, s, "default", 10, "i-e", 1)
	_, err := s.EndPool(ctx, rec, base.Add(time.Hour))
	require.ErrorIs(t, err, warmpool.ErrConflict, "a pool with a task does not end")
	got, err := s.GetPool(ctx, "i-e")
	require.NoError(t, err)
	assert.Equal(t, warmpool.PoolActive, got.State)

	require.NoError(t, s.DeleteTask(ctx, recs[0]))
	ended, err := s.EndPool(ctx, rec, base.Add(time.Hour))
	require.NoError(t, err)
	assert.Equal(t, warmpool.PoolEnded, ended.State)
	assertTime(t, base.Add(time.Hour), ended.EndedAt, "ended_at")
	assert.Equal(t, rec.Version+1, ended.Version)

	_, err = s.EndPool(ctx, ended, base.Add(time.Hour))
	require.ErrorIs(t, err, warmpool.ErrConflict, "an ended pool does not end again")
	_, err = s.EndPool(ctx, rec, base.Add(time.Hour))
	require.ErrorIs(t, err, warmpool.ErrConflict, "a stale version")

	// An ended pool is made active again by UpdatePool.
	ended.State = warmpool.PoolActive
	ended.EndedAt = time.Time{}
	ended.LastUsed = base.Add(2 * time.Hour)
	active, err := s.UpdatePool(ctx, ended)
	require.NoError(t, err)
	assert.Equal(t, warmpool.PoolActive, active.State)
	assert.True(t, active.EndedAt.IsZero())
	reserveClass(t, s, "default", 10, "i-e", 1)
}

func testPoolDelete(t *testing.T, s warmpool.Store) {
	ctx := t.Context()
	rec := createPool(t, s, "i-d", "default")
	require.ErrorIs(t, s.DeletePool(ctx, rec), warmpool.ErrConflict, "an active pool is not deleted")
	ended, err := s.EndPool(ctx, rec, base)
	require.NoError(t, err)
	require.ErrorIs(t, s.DeletePool(ctx, rec), warmpool.ErrConflict, "a stale version")
	require.NoError(t, s.DeletePool(ctx, ended))
	_, err = s.GetPool(ctx, "i-d")
	require.ErrorIs(t, err, warmpool.ErrNotFound)
	require.NoError(t, s.DeletePool(ctx, ended), "idempotent")
	page, err := s.ListPoolsPage(ctx, "default", "", 10)
	require.NoError(t, err)
	assert.Empty(t, page.Pools, "gone from its class too")
	_, err = s.CreatePool(ctx, newPoolRecord("i-d", "default"))
	require.NoError(t, err, "the name can be made again")
}

func testPoolList(t *testing.T, s warmpool.Store) {
	ctx := t.Context()
	want := map[string]bool{}
	for i := 0; i < 7; i++ {
		name := fmt.Sprintf("i-l%d", i)
		createPool(t, s, name, "a")
		want[name] = true
	}
	createPool(t, s, "i-other", "b")
	seen := map[string]int{}
	cursor := ""
	for pages := 0; ; pages++ {
		require.Less(t, pages, 10, "the walk ends")
		page, err := s.ListPoolsPage(ctx, "a", cursor, 3)
		require.NoError(t, err)
		assert.LessOrEqual(t, len(page.Pools), 3)
		for _, p := range page.Pools {
			assert.Equal(t, "a", p.Class)
			seen[p.Name]++
		}
		if cursor = page.Next; cursor == "" {
			break
		}
	}
	assert.Len(t, seen, len(want))
	for name := range want {
		assert.Equal(t, 1, seen[name], "%s once", name)
	}
	all, err := s.ListPoolsPage(ctx, "", "", 100)
	require.NoError(t, err)
	assert.Len(t, all.Pools, 8, "every class")
	assert.Empty(t, all.Next)
	require.Error(t, func() error { _, err := s.ListPoolsPage(ctx, "a", "", 0); return err }())
}

func testReserveClass(t *testing.T, s warmpool.Store) {
	ctx := t.Context()
	createPool(t, s, "i-x", "c")
	createPool(t, s, "i-y", "c")
	createPool(t, s, "i-z", "other")
	a := reserveClass(t, s, "c", 5, "i-x", 3)
	err := s.ReserveClassTasks(ctx, "c", 5, "i-y", 100, []warmpool.TaskRecord{newTask("i-y"), newTask("i-y"), newTask("i-y")})
	require.ErrorIs(t, err, warmpool.ErrNoCapacity, "3 + 3 pass the class's 5")
	assert.Equal(t, 3, countClass(t, s, "c"), "nothing of the refused reservation")
	reserveClass(t, s, "c", 5, "i-y", 2)
	assert.Equal(t, 5, countClass(t, s, "c"))
	reserveClass(t, s, "other", 5, "i-z", 4) // another class counts apart
	assert.Equal(t, 4, countClass(t, s, "other"))

	err = s.ReserveClassTasks(ctx, "c", 100, "i-x", 3, []warmpool.TaskRecord{newTask("i-x")})
	require.ErrorIs(t, err, warmpool.ErrNoCapacity, "the pool's own max_total holds too")

	got, err := s.GetTask(ctx, a[0].ID)
	require.NoError(t, err)
	assert.Equal(t, "c", got.Class, "records carry their class")
	got = setState(t, s, got, warmpool.TaskReady)
	assert.Equal(t, "c", got.Class, "an update keeps it")
	require.NoError(t, s.DeleteTask(ctx, got))
	assert.Equal(t, 4, countClass(t, s, "c"), "a deleted task is uncounted from its class")
	assertCounts(t, s, "i-x", warmpool.TaskCounts{Launching: 2}, "and from its pool")
	reserveClass(t, s, "c", 5, "i-y", 1)
}

func testReserveClassActive(t *testing.T, s warmpool.Store) {
	ctx := t.Context()
	err := s.ReserveClassTasks(ctx, "c", 10, "i-none", 10, []warmpool.TaskRecord{newTask("i-none")})
	require.ErrorIs(t, err, warmpool.ErrNoCapacity, "no record: no task")
	rec := createPool(t, s, "i-a", "c")
	ended, err := s.EndPool(ctx, rec, base)
	require.NoError(t, err)
	err = s.ReserveClassTasks(ctx, "c", 10, "i-a", 10, []warmpool.TaskRecord{newTask("i-a")})
	require.ErrorIs(t, err, warmpool.ErrNoCapacity, "an ended pool gets no task")
	assert.Equal(t, 0, countClass(t, s, "c"))
	ended.State = warmpool.PoolActive
	_, err = s.UpdatePool(ctx, ended)
	require.NoError(t, err)
	reserveClass(t, s, "c", 10, "i-a", 1)
}

func testReserveClassArgs(t *testing.T, s warmpool.Store) {
	ctx := t.Context()
	createPool(t, s, "i-a", "c")
	task := newTask("i-a")
	task.Class = "c"
	require.Error(t, s.ReserveTasks(ctx, "i-a", 10, []warmpool.TaskRecord{task}), "a record of a class goes through ReserveClassTasks")
	require.Error(t, s.ReserveClassTasks(ctx, "", 10, "i-a", 10, []warmpool.TaskRecord{newTask("i-a")}), "no class")
	require.Error(t, s.ReserveClassTasks(ctx, "c", 0, "i-a", 10, []warmpool.TaskRecord{newTask("i-a")}), "no class total")
	other := newTask("i-a")
	other.Class = "d"
	require.Error(t, s.ReserveClassTasks(ctx, "c", 10, "i-a", 10, []warmpool.TaskRecord{other}), "a record of another class")
	require.Error(t, s.ReserveClassTasks(ctx, "d", 10, "i-a", 10, []warmpool.TaskRecord{newTask("i-a")}), "a pool of another class")
	_, err := s.CreatePool(ctx, warmpool.PoolRecord{Name: "i-b", Class: "c"})
	require.Error(t, err, "a record without an image")
	assertCounts(t, s, "i-a", warmpool.TaskCounts{}, "nothing was reserved")
	assert.Equal(t, 0, countClass(t, s, "c"))
}

// testRaceClassTotal: reservations of many pools of one class, from many
// goroutines (and replicas), never pass the class's total.
func testRaceClassTotal(t *testing.T, s warmpool.Store, opts Options) {
	const classMax, pools = 12, 4
	for i := 0; i < pools; i++ {
		createPool(t, s, fmt.Sprintf("i-r%d", i), "race")
	}
	stores := replicas(t, s, opts)
	attempts := max(4*classMax, opts.RaceClaimers)
	var ok atomic.Int64
	var wg sync.WaitGroup
	for i := 0; i < attempts; i++ {
		wg.Add(1)
		go func(i int, st warmpool.Store) {
			defer wg.Done()
			pool := fmt.Sprintf("i-r%d", i%pools)
			err := st.ReserveClassTasks(context.Background(), "race", classMax, pool, 100, []warmpool.TaskRecord{newTask(pool)})
			switch {
			case err == nil:
				ok.Add(1)
			case !errors.Is(err, warmpool.ErrNoCapacity):
				assert.NoError(t, err)
			}
		}(i, stores[i%len(stores)])
	}
	wg.Wait()
	assert.Equal(t, int64(classMax), ok.Load(), "exactly the class's total")
	assert.Equal(t, classMax, countClass(t, s, "race"))
	total := 0
	for i := 0; i < pools; i++ {
		total += len(mustList(t, s, fmt.Sprintf("i-r%d", i)))
	}
	assert.Equal(t, classMax, total, "records agree with the counter")
}

// testRaceEndPool: EndPool racing reservations of the same pool never
// leaves an ended pool with a task.
func testRaceEndPool(t *testing.T, s warmpool.Store, opts Options) {
	stores := replicas(t, s, opts)
	for round := 0; round < 8; round++ {
		name := fmt.Sprintf("i-end%d", round)
		rec := createPool(t, s, name, "race")
		var wg sync.WaitGroup
		wg.Add(2)
		go func() {
			defer wg.Done()
			_, err := stores[0].EndPool(context.Background(), rec, base)
			if err != nil && !errors.Is(err, warmpool.ErrConflict) {
				assert.NoError(t, err)
			}
		}()
		go func() {
			defer wg.Done()
			st := stores[len(stores)-1]
			err := st.ReserveClassTasks(context.Background(), "race", 100, name, 100, []warmpool.TaskRecord{newTask(name)})
			if err != nil && !errors.Is(err, warmpool.ErrNoCapacity) {
				assert.NoError(t, err)
			}
		}()
		wg.Wait()
		got, err := s.GetPool(t.Context(), name)
		require.NoError(t, err)
		n := counts(t, s, name).Total()
		switch got.State {
		case warmpool.PoolEnded:
			assert.Zero(t, n, "round %d: an ended pool has no task", round)
		case warmpool.PoolActive:
			assert.Equal(t, 1, n, "round %d: the reservation won", round)
		}
	}
}
