package dynamostore_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/internal/testenv"
	"github.com/quarryhq/quarry/warmpool"
	"github.com/quarryhq/quarry/warmpool/dynamostore"
)

var base = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

type fixedClock struct{ t time.Time }

func (c fixedClock) Now() time.Time { return c.t }

// readyTasks reserves n tasks in pool and makes them ready.
func readyTasks(t *testing.T, s *dynamostore.Store, pool string, n int) {
	t.Helper()
	recs := make([]warmpool.TaskRecord, n)
	for i := range recs {
		recs[i] = warmpool.TaskRecord{ID: warmpool.NewTaskID(), Provider: "fake", CreatedAt: base}
	}
	for start := 0; start < n; start += 50 {
		require.NoError(t, s.ReserveTasks(t.Context(), pool, 1000, recs[start:min(start+50, n)]))
	}
	for _, r := range recs {
		r.Pool, r.State, r.Version, r.AgentURL = pool, warmpool.TaskReady, 1, "http://127.0.0.1:1"
		_, err := s.UpdateTask(t.Context(), r, warmpool.TaskLaunching)
		require.NoError(t, err)
	}
}

func TestCreateTables_IdempotentAndKeepsShards(t *testing.T) {
	testenv.AWS(t)
	client := newClient(t)
	cfg := freshTables(t, client, dynamostore.Config{Shards: 4})
	require.NoError(t, dynamostore.CreateTables(t.Context(), client, cfg), "creating existing tables again is a no-op")
	other := cfg
	other.Shards = 8
	err := dynamostore.CreateTables(t.Context(), client, other)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "QUARRY_DYNAMODB_SHARDS=4")
	require.NoError(t, dynamostore.DeleteTables(t.Context(), client, cfg))
	require.NoError(t, dynamostore.DeleteTables(t.Context(), client, cfg), "deleting missing tables is a no-op")
}

// TestStore_TTLPassedLeaseIsGone: DynamoDB deletes TTL-expired items days
// late, so reads treat a lease past its TTL as purged already.
func TestStore_TTLPassedLeaseIsGone(t *testing.T) {
	testenv.AWS(t)
	client := newClient(t)
	cfg := freshTables(t, client, dynamostore.Config{EndedTTL: time.Hour})
	later := base.Add(2 * time.Hour)
	clock := &fixedClock{t: base}
	cfg.Clock = clock
	s, err := dynamostore.New(client, cfg)
	require.NoError(t, err)
	readyTasks(t, s, "p", 2)

	l := warmpool.Lease{ID: warmpool.NewLeaseID(), Owner: "o", IdempotencyKey: "k", ExpiresAt: base.Add(time.Minute)}
	first, err := s.Claim(t.Context(), warmpool.ClaimRequest{Pool: "p", Now: base, Lease: l})
	require.NoError(t, err)
	_, err = s.EndLease(t.Context(), l.ID, warmpool.LeaseEnd{State: warmpool.LeaseReleased, Now: base})
	require.NoError(t, err)
	_, err = s.GetLease(t.Context(), l.ID)
	require.NoError(t, err, "within its TTL the ended lease is readable")

	clock.t = later
	_, err = s.GetLease(t.Context(), l.ID)
	require.ErrorIs(t, err, warmpool.ErrNotFound, "past its TTL it reads as purged")
	all, err := s.ListLeases(t.Context(), warmpool.LeaseFilter{Owner: "o"})
	require.NoError(t, err)
	assert.Empty(t, all)

	retry := warmpool.Lease{ID: warmpool.NewLeaseID(), Owner: "o", IdempotencyKey: "k", ExpiresAt: later.Add(time.Minute)}
	res, err := s.Claim(t.Context(), warmpool.ClaimRequest{Pool: "p", Now: later, Lease: retry})
	require.NoError(t, err)
	assert.False(t, res.Replayed, "the key of a purged lease is free")
	assert.NotEqual(t, first.Lease.TaskID, res.Lease.TaskID)
}

// TestStore_Claim_HappyPathCalls checks the call budget of a warm claim:
// one transaction, at most three calls. With 256 ready tasks over 8 shards
// no shard runs empty within 16 claims, so every claim is on the happy path.
func TestStore_Claim_HappyPathCalls(t *testing.T) {
	testenv.AWS(t)
	client := newClient(t)
	s := newStore(t, client, dynamostore.Config{})
	readyTasks(t, s, "p", 256)
	for i := range 16 {
		before := s.Calls()
		_, err := s.Claim(t.Context(), warmpool.ClaimRequest{Pool: "p", Now: base, Lease: warmpool.Lease{
			ID: warmpool.NewLeaseID(), Owner: "o", IdempotencyKey: warmpool.NewLeaseID(), ExpiresAt: base.Add(time.Minute)}})
		require.NoError(t, err)
		after := s.Calls()
		total := int64(0)
		for op, n := range after {
			total += n - before[op]
		}
		assert.Equal(t, int64(1), after["TransactWriteItems"]-before["TransactWriteItems"], "claim %d: one transaction", i)
		assert.LessOrEqual(t, total, int64(3), "claim %d: %v", i, after)
	}
}

func TestStore_GetTask(t *testing.T) {
	testenv.AWS(t)
	s := newStore(t, newClient(t), dynamostore.Config{})
	readyTasks(t, s, "p", 1)
	recs, err := s.ListTasks(t.Context(), "p")
	require.NoError(t, err)
	require.Len(t, recs, 1)
	got, err := s.GetTask(t.Context(), recs[0].ID)
	require.NoError(t, err)
	assert.Equal(t, recs[0], got)
	_, err = s.GetTask(t.Context(), "tsk-unknown")
	require.ErrorIs(t, err, warmpool.ErrNotFound)
}

// callsSince is how many calls s made since before, in all and by operation.
func callsSince(s *dynamostore.Store, before map[string]int64) (int64, map[string]int64) {
	by := map[string]int64{}
	total := int64(0)
	for op, n := range s.Calls() {
		if d := n - before[op]; d > 0 {
			by[op] = d
			total += d
		}
	}
	return total, by
}

// TestStore_Heartbeat_OneUpdateItem: a heartbeat (RenewLease by the
// lease's own duration) is one conditional UpdateItem, with no read, and
// it leaves the lease's env (an item of its own) alone.
func TestStore_Heartbeat_OneUpdateItem(t *testing.T) {
	testenv.AWS(t)
	s := newStore(t, newClient(t), dynamostore.Config{})
	readyTasks(t, s, "p", 1)
	l := warmpool.Lease{ID: warmpool.NewLeaseID(), Owner: "o", Duration: time.Minute, ExpiresAt: base.Add(time.Minute),
		Env: map[string]string{"BIG": strings.Repeat("x", 4096)}}
	_, err := s.Claim(t.Context(), warmpool.ClaimRequest{Pool: "p", Now: base, Lease: l})
	require.NoError(t, err)
	for i := range 3 {
		before := s.Calls()
		renewed, err := s.RenewLease(t.Context(), l.ID, "o", time.Time{}, base.Add(time.Duration(i+1)*time.Second))
		require.NoError(t, err)
		assert.Equal(t, base.Add(time.Duration(i+1)*time.Second+time.Minute), renewed.ExpiresAt)
		total, by := callsSince(s, before)
		assert.Equal(t, int64(1), total, "heartbeat %d: %v", i, by)
		assert.Equal(t, int64(1), by["UpdateItem"], "heartbeat %d: %v", i, by)
	}
}

// TestStore_Release_AtMostThreeCalls: the manager's release reads the
// lease (Manager.Release: GetLease, or its lease cache), ends it with a
// write conditional on that copy (EndLease with Read) and, once the
// provider stopped the task, deletes the task's record by the state it
// knows (DeleteTask of the stopping record): at most 3 calls in all.
func TestStore_Release_AtMostThreeCalls(t *testing.T) {
	testenv.AWS(t)
	s := newStore(t, newClient(t), dynamostore.Config{})
	readyTasks(t, s, "p", 4)
	for i := range 3 {
		l := warmpool.Lease{ID: warmpool.NewLeaseID(), Owner: "o", IdempotencyKey: warmpool.NewLeaseID(), ExpiresAt: base.Add(time.Minute),
			Env: map[string]string{"A": "1"}}
		res, err := s.Claim(t.Context(), warmpool.ClaimRequest{Pool: "p", Now: base, Lease: l})
		require.NoError(t, err)

		before := s.Calls()
		read, err := s.GetLease(t.Context(), l.ID)
		require.NoError(t, err)
		ended, err := s.EndLease(t.Context(), l.ID, warmpool.LeaseEnd{State: warmpool.LeaseReleased, Now: base, Owner: "o", Read: &read})
		require.NoError(t, err)
		require.Equal(t, warmpool.LeaseReleased, ended.State)
		rec := res.Task
		rec.State, rec.LeaseID = warmpool.TaskStopping, ended.ID
		require.NoError(t, s.DeleteTask(t.Context(), rec))
		total, by := callsSince(s, before)
		assert.LessOrEqual(t, total, int64(3), "release %d: %v", i, by)

		_, err = s.GetTask(t.Context(), res.Task.ID)
		require.ErrorIs(t, err, warmpool.ErrNotFound, "release %d: the task's record is gone", i)
		counts, err := s.CountTasks(t.Context(), "p")
		require.NoError(t, err)
		assert.Equal(t, 3-i, counts.Total(), "release %d: its slot is free", i)
	}
}
