package rockcompat

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/warmpool"
)

// keyLeases is a Leases with KeyLookup: ByKey answers from byKey, and any
// listing fails the test (a chosen-id lookup must not list leases).
type keyLeases struct {
	Leases
	t     *testing.T
	byKey map[string]warmpool.Lease // owner + " " + key → lease
	reads int
}

func (k *keyLeases) ByKey(_ context.Context, owner, key string) (warmpool.Lease, error) {
	k.reads++
	l, ok := k.byKey[owner+" "+key]
	if !ok {
		return warmpool.Lease{}, warmpool.ErrNotFound
	}
	return l, nil
}

func (k *keyLeases) List(context.Context, warmpool.LeaseFilter) ([]warmpool.Lease, error) {
	k.t.Error("a chosen-id lookup listed leases")
	return nil, errors.New("listed")
}

// A sandbox id the caller chose is found by its start's idempotency key
// (one read), not by listing the owner's leases.
func TestService_Lookup_ChosenIDByItsKey(t *testing.T) {
	l := warmpool.Lease{ID: warmpool.NewLeaseID(), Owner: "alice", State: warmpool.LeaseActive}
	k := &keyLeases{t: t, byKey: map[string]warmpool.Lease{"alice rock:my-box": l}}
	s := &Service{leases: k}
	got, err := s.lookup(t.Context(), "alice", "my-box")
	require.NoError(t, err)
	assert.Equal(t, l.ID, got.ID)
	assert.Equal(t, 1, k.reads)

	_, err = s.lookup(t.Context(), "bob", "my-box")
	require.ErrorIs(t, err, warmpool.ErrNotFound, "another owner's id does not exist for bob")
	_, err = s.lookup(t.Context(), "alice", "other-box")
	require.ErrorIs(t, err, warmpool.ErrNotFound)
	assert.Equal(t, 3, k.reads)
}
