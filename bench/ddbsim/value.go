package ddbsim

import (
	"bytes"
	"encoding/binary"
	"slices"
	"strings"
)

// Value is one attribute value in DynamoDB's JSON shape: exactly one member
// is set. Pointers tell an empty member ("S": "", "M": {}) from an absent
// one. Values held by the simulator are never modified: a write builds new
// ones.
type Value struct {
	S    *string            `json:"S,omitempty"`
	N    *string            `json:"N,omitempty"`
	B    *[]byte            `json:"B,omitempty"`
	BOOL *bool              `json:"BOOL,omitempty"`
	NULL *bool              `json:"NULL,omitempty"`
	M    *map[string]*Value `json:"M,omitempty"`
	L    *[]*Value          `json:"L,omitempty"`
	SS   []string           `json:"SS,omitempty"`
	NS   []string           `json:"NS,omitempty"`
	BS   [][]byte           `json:"BS,omitempty"`
}

// Item is an item: attribute name to value.
type Item map[string]*Value

// Type names, as DynamoDB writes them.
const (
	typeS    = "S"
	typeN    = "N"
	typeB    = "B"
	typeBOOL = "BOOL"
	typeNULL = "NULL"
	typeM    = "M"
	typeL    = "L"
	typeSS   = "SS"
	typeNS   = "NS"
	typeBS   = "BS"
)

// maxDepth is how deep documents may nest (DynamoDB: 32 levels).
const maxDepth = 32

// kind returns v's type name, "" when no member or several are set.
func (v *Value) kind() string {
	if v == nil {
		return ""
	}
	k, n := "", 0
	set := func(ok bool, name string) {
		if ok {
			k = name
			n++
		}
	}
	set(v.S != nil, typeS)
	set(v.N != nil, typeN)
	set(v.B != nil, typeB)
	set(v.BOOL != nil, typeBOOL)
	set(v.NULL != nil, typeNULL)
	set(v.M != nil, typeM)
	set(v.L != nil, typeL)
	set(v.SS != nil, typeSS)
	set(v.NS != nil, typeNS)
	set(v.BS != nil, typeBS)
	if n != 1 {
		return ""
	}
	return k
}

func strVal(s string) *Value { return &Value{S: &s} }
func numVal(n string) *Value { return &Value{N: &n} }
func boolVal(b bool) *Value  { return &Value{BOOL: &b} }

// check validates v as DynamoDB does on input, and normalizes its numbers
// in place (the caller owns v: it was just decoded). depth counts nesting.
func (v *Value) check(depth int) *apiError {
	if depth > maxDepth {
		return validation("Nesting Levels have exceeded supported limits")
	}
	switch v.kind() {
	case "":
		if v == nil || (v.S == nil && v.N == nil && v.B == nil && v.BOOL == nil && v.NULL == nil && v.M == nil && v.L == nil && v.SS == nil && v.NS == nil && v.BS == nil) {
			return validation("Supplied AttributeValue is empty, must contain exactly one of the supported datatypes")
		}
		return validation("Supplied AttributeValue has more than one datatypes set, must contain exactly one of the supported datatypes")
	case typeN:
		d, err := parseNumber(*v.N)
		if err != nil {
			return err
		}
		s := d.String()
		v.N = &s
	case typeNULL:
		if !*v.NULL {
			return validation("One or more parameter values were invalid: Null attribute value types must have the value of true")
		}
	case typeM:
		for _, e := range *v.M {
			if err := e.check(depth + 1); err != nil {
				return err
			}
		}
	case typeL:
		for _, e := range *v.L {
			if err := e.check(depth + 1); err != nil {
				return err
			}
		}
	case typeSS:
		if len(v.SS) == 0 {
			return validation("One or more parameter values were invalid: An string set  may not be empty")
		}
		if dup := firstDup(v.SS); dup {
			return validation("One or more parameter values were invalid: Input collection %s contains duplicates.", listText(v.SS))
		}
	case typeNS:
		if len(v.NS) == 0 {
			return validation("One or more parameter values were invalid: An number set  may not be empty")
		}
		out := make([]string, len(v.NS))
		for i, n := range v.NS {
			d, err := parseNumber(n)
			if err != nil {
				return err
			}
			out[i] = d.String()
		}
		if firstDup(out) {
			return validation("One or more parameter values were invalid: Input collection %s contains duplicates.", listText(v.NS))
		}
		v.NS = out
	case typeBS:
		if len(v.BS) == 0 {
			return validation("One or more parameter values were invalid: Binary sets should not be empty")
		}
		ss := make([]string, len(v.BS))
		for i, b := range v.BS {
			ss[i] = string(b)
		}
		if firstDup(ss) {
			return validation("One or more parameter values were invalid: Input collection contains duplicates.")
		}
	}
	return nil
}

func firstDup(ss []string) bool {
	seen := make(map[string]struct{}, len(ss))
	for _, s := range ss {
		if _, ok := seen[s]; ok {
			return true
		}
		seen[s] = struct{}{}
	}
	return false
}

func listText(ss []string) string { return "[" + strings.Join(ss, ", ") + "]" }

// checkItem validates every value of it (see Value.check).
func checkItem(it Item) *apiError {
	for _, v := range it {
		if err := v.check(1); err != nil {
			return err
		}
	}
	return nil
}

// size is v's size in bytes as DynamoDB counts it.
func (v *Value) size() int {
	switch v.kind() {
	case typeS:
		return len(*v.S)
	case typeN:
		return numberSize(*v.N)
	case typeB:
		return len(*v.B)
	case typeBOOL, typeNULL:
		return 1
	case typeM:
		n := 3
		for k, e := range *v.M {
			n += len(k) + e.size() + 1
		}
		return n
	case typeL:
		n := 3
		for _, e := range *v.L {
			n += e.size() + 1
		}
		return n
	case typeSS:
		n := 0
		for _, s := range v.SS {
			n += len(s)
		}
		return n
	case typeNS:
		n := 0
		for _, s := range v.NS {
			n += numberSize(s)
		}
		return n
	case typeBS:
		n := 0
		for _, b := range v.BS {
			n += len(b)
		}
		return n
	}
	return 0
}

// itemSize is an item's size: names and values.
func itemSize(it Item) int {
	n := 0
	for k, v := range it {
		n += len(k) + v.size()
	}
	return n
}

// equal reports deep equality (sets compare as sets).
func equal(a, b *Value) bool {
	ka := a.kind()
	if ka != b.kind() {
		return false
	}
	switch ka {
	case typeS:
		return *a.S == *b.S
	case typeN:
		return cmpNumber(*a.N, *b.N) == 0
	case typeB:
		return bytes.Equal(*a.B, *b.B)
	case typeBOOL:
		return *a.BOOL == *b.BOOL
	case typeNULL:
		return true
	case typeM:
		if len(*a.M) != len(*b.M) {
			return false
		}
		for k, x := range *a.M {
			y, ok := (*b.M)[k]
			if !ok || !equal(x, y) {
				return false
			}
		}
		return true
	case typeL:
		return slices.EqualFunc(*a.L, *b.L, equal)
	case typeSS:
		return sameSet(a.SS, b.SS)
	case typeNS:
		return sameSet(a.NS, b.NS) // normalized on input
	case typeBS:
		return sameSet(bytesToStrings(a.BS), bytesToStrings(b.BS))
	}
	return false
}

func sameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	m := make(map[string]struct{}, len(a))
	for _, s := range a {
		m[s] = struct{}{}
	}
	for _, s := range b {
		if _, ok := m[s]; !ok {
			return false
		}
	}
	return true
}

func bytesToStrings(bs [][]byte) []string {
	out := make([]string, len(bs))
	for i, b := range bs {
		out[i] = string(b)
	}
	return out
}

// cmpNumber compares two canonical numbers.
func cmpNumber(a, b string) int {
	if a == b {
		return 0
	}
	da, _ := parseNumber(a)
	db, _ := parseNumber(b)
	return cmpDecimal(da, db)
}

// compare orders two scalars of one type (S by UTF-8 bytes, N by value, B
// by unsigned bytes); ok is false for other types or differing ones.
func compare(a, b *Value) (int, bool) {
	ka := a.kind()
	if ka != b.kind() {
		return 0, false
	}
	switch ka {
	case typeS:
		return strings.Compare(*a.S, *b.S), true
	case typeN:
		return cmpNumber(*a.N, *b.N), true
	case typeB:
		return bytes.Compare(*a.B, *b.B), true
	}
	return 0, false
}

// keyBytes is a scalar key value's bytes (S, N canonical, B).
func keyBytes(v *Value) []byte {
	switch v.kind() {
	case typeS:
		return []byte(*v.S)
	case typeN:
		return []byte(*v.N)
	case typeB:
		return *v.B
	}
	return nil
}

// encodeKey encodes scalar key values into one string that is unique per
// combination of values (type, length and bytes of each).
func encodeKey(vs ...*Value) string {
	var b []byte
	for _, v := range vs {
		if v == nil {
			b = append(b, 0)
			continue
		}
		kb := keyBytes(v)
		b = append(b, v.kind()[0])
		b = binary.AppendUvarint(b, uint64(len(kb)))
		b = append(b, kb...)
	}
	return string(b)
}

// copyValue copies v's structure (maps and lists), sharing its immutable
// strings and bytes.
func copyValue(v *Value) *Value {
	switch v.kind() {
	case typeM:
		m := make(map[string]*Value, len(*v.M))
		for k, e := range *v.M {
			m[k] = copyValue(e)
		}
		return &Value{M: &m}
	case typeL:
		l := make([]*Value, len(*v.L))
		for i, e := range *v.L {
			l[i] = copyValue(e)
		}
		return &Value{L: &l}
	}
	c := *v
	return &c
}

// copyItem copies it's structure (see copyValue).
func copyItem(it Item) Item {
	out := make(Item, len(it))
	for k, v := range it {
		out[k] = copyValue(v)
	}
	return out
}
