package filestore

import (
	"context"
	"fmt"

	bolt "go.etcd.io/bbolt"

	"github.com/quarryhq/quarry/checkpoints"
)

// The budget's accounting (checkpoints.Budget): owner_refs counts each
// owner's checkpoints of each blob, and usage the bytes of the blobs each
// owner holds (once per owner, however many of its checkpoints share one)
// and their sum. Both change in the transaction that adds or removes a
// record, under blobMu, so a commit checks the budget against a count
// that includes every commit before it.

// usageKey is owner's key in the usage bucket ('o' owner; keyTotal is 't').
func usageKey(owner string) []byte { return append([]byte{'o'}, owner...) }

// holdKey is the key in owner_refs of owner's references to blob sha.
func holdKey(owner, sha string) []byte { return append(lp(owner), sha...) }

// usage reads owner's and the total usage.
func usage(tx *bolt.Tx, owner string) checkpoints.Usage {
	b := tx.Bucket(bucketUsage)
	return checkpoints.Usage{Owner: count(b, usageKey(owner)), Total: count(b, keyTotal)}
}

// hold adds delta (1 or -1) to c's owner's references to c's blob. The
// owner's first reference adds the blob's bytes to its usage and the
// total, if b has room for them (else a *checkpoints.BudgetError); its
// last takes them away.
func hold(tx *bolt.Tx, c checkpoints.Checkpoint, delta int64, b checkpoints.Budget) error {
	refs, err := addCount(tx.Bucket(bucketHolds), holdKey(c.Owner, c.SHA256), delta)
	if err != nil {
		return err
	}
	var bytes int64
	switch {
	case delta > 0 && refs == 1:
		bytes = c.SizeBytes
		if err := b.Check(usage(tx, c.Owner), bytes); err != nil {
			return err
		}
	case delta < 0 && refs == 0:
		bytes = -c.SizeBytes
	default:
		return nil
	}
	u := tx.Bucket(bucketUsage)
	if _, err := addCount(u, usageKey(c.Owner), bytes); err != nil {
		return err
	}
	_, err = addCount(u, keyTotal, bytes)
	return err
}

// migrate counts the usage of a store written before the budget (schema
// 1): one walk of the records, once.
func migrate(tx *bolt.Tx) error {
	return tx.Bucket(bucketRecords).ForEach(func(k, _ []byte) error {
		rec, ok, err := readRecord(tx, string(k))
		if err != nil || !ok {
			return err
		}
		return hold(tx, rec.Checkpoint, 1, checkpoints.Budget{})
	})
}

// Usage implements checkpoints.Store: two counters read in one
// transaction.
func (s *Store) Usage(ctx context.Context, owner string) (checkpoints.Usage, error) {
	var u checkpoints.Usage
	err := s.view(ctx, fmt.Sprintf("read the checkpoint usage of %q", owner), func(tx *bolt.Tx) error {
		u = usage(tx, owner)
		return nil
	})
	return u, err
}
