package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/kelseyhightower/envconfig"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/quarryhq/quarry/checkpoints"
	"github.com/quarryhq/quarry/checkpoints/filestore"
	"github.com/quarryhq/quarry/checkpoints/s3store"
	"github.com/quarryhq/quarry/internal/defaults"
)

// CheckpointConfig is the checkpoints' configuration: the store, the
// retention and the size limit (checkpoints.Config), and the purge loop.
type CheckpointConfig struct {
	checkpoints.Config
	// PurgeInterval is how often expired checkpoints are deleted (0: 5 m).
	PurgeInterval time.Duration `envconfig:"QUARRY_CHECKPOINT_PURGE_INTERVAL"`
	// PurgeBudget is the most checkpoints one pass deletes (0: 200); a
	// backlog drains over passes.
	PurgeBudget int `envconfig:"QUARRY_CHECKPOINT_PURGE_BUDGET"`
	// Dir is the embedded store's directory ("": $QUARRY_DATA_DIR/checkpoints).
	// One gateway process holds it at a time.
	Dir string `envconfig:"QUARRY_CHECKPOINT_DIR"`
}

// Defaults of CheckpointConfig's purge loop.
const (
	defaultPurgeInterval = 5 * time.Minute
	defaultPurgeBudget   = 200
)

// WithDefaults returns c with every zero field set to its default.
func (c CheckpointConfig) WithDefaults() CheckpointConfig {
	c.Config = c.Config.WithDefaults()
	defaults.Set(&c.PurgeInterval, defaultPurgeInterval)
	defaults.Set(&c.PurgeBudget, defaultPurgeBudget)
	return c
}

// Validate checks c after defaults; each error names its variable.
func (c CheckpointConfig) Validate() error {
	if err := c.Config.Validate(); err != nil {
		return err
	}
	c = c.WithDefaults()
	if c.PurgeInterval < 0 {
		return fmt.Errorf("QUARRY_CHECKPOINT_PURGE_INTERVAL: must be positive, got %s", c.PurgeInterval)
	}
	if c.PurgeBudget < 0 {
		return fmt.Errorf("QUARRY_CHECKPOINT_PURGE_BUDGET: must be positive, got %d", c.PurgeBudget)
	}
	return nil
}

// openCheckpointStore opens the store QUARRY_CHECKPOINT_STORE names: the
// embedded one under $QUARRY_DATA_DIR/checkpoints, or S3 with its metadata
// in DynamoDB (the AWS configuration of the lease store: region, endpoint,
// credentials).
func openCheckpointStore(ctx context.Context, cfg Config, log *slog.Logger) (checkpoints.Store, error) {
	switch cfg.CheckpointConfig.WithDefaults().Store {
	case checkpoints.StoreS3:
		budget := cfg.CheckpointConfig.Budget(0)
		var sc s3store.Config
		if err := envconfig.Process("", &sc); err != nil {
			return nil, fmt.Errorf("read QUARRY_CHECKPOINT_* configuration: %w", err)
		}
		sc.Logger, sc.Budget = log, budget
		awsCfg, err := loadAWS(ctx, cfg.DynamoConfig)
		if err != nil {
			return nil, err
		}
		// Path-style addressing when an endpoint is set (an emulator on
		// 127.0.0.1 has no per-bucket host names).
		pathStyle := awsCfg.BaseEndpoint != nil && *awsCfg.BaseEndpoint != ""
		s3c := s3.NewFromConfig(awsCfg, func(o *s3.Options) { o.UsePathStyle = pathStyle })
		st, err := s3store.New(sc, s3c, dynamodb.NewFromConfig(awsCfg))
		if err != nil {
			return nil, err
		}
		log.Info("checkpoint store: S3", "bucket", sc.Bucket, "table", sc.WithDefaults().Table,
			"budget_per_key", budget.PerOwner, "budget_total", budget.Total)
		return st, nil
	default:
		dir := cfg.CheckpointConfig.Dir
		if dir == "" {
			dir = filepath.Join(cfg.DataDir, "checkpoints")
		}
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("open checkpoint store: %w", err)
		}
		fs, err := fileSystemSize(dir)
		if err != nil {
			return nil, fmt.Errorf("open checkpoint store: the size of the file system of %s (QUARRY_CHECKPOINT_BUDGET_TOTAL's default): %w", dir, err)
		}
		budget := cfg.CheckpointConfig.Budget(fs)
		st, err := filestore.Open(filestore.Config{Dir: dir, Logger: log, Budget: budget})
		if err != nil {
			return nil, err
		}
		log.Info("checkpoint store: embedded", "dir", dir, "budget_per_key", budget.PerOwner, "budget_total", budget.Total)
		return st, nil
	}
}

// purger deletes expired checkpoints every interval, at most budget per
// pass. Start it once; Close stops it and waits.
type purger struct {
	store    checkpoints.Store
	interval time.Duration
	budget   int
	log      *slog.Logger
	purged   prometheus.Counter
	failures prometheus.Counter

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// newPurger builds a purger and registers its metrics on reg.
func newPurger(store checkpoints.Store, cfg CheckpointConfig, log *slog.Logger, reg prometheus.Registerer) (*purger, error) {
	cfg = cfg.WithDefaults()
	p := &purger{
		store: store, interval: cfg.PurgeInterval, budget: cfg.PurgeBudget, log: log,
		purged: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "quarry_checkpoints_purged_total",
			Help: "Expired checkpoints deleted by the purge loop.",
		}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "quarry_checkpoint_purge_failures_total",
			Help: "Purge passes that failed (the next pass retries).",
		}),
	}
	for _, c := range []prometheus.Collector{p.purged, p.failures} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register checkpoint purge metrics: %w", err)
		}
	}
	return p, nil
}

// Start runs passes until Close.
func (p *purger) Start(ctx context.Context) {
	ctx, p.cancel = context.WithCancel(context.WithoutCancel(ctx))
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		t := time.NewTicker(p.interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				p.pass(ctx)
			}
		}
	}()
}

// pass deletes at most budget expired checkpoints.
func (p *purger) pass(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, p.interval)
	defer cancel()
	n, err := p.store.Purge(ctx, time.Now(), p.budget)
	p.purged.Add(float64(n))
	switch {
	case err != nil:
		p.failures.Inc()
		p.log.Warn("purge expired checkpoints", "deleted", n, "err", err)
	case n == p.budget:
		p.log.Info("purge expired checkpoints: the pass used its whole budget; the rest waits for the next", "deleted", n, "budget", p.budget)
	case n > 0:
		p.log.Debug("purge expired checkpoints", "deleted", n)
	}
}

// Close stops the loop and waits for a pass in flight (bounded by ctx:
// the pass is cancelled).
func (p *purger) Close(ctx context.Context) {
	if p.cancel == nil {
		return
	}
	p.cancel()
	done := make(chan struct{})
	go func() { p.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
	}
}
