package main

import (
	"context"
	"fmt"
	"math"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"sync"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// meter is a DynamoDB client that accounts the capacity each call the
// broker makes would consume on DynamoDB, per partition key of the table
// and of each of its global secondary indexes, from the items the calls
// carry and DynamoDB's published rules: a write costs one unit per KB of
// the larger of the item's old and new images; an index entry costs the
// same by its own size (its keys, the table's keys, its projected
// attributes and 100 bytes), two writes when its key changes, one when it
// appears, goes or only a projected attribute changes; a read costs one
// unit per 4 KB read (half when eventually consistent: every index read),
// whatever a projection returns. The emulator charges nothing real, so
// these figures are computed, not measured by DynamoDB.
//
// It keeps the last image of every item written through it (so every
// writer of the table must use one meter), asks UpdateItem for the new
// image and gives its caller what it asked for, and serializes writes so
// that the images stay in order (the emulator serves one call at a time
// anyway).
type meter struct {
	*dynamodb.Client
	def *dynamodb.CreateTableInput

	wmu   sync.Mutex // serializes writes
	mu    sync.Mutex
	items map[string]map[string]types.AttributeValue
	units map[partition]*usage
	calls map[string]int
}

// partition is one partition-key value of the table (index "") or of an
// index.
type partition struct{ index, key string }

type usage struct{ wcu, rcu float64 }

func newMeter(c *dynamodb.Client, def *dynamodb.CreateTableInput) *meter {
	return &meter{Client: c, def: def, items: map[string]map[string]types.AttributeValue{},
		units: map[partition]*usage{}, calls: map[string]int{}}
}

type attrs = map[string]types.AttributeValue

func (m *meter) count(op string) {
	m.mu.Lock()
	m.calls[op]++
	m.mu.Unlock()
}

// add charges u units of kind ("w" or "r") to partition p; m.mu is held.
func (m *meter) add(p partition, kind string, u float64) {
	x := m.units[p]
	if x == nil {
		x = &usage{}
		m.units[p] = x
	}
	if kind == "w" {
		x.wcu += u
	} else {
		x.rcu += u
	}
}

func (m *meter) keyOf(it attrs) string {
	var parts []string
	for _, k := range m.def.KeySchema {
		parts = append(parts, str(it[aws.ToString(k.AttributeName)]))
	}
	return strings.Join(parts, "\x00")
}

func (m *meter) hashKey() string { return aws.ToString(m.def.KeySchema[0].AttributeName) }

// written accounts a write that turned image old into new (nil: absent);
// m.mu is held.
func (m *meter) written(old, new attrs) {
	img := new
	if img == nil {
		img = old
	}
	m.add(partition{"", str(img[m.hashKey()])}, "w", writeUnits(max(size(old), size(new))))
	for _, ix := range m.def.GlobalSecondaryIndexes {
		m.indexWritten(ix, old, new)
	}
}

func (m *meter) indexWritten(ix types.GlobalSecondaryIndex, old, new attrs) {
	name := aws.ToString(ix.IndexName)
	var keys []string
	for _, k := range ix.KeySchema {
		keys = append(keys, aws.ToString(k.AttributeName))
	}
	in := func(it attrs) bool {
		if it == nil {
			return false
		}
		for _, k := range keys {
			if _, ok := it[k]; !ok {
				return false
			}
		}
		return true
	}
	entry := func(it attrs) attrs {
		out := attrs{}
		for _, k := range m.def.KeySchema {
			out[aws.ToString(k.AttributeName)] = it[aws.ToString(k.AttributeName)]
		}
		for _, k := range keys {
			out[k] = it[k]
		}
		switch ix.Projection.ProjectionType {
		case types.ProjectionTypeAll:
			for k, v := range it {
				out[k] = v
			}
		case types.ProjectionTypeInclude:
			for _, k := range ix.Projection.NonKeyAttributes {
				if v, ok := it[k]; ok {
					out[k] = v
				}
			}
		}
		return out
	}
	hash := func(it attrs) partition { return partition{name, str(it[keys[0]])} }
	units := func(e attrs) float64 { return writeUnits(size(e) + 100) }
	switch inOld, inNew := in(old), in(new); {
	case inOld && !inNew:
		m.add(hash(old), "w", units(entry(old)))
	case !inOld && inNew:
		m.add(hash(new), "w", units(entry(new)))
	case inOld && inNew:
		eo, en := entry(old), entry(new)
		moved := false
		for _, k := range keys {
			moved = moved || str(old[k]) != str(new[k])
		}
		switch {
		case moved:
			m.add(hash(old), "w", units(eo))
			m.add(hash(new), "w", units(en))
		case !reflect.DeepEqual(eo, en):
			m.add(hash(new), "w", math.Max(units(eo), units(en)))
		}
	}
}

// read charges a read of bytes on p (consistent or not); m.mu is held.
func (m *meter) read(p partition, bytes int, consistent bool) {
	u := math.Ceil(float64(max(bytes, 1)) / 4096)
	if !consistent {
		u /= 2
	}
	m.add(p, "r", u)
}

// write counts a write call op, makes it (writes serialized) and, when it
// succeeds, accounts it.
func write[O any](m *meter, op string, call func() (O, error), account func()) (O, error) {
	m.count(op)
	m.wmu.Lock()
	defer m.wmu.Unlock()
	out, err := call()
	if err == nil {
		account()
	}
	return out, err
}

func (m *meter) PutItem(ctx context.Context, in *dynamodb.PutItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.PutItemOutput, error) {
	return write(m, "PutItem", func() (*dynamodb.PutItemOutput, error) { return m.Client.PutItem(ctx, in, optFns...) },
		func() { m.put(in.Item) })
}

// put accounts the write of item it (replacing what it had).
func (m *meter) put(it attrs) {
	m.mu.Lock()
	defer m.mu.Unlock()
	k := m.keyOf(it)
	m.written(m.items[k], it)
	m.items[k] = it
}

func (m *meter) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	m.count("UpdateItem")
	m.wmu.Lock()
	defer m.wmu.Unlock()
	want := in.ReturnValues
	cp := *in
	cp.ReturnValues = types.ReturnValueAllNew
	out, err := m.Client.UpdateItem(ctx, &cp, optFns...)
	if err != nil {
		return out, err
	}
	m.mu.Lock()
	k := m.keyOf(in.Key)
	old := m.items[k]
	m.written(old, out.Attributes)
	m.items[k] = out.Attributes
	m.mu.Unlock()
	switch want {
	case types.ReturnValueAllNew:
	case types.ReturnValueAllOld:
		out.Attributes = old
	case types.ReturnValueNone, "":
		out.Attributes = nil
	default:
		return nil, fmt.Errorf("meter: ReturnValues %s is not supported", want)
	}
	return out, nil
}

func (m *meter) DeleteItem(ctx context.Context, in *dynamodb.DeleteItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.DeleteItemOutput, error) {
	return write(m, "DeleteItem", func() (*dynamodb.DeleteItemOutput, error) { return m.Client.DeleteItem(ctx, in, optFns...) },
		func() { m.deleted(in.Key) })
}

func (m *meter) deleted(key attrs) {
	m.mu.Lock()
	defer m.mu.Unlock()
	k := m.keyOf(key)
	old := m.items[k]
	if old == nil {
		old = key
	}
	m.written(old, nil)
	delete(m.items, k)
}

func (m *meter) BatchWriteItem(ctx context.Context, in *dynamodb.BatchWriteItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.BatchWriteItemOutput, error) {
	m.count("BatchWriteItem")
	m.wmu.Lock()
	defer m.wmu.Unlock()
	out, err := m.Client.BatchWriteItem(ctx, in, optFns...)
	if err != nil {
		return out, err
	}
	left := map[string]bool{}
	for _, reqs := range out.UnprocessedItems {
		for _, r := range reqs {
			left[m.requestKey(r)] = true
		}
	}
	for _, reqs := range in.RequestItems {
		for _, r := range reqs {
			if left[m.requestKey(r)] {
				continue
			}
			if r.PutRequest != nil {
				m.put(r.PutRequest.Item)
			} else if r.DeleteRequest != nil {
				m.deleted(r.DeleteRequest.Key)
			}
		}
	}
	return out, nil
}

func (m *meter) requestKey(r types.WriteRequest) string {
	if r.PutRequest != nil {
		return m.keyOf(r.PutRequest.Item)
	}
	return m.keyOf(r.DeleteRequest.Key)
}

func (m *meter) GetItem(ctx context.Context, in *dynamodb.GetItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error) {
	m.count("GetItem")
	out, err := m.Client.GetItem(ctx, in, optFns...)
	if err == nil {
		m.mu.Lock()
		full := m.items[m.keyOf(in.Key)] // charged by the item's size, not the projection's
		if full == nil {
			full = out.Item
		}
		m.read(partition{"", str(in.Key[m.hashKey()])}, size(full), aws.ToBool(in.ConsistentRead))
		m.mu.Unlock()
	}
	return out, err
}

func (m *meter) BatchGetItem(ctx context.Context, in *dynamodb.BatchGetItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error) {
	m.count("BatchGetItem")
	out, err := m.Client.BatchGetItem(ctx, in, optFns...)
	if err == nil {
		m.mu.Lock()
		for table, items := range out.Responses {
			consistent := aws.ToBool(in.RequestItems[table].ConsistentRead)
			for _, it := range items {
				full := m.items[m.keyOf(it)]
				if full == nil {
					full = it
				}
				m.read(partition{"", str(it[m.hashKey()])}, size(full), consistent)
			}
		}
		m.mu.Unlock()
	}
	return out, err
}

// hashPlaceholder finds the value placeholder of a key condition's
// partition key ("qp = :p AND …").
var hashPlaceholder = regexp.MustCompile(`^\s*[#\w]+\s*=\s*(:\w+)`)

func (m *meter) Query(ctx context.Context, in *dynamodb.QueryInput, optFns ...func(*dynamodb.Options)) (*dynamodb.QueryOutput, error) {
	m.count("Query")
	out, err := m.Client.Query(ctx, in, optFns...)
	if err == nil {
		key := ""
		if g := hashPlaceholder.FindStringSubmatch(aws.ToString(in.KeyConditionExpression)); g != nil {
			key = str(in.ExpressionAttributeValues[g[1]])
		}
		bytes := 0
		for _, it := range out.Items {
			bytes += size(it) // the index entries (projected) or the table's items
		}
		m.mu.Lock()
		m.read(partition{aws.ToString(in.IndexName), key}, bytes, aws.ToBool(in.ConsistentRead))
		m.mu.Unlock()
	}
	return out, err
}

// capacity is what the meter counted over a run of calls relay calls.
type capacity struct {
	wcu, rcu float64 // in total
	// hottest per index ("" = the table): the partition key with the most
	// write units, and with the most read units, over the run.
	hotW, hotR map[string]float64
	sumW       map[string]float64 // write units per index
	keys       map[string]int     // partition keys used per index
	calls      map[string]int     // DynamoDB calls by operation
}

func (m *meter) snapshot() capacity {
	m.mu.Lock()
	defer m.mu.Unlock()
	c := capacity{hotW: map[string]float64{}, hotR: map[string]float64{}, sumW: map[string]float64{}, keys: map[string]int{}, calls: map[string]int{}}
	for p, u := range m.units {
		c.wcu += u.wcu
		c.rcu += u.rcu
		c.hotW[p.index] = max(c.hotW[p.index], u.wcu)
		c.hotR[p.index] = max(c.hotR[p.index], u.rcu)
		c.sumW[p.index] += u.wcu
		c.keys[p.index]++
	}
	for k, v := range m.calls {
		c.calls[k] = v
	}
	return c
}

// report turns a run of n relay calls into per-call figures and the call
// rate at which the hottest partition key would reach DynamoDB's
// per-partition write limit (1,000 WCU/s), which is what one trainer key
// sustains. Reads are listed per call but are not per call: polls (a
// waiting claim's, the inbox's every AwaitPoll, a waiting call's
// rechecks) cost by the second, so their share per call falls as the rate
// rises; at these runs' sizes no key comes near 3,000 RCU/s.
func (c capacity) report(n int) (map[string]float64, string) {
	v := map[string]float64{"wru_per_call": c.wcu / float64(n), "rru_per_call": c.rcu / float64(n)}
	sustain := math.Inf(1)
	var hot []string
	names := make([]string, 0, len(c.keys))
	for ix := range c.keys {
		names = append(names, ix)
	}
	sort.Strings(names)
	for _, ix := range names {
		label := ix
		if label == "" {
			label = "table"
		}
		label = strings.ReplaceAll(label, "-", "_")
		w, r := c.hotW[ix]/float64(n), c.hotR[ix]/float64(n)
		v[label+"_hottest_wcu_per_call"], v[label+"_hottest_rcu_per_call"], v[label+"_keys"] = w, r, float64(c.keys[ix])
		v[label+"_mean_wcu_per_call"] = c.sumW[ix] / float64(c.keys[ix]) / float64(n)
		limit := math.Inf(1)
		if w > 0 {
			limit = 1000 / w
		}
		if limit < sustain {
			sustain, hot = limit, []string{label}
		}
	}
	v["sustain_calls_per_s"] = sustain
	var ops []string
	for op, k := range c.calls {
		ops = append(ops, fmt.Sprintf("%s %.1f", op, float64(k)/float64(n)))
	}
	sort.Strings(ops)
	return v, fmt.Sprintf("computed from the items written and read on the emulator by DynamoDB's capacity rules, not measured by DynamoDB; "+
		"sustain: the call rate at which the hottest partition key of this run (%s) reaches 1,000 WCU/s (a sample's hottest shard is above the shards' mean, which is what uniform hashing gives at a steady rate); reads are polls, by the second; DynamoDB calls per relay call: %s",
		strings.Join(hot, ", "), strings.Join(ops, ", "))
}

func writeUnits(bytes int) float64 {
	if bytes <= 0 {
		return 0
	}
	return math.Ceil(float64(bytes) / 1024)
}

func str(v types.AttributeValue) string {
	switch v := v.(type) {
	case *types.AttributeValueMemberS:
		return v.Value
	case *types.AttributeValueMemberN:
		return v.Value
	}
	return ""
}

// size is an item's size as DynamoDB counts it: names and values
// (strings and binaries their bytes, numbers about one byte per two
// digits, documents 3 bytes plus 1 per element).
func size(it attrs) int {
	if it == nil {
		return 0
	}
	n := 0
	for k, v := range it {
		n += len(k) + valueSize(v)
	}
	return n
}

func valueSize(v types.AttributeValue) int {
	switch v := v.(type) {
	case *types.AttributeValueMemberS:
		return len(v.Value)
	case *types.AttributeValueMemberN:
		return (len(strings.TrimLeft(v.Value, "-0"))+1)/2 + 1
	case *types.AttributeValueMemberB:
		return len(v.Value)
	case *types.AttributeValueMemberM:
		n := 3
		for k, e := range v.Value {
			n += len(k) + valueSize(e) + 1
		}
		return n
	case *types.AttributeValueMemberL:
		n := 3
		for _, e := range v.Value {
			n += valueSize(e) + 1
		}
		return n
	}
	return 1
}
