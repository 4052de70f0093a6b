package warmpool_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/warmpool"
)

// lostAnswerStore writes the first lost reservations, then answers them
// with a deadline, as a store whose answer never reached the caller does
// (the DynamoDB emulator under load, a broken connection).
type lostAnswerStore struct {
	warmpool.Store
	lost  atomic.Int32 // how many answers to lose yet
	write bool         // whether a lost reservation was written
}

func (s *lostAnswerStore) ReserveTasks(ctx context.Context, pool string, maxTotal int, recs []warmpool.TaskRecord) error {
	if s.lost.Add(-1) < 0 {
		return s.Store.ReserveTasks(ctx, pool, maxTotal, recs)
	}
	if s.write {
		if err := s.Store.ReserveTasks(ctx, pool, maxTotal, recs); err != nil {
			return err
		}
	}
	return fmt.Errorf("reserve tasks: %w", context.DeadlineExceeded)
}

// A reservation whose answer was lost, and that was written, is launched
// all the same: its slots are not held until their launch deadline (the
// clock never moves here, so without the adoption the pool, full of the
// lost reservation's records, would never fill). One that was not written
// is retried. A flake hunt found the first: a refill on the emulator whose
// 83-record transaction outlived its 5 s deadline never filled the pool
// (TestManager_Refill_PastMaxReserveOnDynamoDB, 1 of 20 runs).
func TestManager_Refill_LostReservationAnswer(t *testing.T) {
	for _, written := range []bool{true, false} {
		t.Run(fmt.Sprintf("written=%v", written), func(t *testing.T) {
			s := &lostAnswerStore{write: written}
			s.lost.Store(1)
			e := newEnvSetup(t, fastConfig(), func(e *env) {
				e.wrap = func(st warmpool.Store) warmpool.Store { s.Store = st; return s }
			}, testPool(3, 3))
			require.Eventually(t, func() bool { return e.status().Ready == 3 }, waitFor, 20*time.Millisecond,
				"the pool fills: %+v", e.status())
			assert.Equal(t, 3, e.status().Ready+e.status().Launching+e.status().Leased, "no record beyond max_total")
		})
	}
}
