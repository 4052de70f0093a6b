package checkpoints

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"errors"
	"io"
	"strings"
	"time"
)

// Checkpoint is one stored archive of a sandbox's paths (metadata; the
// bytes live in the store).
type Checkpoint struct {
	ID        string            `json:"id"`      // "ckp-" + 26 base32 chars, chosen by the caller (NewID)
	Owner     string            `json:"-"`       // the API key's owner hash (as warmpool.Lease.Owner)
	Pool      string            `json:"pool"`    // the pool of the sandbox it was taken from
	Image     string            `json:"image"`   // that pool's image (restores check it)
	Sandbox   string            `json:"sandbox"` // the lease id it was taken from
	Paths     []string          `json:"paths"`   // absolute paths in the sandbox
	Exclude   []string          `json:"exclude,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
	Format    string            `json:"format"`     // "tar" or "tar+gzip" (agentapi names them)
	SizeBytes int64             `json:"size_bytes"` // archive bytes as stored
	Files     int               `json:"files"`      // entries in the archive
	SHA256    string            `json:"sha256"`     // hex of the archive bytes
	CreatedAt time.Time         `json:"created_at"`
	ExpiresAt time.Time         `json:"expires_at"` // CreatedAt + retention
}

// Expired reports whether c has expired at now: now is at or past
// ExpiresAt. An expired checkpoint is ErrNotFound to Get and Open, absent
// from List, and Purge deletes it.
func (c Checkpoint) Expired(now time.Time) bool { return !now.Before(c.ExpiresAt) }

// The contract's sentinel errors. Stores wrap them with what they were
// doing (errors.Is finds them); errclass classifies them.
var (
	// ErrNotFound: no such checkpoint for this owner: unknown, expired,
	// being deleted, or another owner's (which must be indistinguishable).
	ErrNotFound = errors.New("checkpoint not found")
	// ErrTooLarge: the archive exceeded Put's maxBytes; nothing was kept.
	ErrTooLarge = errors.New("checkpoint archive too large")
	// ErrCorrupt: the stored bytes do not hash to the checkpoint's SHA256,
	// or their size differs from SizeBytes.
	ErrCorrupt = errors.New("checkpoint archive corrupt")
	// ErrExists: Put was given an id that exists already (any owner's).
	ErrExists = errors.New("checkpoint id exists")
	// ErrUnavailable: the store's backend could not be reached or refused
	// the load (throttling, a server fault, a timeout); retry later.
	ErrUnavailable = errors.New("checkpoint store unavailable")
	// ErrClosed: the store was closed.
	ErrClosed = errors.New("checkpoint store closed")
	// ErrOverBudget: a Put would have taken the store past its Budget;
	// nothing was kept. The error is a *BudgetError, which says by how
	// much.
	ErrOverBudget = errors.New("checkpoint budget spent")
)

// Store keeps checkpoints. Implementations are safe for concurrent use;
// every method that does I/O takes ctx and stops when it ends (returning
// its error). The conformance suite (checkpointtest) holds every rule below.
type Store interface {
	// Put reads the archive from r (streaming: never held whole in memory)
	// and stores it under meta (ID, Owner, ... set by the caller),
	// computing SHA256 and SizeBytes, and returns the stored metadata.
	// Over maxBytes it stops reading (at most maxBytes+1 bytes are read),
	// keeps nothing and returns ErrTooLarge. An ID that exists is
	// ErrExists. Metadata CheckPut refuses is a *badinput.Error. A reader
	// that fails, or a ctx that ends, keeps nothing and returns that error.
	// Past the store's Budget (its Config) it keeps nothing and returns a
	// *BudgetError: it reads at most what the budget left at its start
	// (+1 byte, Budget.Reader), and its commit counts the archive only if
	// it still fits. Nothing is visible to Get/List/Open, and nothing
	// counts in Usage, until Put returns nil.
	Put(ctx context.Context, meta Checkpoint, r io.Reader, maxBytes int64) (Checkpoint, error)
	// Get returns the checkpoint; ErrNotFound when unknown, expired or
	// another owner's.
	Get(ctx context.Context, id, owner string) (Checkpoint, error)
	// Open streams the archive; the reader returns ErrCorrupt (instead of
	// io.EOF) when the bytes read do not hash to SHA256 or their size
	// differs, so a caller that copies it to the end learns of corruption
	// before it commits anything. Errors as Get's. The caller closes the
	// reader.
	Open(ctx context.Context, id, owner string) (io.ReadCloser, Checkpoint, error)
	// List returns an owner's checkpoints matching every label, newest
	// first (CreatedAt, then ID, descending), at most Limit (Filter.Check).
	// Expired checkpoints are not listed.
	List(ctx context.Context, f Filter) ([]Checkpoint, error)
	// Delete removes it: idempotent for an owner's own id (an unknown or
	// already deleted id is nil); ErrNotFound for another's.
	Delete(ctx context.Context, id, owner string) error
	// Purge deletes checkpoints that expired at or before now, at most
	// budget of them, and returns how many it deleted (called periodically
	// with a budget: work grows with change). budget <= 0 deletes nothing.
	// Delete and Purge free what Usage counted (Budget's rules).
	Purge(ctx context.Context, now time.Time, budget int) (int, error)
	// Usage returns the bytes counted against the store's Budget for owner
	// and for all owners, from counters the store keeps durably with its
	// checkpoints (never a walk of them). An owner with none has 0.
	Usage(ctx context.Context, owner string) (Usage, error)
	// Close makes later calls return ErrClosed; calls in flight finish or
	// fail. A reader returned by Open before may still be read. Closing
	// twice returns nil.
	Close() error
}

// Filter selects the checkpoints List returns.
type Filter struct {
	// Owner is required: List never crosses owners.
	Owner string
	// Labels: a checkpoint is listed when it carries every one of them
	// with the same value (nil or empty: all).
	Labels map[string]string
	// Limit is the most returned: 0 or less is DefaultListLimit, above
	// MaxListLimit is MaxListLimit.
	Limit int
}

// List limits.
const (
	DefaultListLimit = 100
	MaxListLimit     = 1000
)

// Matches reports whether c carries every label of f.
func (f Filter) Matches(c Checkpoint) bool {
	for k, v := range f.Labels {
		if got, ok := c.Labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// IDPrefix starts every checkpoint id.
const IDPrefix = "ckp-"

// idEncoding is lowercase base32 without padding, as the warm pool's ids:
// URL-safe and valid in object keys and file names.
var idEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// NewID returns a new checkpoint id: "ckp-" and 128 random bits (26
// lowercase base32 characters). Safe for concurrent use.
func NewID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (it panics on a broken source)
	return IDPrefix + idEncoding.EncodeToString(b[:])
}

// ValidID reports whether id has the shape of a checkpoint id, so that
// callers (and stores) refuse garbage before a read: a malformed id is
// simply not found.
func ValidID(id string) bool {
	rest, ok := strings.CutPrefix(id, IDPrefix)
	if !ok || len(rest) != 26 {
		return false
	}
	_, err := idEncoding.DecodeString(rest)
	return err == nil
}
