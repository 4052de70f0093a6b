package checkpoints

import (
	"errors"
	"fmt"
	"time"

	"github.com/quarryhq/quarry/internal/defaults"
)

// Store names (QUARRY_CHECKPOINT_STORE).
const (
	StoreEmbedded = "embedded" // checkpoints/filestore, under QUARRY_DATA_DIR
	StoreS3       = "s3"       // checkpoints/s3store
)

// Defaults of Config.
const (
	DefaultRetention = 7 * 24 * time.Hour
	DefaultMaxBytes  = 4 << 30 // 4 GiB
)

// Config is what the gateway needs to know about checkpoints whichever
// store keeps them; each store has its own Config for the rest. The zero
// value of each field takes the default noted on it; cmd/ fills it from
// the environment.
type Config struct {
	// Store picks the store: "embedded" (default) or "s3".
	Store string `envconfig:"QUARRY_CHECKPOINT_STORE"`
	// Retention is how long a checkpoint lives after it was taken:
	// ExpiresAt = CreatedAt + Retention (default 7 days).
	Retention time.Duration `envconfig:"QUARRY_CHECKPOINT_RETENTION"`
	// MaxBytes is the largest archive a Put keeps, as stored (compressed);
	// a larger one is ErrTooLarge, a 413 (default 4 GiB).
	MaxBytes int64 `envconfig:"QUARRY_MAX_CHECKPOINT_BYTES"`
	// BudgetPerKey is the most bytes one API key's checkpoints take in the
	// store (Budget.PerOwner); a Put past it is a *BudgetError, a 429.
	// 0 (unset) or -1: no limit.
	BudgetPerKey int64 `envconfig:"QUARRY_CHECKPOINT_BUDGET_PER_KEY"`
	// BudgetTotal is the most bytes all checkpoints take (Budget.Total).
	// 0 (unset): half the file system an embedded store is on, none for
	// S3 (Budget says how); -1: no limit.
	BudgetTotal int64 `envconfig:"QUARRY_CHECKPOINT_BUDGET_TOTAL"`
}

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	defaults.Set(&c.Store, StoreEmbedded)
	defaults.Set(&c.Retention, DefaultRetention)
	defaults.Set(&c.MaxBytes, DefaultMaxBytes)
	return c
}

// Validate checks c after defaults; each error names its variable.
func (c Config) Validate() error {
	c = c.WithDefaults()
	var errs []error
	if c.Store != StoreEmbedded && c.Store != StoreS3 {
		errs = append(errs, fmt.Errorf("QUARRY_CHECKPOINT_STORE: %q; want %q or %q", c.Store, StoreEmbedded, StoreS3))
	}
	if c.Retention <= 0 {
		errs = append(errs, fmt.Errorf("QUARRY_CHECKPOINT_RETENTION: %s is not a positive duration", c.Retention))
	}
	if c.MaxBytes <= 0 {
		errs = append(errs, fmt.Errorf("QUARRY_MAX_CHECKPOINT_BYTES: %d; at least 1", c.MaxBytes))
	}
	for _, b := range []struct {
		name string
		v    int64
	}{{"QUARRY_CHECKPOINT_BUDGET_PER_KEY", c.BudgetPerKey}, {"QUARRY_CHECKPOINT_BUDGET_TOTAL", c.BudgetTotal}} {
		if b.v < NoBudget {
			errs = append(errs, fmt.Errorf("%s: %d; a number of bytes, or %d for no limit", b.name, b.v, NoBudget))
		}
	}
	return errors.Join(errs...)
}

// NoBudget is the value of BudgetPerKey and BudgetTotal that sets no limit.
const NoBudget = -1

// Budget returns the store's budget. fsBytes is the size of the file
// system an embedded store is on (0 for S3): unset, the total is half of
// it, so that checkpoints alone never fill the disk the gateway's data
// dir shares; S3 has no disk to fill, and no default.
func (c Config) Budget(fsBytes int64) Budget {
	total := c.BudgetTotal
	if total == 0 {
		total = fsBytes / 2
	}
	return Budget{PerOwner: max(c.BudgetPerKey, 0), Total: max(total, 0)}
}

// Stamp returns meta with CreatedAt set to now and ExpiresAt to now +
// Retention (defaults applied): the times a new checkpoint carries.
func (c Config) Stamp(meta Checkpoint, now time.Time) Checkpoint {
	c = c.WithDefaults()
	meta.CreatedAt = utc(now)
	meta.ExpiresAt = meta.CreatedAt.Add(c.Retention)
	return meta
}
