package modelservice

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/warmpool"
)

// nullBroker is a Broker whose every call fails; the tests of this package
// that build a Service never reach it.
type nullBroker struct{ Broker }

type nullLeases struct{}

func (nullLeases) GetLease(context.Context, string) (warmpool.Lease, error) {
	return warmpool.Lease{}, warmpool.ErrNotFound
}

func depsWithPool(t *testing.T, options map[string]string) Deps {
	t.Helper()
	tok, err := NewTokens([]byte(strings.Repeat("k", MinSecretLen)))
	require.NoError(t, err)
	return Deps{Broker: nullBroker{}, Leases: nullLeases{}, Tokens: tok, Pools: []warmpool.PoolConfig{{Name: "p", Options: options}}}
}

func leaseOf(pool string) warmpool.Lease { return warmpool.Lease{ID: "sbx-x", Pool: pool} }

func mustTime(t *testing.T, s string) time.Time {
	t.Helper()
	v, err := time.Parse(time.RFC3339, s)
	require.NoError(t, err)
	return v
}
