package ddbsim

import (
	"hash/fnv"
	"strings"
	"time"

	"github.com/google/btree"
)

// keyAttr is one key attribute: its name and scalar type (S, N or B).
type keyAttr struct{ name, typ string }

// keySchema is a table's or an index's key: a partition key and an
// optional sort key (rng.name == "" when none).
type keySchema struct{ hash, rng keyAttr }

func (ks keySchema) hasRange() bool { return ks.rng.name != "" }

func (ks keySchema) names() []string {
	if ks.hasRange() {
		return []string{ks.hash.name, ks.rng.name}
	}
	return []string{ks.hash.name}
}

// Key size limits: 2048 bytes of partition key, 1024 of sort key.
const (
	maxHashKey  = 2048
	maxRangeKey = 1024
)

// tableKey checks that key holds exactly the table's key attributes, of
// their types, and returns them.
func (ks keySchema) tableKey(key Item) (hk, rk *Value, err *apiError) {
	bad := validation("The provided key element does not match the schema")
	if len(key) != len(ks.names()) {
		return nil, nil, bad
	}
	hk, rk, err = ks.keyValues(key, true)
	if err != nil {
		return nil, nil, err
	}
	if hk == nil || ks.hasRange() && rk == nil {
		return nil, nil, bad
	}
	return hk, rk, nil
}

// keyValues returns it's key attributes for ks (nil when missing); with
// strict, a present one of the wrong type or empty is an error.
func (ks keySchema) keyValues(it Item, strict bool) (hk, rk *Value, err *apiError) {
	get := func(a keyAttr, limit int, what string) (*Value, *apiError) {
		v, ok := it[a.name]
		if !ok {
			return nil, nil
		}
		if v.kind() != a.typ {
			if strict {
				return nil, validation("The provided key element does not match the schema")
			}
			return nil, nil
		}
		b := keyBytes(v)
		if len(b) == 0 && a.typ != typeN {
			if strict {
				return nil, validation("One or more parameter values are not valid. The AttributeValue for a key attribute cannot contain an empty %s value. Key: %s", strings.ToLower(longType(a.typ)), a.name)
			}
			return nil, nil
		}
		if len(b) > limit {
			return nil, validation("One or more parameter values were invalid: %s", what)
		}
		return v, nil
	}
	hk, err = get(ks.hash, maxHashKey, "Size of hashkey has exceeded the maximum size limit of2048 bytes")
	if err != nil || !ks.hasRange() {
		return hk, nil, err
	}
	rk, err = get(ks.rng, maxRangeKey, "Aggregated size of all range keys has exceeded the size limit of 1024 bytes")
	return hk, rk, err
}

// keyItem is the item holding just ks's attributes of it.
func (ks keySchema) keyItem(it Item) Item {
	out := Item{}
	for _, n := range ks.names() {
		if v, ok := it[n]; ok {
			out[n] = v
		}
	}
	return out
}

// hashToken places a partition key in the hash space (Scan order and
// segments), as DynamoDB hashes partition keys: FNV-1a then a mix.
func hashToken(henc string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(henc))
	x := h.Sum64()
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// --- ordered rows ---

// row is one item in a table or an index: its sort key there, its table
// key (unique within the store) and the item (for an index, as projected).
type row struct {
	rk   *Value
	edge int8 // pivots only: -1 before, +1 after every row of rk
	tkey string
	item Item
	size int
}

func rowLess(a, b *row) bool {
	if a.rk != nil && b.rk != nil {
		if c, _ := compare(a.rk, b.rk); c != 0 {
			return c < 0
		}
	}
	if a.edge != b.edge {
		return a.edge < b.edge
	}
	return a.tkey < b.tkey
}

// partition holds the rows of one partition key, in sort-key order.
type partition struct {
	token uint64
	henc  string
	hk    *Value
	rows  *btree.BTreeG[*row]
}

func partLess(a, b *partition) bool {
	if a.token != b.token {
		return a.token < b.token
	}
	return a.henc < b.henc
}

// ordered is a store of rows: partitions in hash order, rows in sort-key
// order within them.
type ordered struct {
	parts  *btree.BTreeG[*partition]
	byHash map[string]*partition
	count  int
	bytes  int64
}

func newOrdered() ordered {
	return ordered{parts: btree.NewG(16, partLess), byHash: map[string]*partition{}}
}

func (o *ordered) insert(hk *Value, r *row) {
	henc := encodeKey(hk)
	p := o.byHash[henc]
	if p == nil {
		p = &partition{token: hashToken(henc), henc: henc, hk: hk, rows: btree.NewG(8, rowLess)}
		o.byHash[henc] = p
		o.parts.ReplaceOrInsert(p)
	}
	if old, ok := p.rows.ReplaceOrInsert(r); ok {
		o.bytes -= int64(old.size)
	} else {
		o.count++
	}
	o.bytes += int64(r.size)
}

func (o *ordered) remove(hk *Value, r *row) {
	henc := encodeKey(hk)
	p := o.byHash[henc]
	if p == nil {
		return
	}
	if old, ok := p.rows.Delete(r); ok {
		o.count--
		o.bytes -= int64(old.size)
	}
	if p.rows.Len() == 0 {
		delete(o.byHash, henc)
		o.parts.Delete(p)
	}
}

// --- tables and indexes ---

// Table states.
const (
	statusCreating = "CREATING"
	statusActive   = "ACTIVE"
	statusDeleting = "DELETING"
)

// attrDef is one AttributeDefinition.
type attrDef struct {
	AttributeName string
	AttributeType string
}

// index is a global secondary index: its rows follow the table's after
// the lag (see table.catchUp).
type index struct {
	name     string
	arn      string
	ks       keySchema
	projType string
	include  []string
	data     ordered
	// cur holds, by table key, the index's row and partition key for it.
	cur     map[string]indexed
	buckets buckets
}

type indexed struct {
	hk *Value
	r  *row
}

// Projection types.
const (
	projAll      = "ALL"
	projKeysOnly = "KEYS_ONLY"
	projInclude  = "INCLUDE"
)

// pendingWrite is a table write the indexes have not seen yet.
type pendingWrite struct {
	due  time.Time
	tkey string
	item Item // nil: deleted
}

type table struct {
	name, arn, id string
	created       time.Time
	activeAt      time.Time // CREATING until then
	ks            keySchema
	attrDefs      []attrDef
	billing       string
	tags          []tag
	gsis          []*index
	ttlAttr       string
	ttlOn         bool
	maxRead       float64 // OnDemandThroughput, 0: none
	maxWrite      float64
	items         map[string]*row // by table key
	data          ordered
	pending       []pendingWrite
	buckets       buckets
	tableRead     bucket
	tableWrite    bucket
}

type tag struct {
	Key   string
	Value string
}

// projected is it as index ix holds it.
func (ix *index) projected(it Item, tableKS keySchema) Item {
	if ix.projType == projAll {
		return it
	}
	out := Item{}
	for _, n := range tableKS.names() {
		out[n] = it[n]
	}
	for _, n := range ix.ks.names() {
		out[n] = it[n]
	}
	for _, n := range ix.include {
		if v, ok := it[n]; ok {
			out[n] = v
		}
	}
	return out
}

// indexKey returns it's partition and sort key in ix, or false when the
// item is not in the index (sparse: a key attribute missing).
func (ix *index) indexKey(it Item) (hk, rk *Value, ok bool) {
	if it == nil {
		return nil, nil, false
	}
	hk, rk, _ = ix.ks.keyValues(it, false)
	if hk == nil || ix.ks.hasRange() && rk == nil {
		return nil, nil, false
	}
	return hk, rk, true
}

// apply makes ix hold item (nil: nothing) for table key tkey.
func (ix *index) apply(tkey string, item Item, tableKS keySchema) {
	hk, rk, ok := ix.indexKey(item)
	if old, had := ix.cur[tkey]; had && (!ok || encodeKey(old.hk, old.r.rk) != encodeKey(hk, rk)) {
		ix.data.remove(old.hk, old.r)
		delete(ix.cur, tkey)
	}
	if !ok {
		return
	}
	p := ix.projected(item, tableKS)
	r := &row{rk: rk, tkey: tkey, item: p, size: itemSize(p)}
	ix.data.insert(hk, r)
	ix.cur[tkey] = indexed{hk: hk, r: r}
}

// status is the table's state at now.
func (t *table) status(now time.Time) string {
	if now.Before(t.activeAt) {
		return statusCreating
	}
	return statusActive
}

// get returns the item at table key tkey (nil when none).
func (t *table) get(tkey string) Item {
	if r, ok := t.items[tkey]; ok {
		return r.item
	}
	return nil
}

// write stores item (nil: deletes) at the key, and queues the change for
// the indexes (applied at once when lag <= 0).
func (t *table) write(tkey string, hk, rk *Value, item Item, now time.Time, lag time.Duration) {
	if item == nil {
		if old, ok := t.items[tkey]; ok {
			t.data.remove(hk, old)
			delete(t.items, tkey)
		}
	} else {
		// The same key orders the same: insert replaces the old row in
		// place (its partition stays).
		r := &row{rk: rk, tkey: tkey, item: item, size: itemSize(item)}
		t.items[tkey] = r
		t.data.insert(hk, r)
	}
	if len(t.gsis) == 0 {
		return
	}
	if lag <= 0 {
		for _, ix := range t.gsis {
			ix.apply(tkey, item, t.ks)
		}
		return
	}
	t.pending = append(t.pending, pendingWrite{due: now.Add(lag), tkey: tkey, item: item})
}

// catchUp applies the writes whose lag has passed to the indexes, in the
// order they were made.
func (t *table) catchUp(now time.Time) {
	n := 0
	for n < len(t.pending) && !t.pending[n].due.After(now) {
		w := t.pending[n]
		for _, ix := range t.gsis {
			ix.apply(w.tkey, w.item, t.ks)
		}
		t.pending[n] = pendingWrite{}
		n++
	}
	if n > 0 {
		t.pending = t.pending[n:]
		if len(t.pending) == 0 {
			t.pending = nil // let the backing array go
		}
	}
}

// index returns the table's index named name, or nil.
func (t *table) index(name string) *index {
	for _, ix := range t.gsis {
		if ix.name == name {
			return ix
		}
	}
	return nil
}
