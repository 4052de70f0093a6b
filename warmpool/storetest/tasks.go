package storetest

import (
	"context"
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/warmpool"
)

func testReserveWithinMax(t *testing.T, s warmpool.Store) {
	recs := []warmpool.TaskRecord{newTask("p"), newTask("p")}
	require.NoError(t, s.ReserveTasks(t.Context(), "p", 2, recs))
	got, err := s.ListTasks(t.Context(), "p")
	require.NoError(t, err)
	require.Len(t, got, 2)
	for _, r := range got {
		assert.Equal(t, warmpool.TaskLaunching, r.State)
		assert.Equal(t, "p", r.Pool)
		assert.Positive(t, r.Version)
	}
	assert.ElementsMatch(t, []string{recs[0].ID, recs[1].ID}, []string{got[0].ID, got[1].ID})
}

func testReserveOverMax(t *testing.T, s warmpool.Store) {
	require.NoError(t, s.ReserveTasks(t.Context(), "p", 3, []warmpool.TaskRecord{newTask("p")}))
	err := s.ReserveTasks(t.Context(), "p", 3, []warmpool.TaskRecord{newTask("p"), newTask("p"), newTask("p")})
	require.ErrorIs(t, err, warmpool.ErrNoCapacity)
	assert.Equal(t, 1, tasksByState(t, s, "p")[warmpool.TaskLaunching], "all or none: nothing of the refused batch is created")
	require.NoError(t, s.ReserveTasks(t.Context(), "p", 3, []warmpool.TaskRecord{newTask("p"), newTask("p")}), "exactly max_total fits")
	require.ErrorIs(t, s.ReserveTasks(t.Context(), "p", 3, []warmpool.TaskRecord{newTask("p")}), warmpool.ErrNoCapacity)
}

func testReserveDuplicate(t *testing.T, s warmpool.Store) {
	first := newTask("p")
	require.NoError(t, s.ReserveTasks(t.Context(), "p", 10, []warmpool.TaskRecord{first}))
	err := s.ReserveTasks(t.Context(), "p", 10, []warmpool.TaskRecord{newTask("p"), first})
	require.ErrorIs(t, err, warmpool.ErrConflict)
	assert.Len(t, mustList(t, s, "p"), 1, "all or none: the new record of the refused batch is not created")
}

func testReservePools(t *testing.T, s warmpool.Store) {
	require.NoError(t, s.ReserveTasks(t.Context(), "a", 1, []warmpool.TaskRecord{newTask("a")}))
	require.NoError(t, s.ReserveTasks(t.Context(), "b", 1, []warmpool.TaskRecord{newTask("b")}), "pool b has its own max_total")
	require.ErrorIs(t, s.ReserveTasks(t.Context(), "a", 1, []warmpool.TaskRecord{newTask("a")}), warmpool.ErrNoCapacity)
}

func testUpdateTask(t *testing.T, s warmpool.Store) {
	rec := reserve(t, s, "p", 1)[0]
	rec.ProviderID = "prov-1"
	rec.AgentURL = "http://127.0.0.1:9"
	rec.AgentToken = "secret"
	out, err := s.UpdateTask(t.Context(), rec, warmpool.TaskLaunching)
	require.NoError(t, err)
	assert.Equal(t, rec.Version+1, out.Version)
	assert.Equal(t, "prov-1", out.ProviderID)
	stored := mustList(t, s, "p")
	require.Len(t, stored, 1)
	assert.Equal(t, out.Version, stored[0].Version)
	assert.Equal(t, "secret", stored[0].AgentToken)
}

func testUpdateTaskConflict(t *testing.T, s warmpool.Store) {
	rec := reserve(t, s, "p", 1)[0]
	_ = setState(t, s, rec, warmpool.TaskReady)
	rec.State = warmpool.TaskStopping // rec still carries the old version
	_, err := s.UpdateTask(t.Context(), rec, warmpool.TaskLaunching)
	require.ErrorIs(t, err, warmpool.ErrConflict)
	assert.Equal(t, 1, tasksByState(t, s, "p")[warmpool.TaskReady], "the losing write changed nothing")
}

func testUpdateTaskUnknown(t *testing.T, s warmpool.Store) {
	rec := newTask("p")
	rec.State = warmpool.TaskReady
	rec.Version = 1
	_, err := s.UpdateTask(t.Context(), rec, warmpool.TaskLaunching)
	require.ErrorIs(t, err, warmpool.ErrNotFound)
}

func testUpdateTaskFrom(t *testing.T, s warmpool.Store) {
	rec := reserve(t, s, "p", 1)[0] // launching, version 1
	rec.State = warmpool.TaskStopping
	_, err := s.UpdateTask(t.Context(), rec, warmpool.TaskReady) // the version matches, the state does not
	require.ErrorIs(t, err, warmpool.ErrConflict)
	assert.Equal(t, warmpool.TaskCounts{Launching: 1}, counts(t, s, "p"), "the refused write moved no count")
	stored, err := s.GetTask(t.Context(), rec.ID)
	require.NoError(t, err)
	assert.Equal(t, warmpool.TaskLaunching, stored.State)
	assert.Equal(t, int64(1), stored.Version)
}

func testDeleteTask(t *testing.T, s warmpool.Store) {
	rec := newTask("p")
	require.NoError(t, s.ReserveTasks(t.Context(), "p", 1, []warmpool.TaskRecord{rec}))
	require.NoError(t, s.DeleteTask(t.Context(), rec))
	require.NoError(t, s.DeleteTask(t.Context(), rec), "deleting again is a no-op")
	require.NoError(t, s.DeleteTask(t.Context(), warmpool.TaskRecord{ID: "tsk-unknown", Pool: "p"}))
	assert.Empty(t, mustList(t, s, "p"))
	require.NoError(t, s.ReserveTasks(t.Context(), "p", 1, []warmpool.TaskRecord{newTask("p")}), "the slot is free again")

	readyRec := ready(t, s, "q", 1)[0]
	require.NoError(t, s.DeleteTask(t.Context(), readyRec))
	_, err := s.Claim(t.Context(), warmpool.ClaimRequest{Pool: "q", Lease: newLease("o"), Now: base})
	require.ErrorIs(t, err, warmpool.ErrNoCapacity, "a deleted ready task is not claimable")
}

func testDeleteTaskAnyState(t *testing.T, s warmpool.Store) {
	recs := reserve(t, s, "p", 3)
	readyRec := setState(t, s, recs[1], warmpool.TaskReady)
	stopping := setState(t, s, recs[2], warmpool.TaskStopping)
	seen := readyRec
	seen.State = warmpool.TaskStopping // the caller's view is stale
	require.NoError(t, s.DeleteTask(t.Context(), seen))
	require.NoError(t, s.DeleteTask(t.Context(), recs[0]))
	require.NoError(t, s.DeleteTask(t.Context(), stopping))
	assert.Empty(t, mustList(t, s, "p"))
	assertCounts(t, s, "p", warmpool.TaskCounts{}, "all deleted")
}

func testGetTask(t *testing.T, s warmpool.Store) {
	rec := setState(t, s, reserve(t, s, "p", 1)[0], warmpool.TaskReady)
	got, err := s.GetTask(t.Context(), rec.ID)
	require.NoError(t, err)
	assert.Equal(t, rec.ID, got.ID)
	assert.Equal(t, "p", got.Pool)
	assert.Equal(t, warmpool.TaskReady, got.State)
	assert.Equal(t, rec.Version, got.Version)
	assert.Equal(t, rec.AgentURL, got.AgentURL)
	_, err = s.GetTask(t.Context(), "tsk-unknown")
	require.ErrorIs(t, err, warmpool.ErrNotFound)
}

// testCounts follows one task through its life (and a second pool beside
// it): every write moves the counts, a refused write moves none.
func testCounts(t *testing.T, s warmpool.Store) {
	assertCounts(t, s, "p", warmpool.TaskCounts{}, "empty")
	recs := []warmpool.TaskRecord{newTask("p"), newTask("p"), newTask("p")} // max_total 3 throughout
	require.NoError(t, s.ReserveTasks(t.Context(), "p", 3, recs))
	for i := range recs {
		recs[i].State, recs[i].Version = warmpool.TaskLaunching, 1
	}
	_ = reserve(t, s, "q", 2)
	assertCounts(t, s, "p", warmpool.TaskCounts{Launching: 3}, "reserved")
	assertCounts(t, s, "q", warmpool.TaskCounts{Launching: 2}, "another pool")
	require.ErrorIs(t, s.ReserveTasks(t.Context(), "p", 3, []warmpool.TaskRecord{newTask("p")}), warmpool.ErrNoCapacity)
	assertCounts(t, s, "p", warmpool.TaskCounts{Launching: 3}, "refused reservation")

	a := setState(t, s, recs[0], warmpool.TaskReady)
	b := setState(t, s, recs[1], warmpool.TaskReady)
	assertCounts(t, s, "p", warmpool.TaskCounts{Launching: 1, Ready: 2}, "ready")
	again := recs[0] // stale: version 1, launching
	again.State = warmpool.TaskStopping
	_, err := s.UpdateTask(t.Context(), again, warmpool.TaskLaunching)
	require.ErrorIs(t, err, warmpool.ErrConflict)
	assertCounts(t, s, "p", warmpool.TaskCounts{Launching: 1, Ready: 2}, "refused update")

	res := claim(t, s, "p", newLease("o"))
	assertCounts(t, s, "p", warmpool.TaskCounts{Launching: 1, Ready: 1, Leased: 1}, "claimed")
	byID, err := s.Claim(t.Context(), warmpool.ClaimRequest{Pool: "p", TaskID: recs[2].ID, Lease: newLease("o"), Now: base})
	require.NoError(t, err)
	assertCounts(t, s, "p", warmpool.TaskCounts{Ready: 1, Leased: 2}, "claimed a launching task by id")
	_, err = s.Claim(t.Context(), warmpool.ClaimRequest{Pool: "p", Lease: res.Lease, Now: base})
	require.ErrorIs(t, err, warmpool.ErrConflict)
	assertCounts(t, s, "p", warmpool.TaskCounts{Ready: 1, Leased: 2}, "refused claim")

	_, err = s.EndLease(t.Context(), res.Lease.ID, warmpool.LeaseEnd{State: warmpool.LeaseReleased, Now: base})
	require.NoError(t, err)
	assertCounts(t, s, "p", warmpool.TaskCounts{Ready: 1, Leased: 1, Stopping: 1}, "ended")
	_, err = s.EndLease(t.Context(), res.Lease.ID, warmpool.LeaseEnd{State: warmpool.LeaseReleased, Now: base})
	require.ErrorIs(t, err, warmpool.ErrLeaseEnded)
	assertCounts(t, s, "p", warmpool.TaskCounts{Ready: 1, Leased: 1, Stopping: 1}, "ended twice")

	stopped, err := s.GetTask(t.Context(), res.Lease.TaskID)
	require.NoError(t, err)
	require.NoError(t, s.DeleteTask(t.Context(), stopped))
	require.NoError(t, s.DeleteTask(t.Context(), stopped))
	assertCounts(t, s, "p", warmpool.TaskCounts{Ready: 1, Leased: 1}, "deleted")
	other := a
	if other.ID == res.Lease.TaskID {
		other = b
	}
	require.NoError(t, s.DeleteTask(t.Context(), other))
	_, err = s.EndLease(t.Context(), byID.Lease.ID, warmpool.LeaseEnd{State: warmpool.LeaseLost, Now: base})
	require.NoError(t, err)
	assertCounts(t, s, "p", warmpool.TaskCounts{Stopping: 1}, "one left")
	assertCounts(t, s, "q", warmpool.TaskCounts{Launching: 2}, "the other pool was left alone")
	require.NoError(t, s.ReserveTasks(t.Context(), "p", 3, []warmpool.TaskRecord{newTask("p"), newTask("p")}), "the freed slots count")
}

// testReserveLimit: a store with a ReserveLimiter takes that many records
// in one call and refuses one more, writing nothing.
func testReserveLimit(t *testing.T, s warmpool.Store) {
	l, ok := s.(warmpool.ReserveLimiter)
	if !ok {
		recs := make([]warmpool.TaskRecord, 500)
		for i := range recs {
			recs[i] = newTask("p")
		}
		require.NoError(t, s.ReserveTasks(t.Context(), "p", math.MaxInt32, recs), "a store without a limit takes a large batch")
		assertCounts(t, s, "p", warmpool.TaskCounts{Launching: 500}, "large batch")
		return
	}
	n := l.MaxReserve()
	require.Positive(t, n)
	recs := make([]warmpool.TaskRecord, n+1)
	for i := range recs {
		recs[i] = newTask("p")
	}
	require.Error(t, s.ReserveTasks(t.Context(), "p", math.MaxInt32, recs), "one record more than MaxReserve")
	assertCounts(t, s, "p", warmpool.TaskCounts{}, "nothing of the refused batch")
	require.NoError(t, s.ReserveTasks(t.Context(), "p", math.MaxInt32, recs[:n]), "MaxReserve records in one call")
	assertCounts(t, s, "p", warmpool.TaskCounts{Launching: n}, "the whole batch")
}

func testListTasks(t *testing.T, s warmpool.Store) {
	a := reserve(t, s, "a", 2)
	b := reserve(t, s, "b", 1)
	assert.Len(t, mustList(t, s, "a"), 2)
	assert.Len(t, mustList(t, s, "b"), 1)
	assert.Len(t, mustList(t, s, ""), 3)
	assert.Empty(t, mustList(t, s, "c"))
	_, ok := findTask(t, s, a[1].ID)
	assert.True(t, ok)
	got, ok := findTask(t, s, b[0].ID)
	require.True(t, ok)
	assert.Equal(t, "b", got.Pool)
}

func testListTasksPage(t *testing.T, s warmpool.Store) {
	a := reserve(t, s, "a", 23)
	_ = reserve(t, s, "b", 4)
	walk := func(pool string, limit int) map[string]int {
		t.Helper()
		seen := map[string]int{}
		cursor := ""
		for pages := 0; ; pages++ {
			require.Less(t, pages, 100, "the walk ends")
			page, err := s.ListTasksPage(t.Context(), pool, cursor, limit)
			require.NoError(t, err)
			require.LessOrEqual(t, len(page.Tasks), limit)
			for _, r := range page.Tasks {
				seen[r.ID]++
				if pool != "" {
					assert.Equal(t, pool, r.Pool)
				}
			}
			if page.Next == "" {
				return seen
			}
			cursor = page.Next
		}
	}
	for _, limit := range []int{1, 7, 23, 100} {
		seen := walk("a", limit)
		assert.Len(t, seen, 23, "limit %d: every record of the pool", limit)
		for _, r := range a {
			assert.Equal(t, 1, seen[r.ID], "limit %d: %s seen once", limit, r.ID)
		}
	}
	assert.Len(t, walk("", 5), 27, "every pool")
	assert.Empty(t, walk("c", 5), "an empty pool")
}

func testRaceReserve(t *testing.T, s warmpool.Store, opts Options) {
	const maxTotal = 10
	stores := replicas(t, s, opts)
	attempts := max(4*maxTotal, opts.RaceClaimers)
	var ok, full atomic.Int64
	var wg sync.WaitGroup
	for i := 0; i < attempts; i++ {
		wg.Add(1)
		go func(st warmpool.Store) {
			defer wg.Done()
			err := st.ReserveTasks(context.Background(), "race", maxTotal, []warmpool.TaskRecord{newTask("race")})
			switch {
			case err == nil:
				ok.Add(1)
			case errors.Is(err, warmpool.ErrNoCapacity):
				full.Add(1)
			default:
				assert.NoError(t, err)
			}
		}(stores[i%len(stores)])
	}
	wg.Wait()
	assert.Equal(t, int64(maxTotal), ok.Load())
	assert.Equal(t, int64(attempts-maxTotal), full.Load())
	assert.Len(t, mustList(t, s, "race"), maxTotal, "max_total is never exceeded")
}

// testRaceCounts runs whole task lives at once on every replica (reserve,
// ready, claim, end, delete, with stale updates racing them) and checks
// that the counts end as the records say.
func testRaceCounts(t *testing.T, s warmpool.Store, opts Options) {
	const pool = "race-counts"
	stores := replicas(t, s, opts)
	workers := min(opts.RaceClaimers, 16)
	const lives = 6
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func(st warmpool.Store) {
			defer wg.Done()
			ctx := context.Background()
			for i := range lives {
				rec := newTask(pool)
				if err := st.ReserveTasks(ctx, pool, math.MaxInt32, []warmpool.TaskRecord{rec}); !assert.NoError(t, err) {
					return
				}
				rec.State, rec.Version = warmpool.TaskLaunching, 1
				stale := rec
				rec.State, rec.AgentURL = warmpool.TaskReady, "http://127.0.0.1:1/"+rec.ID
				ready, err := st.UpdateTask(ctx, rec, warmpool.TaskLaunching)
				if !assert.NoError(t, err) {
					return
				}
				stale.State = warmpool.TaskStopping // loses: the version moved on
				_, err = st.UpdateTask(ctx, stale, warmpool.TaskLaunching)
				assert.ErrorIs(t, err, warmpool.ErrConflict)
				switch i % 3 {
				case 0: // stays ready
				case 1: // claimed by id, ended, deleted
					res, err := st.Claim(ctx, warmpool.ClaimRequest{Pool: pool, TaskID: ready.ID, Lease: newLease("o"), Now: base})
					if errors.Is(err, warmpool.ErrConflict) {
						continue // another worker's claim of any task took it
					}
					if !assert.NoError(t, err) {
						return
					}
					_, err = st.EndLease(ctx, res.Lease.ID, warmpool.LeaseEnd{State: warmpool.LeaseReleased, Now: base})
					assert.NoError(t, err)
					assert.NoError(t, st.DeleteTask(ctx, res.Task))
				case 2: // any ready task claimed, then left leased
					_, err := st.Claim(ctx, warmpool.ClaimRequest{Pool: pool, Lease: newLease("o"), Now: base})
					if !errors.Is(err, warmpool.ErrNoCapacity) {
						assert.NoError(t, err)
					}
				}
			}
		}(stores[w%len(stores)])
	}
	wg.Wait()
	got := counts(t, s, pool)
	want := warmpool.CountStates(mustList(t, s, pool))
	assert.Equal(t, want, got, "the counts agree with the records")
	assert.Positive(t, want.Total())
	for _, st := range stores {
		c, err := st.CountTasks(t.Context(), pool)
		require.NoError(t, err)
		assert.Equal(t, want, c, "every replica reads the same counts")
	}
}
