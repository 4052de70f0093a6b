package boltstore

import (
	"errors"
	"fmt"

	bolt "go.etcd.io/bbolt"

	"github.com/quarryhq/quarry/warmpool"
)

// isRefusal reports whether a write's error is one of the contract's
// refusals, which every write decides before it writes anything.
func isRefusal(err error) bool {
	for _, sentinel := range []error{warmpool.ErrNoCapacity, warmpool.ErrConflict, warmpool.ErrNotFound,
		warmpool.ErrLeaseEnded, warmpool.ErrLeaseNotHeld} {
		if errors.Is(err, sentinel) {
			return true
		}
	}
	return false
}

// commitError is the error of a write whose transaction bbolt could not
// run or commit.
func (s *Store) commitError(action string, err error) error {
	if errors.Is(err, bolt.ErrDatabaseNotOpen) || s.closed.Load() {
		return fmt.Errorf("%s: %w", action, warmpool.ErrClosed)
	}
	return fmt.Errorf("%s: %w: %w", action, warmpool.ErrUnavailable, err)
}
