package warmpool_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/providers"
	"github.com/quarryhq/quarry/warmpool"
)

// tallyStore wraps the real store of a test and counts every call of the
// Store contract by its caller (warmpool.CallerOf).
type tallyStore struct {
	warmpool.Store

	mu    sync.Mutex
	calls map[string]map[string]int // caller → method → calls
}

func (s *tallyStore) tally(ctx context.Context, method string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := warmpool.CallerOf(ctx)
	if s.calls[c] == nil {
		s.calls[c] = map[string]int{}
	}
	s.calls[c][method]++
}

// of returns the calls of caller since the last of, and forgets them.
func (s *tallyStore) of(caller string) map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.calls[caller]
	delete(s.calls, caller)
	return out
}

func total(calls map[string]int) int {
	n := 0
	for _, c := range calls {
		n += c
	}
	return n
}

func (s *tallyStore) ReserveTasks(ctx context.Context, pool string, maxTotal int, recs []warmpool.TaskRecord) error {
	s.tally(ctx, "ReserveTasks")
	return s.Store.ReserveTasks(ctx, pool, maxTotal, recs)
}

func (s *tallyStore) UpdateTask(ctx context.Context, rec warmpool.TaskRecord, from warmpool.TaskState) (warmpool.TaskRecord, error) {
	s.tally(ctx, "UpdateTask")
	return s.Store.UpdateTask(ctx, rec, from)
}

func (s *tallyStore) DeleteTask(ctx context.Context, rec warmpool.TaskRecord) error {
	s.tally(ctx, "DeleteTask")
	return s.Store.DeleteTask(ctx, rec)
}

func (s *tallyStore) GetTask(ctx context.Context, id string) (warmpool.TaskRecord, error) {
	s.tally(ctx, "GetTask")
	return s.Store.GetTask(ctx, id)
}

func (s *tallyStore) CountTasks(ctx context.Context, pool string) (warmpool.TaskCounts, error) {
	s.tally(ctx, "CountTasks")
	return s.Store.CountTasks(ctx, pool)
}

func (s *tallyStore) ListTasksPage(ctx context.Context, pool, cursor string, limit int) (warmpool.TaskPage, error) {
	s.tally(ctx, "ListTasksPage")
	return s.Store.ListTasksPage(ctx, pool, cursor, limit)
}

func (s *tallyStore) ListTasks(ctx context.Context, pool string) ([]warmpool.TaskRecord, error) {
	s.tally(ctx, "ListTasks")
	return s.Store.ListTasks(ctx, pool)
}

func (s *tallyStore) Claim(ctx context.Context, req warmpool.ClaimRequest) (warmpool.ClaimResult, error) {
	s.tally(ctx, "Claim")
	return s.Store.Claim(ctx, req)
}

func (s *tallyStore) GetLease(ctx context.Context, id string) (warmpool.Lease, error) {
	s.tally(ctx, "GetLease")
	return s.Store.GetLease(ctx, id)
}

func (s *tallyStore) RenewLease(ctx context.Context, id, owner string, expiresAt, now time.Time) (warmpool.Lease, error) {
	s.tally(ctx, "RenewLease")
	return s.Store.RenewLease(ctx, id, owner, expiresAt, now)
}

func (s *tallyStore) EndLease(ctx context.Context, id string, end warmpool.LeaseEnd) (warmpool.Lease, error) {
	s.tally(ctx, "EndLease")
	return s.Store.EndLease(ctx, id, end)
}

func (s *tallyStore) ListLeases(ctx context.Context, f warmpool.LeaseFilter) ([]warmpool.Lease, error) {
	s.tally(ctx, "ListLeases")
	return s.Store.ListLeases(ctx, f)
}

func (s *tallyStore) LeaseByKey(ctx context.Context, owner, key string) (warmpool.Lease, error) {
	s.tally(ctx, "LeaseByKey")
	return s.Store.LeaseByKey(ctx, owner, key)
}

// A heartbeat is one store write (RenewLease, no read), and a release at
// most 3 calls (read the lease, end it on that copy, delete the task's
// record), with the lease cache off so that the release reads the store.
// Each of those calls is one request to DynamoDB
// (dynamostore.TestStore_Heartbeat_OneUpdateItem,
// TestStore_Release_AtMostThreeCalls).
func TestManager_HeartbeatAndRelease_StoreCalls(t *testing.T) {
	s := &tallyStore{calls: map[string]map[string]int{}}
	cfg := fastConfig()
	cfg.LeaseCacheTTL = -1
	e := newEnvSetup(t, cfg, func(e *env) {
		e.wrap = func(st warmpool.Store) warmpool.Store { s.Store = st; return s }
	}, testPool(0, 4))
	for i := range 3 {
		l := e.acquire("alice")
		s.of(warmpool.CallerHeartbeat)
		_, err := e.m.Heartbeat(t.Context(), l.ID, "alice")
		require.NoError(t, err)
		assert.Equal(t, map[string]int{"RenewLease": 1}, s.of(warmpool.CallerHeartbeat), "heartbeat %d", i)

		s.of(warmpool.CallerRelease)
		_, err = e.m.Release(t.Context(), l.ID, "alice")
		require.NoError(t, err)
		calls := s.of(warmpool.CallerRelease)
		assert.LessOrEqual(t, total(calls), 3, "release %d: %v", i, calls)
		assert.Equal(t, 1, calls["DeleteTask"], "release %d: the task's record is deleted: %v", i, calls)
		assert.Equal(t, providers.TaskStopped, e.providerTask(l.TaskID).State, "release %d: the task is stopped", i)
	}
}
