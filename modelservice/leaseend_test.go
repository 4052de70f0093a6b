package modelservice_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/modelservice"
	"github.com/quarryhq/quarry/warmpool"
)

// mutableLeases is a LeaseReader whose one lease the test changes.
type mutableLeases struct {
	mu sync.Mutex
	l  warmpool.Lease
}

func (m *mutableLeases) GetLease(_ context.Context, id string) (warmpool.Lease, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if id != m.l.ID {
		return warmpool.Lease{}, warmpool.ErrNotFound
	}
	return m.l, nil
}

func (m *mutableLeases) set(f func(l *warmpool.Lease)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	f(&m.l)
}

// A call waiting for a trainer whose lease ends (released, expired) is
// cancelled at the next lease check: the agent's call fails with
// ErrLeaseEnded and trainers are no longer offered the request.
func TestService_Relay_LeaseEndCancelsTheWaitingCall(t *testing.T) {
	tests := []struct {
		name string
		end  func(l *warmpool.Lease)
		want string
	}{
		{name: "released", end: func(l *warmpool.Lease) { l.State, l.Reason = warmpool.LeaseReleased, "released by its owner" },
			want: "was released: released by its owner"},
		{name: "expired without the reaper yet", end: func(l *warmpool.Lease) { l.ExpiresAt = time.Now().Add(-time.Second) },
			want: "expired"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lease := warmpool.Lease{ID: "sbx-1", Owner: "o", Pool: "p", State: warmpool.LeaseActive, ExpiresAt: time.Now().Add(time.Hour)}
			leases := &mutableLeases{l: lease}
			svc, b := newServiceWith(t, modelservice.Config{LeaseCheck: 20 * time.Millisecond}, leases)

			done := make(chan error, 1)
			go func() {
				_, _, err := svc.Relay(context.Background(), lease, "chat/completions", []byte(`{"model":"m"}`))
				done <- err
			}()
			// Several lease checks pass while the lease is active: the call waits.
			var (
				queued []modelservice.Exchange
				err    error
			)
			deadline := time.Now().Add(30 * time.Second)
			for len(queued) == 0 {
				require.True(t, time.Now().Before(deadline), "the call is queued")
				queued, _, err = b.Transcript(context.Background(), modelservice.TranscriptQuery{LeaseID: "sbx-1", Limit: 10})
				require.NoError(t, err)
				time.Sleep(5 * time.Millisecond)
			}
			time.Sleep(100 * time.Millisecond)
			select {
			case err := <-done:
				t.Fatalf("the call ended while its lease was active: %v", err)
			default:
			}

			leases.set(tt.end)
			select {
			case err := <-done:
				require.ErrorIs(t, err, modelservice.ErrLeaseEnded)
				require.ErrorIs(t, err, warmpool.ErrLeaseEnded)
				assert.Contains(t, err.Error(), tt.want)
			case <-time.After(30 * time.Second):
				t.Fatal("the call still waits after its lease ended")
			}
			ex, _, err := b.Transcript(context.Background(), modelservice.TranscriptQuery{LeaseID: "sbx-1", Limit: 10})
			require.NoError(t, err)
			require.Len(t, ex, 1)
			assert.Equal(t, modelservice.StateCancelled, ex[0].State)
			assert.Contains(t, ex[0].Reason, tt.want)
			claimed, err := svc.Claim(context.Background(), "o", modelservice.ClaimParams{Max: 10})
			require.NoError(t, err)
			assert.Empty(t, claimed, "trainers are not offered a dead sandbox's call")
		})
	}
}
