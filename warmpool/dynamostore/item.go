package dynamostore

import (
	"fmt"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/quarryhq/quarry/warmpool"
)

// item is one DynamoDB item.
type item = map[string]types.AttributeValue

// Record attribute names (besides the key and index attributes in keys.go).
// Times are Unix nanoseconds (numbers), so conditions compare them; a zero
// time is an absent attribute, as is an empty string or map.
const (
	fID             = "id"
	fPool           = "pool"
	fProvider       = "provider"
	fProviderID     = "provider_id"
	fState          = "state"
	fAgentURL       = "agent_url"
	fAgentToken     = "agent_token"
	fLeaseID        = "lease_id"
	fGeneration     = "generation"
	fReason         = "reason"
	fCreatedAt      = "created_at"
	fUpdatedAt      = "updated_at"
	fLaunchDeadline = "launch_deadline"
	fVersion        = "version"
	fTaskID         = "task_id"
	fOwner          = "owner"
	fLabels         = "labels"
	fEnv            = "env"
	fIdemKey        = "idempotency_key"
	fIdemForgotten  = "idempotency_forgotten"
	fReqDigest      = "request_digest"
	fDuration       = "duration_ns"
	fExpiresAt      = "expires_at"
	fPausedAt       = "paused_at"
	fEndedAt        = "ended_at"
	fHolder         = "holder"
	fProviderTaskID = "provider_task_id"
	fSpec           = "spec"
	fClass          = "class"
	fName           = "name"
	fImage          = "image"
	fCPU            = "cpu"
	fMemoryMiB      = "memory_mib"
	fDiskMiB        = "disk_mib"
	fDigest         = "digest"
	fRef            = "ref"
	fLastUsed       = "last_used"
	fAcquires       = "acquires"
	fWarmFloor      = "warm_floor"
	fWarmUntil      = "warm_until"
)

// taskFields are the attributes UpdateTask writes (SET when the record has
// a value, REMOVE when not); id, pool, spec and class never change.
var taskFields = []string{fProvider, fProviderID, fState, fAgentURL, fAgentToken, fLeaseID, fGeneration,
	fReason, fCreatedAt, fUpdatedAt, fLaunchDeadline, fVersion}

func avS(v string) types.AttributeValue { return &types.AttributeValueMemberS{Value: v} }
func avN(v int64) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: strconv.FormatInt(v, 10)}
}

// avF encodes a float as a plain decimal (no exponent).
func avF(v float64) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: strconv.FormatFloat(v, 'f', -1, 64)}
}

// avTime encodes t as Unix nanoseconds.
func avTime(t time.Time) types.AttributeValue { return avN(t.UnixNano()) }

func key(pk string) item { return item{attrPK: avS(pk)} }

// putS, putTime and putMap set an attribute unless the value is empty.
func putS(it item, name, v string) {
	if v != "" {
		it[name] = avS(v)
	}
}

// putN sets a number attribute unless it is zero.
func putN(it item, name string, v int64) {
	if v != 0 {
		it[name] = avN(v)
	}
}

func putTime(it item, name string, t time.Time) {
	if !t.IsZero() {
		it[name] = avTime(t)
	}
}

func putMap(it item, name string, m map[string]string) {
	if len(m) == 0 {
		return
	}
	av := make(map[string]types.AttributeValue, len(m))
	for k, v := range m {
		av[k] = avS(v)
	}
	it[name] = &types.AttributeValueMemberM{Value: av}
}

// taskAttrs encodes the contract fields of rec.
func taskAttrs(rec warmpool.TaskRecord) item {
	it := item{fID: avS(rec.ID), fPool: avS(rec.Pool), fState: avS(string(rec.State)),
		fGeneration: avN(rec.Generation), fVersion: avN(rec.Version)}
	putS(it, fProvider, rec.Provider)
	putS(it, fProviderID, rec.ProviderID)
	putS(it, fSpec, rec.Spec)
	putS(it, fClass, rec.Class)
	putS(it, fAgentURL, rec.AgentURL)
	putS(it, fAgentToken, rec.AgentToken)
	putS(it, fLeaseID, rec.LeaseID)
	putS(it, fReason, rec.Reason)
	putTime(it, fCreatedAt, rec.CreatedAt)
	putTime(it, fUpdatedAt, rec.UpdatedAt)
	putTime(it, fLaunchDeadline, rec.LaunchDeadline)
	return it
}

// taskItem is the whole stored item of a new task record counted in
// capacity shard cshard of its pool and, for a task of a class, in shard
// gshard of its class's counter (-1: none).
func taskItem(rec warmpool.TaskRecord, shards, cshard, gshard int) item {
	it := taskAttrs(rec)
	it[attrPK] = avS(taskPK(rec.ID))
	it[attrPoolPK] = avS(shardKey(rec.Pool, shardOf(rec.ID, shards)))
	it[attrCShard] = avN(int64(cshard))
	if gshard >= 0 {
		it[attrGShard] = avN(int64(gshard))
	}
	return it
}

// decoder reads attributes of one item, remembering the first error.
type decoder struct {
	it  item
	err error
}

func (d *decoder) fail(name string, format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("attribute %s: %s", name, fmt.Sprintf(format, args...))
	}
}

func (d *decoder) s(name string) string {
	switch v := d.it[name].(type) {
	case nil:
		return ""
	case *types.AttributeValueMemberS:
		return v.Value
	default:
		d.fail(name, "want a string, got %T", v)
		return ""
	}
}

func (d *decoder) n(name string) int64 {
	switch v := d.it[name].(type) {
	case nil:
		return 0
	case *types.AttributeValueMemberN:
		n, err := strconv.ParseInt(v.Value, 10, 64)
		if err != nil {
			d.fail(name, "%q is not an integer", v.Value)
		}
		return n
	default:
		d.fail(name, "want a number, got %T", v)
		return 0
	}
}

func (d *decoder) f(name string) float64 {
	switch v := d.it[name].(type) {
	case nil:
		return 0
	case *types.AttributeValueMemberN:
		f, err := strconv.ParseFloat(v.Value, 64)
		if err != nil {
			d.fail(name, "%q is not a number", v.Value)
		}
		return f
	default:
		d.fail(name, "want a number, got %T", v)
		return 0
	}
}

func (d *decoder) time(name string) time.Time {
	if _, ok := d.it[name]; !ok {
		return time.Time{}
	}
	return time.Unix(0, d.n(name)).UTC()
}

func (d *decoder) m(name string) map[string]string {
	switch v := d.it[name].(type) {
	case nil:
		return nil
	case *types.AttributeValueMemberM:
		out := make(map[string]string, len(v.Value))
		for k, av := range v.Value {
			s, ok := av.(*types.AttributeValueMemberS)
			if !ok {
				d.fail(name, "value of %q: want a string, got %T", k, av)
				continue
			}
			out[k] = s.Value
		}
		return out
	default:
		d.fail(name, "want a map, got %T", v)
		return nil
	}
}

func decodeTask(it item) (warmpool.TaskRecord, error) {
	d := decoder{it: it}
	rec := warmpool.TaskRecord{
		ID: d.s(fID), Pool: d.s(fPool), Provider: d.s(fProvider), ProviderID: d.s(fProviderID), Spec: d.s(fSpec),
		Class: d.s(fClass), State: warmpool.TaskState(d.s(fState)), AgentURL: d.s(fAgentURL), AgentToken: d.s(fAgentToken),
		LeaseID: d.s(fLeaseID), Generation: d.n(fGeneration), Reason: d.s(fReason),
		CreatedAt: d.time(fCreatedAt), UpdatedAt: d.time(fUpdatedAt), LaunchDeadline: d.time(fLaunchDeadline),
		Version: d.n(fVersion),
	}
	return rec, d.done("task", rec.ID)
}

// done returns the first decoding error, or a missing id, as an error of
// the record kind id.
func (d *decoder) done(kind, id string) error { return d.doneAttr(kind, fID, id) }

// doneAttr is done for a record whose id is attribute attr.
func (d *decoder) doneAttr(kind, attr, id string) error {
	if d.err == nil && id == "" {
		d.fail(attr, "missing")
	}
	if d.err != nil {
		return fmt.Errorf("decode %s %s: %w", kind, id, d.err)
	}
	return nil
}

// envItem is the item that keeps l's env apart from its lease item, which
// every heartbeat rewrites (an update costs the size of the item); nil when
// l has no env.
func envItem(l warmpool.Lease) item {
	if len(l.Env) == 0 {
		return nil
	}
	it := item{attrPK: avS(envPK(l.ID))}
	putMap(it, fEnv, l.Env)
	return it
}

// leaseItem is the whole stored item of l (its env aside): its attributes plus the index
// attributes its state calls for (expiry index while active, end index
// and TTL once ended). forgotten marks a lease whose idempotency key was
// freed (EndLease with ForgetIdempotencyKey).
func leaseItem(l warmpool.Lease, shards int, endedTTL time.Duration, forgotten bool) item {
	it := item{attrPK: avS(leasePK(l.ID)), fID: avS(l.ID), fPool: avS(l.Pool), fTaskID: avS(l.TaskID),
		fOwner: avS(l.Owner), fState: avS(string(l.State)), fGeneration: avN(l.Generation),
		fDuration: avN(int64(l.Duration)), fVersion: avN(l.Version)}
	putS(it, fReason, l.Reason)
	putS(it, fAgentURL, l.AgentURL)
	putS(it, fAgentToken, l.AgentToken)
	putS(it, fProviderTaskID, l.ProviderTaskID)
	putS(it, fProvider, l.Provider)
	putS(it, fImage, l.Image)
	putS(it, fIdemKey, l.IdempotencyKey)
	putS(it, fReqDigest, l.RequestDigest)
	putMap(it, fLabels, l.Labels) // the env is an item of its own (envItem)
	putTime(it, fCreatedAt, l.CreatedAt)
	putTime(it, fExpiresAt, l.ExpiresAt)
	putTime(it, fEndedAt, l.EndedAt)
	putTime(it, fPausedAt, l.PausedAt)
	if forgotten {
		it[fIdemForgotten] = &types.AttributeValueMemberBOOL{Value: true}
	}
	shard := shardOf(l.ID, shards)
	it[attrOwnerPK] = avS(shardKey(l.Owner, shard))
	it[attrOwnerSK] = avTime(l.CreatedAt)
	if l.State == warmpool.LeaseActive {
		it[attrExpiryPK] = avS(shardKey("x", shard))
		it[attrExpirySK] = avTime(l.ExpiresAt)
	} else {
		it[attrEndedPK] = avS(shardKey("e", shard))
		it[attrEndedSK] = avTime(l.EndedAt)
		it[attrTTL] = avN(ttlOf(l.EndedAt, endedTTL))
	}
	return it
}

// ttlOf is the TTL attribute (Unix seconds) of an item ended at end.
func ttlOf(end time.Time, after time.Duration) int64 {
	return end.Add(after).Unix()
}

// ttlPassed reports whether it carries a TTL attribute at or before now:
// DynamoDB may delete it any time (days later), and reads treat it as gone
// already.
func ttlPassed(it item, now time.Time) bool {
	v, ok := it[attrTTL].(*types.AttributeValueMemberN)
	if !ok {
		return false
	}
	ttl, err := strconv.ParseInt(v.Value, 10, 64)
	return err == nil && ttl <= now.Unix()
}

func decodeLease(it item) (warmpool.Lease, error) {
	d := decoder{it: it}
	l := warmpool.Lease{
		ID: d.s(fID), Pool: d.s(fPool), TaskID: d.s(fTaskID), Owner: d.s(fOwner),
		State: warmpool.LeaseState(d.s(fState)), Reason: d.s(fReason), Generation: d.n(fGeneration),
		AgentURL: d.s(fAgentURL), AgentToken: d.s(fAgentToken), ProviderTaskID: d.s(fProviderTaskID), Provider: d.s(fProvider), Image: d.s(fImage), Labels: d.m(fLabels),
		IdempotencyKey: d.s(fIdemKey), RequestDigest: d.s(fReqDigest), Duration: time.Duration(d.n(fDuration)),
		CreatedAt: d.time(fCreatedAt), ExpiresAt: d.time(fExpiresAt), EndedAt: d.time(fEndedAt), PausedAt: d.time(fPausedAt),
		Version: d.n(fVersion),
	}
	return l, d.done("lease", l.ID)
}

// idemForgotten reports whether a lease item's idempotency key was freed.
func idemForgotten(it item) bool {
	v, ok := it[fIdemForgotten].(*types.AttributeValueMemberBOOL)
	return ok && v.Value
}

// pkOf returns the partition key of it ("" when missing).
func pkOf(it item) string {
	if v, ok := it[attrPK].(*types.AttributeValueMemberS); ok {
		return v.Value
	}
	return ""
}

// poolFields are the attributes UpdatePool writes from its record (SET
// when it has a value, REMOVE when not); name and class never change, and
// state, last_used, acquires and version have rules of their own.
var poolFields = []string{fImage, fCPU, fMemoryMiB, fDiskMiB, fDigest, fRef, fCreatedAt, fEndedAt, fWarmFloor, fWarmUntil}

// poolAttrs encodes the contract fields of rec.
func poolAttrs(rec warmpool.PoolRecord) item {
	it := item{fName: avS(rec.Name), fClass: avS(rec.Class), fImage: avS(rec.Image), fState: avS(string(rec.State)),
		fAcquires: avN(rec.Acquires), fVersion: avN(rec.Version)}
	if rec.CPU != 0 {
		it[fCPU] = avF(rec.CPU)
	}
	putN(it, fMemoryMiB, int64(rec.MemoryMiB))
	putN(it, fDiskMiB, int64(rec.DiskMiB))
	putS(it, fDigest, rec.Digest)
	putS(it, fRef, rec.Ref)
	putTime(it, fCreatedAt, rec.CreatedAt)
	putTime(it, fLastUsed, rec.LastUsed)
	putTime(it, fEndedAt, rec.EndedAt)
	putN(it, fWarmFloor, int64(rec.WarmFloor))
	putTime(it, fWarmUntil, rec.WarmUntil)
	return it
}

// poolItem is the whole stored item of pool record rec: its attributes
// and its key in tasks-by-pool (its class's shard of its name), by which
// ListPoolsPage finds a class's records.
func poolItem(rec warmpool.PoolRecord, shards int) item {
	it := poolAttrs(rec)
	it[attrPK] = avS(poolPK(rec.Name))
	it[attrPoolPK] = avS(poolIndexKey(rec.Class, shardOf(rec.Name, shards)))
	return it
}

func decodePool(it item) (warmpool.PoolRecord, error) {
	d := decoder{it: it}
	rec := warmpool.PoolRecord{
		Name: d.s(fName), Class: d.s(fClass), Image: d.s(fImage), CPU: d.f(fCPU),
		MemoryMiB: int(d.n(fMemoryMiB)), DiskMiB: int(d.n(fDiskMiB)), Digest: d.s(fDigest), Ref: d.s(fRef),
		State: warmpool.PoolState(d.s(fState)), CreatedAt: d.time(fCreatedAt), LastUsed: d.time(fLastUsed),
		EndedAt: d.time(fEndedAt), Acquires: d.n(fAcquires), WarmFloor: int(d.n(fWarmFloor)),
		WarmUntil: d.time(fWarmUntil), Version: d.n(fVersion),
	}
	return rec, d.doneAttr("pool", fName, rec.Name)
}
