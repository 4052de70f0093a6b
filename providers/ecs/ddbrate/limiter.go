package ddbrate

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/quarryhq/quarry/internal/defaults"
)

// Defaults applied by Config.WithDefaults.
const (
	// DefaultKey names the item: its partition key is "rate#" + Key.
	DefaultKey = "ecs-run-task"
	// RegisterKey names the item of RegisterTaskDefinition's rate (a
	// Limiter with calls only: TaskRate and TaskBurst 0).
	RegisterKey = "ecs-register-task-definition"
	// DefaultMaxRaces bounds the writes one Wait loses to other writers
	// before it fails.
	DefaultMaxRaces = 20
)

// Item attributes. The partition key is the leases table's ("pk"); the
// "rate#" prefix keeps the item out of the lease store's scans (they
// filter by their own prefixes).
const (
	attrPK      = "pk"
	attrCallTAT = "call_tat" // Unix ns
	attrTaskTAT = "task_tat" // Unix ns
	attrVersion = "v"
	keyPrefix   = "rate#"
)

// API is the part of the DynamoDB client a Limiter uses; *dynamodb.Client
// implements it.
type API interface {
	UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error)
}

// Config configures a Limiter. Every replica that shares the rate must use
// the same Table, Key, rates and bursts.
type Config struct {
	// Table holds the item (the lease store's leases table). Required.
	Table string
	// Key names the item (DefaultKey).
	Key string
	// CallRate/CallBurst: RunTask calls per second; TaskRate/TaskBurst:
	// tasks launched per second (ECS's: 20/20 and 20/100). CallRate is
	// required; TaskRate and TaskBurst both 0 leave the task bucket out (a
	// rate of calls only, such as RegisterTaskDefinition's 1/s burst 20).
	CallRate  float64
	CallBurst int
	TaskRate  float64
	TaskBurst int
	// MaxRaces bounds the conditional writes one Wait may lose.
	MaxRaces int
}

// WithDefaults returns c with its unset defaults set.
func (c Config) WithDefaults() Config {
	defaults.Set(&c.Key, DefaultKey)
	defaults.Set(&c.MaxRaces, DefaultMaxRaces)
	return c
}

// Validate names the first bad field.
func (c Config) Validate() error {
	switch {
	case c.Table == "":
		return errors.New("ddbrate config: Table: must be set")
	case c.CallRate <= 0 || c.CallBurst < 1:
		return fmt.Errorf("ddbrate config: CallRate: rate and burst must be positive, got %g/s burst %d", c.CallRate, c.CallBurst)
	case !c.callsOnly() && (c.TaskRate <= 0 || c.TaskBurst < 1):
		return fmt.Errorf("ddbrate config: TaskRate: rate and burst must be positive (or both 0: no task bucket), got %g/s burst %d", c.TaskRate, c.TaskBurst)
	case c.MaxRaces < 1:
		return fmt.Errorf("ddbrate config: MaxRaces: must be at least 1, got %d", c.MaxRaces)
	}
	return nil
}

// callsOnly says the limiter has no task bucket.
func (c Config) callsOnly() bool { return c.TaskRate == 0 && c.TaskBurst == 0 }

// Limiter admits RunTask calls within rates shared through one DynamoDB
// item. Safe for concurrent use; any number of Limiters (in one process or
// many) on the same item share the rates.
type Limiter struct {
	api API
	cfg Config
	pk  string
	now func() time.Time

	mu    sync.Mutex // one write of this process at a time (fewer lost races)
	known state      // the item as last written or read
}

// state is the item: whether it exists, its version and the two buckets'
// theoretical arrival times (Unix ns).
type state struct {
	exists           bool
	version          int64
	callTAT, taskTAT int64
}

// New returns a Limiter for cfg (after defaults and Validate) on api. It
// makes no call: the item is created by the first Wait.
func New(api API, cfg Config) (*Limiter, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if api == nil {
		return nil, errors.New("ddbrate: no DynamoDB client")
	}
	return &Limiter{api: api, cfg: cfg, pk: keyPrefix + cfg.Key, now: time.Now}, nil
}

// Wait blocks until one RunTask call starting n tasks (1..TaskBurst; any
// n ≥ 1 without a task bucket) fits both rates, as shared by every Limiter of the item. It reserves the
// call's time with one conditional UpdateItem (plus one per write lost to
// another Limiter: the failed write returns the current item), then sleeps
// until that time. It fails, reserving nothing, when ctx's deadline comes
// before the reserved time would, when it loses Config.MaxRaces writes in
// a row, or when DynamoDB fails (after the SDK's retries); when ctx ends
// while it sleeps, the reservation stays spent (never over the rate).
func (l *Limiter) Wait(ctx context.Context, n int) error {
	_, err := l.wait(ctx, n)
	return err
}

// Admit is Wait, and returns the time the call was admitted at on this
// limiter's clock (its reservation's: the rates hold for these times,
// however late the caller runs after its sleep). Tests count admissions
// by it.
func (l *Limiter) Admit(ctx context.Context, n int) (time.Time, error) { return l.wait(ctx, n) }

// wait is Wait, and returns the time the call was admitted at.
func (l *Limiter) wait(ctx context.Context, n int) (time.Time, error) {
	if n < 1 || (!l.cfg.callsOnly() && n > l.cfg.TaskBurst) {
		return time.Time{}, fmt.Errorf("shared run task rate: %d tasks in one call, want 1..%d", n, l.cfg.TaskBurst)
	}
	at, err := l.reserve(ctx, n)
	if err != nil {
		return time.Time{}, err
	}
	d := time.Until(at)
	if d <= 0 {
		return at, nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return time.Time{}, fmt.Errorf("shared run task rate: %w", ctx.Err())
	case <-t.C:
		return at, nil
	}
}

// reserve writes the next call's reservation and returns its time.
func (l *Limiter) reserve(ctx context.Context, n int) (time.Time, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for race := 0; ; race++ {
		if err := ctx.Err(); err != nil {
			return time.Time{}, fmt.Errorf("shared run task rate: %w", err)
		}
		now := l.now()
		at, next := schedule(l.known, now.UnixNano(), n, l.cfg)
		atTime := time.Unix(0, at)
		if dl, ok := ctx.Deadline(); ok && atTime.After(dl) {
			return time.Time{}, fmt.Errorf("shared run task rate: the call could start in %s, after the context's deadline", atTime.Sub(now).Round(time.Millisecond))
		}
		old, err := l.write(ctx, next)
		if err == nil {
			l.known = next
			return atTime, nil
		}
		var ccf *types.ConditionalCheckFailedException
		if !errors.As(err, &ccf) {
			return time.Time{}, fmt.Errorf("shared run task rate: update %s in %s: %w", l.pk, l.cfg.Table, err)
		}
		if race+1 >= l.cfg.MaxRaces {
			return time.Time{}, fmt.Errorf("shared run task rate: lost %d writes of %s in a row to other replicas", l.cfg.MaxRaces, l.pk)
		}
		if l.known, err = parse(old); err != nil {
			return time.Time{}, fmt.Errorf("shared run task rate: %s in %s: %w", l.pk, l.cfg.Table, err)
		}
	}
}

// write stores next if the item is still as known; on a lost race it
// returns the item as stored (nil when there is none).
func (l *Limiter) write(ctx context.Context, next state) (map[string]types.AttributeValue, error) {
	names := map[string]string{"#c": attrCallTAT, "#t": attrTaskTAT, "#v": attrVersion}
	values := map[string]types.AttributeValue{
		":c":  num(next.callTAT),
		":t":  num(next.taskTAT),
		":nv": num(next.version),
	}
	cond := "#v = :v"
	if l.known.exists {
		values[":v"] = num(l.known.version)
	} else {
		cond = "attribute_not_exists(#pk)"
		names["#pk"] = attrPK
	}
	_, err := l.api.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                           aws.String(l.cfg.Table),
		Key:                                 map[string]types.AttributeValue{attrPK: &types.AttributeValueMemberS{Value: l.pk}},
		UpdateExpression:                    aws.String("SET #c = :c, #t = :t, #v = :nv"),
		ConditionExpression:                 aws.String(cond),
		ExpressionAttributeNames:            names,
		ExpressionAttributeValues:           values,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	if err != nil {
		var ccf *types.ConditionalCheckFailedException
		if errors.As(err, &ccf) {
			return ccf.Item, err
		}
		return nil, err
	}
	return nil, nil
}

// schedule returns when a call of n tasks arriving at now may start, given
// the buckets' state s, and the state after admitting it (GCRA, see the
// package doc).
func schedule(s state, now int64, n int, cfg Config) (at int64, next state) {
	tc := interval(cfg.CallRate)
	callAt := max(s.callTAT, now) + tc - int64(cfg.CallBurst)*tc
	if cfg.callsOnly() {
		at = max(now, callAt)
		return at, state{exists: true, version: s.version + 1, callTAT: max(s.callTAT, at) + tc}
	}
	tt := interval(cfg.TaskRate)
	taskAt := max(s.taskTAT, now) + int64(n)*tt - int64(cfg.TaskBurst)*tt
	at = max(now, callAt, taskAt)
	next = state{
		exists:  true,
		version: s.version + 1,
		callTAT: max(s.callTAT, at) + tc,
		taskTAT: max(s.taskTAT, at) + int64(n)*tt,
	}
	return at, next
}

// interval is the time one token takes at rate per second, in ns.
func interval(rate float64) int64 { return int64(math.Ceil(float64(time.Second) / rate)) }

// parse reads the item as stored (nil: there is none).
func parse(item map[string]types.AttributeValue) (state, error) {
	if item == nil {
		return state{}, nil
	}
	s := state{exists: true}
	for name, p := range map[string]*int64{attrVersion: &s.version, attrCallTAT: &s.callTAT, attrTaskTAT: &s.taskTAT} {
		v, ok := item[name].(*types.AttributeValueMemberN)
		if !ok {
			return state{}, fmt.Errorf("attribute %s: not a number", name)
		}
		x, err := strconv.ParseInt(v.Value, 10, 64)
		if err != nil {
			return state{}, fmt.Errorf("attribute %s: %w", name, err)
		}
		*p = x
	}
	return s, nil
}

func num(n int64) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: strconv.FormatInt(n, 10)}
}
