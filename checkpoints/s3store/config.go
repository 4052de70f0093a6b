package s3store

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/quarryhq/quarry/checkpoints"
	"github.com/quarryhq/quarry/internal/clock"
	"github.com/quarryhq/quarry/internal/defaults"
)

// Defaults of Config.
const (
	DefaultTable             = "quarry-checkpoints"
	DefaultPrefix            = "checkpoints/"
	DefaultPartSize          = 8 << 20
	DefaultUploadConcurrency = 2
	DefaultPendingGrace      = 6 * time.Hour
	// MinPartSize is S3's smallest multipart part (but the last).
	MinPartSize = 5 << 20
)

// Config configures the store; cmd/ fills it with envconfig.
type Config struct {
	// Bucket holds the archives (QUARRY_CHECKPOINT_BUCKET). Required.
	Bucket string `envconfig:"QUARRY_CHECKPOINT_BUCKET"`
	// Prefix starts every object key (QUARRY_CHECKPOINT_PREFIX, default
	// "checkpoints/").
	Prefix string `envconfig:"QUARRY_CHECKPOINT_PREFIX"`
	// Table is the metadata table (QUARRY_CHECKPOINT_TABLE, default
	// quarry-checkpoints).
	Table string `envconfig:"QUARRY_CHECKPOINT_TABLE"`
	// PartSize is the multipart upload's part size
	// (QUARRY_CHECKPOINT_PART_SIZE, default 8 MiB, at least 5 MiB).
	PartSize int64 `envconfig:"QUARRY_CHECKPOINT_PART_SIZE"`
	// UploadConcurrency is how many parts of one Put are in flight
	// (QUARRY_CHECKPOINT_UPLOAD_CONCURRENCY, default 2). One Put holds
	// about (UploadConcurrency + 2) × PartSize.
	UploadConcurrency int `envconfig:"QUARRY_CHECKPOINT_UPLOAD_CONCURRENCY"`
	// PendingGrace is how long an upload may take before Purge collects
	// its pending item (QUARRY_CHECKPOINT_PENDING_GRACE, default 6 h).
	PendingGrace time.Duration `envconfig:"QUARRY_CHECKPOINT_PENDING_GRACE"`
	// Budget is what the store keeps, per owner and in all (none when
	// zero); cmd/ sets it from checkpoints.Config.Budget.
	Budget checkpoints.Budget `ignored:"true"`
	// Clock tells the time for expiry on reads (default clock.System).
	Clock clock.Clock `ignored:"true"`
	// Logger receives what cannot be returned: an object or item a failed
	// Put could not clean up (default slog.Default).
	Logger *slog.Logger `ignored:"true"`
}

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	defaults.Set(&c.Prefix, DefaultPrefix)
	defaults.Set(&c.Table, DefaultTable)
	defaults.Positive(&c.PartSize, DefaultPartSize)
	defaults.Positive(&c.UploadConcurrency, DefaultUploadConcurrency)
	defaults.Positive(&c.PendingGrace, DefaultPendingGrace)
	if c.Clock == nil {
		c.Clock = clock.System{}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate checks c after defaults; each error names its variable.
func (c Config) Validate() error {
	c = c.WithDefaults()
	var errs []error
	if c.Bucket == "" {
		errs = append(errs, errors.New("QUARRY_CHECKPOINT_BUCKET: required with QUARRY_CHECKPOINT_STORE=s3"))
	}
	if c.PartSize < MinPartSize {
		errs = append(errs, fmt.Errorf("QUARRY_CHECKPOINT_PART_SIZE: %d; at least %d (S3's smallest part)", c.PartSize, MinPartSize))
	}
	return errors.Join(errs...)
}
