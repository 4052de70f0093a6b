package ddbsim

import (
	"bytes"
	"math"
	"math/bits"
	"strings"
	"time"
)

// maxPage is how many bytes one Query or Scan reads (1 MB).
const maxPage = 1 << 20

// keyCond is a Query's key condition: the partition key, and an optional
// condition on the sort key.
type keyCond struct {
	hk   *Value
	op   string // "", "=", "<", "<=", ">", ">=", "BETWEEN", "begins_with"
	a, b *Value
}

// keyCondOf checks a parsed KeyConditionExpression against the key ks of
// the table or index queried.
func keyCondOf(c *cond, ks keySchema) (*keyCond, *apiError) {
	var parts []*cond
	var flatten func(c *cond) *apiError
	flatten = func(c *cond) *apiError {
		switch c.kind {
		case cAnd:
			if err := flatten(c.subs[0]); err != nil {
				return err
			}
			return flatten(c.subs[1])
		case cOr:
			return validation("Invalid KeyConditionExpression: Invalid operator used in KeyConditionExpression: OR")
		case cNot:
			return validation("Invalid KeyConditionExpression: Invalid operator used in KeyConditionExpression: NOT")
		case cIn:
			return validation("Invalid KeyConditionExpression: Invalid operator used in KeyConditionExpression: IN")
		case cExists, cNotExists, cType, cContains:
			return validation("Invalid KeyConditionExpression: Invalid operator used in KeyConditionExpression: %s", condName(c.kind))
		}
		parts = append(parts, c)
		return nil
	}
	if err := flatten(c); err != nil {
		return nil, err
	}
	if len(parts) > 2 {
		return nil, validation("KeyConditionExpressions must only contain one condition per key")
	}
	kc := &keyCond{}
	seen := map[string]bool{}
	for _, p := range parts {
		name, op, vals, err := keyPart(p)
		if err != nil {
			return nil, err
		}
		if seen[name] {
			return nil, validation("KeyConditionExpressions must only contain one condition per key")
		}
		seen[name] = true
		switch name {
		case ks.hash.name:
			if op != "=" {
				return nil, validation("Query key condition not supported")
			}
			if vals[0].kind() != ks.hash.typ {
				return nil, validation("One or more parameter values were invalid: Condition parameter type does not match schema type")
			}
			kc.hk = vals[0]
		case ks.rng.name:
			if ks.rng.name == "" {
				return nil, validation("Query key condition not supported")
			}
			for _, v := range vals {
				if v.kind() != ks.rng.typ {
					return nil, validation("One or more parameter values were invalid: Condition parameter type does not match schema type")
				}
			}
			if op == "begins_with" && ks.rng.typ == typeN {
				return nil, validation("Invalid KeyConditionExpression: Incorrect operand type for operator or function; operator or function: begins_with, operand type: N")
			}
			kc.op, kc.a = op, vals[0]
			if len(vals) > 1 {
				kc.b = vals[1]
			}
		default:
			return nil, validation("Query condition missed key schema element: %s", ks.hash.name)
		}
	}
	if kc.hk == nil {
		return nil, validation("Query condition missed key schema element: %s", ks.hash.name)
	}
	return kc, nil
}

func condName(k condKind) string {
	switch k {
	case cExists:
		return "attribute_exists"
	case cNotExists:
		return "attribute_not_exists"
	case cType:
		return "attribute_type"
	case cContains:
		return "contains"
	}
	return "?"
}

// keyPart reads one condition of a key condition: the attribute, the
// operator and the values.
func keyPart(c *cond) (string, string, []*Value, *apiError) {
	notSupported := validation("Query key condition not supported")
	top := func(o *operand) (string, bool) {
		if o.kind != oPath || len(o.path) != 1 {
			return "", false
		}
		return o.path[0].name, true
	}
	switch c.kind {
	case cCompare:
		if c.op == "<>" {
			return "", "", nil, validation("Invalid KeyConditionExpression: Invalid operator used in KeyConditionExpression: <>")
		}
		l, r, op := c.args[0], c.args[1], c.op
		if l.kind == oValue && r.kind == oPath { // ":v < sk" is "sk > :v"
			l, r = r, l
			op = map[string]string{"=": "=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}[op]
		}
		name, ok := top(l)
		if !ok || r.kind != oValue {
			return "", "", nil, notSupported
		}
		return name, op, []*Value{r.val}, nil
	case cBetween:
		name, ok := top(c.args[0])
		if !ok || c.args[1].kind != oValue || c.args[2].kind != oValue {
			return "", "", nil, notSupported
		}
		return name, "BETWEEN", []*Value{c.args[1].val, c.args[2].val}, nil
	case cBeginsWith:
		name, ok := top(c.args[0])
		if !ok || c.args[1].kind != oValue {
			return "", "", nil, notSupported
		}
		return name, "begins_with", []*Value{c.args[1].val}, nil
	}
	return "", "", nil, notSupported
}

// match reports whether sort key rk satisfies the condition.
func (k *keyCond) match(rk *Value) bool {
	if k.op == "" {
		return true
	}
	c, _ := compare(rk, k.a)
	switch k.op {
	case "=":
		return c == 0
	case "<":
		return c < 0
	case "<=":
		return c <= 0
	case ">":
		return c > 0
	case ">=":
		return c >= 0
	case "BETWEEN":
		d, _ := compare(rk, k.b)
		return c >= 0 && d <= 0
	case "begins_with":
		if rk.S != nil {
			return strings.HasPrefix(*rk.S, *k.a.S)
		}
		return bytes.HasPrefix(*rk.B, *k.a.B)
	}
	return false
}

// bounds returns pivots around the rows that can match: from (ascending
// start) and to (descending start); nil when unbounded on that side.
func (k *keyCond) bounds() (from, to *row) {
	switch k.op {
	case "=":
		return &row{rk: k.a, edge: -1}, &row{rk: k.a, edge: 1}
	case ">":
		return &row{rk: k.a, edge: 1}, nil
	case ">=":
		return &row{rk: k.a, edge: -1}, nil
	case "<":
		return nil, &row{rk: k.a, edge: -1}
	case "<=":
		return nil, &row{rk: k.a, edge: 1}
	case "BETWEEN":
		return &row{rk: k.a, edge: -1}, &row{rk: k.b, edge: 1}
	case "begins_with":
		from = &row{rk: k.a, edge: -1}
		if succ, ok := successor(keyBytes(k.a)); ok {
			v := &Value{B: &succ}
			if k.a.S != nil {
				s := string(succ)
				v = &Value{S: &s}
			}
			to = &row{rk: v, edge: -1}
		}
		return from, to
	}
	return nil, nil
}

// successor is the least byte string greater than every string with
// prefix p; false when there is none (p is all 0xff).
func successor(p []byte) ([]byte, bool) {
	b := bytes.Clone(p)
	for len(b) > 0 && b[len(b)-1] == 0xff {
		b = b[:len(b)-1]
	}
	if len(b) == 0 {
		return nil, false
	}
	b[len(b)-1]++
	return b, true
}

// walkPartition calls fn on p's rows that may match kc, forward or
// backward, after the row `after` (nil: from the start); fn returns false
// to stop.
func walkPartition(p *partition, kc *keyCond, forward bool, after *row, fn func(r *row) bool) {
	from, to := kc.bounds()
	visit := func(r *row) bool {
		if after != nil && r.tkey == after.tkey && !rowLess(r, after) && !rowLess(after, r) {
			return true // the exclusive start itself
		}
		if !kc.match(r.rk) {
			// Past the bounds the walk ends; within them (begins_with
			// pivots are exact) a miss cannot happen.
			return false
		}
		return fn(r)
	}
	if forward {
		start := from
		if after != nil && (start == nil || rowLess(start, after)) {
			start = after
		}
		if start == nil {
			p.rows.Ascend(visit)
		} else {
			p.rows.AscendGreaterOrEqual(start, visit)
		}
		return
	}
	start := to
	if after != nil && (start == nil || rowLess(after, start)) {
		start = after
	}
	if start == nil {
		p.rows.Descend(visit)
	} else {
		p.rows.DescendLessOrEqual(start, visit)
	}
}

// Values of Select.
const (
	selAll       = "ALL_ATTRIBUTES"
	selProjected = "ALL_PROJECTED_ATTRIBUTES"
	selSpecific  = "SPECIFIC_ATTRIBUTES"
	selCount     = "COUNT"
)

// readIn is what Query and Scan share.
type readIn struct {
	TableName                 string
	IndexName                 *string
	FilterExpression          *string
	ProjectionExpression      *string
	ExpressionAttributeNames  map[string]string
	ExpressionAttributeValues map[string]*Value
	ExclusiveStartKey         Item
	Limit                     *int
	ConsistentRead            bool
	Select                    string
	ReturnConsumedCapacity    string
	AttributesToGet           []string
	ConditionalOperator       string
}

type queryIn struct {
	readIn
	KeyConditionExpression *string
	ScanIndexForward       *bool
	KeyConditions          map[string]any
	QueryFilter            map[string]any
}

type scanIn struct {
	readIn
	Segment       *int
	TotalSegments *int
	ScanFilter    map[string]any
}

type readOut struct {
	Items            []Item       `json:"Items,omitempty"`
	Count            int          `json:"Count"`
	ScannedCount     int          `json:"ScannedCount"`
	LastEvaluatedKey Item         `json:"LastEvaluatedKey,omitempty"`
	ConsumedCapacity *consumedOut `json:"ConsumedCapacity,omitempty"`
	count            bool
}

// parsedRead is a Query's or Scan's expressions, parsed.
type parsedRead struct {
	key    *cond
	filter *cond
	proj   []docPath
}

func (in *readIn) parse(keySrc *string) (*parsedRead, *apiError) {
	if in.Limit != nil && *in.Limit < 1 {
		return nil, validation("1 validation error detected: Value '%d' at 'limit' failed to satisfy constraint: Member must have value greater than or equal to 1", *in.Limit)
	}
	switch in.Select {
	case "", selAll, selProjected, selSpecific, selCount:
	default:
		return nil, validation("1 validation error detected: Value '%s' at 'select' failed to satisfy constraint: Member must satisfy enum value set: [SPECIFIC_ATTRIBUTES, COUNT, ALL_ATTRIBUTES, ALL_PROJECTED_ATTRIBUTES]", in.Select)
	}
	if in.ProjectionExpression != nil && in.Select != "" && in.Select != selSpecific {
		return nil, validation("Cannot specify the ProjectionExpression when choosing to get %s", in.Select)
	}
	if in.Select == selProjected && in.IndexName == nil {
		return nil, validation("ALL_PROJECTED_ATTRIBUTES can be used only when Querying using an IndexName")
	}
	if err := checkItem(in.ExclusiveStartKey); err != nil {
		return nil, err
	}
	x := newExprContext(in.ExpressionAttributeNames, in.ExpressionAttributeValues)
	if err := x.checkInputs(); err != nil {
		return nil, err
	}
	pr := &parsedRead{}
	var err *apiError
	if keySrc != nil {
		if pr.key, err = parseCondition(x, kindKey, *keySrc); err != nil {
			return nil, err
		}
	}
	if in.FilterExpression != nil {
		if pr.filter, err = parseCondition(x, kindFilter, *in.FilterExpression); err != nil {
			return nil, err
		}
	}
	if in.ProjectionExpression != nil {
		if pr.proj, err = parseProjection(x, *in.ProjectionExpression); err != nil {
			return nil, err
		}
	}
	return pr, x.checkUnused()
}

// source resolves what a Query or Scan reads: the table or one of its
// indexes, with its key and whether it may be read consistently.
func (in *readIn) source(t *table) (*index, keySchema, *apiError) {
	if in.IndexName == nil {
		return nil, t.ks, nil
	}
	ix := t.index(*in.IndexName)
	if ix == nil {
		return nil, keySchema{}, validation("The table does not have the specified index: %s", *in.IndexName)
	}
	if in.ConsistentRead {
		return nil, keySchema{}, validation("Consistent reads are not supported on global secondary indexes")
	}
	if in.Select == selAll && ix.projType != projAll {
		return nil, keySchema{}, validation("One or more parameter values were invalid: Select type ALL_ATTRIBUTES is not supported for global secondary index %s because its projection type is not ALL", ix.name)
	}
	return ix, ix.ks, nil
}

// startRow turns an ExclusiveStartKey into its position: the partition
// key and the row (sort key in the store read, table key).
func (in *readIn) startRow(t *table, ix *index) (*Value, *row, *apiError) {
	if in.ExclusiveStartKey == nil {
		return nil, nil, nil
	}
	bad := validation("The provided starting key is invalid: The provided key element does not match the schema")
	want := map[string]bool{}
	for _, n := range t.ks.names() {
		want[n] = true
	}
	if ix != nil {
		for _, n := range ix.ks.names() {
			want[n] = true
		}
	}
	if len(in.ExclusiveStartKey) != len(want) {
		return nil, nil, bad
	}
	thk, trk, err := t.ks.keyValues(in.ExclusiveStartKey, true)
	if err != nil || thk == nil || t.ks.hasRange() && trk == nil {
		return nil, nil, bad
	}
	r := &row{tkey: encodeKey(thk, trk), rk: trk}
	hk := thk
	if ix != nil {
		ihk, irk, err := ix.ks.keyValues(in.ExclusiveStartKey, true)
		if err != nil || ihk == nil || ix.ks.hasRange() && irk == nil {
			return nil, nil, bad
		}
		hk, r.rk = ihk, irk
	}
	return hk, r, nil
}

// filterKeys refuses a Query filter on the key attributes queried.
func filterKeys(c *cond, ks keySchema) *apiError {
	if c == nil {
		return nil
	}
	var walk func(c *cond) *apiError
	walk = func(c *cond) *apiError {
		for _, s := range c.subs {
			if err := walk(s); err != nil {
				return err
			}
		}
		for _, o := range c.args {
			for _, p := range operandPaths(o) {
				for _, k := range ks.names() {
					if p[0].name == k {
						return validation("Filter Expression can only contain non-primary key attributes: Primary key attribute: %s", k)
					}
				}
			}
		}
		return nil
	}
	return walk(c)
}

func operandPaths(o *operand) []docPath {
	if o.kind == oPath {
		return []docPath{o.path}
	}
	var out []docPath
	for _, a := range o.args {
		out = append(out, operandPaths(a)...)
	}
	return out
}

// collector gathers a page of Query or Scan results within Limit and
// 1 MB.
type collector struct {
	limit   int
	filter  *cond
	proj    []docPath
	count   bool
	ks      []string // the key attributes of LastEvaluatedKey
	items   []Item
	n       int // matched
	scanned int
	bytes   int
	last    *row
	full    bool // stopped at Limit or 1 MB
}

func (c *collector) add(r *row) bool {
	c.scanned++
	c.bytes += r.size
	c.last = r
	if c.filter == nil || c.filter.eval(r.item) {
		c.n++
		if !c.count {
			it := r.item
			if c.proj != nil {
				it = project(it, c.proj)
			}
			c.items = append(c.items, it)
		}
	}
	if c.scanned >= c.limit || c.bytes >= maxPage {
		c.full = true
		return false
	}
	return true
}

func (c *collector) out(consistent bool) (readOut, float64) {
	o := readOut{Items: c.items, Count: c.n, ScannedCount: c.scanned, count: c.count}
	if !c.count && o.Items == nil {
		o.Items = []Item{}
	}
	if c.full && c.last != nil {
		o.LastEvaluatedKey = Item{}
		for _, k := range c.ks {
			if v, ok := c.last.item[k]; ok {
				o.LastEvaluatedKey[k] = v
			}
		}
	}
	return o, readUnits(c.bytes, consistent)
}

func newCollector(in *readIn, pr *parsedRead, t *table, ix *index) *collector {
	c := &collector{limit: math.MaxInt, filter: pr.filter, proj: pr.proj, count: in.Select == selCount, ks: t.ks.names()}
	if in.Limit != nil {
		c.limit = *in.Limit
	}
	if ix != nil {
		c.ks = append(c.ks, ix.ks.names()...)
	}
	return c
}

func (s *Server) query(body []byte) (any, *apiError) {
	var in queryIn
	if err := decode(body, &in); err != nil {
		return nil, err
	}
	if err := legacy(map[string]bool{"KeyConditions": in.KeyConditions != nil, "QueryFilter": in.QueryFilter != nil,
		"AttributesToGet": in.AttributesToGet != nil, "ConditionalOperator": in.ConditionalOperator != ""}); err != nil {
		return nil, err
	}
	if in.KeyConditionExpression == nil {
		return nil, validation("Either the KeyConditions or KeyConditionExpression parameter must be specified in the request.")
	}
	m, err := newMeter(in.ReturnConsumedCapacity)
	if err != nil {
		return nil, err
	}
	pr, err := in.parse(in.KeyConditionExpression)
	if err != nil {
		return nil, err
	}
	forward := in.ScanIndexForward == nil || *in.ScanIndexForward
	var out readOut
	aerr := s.locked(func(now time.Time) *apiError {
		t, err := s.table(in.TableName, now)
		if err != nil {
			return err
		}
		ix, ks, err := in.source(t)
		if err != nil {
			return err
		}
		kc, err := keyCondOf(pr.key, ks)
		if err != nil {
			return err
		}
		if err := filterKeys(pr.filter, ks); err != nil {
			return err
		}
		shk, after, err := in.startRow(t, ix)
		if err != nil {
			return err
		}
		henc := encodeKey(kc.hk)
		if shk != nil && encodeKey(shk) != henc {
			return validation("The provided starting key is outside query boundaries based on provided conditions")
		}
		if err := s.admitRead(t, ix, henc, now); err != nil {
			return err
		}
		store := &t.data
		if ix != nil {
			store = &ix.data
		}
		c := newCollector(&in.readIn, pr, t, ix)
		if p := store.byHash[henc]; p != nil {
			walkPartition(p, kc, forward, after, c.add)
		}
		var units float64
		out, units = c.out(in.ConsistentRead)
		s.chargeRead(t, ix, henc, units, now, m)
		return nil
	})
	if aerr != nil {
		return nil, aerr
	}
	out.ConsumedCapacity = m.one(in.TableName)
	return out, nil
}

func (s *Server) scan(body []byte) (any, *apiError) {
	var in scanIn
	if err := decode(body, &in); err != nil {
		return nil, err
	}
	if err := legacy(map[string]bool{"ScanFilter": in.ScanFilter != nil, "AttributesToGet": in.AttributesToGet != nil,
		"ConditionalOperator": in.ConditionalOperator != ""}); err != nil {
		return nil, err
	}
	lo, hi, last, err := segment(in.Segment, in.TotalSegments)
	if err != nil {
		return nil, err
	}
	m, err := newMeter(in.ReturnConsumedCapacity)
	if err != nil {
		return nil, err
	}
	pr, err := in.parse(nil)
	if err != nil {
		return nil, err
	}
	var out readOut
	aerr := s.locked(func(now time.Time) *apiError {
		t, err := s.table(in.TableName, now)
		if err != nil {
			return err
		}
		ix, _, err := in.source(t)
		if err != nil {
			return err
		}
		shk, after, err := in.startRow(t, ix)
		if err != nil {
			return err
		}
		if err := s.admitRead(t, ix, "", now); err != nil {
			return err
		}
		store := &t.data
		if ix != nil {
			store = &ix.data
		}
		c := newCollector(&in.readIn, pr, t, ix)
		pivot := &partition{token: lo}
		if shk != nil {
			henc := encodeKey(shk)
			pivot = &partition{token: hashToken(henc), henc: henc}
			if pivot.token < lo || !last && pivot.token >= hi {
				return validation("The provided starting key is invalid: Exclusive start key must lie within the segment")
			}
		}
		all := &keyCond{}
		store.parts.AscendGreaterOrEqual(pivot, func(p *partition) bool {
			if !last && p.token >= hi {
				return false
			}
			var from *row
			if shk != nil && p.henc == pivot.henc {
				from = after
			}
			walkPartition(p, all, true, from, c.add)
			return !c.full
		})
		var units float64
		out, units = c.out(in.ConsistentRead)
		s.chargeRead(t, ix, "", units, now, m)
		return nil
	})
	if aerr != nil {
		return nil, aerr
	}
	out.ConsumedCapacity = m.one(in.TableName)
	return out, nil
}

// maxSegments is DynamoDB's limit of TotalSegments.
const maxSegments = 1000000

// segment returns the hash range [lo, hi) of a parallel scan's segment
// (last: up to the end of the space).
func segment(seg, total *int) (lo, hi uint64, last bool, err *apiError) {
	switch {
	case seg == nil && total == nil:
		return 0, 0, true, nil
	case total == nil:
		return 0, 0, false, validation("The TotalSegments parameter is required but was not present in the request when Segment parameter is present")
	case seg == nil:
		return 0, 0, false, validation("The Segment parameter is required but was not present in the request when parameter TotalSegments is present")
	case *total < 1 || *total > maxSegments:
		return 0, 0, false, validation("1 validation error detected: Value '%d' at 'totalSegments' failed to satisfy constraint: Member must have value less than or equal to 1000000 and greater than or equal to 1", *total)
	case *seg < 0 || *seg >= *total:
		return 0, 0, false, validation("The Segment parameter is zero-based and must be less than parameter TotalSegments: Segment: %d is not less than TotalSegments: %d", *seg, *total)
	}
	lo, _ = bits.Div64(uint64(*seg), 0, uint64(*total))
	last = *seg == *total-1
	if !last {
		hi, _ = bits.Div64(uint64(*seg+1), 0, uint64(*total))
	}
	return lo, hi, last, nil
}
