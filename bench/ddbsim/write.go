package ddbsim

import (
	"strings"
	"time"
)

// maxItemSize is DynamoDB's item size limit (400 KB).
const maxItemSize = 400 * 1024

// checkNewItem checks an item about to be stored in t: its key attributes
// (present, typed, non-empty, within size), the types of the index keys it
// has, and its size. update picks the messages UpdateItem uses.
func checkNewItem(t *table, it Item, update bool) *apiError {
	for _, a := range []keyAttr{t.ks.hash, t.ks.rng} {
		if a.name == "" {
			continue
		}
		v, ok := it[a.name]
		if !ok {
			return validation("One or more parameter values were invalid: Missing the key %s in the item", a.name)
		}
		if k := v.kind(); k != a.typ {
			return validation("One or more parameter values were invalid: Type mismatch for key %s expected: %s actual: %s", a.name, a.typ, k)
		}
	}
	if _, _, err := t.ks.keyValues(it, true); err != nil {
		return err
	}
	for _, ix := range t.gsis {
		for _, a := range []keyAttr{ix.ks.hash, ix.ks.rng} {
			if a.name == "" {
				continue
			}
			v, ok := it[a.name]
			if !ok {
				continue
			}
			if k := v.kind(); k != a.typ {
				if update {
					return validation("One or more parameter values were invalid: Type mismatch for Index Key %s Expected: %s Actual: %s IndexName: %s", a.name, a.typ, k, ix.name)
				}
				return validation("One or more parameter values were invalid: Type mismatch for Index Key %s Expected: %s Actual: %s IndexName: %s", a.name, a.typ, k, ix.name)
			}
			if a.typ != typeN && len(keyBytes(v)) == 0 {
				return validation("One or more parameter values are not valid. A value specified for a secondary index key is not supported. The AttributeValue for a key attribute cannot contain an empty string value. IndexName: %s, IndexKey: %s", ix.name, a.name)
			}
		}
	}
	if itemSize(it) > maxItemSize {
		if update {
			return validation("Item size to update has exceeded the maximum allowed size")
		}
		return validation("Item size has exceeded the maximum allowed size")
	}
	return nil
}

// itemWrite is one planned write: what it changes and what it costs.
type itemWrite struct {
	t        *table
	tkey     string
	hk, rk   *Value
	old, new Item // new == nil: a delete
	check    bool // a transaction's ConditionCheck: a read, no write
	units    float64
	idx      []indexWrite
}

// indexWrite is what an item write costs one index, and the partition
// keys it touches there.
type indexWrite struct {
	ix    *index
	units float64
	parts []string
}

// planWrite prices the write of next (nil: delete) over old at t's key:
// writes cost the larger item in 1 KB units, twice in a transaction, and
// every index whose entry changes pays for its writes (a key change is a
// delete and a put).
func planWrite(t *table, tkey string, hk, rk *Value, old, next Item, txn bool) *itemWrite {
	f := 1.0
	if txn {
		f = 2
	}
	w := &itemWrite{t: t, tkey: tkey, hk: hk, rk: rk, old: old, new: next}
	w.units = f * writeUnits(max(itemSize(old), itemSize(next)))
	for _, ix := range t.gsis {
		ohk, _, oin := ix.indexKey(old)
		nhk, _, nin := ix.indexKey(next)
		var iw indexWrite
		switch {
		case oin && nin && encodeKey(ohk) == encodeKey(nhk) && sameIndexEntry(ix, t.ks, old, next):
			continue
		case oin && nin && sameIndexKey(ix, old, next):
			iw.units = f * writeUnits(itemSize(ix.projected(next, t.ks)))
			iw.parts = []string{encodeKey(nhk)}
		default:
			if oin {
				iw.units += f * writeUnits(itemSize(ix.projected(old, t.ks)))
				iw.parts = append(iw.parts, encodeKey(ohk))
			}
			if nin {
				iw.units += f * writeUnits(itemSize(ix.projected(next, t.ks)))
				iw.parts = append(iw.parts, encodeKey(nhk))
			}
		}
		if iw.units > 0 {
			iw.ix = ix
			w.idx = append(w.idx, iw)
		}
	}
	return w
}

func sameIndexKey(ix *index, a, b Item) bool {
	ah, ar, _ := ix.indexKey(a)
	bh, br, _ := ix.indexKey(b)
	return encodeKey(ah, ar) == encodeKey(bh, br)
}

// sameIndexEntry reports whether the index would hold the same entry for
// a and b (so the write costs the index nothing).
func sameIndexEntry(ix *index, ks keySchema, a, b Item) bool {
	if !sameIndexKey(ix, a, b) {
		return false
	}
	pa, pb := ix.projected(a, ks), ix.projected(b, ks)
	if len(pa) != len(pb) {
		return false
	}
	for k, v := range pa {
		w, ok := pb[k]
		if !ok || !equal(v, w) {
			return false
		}
	}
	return true
}

// throttle is the refusal of one bucket: the error and the limit it names.
func (s *Server) throttle(code, reason, resource string) *apiError {
	msg := msgKeyRangeThrottled
	if code == codeThrottling {
		msg = msgTableThrottled
	}
	e := newError(code, 400, "%s", msg)
	e.throttling = []throttlingReason{{Reason: reason, Resource: resource}}
	// One line per limit and resource a second: a hot key would log
	// thousands (the counts are in Stats).
	now, k := s.cfg.Clock.Now(), reason+" "+resource
	if last, ok := s.logged[k]; !ok || now.Sub(last) >= time.Second {
		if s.logged == nil || len(s.logged) > 1024 {
			s.logged = map[string]time.Time{}
		}
		s.logged[k] = now
		s.cfg.Log.Warn("ddbsim: throttled (a simulated DynamoDB limit)", "limit", reason, "resource", resource)
	}
	return e
}

// tableRate is t's per-second quota for reads or writes (0: none).
func (s *Server) tableRate(t *table, write bool) (rate float64, reason string) {
	kind := "Read"
	cfgRate, own := s.cfg.TableReadUnits, t.maxRead
	if write {
		kind = "Write"
		cfgRate, own = s.cfg.TableWriteUnits, t.maxWrite
	}
	if t.billing == billingProvisioned {
		return own, "Table" + kind + "ProvisionedThroughputExceeded"
	}
	rate = max(cfgRate, 0)
	reason = "Table" + kind + "AccountLimitExceeded"
	if own > 0 && (rate == 0 || own < rate) {
		rate, reason = own, "Table"+kind+"MaxOnDemandThroughputExceeded"
	}
	return rate, reason
}

func (s *Server) tableBucketErr(t *table, write bool, reason string) *apiError {
	if t.billing == billingProvisioned {
		return s.throttle(codeThroughput, reason, t.arn)
	}
	return s.throttle(codeThrottling, reason, t.arn)
}

// admitWrites checks every bucket the writes would draw from; it returns
// the position of the first write refused and why (-1, nil: all pass).
// Nothing is consumed.
func (s *Server) admitWrites(ws []*itemWrite, now time.Time) (int, *apiError) {
	pw := max(s.cfg.PartitionWriteUnits, 0)
	for i, w := range ws {
		if w.check {
			if err := s.admitRead(w.t, nil, encodeKey(w.hk), now); err != nil {
				return i, err
			}
			continue
		}
		if rate, reason := s.tableRate(w.t, true); !w.t.tableWrite.ok(rate, now) {
			return i, s.tableBucketErr(w.t, true, reason)
		}
		if !w.t.buckets.get(true, encodeKey(w.hk)).ok(pw, now) {
			return i, s.throttle(codeThroughput, "TableWriteKeyRangeThroughputExceeded", w.t.arn)
		}
		for _, iw := range w.idx {
			for _, p := range iw.parts {
				if !iw.ix.buckets.get(true, p).ok(pw, now) {
					return i, s.throttle(codeThroughput, "IndexWriteKeyRangeThroughputExceeded", iw.ix.arn)
				}
			}
		}
	}
	return -1, nil
}

// chargeWrites consumes the writes' units from their buckets and meters
// them.
func (s *Server) chargeWrites(ws []*itemWrite, now time.Time, m *meter) {
	pw := max(s.cfg.PartitionWriteUnits, 0)
	for _, w := range ws {
		s.chargeWrite(w, pw, now, m)
	}
}

func (s *Server) chargeWrite(w *itemWrite, pw float64, now time.Time, m *meter) {
	if w.check {
		s.chargeRead(w.t, nil, encodeKey(w.hk), 2*readUnits(itemSize(w.old), true), now, m)
		return
	}
	total := w.units
	w.t.buckets.get(true, encodeKey(w.hk)).take(pw, w.units, now)
	m.add(w.t.name, "", 0, w.units)
	for _, iw := range w.idx {
		per := iw.units / float64(len(iw.parts))
		for _, p := range iw.parts {
			iw.ix.buckets.get(true, p).take(pw, per, now)
		}
		m.add(w.t.name, iw.ix.name, 0, iw.units)
		total += iw.units
	}
	rate, _ := s.tableRate(w.t, true)
	w.t.tableWrite.take(rate, total, now)
	w.t.buckets.prune(max(s.cfg.PartitionReadUnits, 0), pw, now)
	s.units.add(w.t.name, 0, total)
}

// commitWrites stores the writes.
func (s *Server) commitWrites(ws []*itemWrite, now time.Time) {
	for _, w := range ws {
		if w.check {
			continue
		}
		w.t.write(w.tkey, w.hk, w.rk, w.new, now, s.cfg.IndexLag)
	}
}

// chargeFailedWrite meters a write whose condition failed: DynamoDB
// charges it all the same (the item's size, no index writes).
func (s *Server) chargeFailedWrite(t *table, hk *Value, old Item, txn bool, now time.Time, m *meter) {
	w := &itemWrite{t: t, hk: hk, units: writeUnits(itemSize(old))}
	if txn {
		w.units *= 2
	}
	s.chargeWrite(w, max(s.cfg.PartitionWriteUnits, 0), now, m)
}

// admitRead checks the buckets a read of partition henc of t (or of its
// index ix) would draw from.
func (s *Server) admitRead(t *table, ix *index, henc string, now time.Time) *apiError {
	if rate, reason := s.tableRate(t, false); !t.tableRead.ok(rate, now) {
		return s.tableBucketErr(t, false, reason)
	}
	if henc == "" {
		return nil
	}
	pr := max(s.cfg.PartitionReadUnits, 0)
	if ix != nil {
		if !ix.buckets.get(false, henc).ok(pr, now) {
			return s.throttle(codeThroughput, "IndexReadKeyRangeThroughputExceeded", ix.arn)
		}
		return nil
	}
	if !t.buckets.get(false, henc).ok(pr, now) {
		return s.throttle(codeThroughput, "TableReadKeyRangeThroughputExceeded", t.arn)
	}
	return nil
}

// chargeRead consumes a read's units and meters them.
func (s *Server) chargeRead(t *table, ix *index, henc string, units float64, now time.Time, m *meter) {
	pr := max(s.cfg.PartitionReadUnits, 0)
	rate, _ := s.tableRate(t, false)
	t.tableRead.take(rate, units, now)
	name := ""
	if henc != "" {
		if ix != nil {
			ix.buckets.get(false, henc).take(pr, units, now)
			ix.buckets.prune(pr, max(s.cfg.PartitionWriteUnits, 0), now)
		} else {
			t.buckets.get(false, henc).take(pr, units, now)
		}
	}
	if ix != nil {
		name = ix.name
	}
	m.add(t.name, name, units, 0)
	s.units.add(t.name, units, 0)
}

// --- metering for ReturnConsumedCapacity ---

// meter collects one request's consumed capacity by table and index.
type meter struct {
	mode   string
	order  []string
	tables map[string]*tableUse
}

type tableUse struct {
	read, write float64 // the table's own
	idx         map[string]*[2]float64
}

// Values of ReturnConsumedCapacity.
const (
	capNone    = "NONE"
	capTotal   = "TOTAL"
	capIndexes = "INDEXES"
)

func newMeter(mode string) (*meter, *apiError) {
	switch mode {
	case "", capNone, capTotal, capIndexes:
		return &meter{mode: mode, tables: map[string]*tableUse{}}, nil
	}
	return nil, validation("1 validation error detected: Value '%s' at 'returnConsumedCapacity' failed to satisfy constraint: Member must satisfy enum value set: [INDEXES, TOTAL, NONE]", mode)
}

func (m *meter) add(tableName, indexName string, read, write float64) {
	u := m.tables[tableName]
	if u == nil {
		u = &tableUse{idx: map[string]*[2]float64{}}
		m.tables[tableName] = u
		m.order = append(m.order, tableName)
	}
	if indexName == "" {
		u.read += read
		u.write += write
		return
	}
	iu := u.idx[indexName]
	if iu == nil {
		iu = &[2]float64{}
		u.idx[indexName] = iu
	}
	iu[0] += read
	iu[1] += write
}

type capacityOut struct {
	CapacityUnits      float64
	ReadCapacityUnits  *float64 `json:",omitempty"`
	WriteCapacityUnits *float64 `json:",omitempty"`
}

type consumedOut struct {
	TableName              string
	CapacityUnits          float64
	ReadCapacityUnits      *float64               `json:",omitempty"`
	WriteCapacityUnits     *float64               `json:",omitempty"`
	Table                  *capacityOut           `json:",omitempty"`
	GlobalSecondaryIndexes map[string]capacityOut `json:",omitempty"`
}

func capOf(read, write float64) capacityOut {
	c := capacityOut{CapacityUnits: read + write}
	if read > 0 {
		c.ReadCapacityUnits = &read
	}
	if write > 0 {
		c.WriteCapacityUnits = &write
	}
	return c
}

// list returns ConsumedCapacity per table, or nil when not asked for.
func (m *meter) list() []consumedOut {
	if m.mode == "" || m.mode == capNone {
		return nil
	}
	out := []consumedOut{}
	for _, name := range m.order {
		u := m.tables[name]
		read, write := u.read, u.write
		for _, iu := range u.idx {
			read += iu[0]
			write += iu[1]
		}
		total := capOf(read, write)
		c := consumedOut{TableName: name, CapacityUnits: total.CapacityUnits, ReadCapacityUnits: total.ReadCapacityUnits, WriteCapacityUnits: total.WriteCapacityUnits}
		if m.mode == capIndexes {
			tc := capOf(u.read, u.write)
			c.Table = &tc
			if len(u.idx) > 0 {
				c.GlobalSecondaryIndexes = map[string]capacityOut{}
				for n, iu := range u.idx {
					c.GlobalSecondaryIndexes[n] = capOf(iu[0], iu[1])
				}
			}
		}
		out = append(out, c)
	}
	return out
}

// one returns the ConsumedCapacity of a single-table request, or nil.
func (m *meter) one(tableName string) *consumedOut {
	l := m.list()
	if l == nil {
		return nil
	}
	for i := range l {
		if l[i].TableName == tableName {
			return &l[i]
		}
	}
	return &consumedOut{TableName: tableName}
}

// legacy refuses DynamoDB's legacy parameters, which the simulator does
// not simulate (the expressions replace them).
func legacy(params map[string]bool) *apiError {
	for name, set := range params {
		if set {
			return validation("ddbsim (a simulator of DynamoDB) does not simulate the legacy parameter %s; use expressions (%s)", name,
				strings.TrimSpace(legacyHint[name]))
		}
	}
	return nil
}

var legacyHint = map[string]string{
	"Expected": "ConditionExpression", "ConditionalOperator": "ConditionExpression", "AttributeUpdates": "UpdateExpression",
	"AttributesToGet": "ProjectionExpression", "KeyConditions": "KeyConditionExpression", "QueryFilter": "FilterExpression",
	"ScanFilter": "FilterExpression",
}
