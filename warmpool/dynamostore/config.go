package dynamostore

import (
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/quarryhq/quarry/internal/clock"
)

// Defaults of Config.
const (
	DefaultTasksTable      = "quarry-tasks"
	DefaultLeasesTable     = "quarry-leases"
	DefaultShards          = 8
	DefaultClaimCandidates = 4
	DefaultEndedTTL        = 7 * 24 * time.Hour
	DefaultCallTimeout     = 10 * time.Second
	DefaultTableWait       = 5 * time.Minute
	DefaultMaxAttempts     = 5
)

// maxShards bounds Config.Shards: a stamp writes every shard of a counter
// in one transaction, and a reservation touches a pool's and a class's
// shards besides its task records (MaxReserve), within DynamoDB's 100
// items per transaction.
const maxShards = 64

// Config configures the store. The zero value of each field takes the
// default noted on it; cmd/ fills it from the environment (QUARRY_ prefix).
type Config struct {
	// TasksTable holds task records, capacity counters and the schema item
	// (default "quarry-tasks").
	TasksTable string `envconfig:"QUARRY_DYNAMODB_TASKS_TABLE"`
	// LeasesTable holds leases, idempotency keys and locks (default
	// "quarry-leases").
	LeasesTable string `envconfig:"QUARRY_DYNAMODB_LEASES_TABLE"`
	// Shards is how many partition keys each sharded index and each pool's
	// capacity counter is spread over (default 8, at most 64). It is part of
	// the tables' schema: CreateTables records it and refuses tables made
	// with another value, since changing it would hide index entries and
	// capacity already counted.
	Shards int `envconfig:"QUARRY_DYNAMODB_SHARDS"`
	// Region is the AWS region, passed to the SDK by SDKOptions; empty
	// leaves it to the SDK's default chain (AWS_REGION).
	Region string `envconfig:"QUARRY_DYNAMODB_REGION"`
	// MaxAttempts is how many times the SDK tries one call before its error
	// (throttling, 5xx, connection) surfaces as warmpool.ErrUnavailable
	// (default 5), passed to the SDK by SDKOptions.
	MaxAttempts int `envconfig:"QUARRY_DYNAMODB_MAX_ATTEMPTS"`
	// ClaimCandidates is how many ready tasks one claim reads from a shard
	// before it tries them one by one (default 4).
	ClaimCandidates int `envconfig:"QUARRY_DYNAMODB_CLAIM_CANDIDATES"`
	// EndedTTL is how long after its end a lease (and its idempotency key)
	// carries a live TTL attribute; past it reads treat the lease as purged
	// and DynamoDB deletes it eventually (default 7 days). It must exceed the
	// manager's lease retention, after which PurgeLeases deletes it anyway.
	EndedTTL time.Duration `envconfig:"QUARRY_DYNAMODB_ENDED_TTL"`
	// CallTimeout bounds each DynamoDB call, retries included (default 10 s).
	CallTimeout time.Duration `envconfig:"QUARRY_DYNAMODB_CALL_TIMEOUT"`
	// TableWait bounds how long CreateTables and DeleteTables wait for the
	// tables to become ACTIVE or to go (default 5 min).
	TableWait time.Duration `envconfig:"QUARRY_DYNAMODB_TABLE_WAIT"`
	// Clock tells the time for TTL checks on reads, which get no time from
	// their caller (default: clock.System).
	Clock clock.Clock `ignored:"true"`
}

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.TasksTable == "" {
		c.TasksTable = DefaultTasksTable
	}
	if c.LeasesTable == "" {
		c.LeasesTable = DefaultLeasesTable
	}
	if c.Shards == 0 {
		c.Shards = DefaultShards
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = DefaultMaxAttempts
	}
	if c.ClaimCandidates == 0 {
		c.ClaimCandidates = DefaultClaimCandidates
	}
	if c.EndedTTL == 0 {
		c.EndedTTL = DefaultEndedTTL
	}
	if c.CallTimeout == 0 {
		c.CallTimeout = DefaultCallTimeout
	}
	if c.TableWait == 0 {
		c.TableWait = DefaultTableWait
	}
	if c.Clock == nil {
		c.Clock = clock.System{}
	}
	return c
}

// tableName is what DynamoDB accepts as a table name.
var tableName = regexp.MustCompile(`^[a-zA-Z0-9_.-]{3,255}$`)

// Validate checks c after defaults; each error names the environment
// variable (QUARRY_ prefix) of the field.
func (c Config) Validate() error {
	c = c.WithDefaults()
	var errs []error
	for _, t := range []struct{ env, name string }{
		{"QUARRY_DYNAMODB_TASKS_TABLE", c.TasksTable},
		{"QUARRY_DYNAMODB_LEASES_TABLE", c.LeasesTable},
	} {
		if !tableName.MatchString(t.name) {
			errs = append(errs, fmt.Errorf("%s: %q is not a DynamoDB table name (3 to 255 of a-z A-Z 0-9 _ . -)", t.env, t.name))
		}
	}
	if c.TasksTable == c.LeasesTable {
		errs = append(errs, fmt.Errorf("QUARRY_DYNAMODB_LEASES_TABLE: %q is also the tasks table; the two tables must differ", c.LeasesTable))
	}
	if c.Shards < 1 || c.Shards > maxShards {
		errs = append(errs, fmt.Errorf("QUARRY_DYNAMODB_SHARDS: %d; between 1 and %d", c.Shards, maxShards))
	}
	if c.MaxAttempts < 1 {
		errs = append(errs, fmt.Errorf("QUARRY_DYNAMODB_MAX_ATTEMPTS: %d; at least 1", c.MaxAttempts))
	}
	if c.ClaimCandidates < 1 || c.ClaimCandidates > 100 {
		errs = append(errs, fmt.Errorf("QUARRY_DYNAMODB_CLAIM_CANDIDATES: %d; between 1 and 100", c.ClaimCandidates))
	}
	for _, d := range []struct {
		env string
		v   time.Duration
	}{
		{"QUARRY_DYNAMODB_ENDED_TTL", c.EndedTTL},
		{"QUARRY_DYNAMODB_CALL_TIMEOUT", c.CallTimeout},
		{"QUARRY_DYNAMODB_TABLE_WAIT", c.TableWait},
	} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("%s: %s; must be positive", d.env, d.v))
		}
	}
	return errors.Join(errs...)
}

// SDKOptions returns the options cmd/ passes to config.LoadDefaultConfig
// for this store's client: the region (when set) and the retry attempts.
// The SDK's default chain supplies the rest (credentials, AWS_ENDPOINT_URL
// for LocalStack or an emulator).
func (c Config) SDKOptions() []func(*config.LoadOptions) error {
	c = c.WithDefaults()
	opts := []func(*config.LoadOptions) error{config.WithRetryMaxAttempts(c.MaxAttempts)}
	if c.Region != "" {
		opts = append(opts, config.WithRegion(c.Region))
	}
	return opts
}
