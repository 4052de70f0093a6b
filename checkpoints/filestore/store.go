package filestore

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/quarryhq/quarry/checkpoints"
	"github.com/quarryhq/quarry/internal/clock"
	"github.com/quarryhq/quarry/internal/defaults"
)

// schemaVersion is written to the meta bucket; Open refuses other versions
// but schemaUncounted, which it migrates (migrate).
const (
	schemaVersion   = "2" // with usage and owner_refs
	schemaUncounted = "1" // before the budget: no usage counters
)

// copyBuffer is the size of the buffer a Put copies through.
const copyBuffer = 256 << 10

// DefaultLockTimeout is Config.LockTimeout's default.
const DefaultLockTimeout = 5 * time.Second

// Bucket names.
var (
	bucketMeta    = []byte("meta")
	bucketRecords = []byte("checkpoints") // id → record JSON
	bucketOwner   = []byte("by_owner")    // lp(owner) created id → ""
	bucketExpiry  = []byte("by_expiry")   // expires id → ""
	bucketRefs    = []byte("refs")        // sha256 hex → count (8 bytes, big endian)
	bucketHolds   = []byte("owner_refs")  // lp(owner) sha256 hex → count: the owner's checkpoints of the blob
	bucketUsage   = []byte("usage")       // keyTotal, or 'o' owner → bytes counted (checkpoints.Budget)
	allBuckets    = [][]byte{bucketMeta, bucketRecords, bucketOwner, bucketExpiry, bucketRefs, bucketHolds, bucketUsage}
	keySchema     = []byte("schema")
	keyTotal      = []byte("t")
)

// Config configures the store. cmd/ sets Dir from QUARRY_DATA_DIR; the
// store reads no variable of its own.
type Config struct {
	// Dir is the store's directory, created when missing
	// ($QUARRY_DATA_DIR/checkpoints). Required.
	Dir string
	// LockTimeout bounds waiting for meta.db's file lock when another
	// process holds it (default 5 s): one process per directory.
	LockTimeout time.Duration
	// NoSync skips every fsync (files, directories, commits): faster, but a
	// machine crash may lose checkpoints or leave damaged blobs. For
	// throwaway stores only.
	NoSync bool
	// Budget is what the store keeps, per owner and in all (none when
	// zero); cmd/ sets it from checkpoints.Config.Budget.
	Budget checkpoints.Budget
	// Clock tells the time for expiry on reads (default clock.System).
	Clock clock.Clock
	// Logger receives what cannot be returned: a blob that could not be
	// unlinked after its last reference was dropped (default slog.Default).
	Logger *slog.Logger
}

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	defaults.Positive(&c.LockTimeout, DefaultLockTimeout)
	if c.Clock == nil {
		c.Clock = clock.System{}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate checks c after defaults.
func (c Config) Validate() error {
	if c.Dir == "" {
		return errors.New("checkpoint store directory: empty (QUARRY_DATA_DIR)")
	}
	return nil
}

// Store is the embedded checkpoint store. It is safe for concurrent use.
type Store struct {
	cfg   Config
	db    *bolt.DB
	tmp   string // tmp/: archives being written
	blobs string // blobs/: the archives
	// blobMu orders blob files with the records that count them: held
	// exclusively from a blob's rename to the commit that counts it, and
	// from a commit that drops a last reference to the unlink; shared from
	// reading a record to opening its blob.
	blobMu sync.RWMutex
	closed atomic.Bool
}

var _ checkpoints.Store = (*Store)(nil)

// record is a checkpoint as stored: its metadata and its owner (which the
// wire JSON of Checkpoint leaves out).
type record struct {
	checkpoints.Checkpoint
	Owner string `json:"owner"`
}

// Open opens the store in cfg.Dir, creating what is missing, and removes
// what a crash may have left (temp files, blobs no record counts). It
// fails when another process holds the store for longer than
// cfg.LockTimeout, or when meta.db was written by an incompatible version.
func Open(cfg Config) (*Store, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("open checkpoint store: %w", err)
	}
	s := &Store{cfg: cfg, tmp: filepath.Join(cfg.Dir, "tmp"), blobs: filepath.Join(cfg.Dir, "blobs")}
	for _, d := range []string{cfg.Dir, s.tmp, s.blobs} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("open checkpoint store: %w", err)
		}
	}
	path := filepath.Join(cfg.Dir, "meta.db")
	db, err := bolt.Open(path, 0o600, &bolt.Options{
		Timeout: cfg.LockTimeout, NoSync: cfg.NoSync,
		NoFreelistSync: true, FreelistType: bolt.FreelistMapType,
	})
	if err != nil {
		if errors.Is(err, bolt.ErrTimeout) {
			return nil, fmt.Errorf("open checkpoint store %s: another process holds it (waited %s): %w", path, cfg.LockTimeout, err)
		}
		return nil, fmt.Errorf("open checkpoint store %s: %w", path, err)
	}
	s.db = db
	if err := s.init(); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("open checkpoint store %s: %w", cfg.Dir, err)
	}
	return s, nil
}

// init creates the buckets, checks the schema and collects what a crash
// left: every temp file, and every blob without a reference.
func (s *Store) init() error {
	err := s.db.Update(func(tx *bolt.Tx) error {
		for _, name := range allBuckets {
			if _, err := tx.CreateBucketIfNotExists(name); err != nil {
				return fmt.Errorf("create bucket %s: %w", name, err)
			}
		}
		meta := tx.Bucket(bucketMeta)
		switch v := meta.Get(keySchema); {
		case v == nil:
			return meta.Put(keySchema, []byte(schemaVersion))
		case string(v) == schemaUncounted:
			if err := migrate(tx); err != nil {
				return fmt.Errorf("count the usage of a schema %s store: %w", v, err)
			}
			return meta.Put(keySchema, []byte(schemaVersion))
		case string(v) != schemaVersion:
			return fmt.Errorf("schema version %q, this build reads %q", v, schemaVersion)
		}
		return nil
	})
	if err != nil {
		return err
	}
	tmps, err := os.ReadDir(s.tmp)
	if err != nil {
		return fmt.Errorf("list temp files: %w", err)
	}
	for _, e := range tmps {
		if err := os.RemoveAll(filepath.Join(s.tmp, e.Name())); err != nil {
			return fmt.Errorf("remove temp file: %w", err)
		}
	}
	return s.db.View(func(tx *bolt.Tx) error {
		refs := tx.Bucket(bucketRefs)
		return filepath.WalkDir(s.blobs, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			if refs.Get([]byte(d.Name())) == nil {
				if err := os.Remove(path); err != nil {
					return fmt.Errorf("remove unreferenced blob: %w", err)
				}
			}
			return nil
		})
	})
}

// Close closes meta.db; later calls return checkpoints.ErrClosed, calls in
// flight finish first (bbolt waits for their transactions). Readers Open
// returned stay readable. Closing twice returns nil.
func (s *Store) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("close checkpoint store: %w", err)
	}
	return nil
}

// Put implements checkpoints.Store: the archive goes to a temp file while
// it is hashed, then becomes (or joins) the blob of its sha256, then the
// record commits.
func (s *Store) Put(ctx context.Context, meta checkpoints.Checkpoint, r io.Reader, maxBytes int64) (checkpoints.Checkpoint, error) {
	if err := s.begin(ctx, "put checkpoint"); err != nil {
		return checkpoints.Checkpoint{}, err
	}
	meta, err := checkpoints.CheckPut(meta, maxBytes)
	if err != nil {
		return checkpoints.Checkpoint{}, err
	}
	action := "put checkpoint " + meta.ID
	// A known id is refused before the archive is read, and the reading
	// stops where the budget ends.
	var used checkpoints.Usage
	err = s.view(ctx, action, func(tx *bolt.Tx) error {
		if tx.Bucket(bucketRecords).Get([]byte(meta.ID)) != nil {
			return checkpoints.ErrExists
		}
		used = usage(tx, meta.Owner)
		return nil
	})
	if err != nil {
		return checkpoints.Checkpoint{}, err
	}
	d, err := s.cfg.Budget.Reader(ctx, r, maxBytes, used)
	if err != nil {
		return checkpoints.Checkpoint{}, fmt.Errorf("%s: %w", action, err)
	}
	tmp, err := s.receive(d, &meta)
	if err != nil {
		return checkpoints.Checkpoint{}, fmt.Errorf("%s: %w", action, err)
	}
	defer func() { _ = os.Remove(tmp) }() // gone already once renamed
	if err := s.commit(ctx, action, meta, tmp); err != nil {
		return checkpoints.Checkpoint{}, err
	}
	return meta, nil
}

// receive copies d into a new temp file, syncs it, and sets meta's SHA256
// and SizeBytes. It returns the file's path; on failure it leaves no file.
func (s *Store) receive(d *checkpoints.DigestReader, meta *checkpoints.Checkpoint) (path string, err error) {
	f, err := os.CreateTemp(s.tmp, meta.ID+"-*")
	if err != nil {
		return "", fmt.Errorf("create temp file: %w", err)
	}
	defer func() {
		if cerr := f.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("close temp file: %w", cerr)
		}
		if err != nil {
			_ = os.Remove(f.Name())
		}
	}()
	// newWriteback starts the disk's writes while the body streams (and,
	// not being an *os.File, has no ReadFrom: the copy uses this buffer
	// rather than a small one of its own).
	var w io.Writer = struct{ io.Writer }{f}
	if !s.cfg.NoSync {
		w = newWriteback(f)
	}
	if _, err := io.CopyBuffer(w, d, make([]byte, copyBuffer)); err != nil {
		if derr := d.Err(); derr != nil {
			return "", derr
		}
		return "", fmt.Errorf("write temp file: %w", err)
	}
	if !s.cfg.NoSync {
		if err := f.Sync(); err != nil {
			return "", fmt.Errorf("sync temp file: %w", err)
		}
	}
	meta.SHA256, meta.SizeBytes = d.SHA256(), d.Size()
	return f.Name(), nil
}

// commit makes tmp the blob of meta.SHA256 (or drops it for the blob that
// has those bytes already) and commits meta's record counting it, if the
// budget has room for it (hold).
func (s *Store) commit(ctx context.Context, action string, meta checkpoints.Checkpoint, tmp string) error {
	s.blobMu.Lock()
	defer s.blobMu.Unlock()
	blob := s.blobPath(meta.SHA256)
	created := false
	switch _, err := os.Stat(blob); {
	case errors.Is(err, fs.ErrNotExist):
		if err := s.place(tmp, blob); err != nil {
			return fmt.Errorf("%s: %w", action, err)
		}
		created = true
	case err != nil:
		return fmt.Errorf("%s: %w", action, err)
	}
	val, err := json.Marshal(record{Checkpoint: meta, Owner: meta.Owner})
	if err != nil {
		return fmt.Errorf("%s: %w", action, err)
	}
	err = s.update(ctx, action, func(tx *bolt.Tx) error {
		recs := tx.Bucket(bucketRecords)
		id := []byte(meta.ID)
		if recs.Get(id) != nil {
			return checkpoints.ErrExists
		}
		if err := recs.Put(id, val); err != nil {
			return err
		}
		if err := tx.Bucket(bucketOwner).Put(ownerKey(meta), nil); err != nil {
			return err
		}
		if err := tx.Bucket(bucketExpiry).Put(expiryKey(meta), nil); err != nil {
			return err
		}
		if err := hold(tx, meta, 1, s.cfg.Budget); err != nil {
			return err
		}
		_, err := addCount(tx.Bucket(bucketRefs), []byte(meta.SHA256), 1)
		return err
	})
	if err != nil && created {
		// No record counts the blob just placed: the lock kept every other
		// Put from finding it.
		_ = os.Remove(blob)
	}
	return err
}

// place renames tmp to blob, making its directory when needed, and syncs
// the directories whose entries changed.
func (s *Store) place(tmp, blob string) error {
	dir := filepath.Dir(blob)
	switch err := os.Mkdir(dir, 0o700); {
	case err == nil:
		if err := s.syncDir(s.blobs); err != nil {
			return err
		}
	case !errors.Is(err, fs.ErrExist):
		return fmt.Errorf("create blob directory: %w", err)
	}
	if err := os.Rename(tmp, blob); err != nil {
		return fmt.Errorf("place blob: %w", err)
	}
	return s.syncDir(dir)
}

func (s *Store) syncDir(dir string) error {
	if s.cfg.NoSync {
		return nil
	}
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync directory: %w", err)
	}
	defer func() { _ = d.Close() }()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync directory %s: %w", dir, err)
	}
	return nil
}

// Get implements checkpoints.Store.
func (s *Store) Get(ctx context.Context, id, owner string) (checkpoints.Checkpoint, error) {
	var c checkpoints.Checkpoint
	err := s.view(ctx, "get checkpoint "+id, func(tx *bolt.Tx) error {
		var err error
		c, err = s.visible(tx, id, owner)
		return err
	})
	return c, err
}

// visible reads id's record for owner: ErrNotFound when there is none,
// it is another owner's or it has expired.
func (s *Store) visible(tx *bolt.Tx, id, owner string) (checkpoints.Checkpoint, error) {
	rec, ok, err := readRecord(tx, id)
	if err != nil {
		return checkpoints.Checkpoint{}, err
	}
	if !ok || rec.Owner != owner || rec.Expired(s.cfg.Clock.Now()) {
		return checkpoints.Checkpoint{}, checkpoints.ErrNotFound
	}
	return rec.Checkpoint, nil
}

func readRecord(tx *bolt.Tx, id string) (record, bool, error) {
	if !checkpoints.ValidID(id) {
		return record{}, false, nil
	}
	v := tx.Bucket(bucketRecords).Get([]byte(id))
	if v == nil {
		return record{}, false, nil
	}
	var rec record
	if err := json.Unmarshal(v, &rec); err != nil {
		return record{}, false, fmt.Errorf("decode checkpoint %s: %w", id, err)
	}
	rec.Checkpoint.Owner = rec.Owner
	return rec, true, nil
}

// Open implements checkpoints.Store. The blob is opened under the shared
// lock, so no Delete unlinks it between the read of the record and the
// open; once open, it reads to the end whatever happens to the file.
func (s *Store) Open(ctx context.Context, id, owner string) (io.ReadCloser, checkpoints.Checkpoint, error) {
	s.blobMu.RLock()
	defer s.blobMu.RUnlock()
	c, err := s.Get(ctx, id, owner)
	if err != nil {
		return nil, checkpoints.Checkpoint{}, err
	}
	f, err := os.Open(s.blobPath(c.SHA256))
	if err != nil {
		return nil, checkpoints.Checkpoint{}, fmt.Errorf("open checkpoint %s: %w", id, err)
	}
	return checkpoints.NewVerifyReader(f, c.SizeBytes, c.SHA256), c, nil
}

// List implements checkpoints.Store: a walk of the owner's index keys,
// newest first, that stops at the limit.
func (s *Store) List(ctx context.Context, f checkpoints.Filter) ([]checkpoints.Checkpoint, error) {
	f, err := f.Check()
	if err != nil {
		return nil, err
	}
	now := s.cfg.Clock.Now()
	out := []checkpoints.Checkpoint{}
	err = s.view(ctx, "list checkpoints", func(tx *bolt.Tx) error {
		prefix := lp(f.Owner)
		c := tx.Bucket(bucketOwner).Cursor()
		var k []byte
		if end := prefixEnd(prefix); end != nil {
			k, _ = c.Seek(end)
		}
		if k == nil {
			k, _ = c.Last()
		} else {
			k, _ = c.Prev()
		}
		for ; k != nil && bytes.HasPrefix(k, prefix) && len(out) < f.Limit; k, _ = c.Prev() {
			rec, ok, err := readRecord(tx, string(k[len(prefix)+8:]))
			if err != nil {
				return err
			}
			if ok && !rec.Expired(now) && f.Matches(rec.Checkpoint) {
				out = append(out, rec.Checkpoint)
			}
		}
		return nil
	})
	return out, err
}

// Delete implements checkpoints.Store.
func (s *Store) Delete(ctx context.Context, id, owner string) error {
	return s.remove(ctx, "delete checkpoint "+id, func(tx *bolt.Tx) ([]record, error) {
		rec, ok, err := readRecord(tx, id)
		switch {
		case err != nil:
			return nil, err
		case !ok:
			return nil, nil
		case rec.Owner != owner:
			return nil, checkpoints.ErrNotFound
		}
		return []record{rec}, nil
	})
}

// Purge implements checkpoints.Store: the head of the expiry index, up to
// budget records, in one transaction.
func (s *Store) Purge(ctx context.Context, now time.Time, budget int) (int, error) {
	var n int
	err := s.remove(ctx, "purge checkpoints", func(tx *bolt.Tx) ([]record, error) {
		var recs []record
		c := tx.Bucket(bucketExpiry).Cursor()
		for k, _ := c.First(); k != nil && len(recs) < budget; k, _ = c.Next() {
			if int64(binary.BigEndian.Uint64(k)) > now.UnixNano() {
				break
			}
			rec, ok, err := readRecord(tx, string(k[8:]))
			if err != nil {
				return nil, err
			}
			if !ok {
				return nil, fmt.Errorf("expiry index names checkpoint %s, which has no record", k[8:])
			}
			recs = append(recs, rec)
		}
		n = len(recs)
		return recs, nil
	})
	if err != nil {
		return 0, err
	}
	return n, nil
}

// remove deletes the records pick chooses, with their index keys and
// references, in one transaction, then unlinks the blobs left without a
// reference.
func (s *Store) remove(ctx context.Context, action string, pick func(*bolt.Tx) ([]record, error)) error {
	s.blobMu.Lock()
	defer s.blobMu.Unlock()
	var unused []string
	err := s.update(ctx, action, func(tx *bolt.Tx) error {
		recs, err := pick(tx)
		if err != nil {
			return err
		}
		unused = unused[:0]
		for _, rec := range recs {
			for _, del := range []struct {
				bucket, key []byte
			}{{bucketRecords, []byte(rec.ID)}, {bucketOwner, ownerKey(rec.Checkpoint)}, {bucketExpiry, expiryKey(rec.Checkpoint)}} {
				if err := tx.Bucket(del.bucket).Delete(del.key); err != nil {
					return err
				}
			}
			if err := hold(tx, rec.Checkpoint, -1, checkpoints.Budget{}); err != nil {
				return err
			}
			left, err := addCount(tx.Bucket(bucketRefs), []byte(rec.SHA256), -1)
			if err != nil {
				return err
			}
			if left == 0 {
				unused = append(unused, rec.SHA256)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, sha := range unused {
		if err := os.Remove(s.blobPath(sha)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			// The records are gone; the next Open collects the blob.
			s.cfg.Logger.Warn("checkpoint store: could not remove an unreferenced blob", "sha256", sha, "error", err)
		}
	}
	return nil
}

// count reads a counter of b (0 when absent).
func count(b *bolt.Bucket, key []byte) int64 {
	if v := b.Get(key); v != nil {
		return int64(binary.BigEndian.Uint64(v))
	}
	return 0
}

// addCount adds delta to a counter of b (a blob's references, an owner's
// references to a blob, bytes used) and returns the new count; at 0 the
// entry is deleted, and below 0 is an error: the counts are wrong.
func addCount(b *bolt.Bucket, key []byte, delta int64) (int64, error) {
	n := count(b, key) + delta
	switch {
	case n < 0:
		return 0, fmt.Errorf("counter %q below zero: the counts are wrong", key)
	case n == 0:
		return 0, b.Delete(key)
	}
	return n, b.Put(key, binary.BigEndian.AppendUint64(nil, uint64(n)))
}

// blobPath is where the blob of sha lives: blobs/<sha[:2]>/<sha>.
func (s *Store) blobPath(sha string) string { return filepath.Join(s.blobs, sha[:2], sha) }

// begin checks that the store is open and ctx alive.
func (s *Store) begin(ctx context.Context, action string) error {
	if s.closed.Load() {
		return fmt.Errorf("%s: %w", action, checkpoints.ErrClosed)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%s: %w", action, err)
	}
	return nil
}

func (s *Store) update(ctx context.Context, action string, fn func(*bolt.Tx) error) error {
	return s.run(ctx, action, true, fn)
}

func (s *Store) view(ctx context.Context, action string, fn func(*bolt.Tx) error) error {
	return s.run(ctx, action, false, fn)
}

// run runs fn in one transaction; errors name the action, and a closed
// database is checkpoints.ErrClosed.
func (s *Store) run(ctx context.Context, action string, writable bool, fn func(*bolt.Tx) error) error {
	if err := s.begin(ctx, action); err != nil {
		return err
	}
	var err error
	if writable {
		err = s.db.Update(fn)
	} else {
		err = s.db.View(fn)
	}
	switch {
	case err == nil:
		return nil
	case errors.Is(err, bolt.ErrDatabaseNotOpen):
		return fmt.Errorf("%s: %w", action, checkpoints.ErrClosed)
	default:
		return fmt.Errorf("%s: %w", action, err)
	}
}

// lp is s with its length in front, so that one owner's keys never
// prefix another's.
func lp(s string) []byte {
	b := binary.AppendUvarint(make([]byte, 0, len(s)+2), uint64(len(s)))
	return append(b, s...)
}

// prefixEnd returns the smallest key above every key that starts with p.
func prefixEnd(p []byte) []byte {
	end := bytes.Clone(p)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] < 0xff {
			end[i]++
			return end[:i+1]
		}
	}
	return nil // p is all 0xff: nothing above; the caller starts at the last key
}

// ownerKey is c's key in by_owner: lp(owner), created (ns, big endian),
// id — in List's order when walked backwards.
func ownerKey(c checkpoints.Checkpoint) []byte {
	k := binary.BigEndian.AppendUint64(lp(c.Owner), uint64(c.CreatedAt.UnixNano()))
	return append(k, c.ID...)
}

// expiryKey is c's key in by_expiry: expires (ns, big endian), id.
func expiryKey(c checkpoints.Checkpoint) []byte {
	return append(binary.BigEndian.AppendUint64(nil, uint64(c.ExpiresAt.UnixNano())), c.ID...)
}
