package boltstore

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/quarryhq/quarry/warmpool"
)

// lockRecord is one named lock: who holds it and until when.
type lockRecord struct {
	Holder    string    `json:"holder"`
	ExpiresAt time.Time `json:"expires_at"`
}

// TryLock implements warmpool.Locker in one transaction.
func (s *Store) TryLock(ctx context.Context, name, holder string, ttl time.Duration, now time.Time) (bool, error) {
	if err := warmpool.CheckLock(name, holder, ttl); err != nil {
		return false, err
	}
	held := false
	err := s.update(ctx, "try lock", func(t *tx) error {
		held = false // a group that rolled back runs it again
		if v := t.locks.Get([]byte(name)); v != nil {
			var cur lockRecord
			if err := json.Unmarshal(v, &cur); err != nil {
				return fmt.Errorf("decode lock %q: %w", name, err)
			}
			if cur.Holder != holder && cur.ExpiresAt.After(now) {
				return nil
			}
		}
		data, err := json.Marshal(lockRecord{Holder: holder, ExpiresAt: now.Add(ttl)})
		if err != nil {
			return fmt.Errorf("encode lock: %w", err)
		}
		held = true
		return t.locks.Put([]byte(name), data)
	})
	if err != nil {
		return false, err
	}
	return held, nil
}

// Unlock implements warmpool.Locker.
func (s *Store) Unlock(ctx context.Context, name, holder string) error {
	return s.update(ctx, "unlock", func(t *tx) error {
		v := t.locks.Get([]byte(name))
		if v == nil {
			return nil
		}
		var cur lockRecord
		if err := json.Unmarshal(v, &cur); err != nil {
			return fmt.Errorf("decode lock %q: %w", name, err)
		}
		if cur.Holder != holder {
			return nil
		}
		return t.locks.Delete([]byte(name))
	})
}
