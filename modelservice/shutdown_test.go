package modelservice_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/modelservice"
	"github.com/quarryhq/quarry/modelservice/membroker"
	"github.com/quarryhq/quarry/warmpool"
)

type leaseMap map[string]warmpool.Lease

func (m leaseMap) GetLease(_ context.Context, id string) (warmpool.Lease, error) {
	l, ok := m[id]
	if !ok {
		return l, warmpool.ErrNotFound
	}
	return l, nil
}

// newService builds a Service on a memory broker.
func newService(t *testing.T) (*modelservice.Service, *membroker.Broker) {
	t.Helper()
	return newServiceWith(t, modelservice.Config{}, leaseMap{})
}

// newServiceWith builds a Service of cfg (its SandboxURL set) reading
// leases, on a memory broker, with one pool "p".
func newServiceWith(t *testing.T, cfg modelservice.Config, leases modelservice.LeaseReader) (*modelservice.Service, *membroker.Broker) {
	t.Helper()
	tok, err := modelservice.NewTokens([]byte(strings.Repeat("k", modelservice.MinSecretLen)))
	require.NoError(t, err)
	b := membroker.New(membroker.Config{})
	t.Cleanup(func() { _ = b.Close(context.Background()) })
	cfg.SandboxURL = "http://127.0.0.1:1"
	svc, err := modelservice.New(cfg, modelservice.Deps{
		Broker: b, Leases: leases, Tokens: tok, Pools: []warmpool.PoolConfig{{Name: "p"}}})
	require.NoError(t, err)
	return svc, b
}

func TestService_Relay_ShuttingDownLeavesTheRequestQueued(t *testing.T) {
	svc, b := newService(t)
	lease := warmpool.Lease{ID: "sbx-1", Owner: "o", Pool: "p"}
	ctx, cancel := context.WithCancelCause(context.Background())
	type result struct {
		rid string
		err error
	}
	done := make(chan result, 1)
	go func() {
		_, rid, err := svc.Relay(ctx, lease, "chat/completions", []byte(`{"model":"m"}`))
		done <- result{rid, err}
	}()
	var queued []modelservice.Exchange
	deadline := time.Now().Add(30 * time.Second)
	for len(queued) == 0 {
		require.True(t, time.Now().Before(deadline), "the call is queued")
		var err error
		queued, _, err = b.Transcript(context.Background(), modelservice.TranscriptQuery{LeaseID: "sbx-1", Limit: 10})
		require.NoError(t, err)
		time.Sleep(5 * time.Millisecond)
	}
	cancel(modelservice.ErrShuttingDown)
	r := <-done
	require.ErrorIs(t, r.err, modelservice.ErrShuttingDown)
	assert.Equal(t, queued[0].ID, r.rid)
	page, _, err := b.Transcript(context.Background(), modelservice.TranscriptQuery{LeaseID: "sbx-1", Limit: 10})
	require.NoError(t, err)
	require.Len(t, page, 1)
	assert.Equal(t, modelservice.StatePending, page[0].State, "still there for another replica's trainers")

	// A call that arrives while shutting down is not queued at all.
	_, _, err = svc.Relay(ctx, lease, "chat/completions", []byte(`{"model":"m"}`))
	require.ErrorIs(t, err, modelservice.ErrShuttingDown)
	page, _, err = b.Transcript(context.Background(), modelservice.TranscriptQuery{LeaseID: "sbx-1", Limit: 10})
	require.NoError(t, err)
	assert.Len(t, page, 1)
}

func TestService_Claim_ShuttingDownWithNothingClaimed(t *testing.T) {
	svc, _ := newService(t)
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(modelservice.ErrShuttingDown)
	reqs, err := svc.Claim(ctx, "o", modelservice.ClaimParams{Max: 1, Wait: 20 * time.Second})
	require.ErrorIs(t, err, modelservice.ErrShuttingDown)
	assert.Empty(t, reqs)

	ctx, cancel = context.WithCancelCause(context.Background())
	cancel(nil)
	reqs, err = svc.Claim(ctx, "o", modelservice.ClaimParams{Max: 1, Wait: 20 * time.Second})
	require.NoError(t, err, "another end of the wait is not a shutdown")
	assert.Empty(t, reqs)
}
