package ddbsim

import (
	"bytes"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// getPath returns the value at path in it; false when any step is missing
// or of the wrong kind.
func getPath(it Item, path docPath) (*Value, bool) {
	v, ok := it[path[0].name]
	if !ok || path[0].isIndex {
		return nil, false
	}
	for _, e := range path[1:] {
		switch {
		case e.isIndex && v.L != nil:
			if e.index >= len(*v.L) {
				return nil, false
			}
			v = (*v.L)[e.index]
		case !e.isIndex && v.M != nil:
			if v, ok = (*v.M)[e.name]; !ok {
				return nil, false
			}
		default:
			return nil, false
		}
	}
	return v, true
}

// resolve evaluates a condition operand; false when it names nothing.
func (o *operand) resolve(it Item) (*Value, bool) {
	switch o.kind {
	case oValue:
		return o.val, true
	case oPath:
		return getPath(it, o.path)
	case oSize:
		v, ok := getPath(it, o.args[0].path)
		if !ok {
			return nil, false
		}
		n, ok := sizeOf(v)
		if !ok {
			return nil, false
		}
		return numVal(strconv.Itoa(n)), true
	}
	return nil, false
}

// sizeOf is size(): a string's length, binary's bytes, a collection's
// elements; false for other types.
func sizeOf(v *Value) (int, bool) {
	switch v.kind() {
	case typeS:
		return utf8.RuneCountInString(*v.S), true
	case typeB:
		return len(*v.B), true
	case typeM:
		return len(*v.M), true
	case typeL:
		return len(*v.L), true
	case typeSS:
		return len(v.SS), true
	case typeNS:
		return len(v.NS), true
	case typeBS:
		return len(v.BS), true
	}
	return 0, false
}

// eval evaluates c against it (nil: the item does not exist). Conditions
// never fail: what cannot be compared is false (and <> true).
func (c *cond) eval(it Item) bool {
	switch c.kind {
	case cAnd:
		return c.subs[0].eval(it) && c.subs[1].eval(it)
	case cOr:
		return c.subs[0].eval(it) || c.subs[1].eval(it)
	case cNot:
		return !c.subs[0].eval(it)
	case cCompare:
		a, okA := c.args[0].resolve(it)
		b, okB := c.args[1].resolve(it)
		if !okA || !okB {
			return c.op == "<>" && (okA || okB)
		}
		switch c.op {
		case "=":
			return equal(a, b)
		case "<>":
			return !equal(a, b)
		}
		r, ok := compare(a, b)
		if !ok {
			return false
		}
		switch c.op {
		case "<":
			return r < 0
		case "<=":
			return r <= 0
		case ">":
			return r > 0
		}
		return r >= 0
	case cBetween:
		v, ok := c.args[0].resolve(it)
		lo, okLo := c.args[1].resolve(it)
		hi, okHi := c.args[2].resolve(it)
		if !ok || !okLo || !okHi {
			return false
		}
		a, okA := compare(v, lo)
		b, okB := compare(v, hi)
		return okA && okB && a >= 0 && b <= 0
	case cIn:
		v, ok := c.args[0].resolve(it)
		if !ok {
			return false
		}
		for _, o := range c.args[1:] {
			if w, ok := o.resolve(it); ok && equal(v, w) {
				return true
			}
		}
		return false
	case cExists:
		_, ok := getPath(it, c.args[0].path)
		return ok
	case cNotExists:
		_, ok := getPath(it, c.args[0].path)
		return !ok
	case cType:
		v, ok := getPath(it, c.args[0].path)
		t, _ := c.args[1].resolve(it)
		return ok && v.kind() == *t.S
	case cBeginsWith:
		v, ok := c.args[0].resolve(it)
		pre, okP := c.args[1].resolve(it)
		if !ok || !okP {
			return false
		}
		switch {
		case v.S != nil && pre.S != nil:
			return strings.HasPrefix(*v.S, *pre.S)
		case v.B != nil && pre.B != nil:
			return bytes.HasPrefix(*v.B, *pre.B)
		}
		return false
	case cContains:
		v, ok := c.args[0].resolve(it)
		e, okE := c.args[1].resolve(it)
		if !ok || !okE {
			return false
		}
		return contains(v, e)
	}
	return false
}

func contains(v, e *Value) bool {
	switch v.kind() {
	case typeS:
		return e.S != nil && strings.Contains(*v.S, *e.S)
	case typeB:
		return e.B != nil && bytes.Contains(*v.B, *e.B)
	case typeSS:
		return e.S != nil && slices.Contains(v.SS, *e.S)
	case typeNS:
		return e.N != nil && slices.ContainsFunc(v.NS, func(n string) bool { return cmpNumber(n, *e.N) == 0 })
	case typeBS:
		return e.B != nil && slices.ContainsFunc(v.BS, func(b []byte) bool { return bytes.Equal(b, *e.B) })
	case typeL:
		return slices.ContainsFunc(*v.L, func(x *Value) bool { return equal(x, e) })
	}
	return false
}

// --- updates ---

// Messages of updates that fail on the item they meet.
const (
	msgPathInvalid   = "The document path provided in the update expression is invalid for update"
	msgNoSuchAttr    = "The provided expression refers to an attribute that does not exist in the item"
	msgWrongDataType = "An operand in the update expression has an incorrect data type"
)

// value evaluates a SET operand against the item before the update.
func (o *operand) value(old Item) (*Value, *apiError) {
	switch o.kind {
	case oValue:
		return o.val, nil
	case oPath:
		v, ok := getPath(old, o.path)
		if !ok {
			return nil, validation(msgNoSuchAttr)
		}
		return v, nil
	case oIfNotExists:
		if v, ok := getPath(old, o.args[0].path); ok {
			return v, nil
		}
		return o.args[1].value(old)
	case oListAppend:
		a, b, err := o.pair(old)
		if err != nil {
			return nil, err
		}
		if a.L == nil || b.L == nil {
			return nil, validation(msgWrongDataType)
		}
		l := append(slices.Clone(*a.L), *b.L...)
		return &Value{L: &l}, nil
	case oPlus, oMinus:
		a, b, err := o.pair(old)
		if err != nil {
			return nil, err
		}
		if a.N == nil || b.N == nil {
			return nil, validation(msgWrongDataType)
		}
		da, _ := parseNumber(*a.N)
		db, _ := parseNumber(*b.N)
		sum, aerr := addDecimal(da, db, o.kind == oMinus)
		if aerr != nil {
			return nil, aerr
		}
		return numVal(sum.String()), nil
	}
	return nil, validation(msgWrongDataType)
}

// pair evaluates the two operands of a function or an arithmetic.
func (o *operand) pair(old Item) (*Value, *Value, *apiError) {
	a, err := o.args[0].value(old)
	if err != nil {
		return nil, nil, err
	}
	b, err := o.args[1].value(old)
	if err != nil {
		return nil, nil, err
	}
	return a, b, nil
}

// apply returns the item old (nil: none) becomes under u, keyed by key
// (the key attributes, for a new item). Operands read old, as DynamoDB's
// do; old is not modified.
func (u *update) apply(old, key Item) (Item, *apiError) {
	vals := make([]*Value, len(u.sets))
	for i, s := range u.sets {
		v, err := s.val.value(old)
		if err != nil {
			return nil, err
		}
		vals[i] = copyValue(v)
	}
	next := copyItem(old)
	for k, v := range key {
		next[k] = v
	}
	for i, s := range u.sets {
		if err := setPath(next, s.path, vals[i]); err != nil {
			return nil, err
		}
	}
	for _, a := range u.adds {
		if err := addPath(next, a.path, a.val.val, false); err != nil {
			return nil, err
		}
	}
	for _, d := range u.deletes {
		if err := addPath(next, d.path, d.val.val, true); err != nil {
			return nil, err
		}
	}
	// List elements are removed last index first, so that every index
	// names the element it named in the item as it was.
	removes := slices.Clone(u.removes)
	slices.SortStableFunc(removes, func(a, b docPath) int {
		ka, ia := removeOrder(a)
		kb, ib := removeOrder(b)
		if c := strings.Compare(ka, kb); c != 0 {
			return c
		}
		return ib - ia
	})
	for _, r := range removes {
		removePath(next, r)
	}
	return next, nil
}

// removeOrder sorts removals: list elements grouped by their list, last
// index first; other paths after them.
func removeOrder(p docPath) (string, int) {
	last := p[len(p)-1]
	if !last.isIndex {
		return "\xff", 0
	}
	return p[:len(p)-1].String(), last.index
}

// parent walks to the container of path's last step; false when a step is
// missing or of the wrong kind.
func parent(it Item, path docPath) (*Value, bool) {
	if len(path) == 1 {
		return nil, true
	}
	v, ok := getPath(it, path[:len(path)-1])
	if !ok {
		return nil, false
	}
	last := path[len(path)-1]
	if last.isIndex && v.L == nil || !last.isIndex && v.M == nil {
		return nil, false
	}
	return v, true
}

// setPath sets path to v in it (whose containers it owns). A list index
// past the end appends.
func setPath(it Item, path docPath, v *Value) *apiError {
	if path[0].isIndex {
		return validation(msgPathInvalid)
	}
	p, ok := parent(it, path)
	if !ok {
		return validation(msgPathInvalid)
	}
	last := path[len(path)-1]
	switch {
	case p == nil:
		it[last.name] = v
	case last.isIndex:
		l := *p.L
		if last.index < len(l) {
			l[last.index] = v
		} else {
			l = append(l, v)
		}
		*p.L = l
	default:
		(*p.M)[last.name] = v
	}
	return nil
}

// removePath removes path from it; nothing when it is not there.
func removePath(it Item, path docPath) {
	p, ok := parent(it, path)
	if !ok {
		return
	}
	last := path[len(path)-1]
	switch {
	case p == nil:
		delete(it, last.name)
	case last.isIndex:
		l := *p.L
		if last.index < len(l) {
			*p.L = append(l[:last.index:last.index], l[last.index+1:]...)
		}
	default:
		delete(*p.M, last.name)
	}
}

// addPath is ADD (numbers add, sets unite; a missing attribute takes the
// value) or, with del, DELETE (sets subtract; an emptied set goes).
func addPath(it Item, path docPath, v *Value, del bool) *apiError {
	cur, ok := getPath(it, path)
	if !ok {
		if del {
			if _, pok := parent(it, path); !pok {
				return validation(msgPathInvalid)
			}
			return nil
		}
		return setPath(it, path, copyValue(v))
	}
	k := v.kind()
	if cur.kind() != k {
		return validation(msgWrongDataType)
	}
	var next *Value
	switch k {
	case typeN:
		a, _ := parseNumber(*cur.N)
		b, _ := parseNumber(*v.N)
		sum, err := addDecimal(a, b, false)
		if err != nil {
			return err
		}
		next = numVal(sum.String())
	case typeSS:
		next = &Value{SS: setOp(cur.SS, v.SS, del, func(a, b string) bool { return a == b })}
	case typeNS:
		next = &Value{NS: setOp(cur.NS, v.NS, del, func(a, b string) bool { return cmpNumber(a, b) == 0 })}
	case typeBS:
		next = &Value{BS: setOp(cur.BS, v.BS, del, bytes.Equal)}
	}
	if next.kind() == "" { // an emptied set
		removePath(it, path)
		return nil
	}
	return setPath(it, path, next)
}

// setOp returns cur ∪ v, or cur − v with del (nil when empty).
func setOp[T any](cur, v []T, del bool, eq func(a, b T) bool) []T {
	var out []T
	if del {
		for _, c := range cur {
			if !slices.ContainsFunc(v, func(x T) bool { return eq(c, x) }) {
				out = append(out, c)
			}
		}
		return out
	}
	out = slices.Clone(cur)
	for _, x := range v {
		if !slices.ContainsFunc(out, func(c T) bool { return eq(c, x) }) {
			out = append(out, x)
		}
	}
	return out
}

// --- projections ---

// projNode is a tree of projected paths.
type projNode struct {
	leaf  bool
	names map[string]*projNode
	idx   map[int]*projNode
}

func projTree(paths []docPath) *projNode {
	root := &projNode{}
	for _, p := range paths {
		n := root
		for _, e := range p {
			var next *projNode
			if e.isIndex {
				if n.idx == nil {
					n.idx = map[int]*projNode{}
				}
				if next = n.idx[e.index]; next == nil {
					next = &projNode{}
					n.idx[e.index] = next
				}
			} else {
				if n.names == nil {
					n.names = map[string]*projNode{}
				}
				if next = n.names[e.name]; next == nil {
					next = &projNode{}
					n.names[e.name] = next
				}
			}
			n = next
		}
		n.leaf = true
	}
	return root
}

// project returns the parts of it that paths name (list elements in their
// order, compacted), as DynamoDB's ProjectionExpression does.
func project(it Item, paths []docPath) Item {
	if it == nil {
		return nil
	}
	root := projTree(paths)
	out := Item{}
	for name, n := range root.names {
		v, ok := it[name]
		if !ok {
			continue
		}
		if pv := projectValue(v, n); pv != nil {
			out[name] = pv
		}
	}
	return out
}

func projectValue(v *Value, n *projNode) *Value {
	if n.leaf {
		return v
	}
	switch {
	case n.names != nil && v.M != nil:
		m := map[string]*Value{}
		for name, c := range n.names {
			if e, ok := (*v.M)[name]; ok {
				if pe := projectValue(e, c); pe != nil {
					m[name] = pe
				}
			}
		}
		if len(m) == 0 {
			return nil
		}
		return &Value{M: &m}
	case n.idx != nil && v.L != nil:
		idx := make([]int, 0, len(n.idx))
		for i := range n.idx {
			idx = append(idx, i)
		}
		slices.Sort(idx)
		var l []*Value
		for _, i := range idx {
			if i < len(*v.L) {
				if pe := projectValue((*v.L)[i], n.idx[i]); pe != nil {
					l = append(l, pe)
				}
			}
		}
		if len(l) == 0 {
			return nil
		}
		return &Value{L: &l}
	}
	return nil
}
