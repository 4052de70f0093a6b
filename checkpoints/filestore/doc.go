// Package filestore is the embedded checkpoint store: checkpoints.Store on
// one directory ($QUARRY_DATA_DIR/checkpoints), for a single gateway
// process (the default store).
//
// Archives are content-addressed files: blobs/ab/abcdef… is the archive
// whose sha256 is abcdef…, shared by every checkpoint with those bytes.
// A Put writes into tmp/ while it hashes, fsyncs, and renames into
// blobs/ (fsyncing the directory) before the metadata that points at the
// blob commits. Metadata is in meta.db (bbolt): the checkpoint records,
// two indexes (by owner and creation time for List, by expiry for Purge)
// and a reference count per blob; each change is one serializable
// transaction. A blob is unlinked only after the transaction that dropped
// its last reference commits, so a record never points at a missing
// blob; a crash leaves at worst a temp file or an unreferenced blob,
// which Open removes (a walk of blobs/: O(blobs), once per start).
//
// The budget (usage.go): meta.db counts each owner's references to each
// blob and the bytes of the blobs each owner holds, once per owner, with
// their total, in the transactions that add and remove records; a commit
// that would pass the budget fails and removes the blob it placed. Commits
// are serialized (blobMu, then bbolt's one writer), so the check sees
// every commit before it. A store of schema 1 (before the budget) is
// counted by one walk of its records when it is first opened.
//
// It passes checkpoints/checkpointtest. It must not import the gateway,
// the warm pool, the providers or another store.
package filestore
