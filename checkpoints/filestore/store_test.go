package filestore

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/checkpoints"
	"github.com/quarryhq/quarry/checkpoints/checkpointtest"
)

// harness adds the suite's test interfaces to a Store.
type harness struct {
	*Store
	t *testing.T
}

// Corrupt rewrites the blob of id's checkpoint in place.
func (h harness) Corrupt(_ context.Context, id string, mutate func([]byte) []byte) error {
	var sha string
	err := h.db.View(func(tx *bolt.Tx) error {
		rec, ok, err := readRecord(tx, id)
		if !ok {
			return fmt.Errorf("no checkpoint %s", id)
		}
		sha = rec.SHA256
		return err
	})
	if err != nil {
		return err
	}
	b, err := os.ReadFile(h.blobPath(sha))
	if err != nil {
		return err
	}
	return os.WriteFile(h.blobPath(sha), mutate(b), 0o600)
}

// Blobs counts the files in blobs/ and tmp/.
func (h harness) Blobs(context.Context) (int, error) {
	n := 0
	for _, dir := range []string{h.blobs, h.tmp} {
		err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				n++
			}
			return err
		})
		if err != nil {
			return 0, err
		}
	}
	return n, nil
}

// Reopen closes the store and opens its directory again.
func (h harness) Reopen(context.Context) (checkpoints.Store, error) {
	if err := h.Close(); err != nil {
		return nil, err
	}
	s, err := Open(h.cfg)
	if err != nil {
		return nil, err
	}
	h.t.Cleanup(func() { _ = s.Close() })
	return harness{Store: s, t: h.t}, nil
}

var _ checkpointtest.Corrupter = harness{}
var _ checkpointtest.BlobCounter = harness{}
var _ checkpointtest.Reopener = harness{}

func open(t *testing.T, cfg Config) *Store {
	t.Helper()
	s, err := Open(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func TestStore_Conformance(t *testing.T) {
	checkpointtest.Run(t, func(t *testing.T, s checkpointtest.Setup) checkpoints.Store {
		return harness{Store: open(t, Config{Dir: filepath.Join(t.TempDir(), "checkpoints"), Clock: s.Clock, Budget: s.Budget}), t: t}
	}, checkpointtest.Options{SharesBlobs: true, MaxBuffered: 4 << 20})
}

// put stores a small archive and returns its metadata.
func put(t *testing.T, s *Store, data string) checkpoints.Checkpoint {
	t.Helper()
	now := time.Now()
	m, err := s.Put(context.Background(), checkpoints.Checkpoint{
		ID: checkpoints.NewID(), Owner: "o", Paths: []string{"/work"}, Format: "tar+gzip",
		CreatedAt: now, ExpiresAt: now.Add(time.Hour),
	}, strings.NewReader(data), 1<<20)
	require.NoError(t, err)
	return m
}

func TestOpen_KeepsCheckpointsAcrossRestarts(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(Config{Dir: dir})
	require.NoError(t, err)
	m := put(t, s, "archive bytes")
	require.NoError(t, s.Close())

	s = open(t, Config{Dir: dir})
	got, err := s.Get(context.Background(), m.ID, "o")
	require.NoError(t, err)
	assert.Equal(t, m, got)
	blobs, err := harness{Store: s}.Blobs(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 1, blobs, "a referenced blob survives the start-up collection")
}

// A crash leaves temp files and blobs without a record; Open removes them
// and keeps what records count.
func TestOpen_CollectsWhatACrashLeft(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(Config{Dir: dir})
	require.NoError(t, err)
	m := put(t, s, "kept")
	require.NoError(t, s.Close())

	// A Put that died while writing, and one that died between placing its
	// blob and committing its record.
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tmp", m.ID+"-123"), []byte("half"), 0o600))
	orphan := strings.Repeat("ab", 32)
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "blobs", "ab"), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "blobs", "ab", orphan), []byte("orphan"), 0o600))

	s = open(t, Config{Dir: dir})
	entries, err := os.ReadDir(filepath.Join(dir, "tmp"))
	require.NoError(t, err)
	assert.Empty(t, entries, "temp files are removed")
	assert.NoFileExists(t, filepath.Join(dir, "blobs", "ab", orphan), "a blob no record counts is removed")
	assert.FileExists(t, s.blobPath(m.SHA256), "a counted blob stays")
}

func TestOpen_SecondProcessWaitsThenFails(t *testing.T) {
	dir := t.TempDir()
	open(t, Config{Dir: dir})
	_, err := Open(Config{Dir: dir, LockTimeout: 100 * time.Millisecond})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "another process holds it")
}

func TestOpen_RequiresDir(t *testing.T) {
	_, err := Open(Config{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "QUARRY_DATA_DIR")
}

// The blob is on disk, named by its sha256, before the record commits.
func TestPut_BlobIsContentAddressed(t *testing.T) {
	s := open(t, Config{Dir: t.TempDir()})
	m := put(t, s, "content")
	b, err := os.ReadFile(filepath.Join(s.blobs, m.SHA256[:2], m.SHA256))
	require.NoError(t, err)
	assert.Equal(t, "content", string(b))
}

// A reader Open returned reads to the end after its checkpoint is deleted
// (and its blob unlinked).
func TestOpen_ReaderOutlivesDelete(t *testing.T) {
	s := open(t, Config{Dir: t.TempDir()})
	m := put(t, s, strings.Repeat("x", 100000))
	rc, _, err := s.Open(context.Background(), m.ID, "o")
	require.NoError(t, err)
	defer func() { _ = rc.Close() }()
	require.NoError(t, s.Delete(context.Background(), m.ID, "o"))
	assert.NoFileExists(t, s.blobPath(m.SHA256))
	b, err := io.ReadAll(rc)
	require.NoError(t, err, "the open file reads to the end and verifies")
	assert.Len(t, b, 100000)
}

// A store written before the budget (schema 1: no usage counters) is
// counted once when it is opened, and is schema 2 from then on.
func TestOpen_CountsTheUsageOfASchema1Store(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(Config{Dir: dir})
	require.NoError(t, err)
	a := put(t, s, "first archive")
	put(t, s, "first archive") // the same bytes: one blob, counted once
	b := put(t, s, "second")
	require.NoError(t, s.db.Update(func(tx *bolt.Tx) error { // as schema 1 left it
		for _, name := range [][]byte{bucketUsage, bucketHolds} {
			if err := tx.DeleteBucket(name); err != nil {
				return err
			}
		}
		return tx.Bucket(bucketMeta).Put(keySchema, []byte(schemaUncounted))
	}))
	require.NoError(t, s.Close())

	s = open(t, Config{Dir: dir})
	u, err := s.Usage(context.Background(), "o")
	require.NoError(t, err)
	want := a.SizeBytes + b.SizeBytes
	assert.Equal(t, checkpoints.Usage{Owner: want, Total: want}, u)
	require.NoError(t, s.db.View(func(tx *bolt.Tx) error {
		assert.Equal(t, schemaVersion, string(tx.Bucket(bucketMeta).Get(keySchema)))
		return nil
	}))
	require.NoError(t, s.Delete(context.Background(), b.ID, "o"))
	u, err = s.Usage(context.Background(), "o")
	require.NoError(t, err)
	assert.Equal(t, checkpoints.Usage{Owner: a.SizeBytes, Total: a.SizeBytes}, u, "the migrated counts are freed as any")
}

func TestOpen_RefusesAnotherSchema(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(Config{Dir: dir})
	require.NoError(t, err)
	require.NoError(t, s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketMeta).Put(keySchema, []byte("3")) }))
	require.NoError(t, s.Close())
	_, err = Open(Config{Dir: dir})
	assert.ErrorContains(t, err, `schema version "3"`)
}
