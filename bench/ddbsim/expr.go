package ddbsim

import (
	_ "embed"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Expression kinds, as DynamoDB names them in its messages.
const (
	kindCondition  = "ConditionExpression"
	kindFilter     = "FilterExpression"
	kindKey        = "KeyConditionExpression"
	kindUpdate     = "UpdateExpression"
	kindProjection = "ProjectionExpression"
)

// Expression limits: 4 KB of text, 100 operands of IN, 300 operators and
// functions.
const (
	maxExprLen   = 4096
	maxInOperand = 100
	maxOperators = 300
)

//go:embed reserved_words.txt
var reservedText string

// reserved holds DynamoDB's reserved words (upper case): an attribute name
// that is one must go through a #placeholder.
var reserved = func() map[string]bool {
	m := map[string]bool{}
	for _, w := range strings.Fields(reservedText) {
		m[strings.ToUpper(w)] = true
	}
	return m
}()

// --- lexer ---

type tokKind int

const (
	tEOF tokKind = iota
	tIdent
	tName  // #name
	tValue // :value
	tNum   // a list index
	tPunct
)

type token struct {
	kind     tokKind
	text     string
	from, to int
}

func isIdentStart(c byte) bool { return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }
func isIdentChar(c byte) bool  { return isIdentStart(c) || c >= '0' && c <= '9' }

// lex splits src into tokens; a character no token starts with is a
// syntax error at that character.
func lex(kind, src string) ([]token, *apiError) {
	var toks []token
	for i := 0; i < len(src); {
		c := src[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
			continue
		case c == '#' || c == ':':
			j := i + 1
			for j < len(src) && isIdentChar(src[j]) {
				j++
			}
			if j == i+1 {
				return nil, syntaxErr(kind, src, toks, token{kind: tPunct, text: src[i : i+1], from: i, to: i + 1})
			}
			k := tName
			if c == ':' {
				k = tValue
			}
			toks = append(toks, token{kind: k, text: src[i:j], from: i, to: j})
			i = j
		case isIdentStart(c):
			j := i + 1
			for j < len(src) && isIdentChar(src[j]) {
				j++
			}
			toks = append(toks, token{kind: tIdent, text: src[i:j], from: i, to: j})
			i = j
		case c >= '0' && c <= '9':
			j := i + 1
			for j < len(src) && src[j] >= '0' && src[j] <= '9' {
				j++
			}
			toks = append(toks, token{kind: tNum, text: src[i:j], from: i, to: j})
			i = j
		case c == '<' && i+1 < len(src) && (src[i+1] == '=' || src[i+1] == '>'),
			c == '>' && i+1 < len(src) && src[i+1] == '=':
			toks = append(toks, token{kind: tPunct, text: src[i : i+2], from: i, to: i + 2})
			i += 2
		case strings.IndexByte("()[],.=<>+-", c) >= 0:
			toks = append(toks, token{kind: tPunct, text: src[i : i+1], from: i, to: i + 1})
			i++
		default:
			return nil, syntaxErr(kind, src, toks, token{kind: tPunct, text: src[i : i+1], from: i, to: i + 1})
		}
	}
	return append(toks, token{kind: tEOF, text: "<EOF>", from: len(src), to: len(src)}), nil
}

// syntaxErr is DynamoDB's syntax error: the offending token and the text
// near it (the token before it, and it).
func syntaxErr(kind, src string, before []token, at token) *apiError {
	from := at.from
	if len(before) > 0 {
		from = before[len(before)-1].from
		if at.kind == tEOF && len(before) > 1 {
			from = before[len(before)-2].from
		}
	}
	near := strings.TrimSpace(src[from:at.to])
	return validation("Invalid %s: Syntax error; token: %q, near: %q", kind, at.text, near)
}

// --- AST ---

// pathElem is one step of a document path: a name, or a list index.
type pathElem struct {
	name    string
	index   int
	isIndex bool
}

// docPath is a document path: a top-level name, then names and indexes.
type docPath []pathElem

func (p docPath) String() string {
	parts := make([]string, len(p))
	for i, e := range p {
		if e.isIndex {
			parts[i] = "[" + strconv.Itoa(e.index) + "]"
		} else {
			parts[i] = e.name
		}
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// overlaps reports whether one of p and q is a prefix of the other.
func (p docPath) overlaps(q docPath) bool {
	n := min(len(p), len(q))
	for i := range n {
		if p[i] != q[i] {
			return false
		}
	}
	return true
}

type operandKind int

const (
	oPath operandKind = iota
	oValue
	oSize
	oIfNotExists
	oListAppend
	oPlus
	oMinus
)

// operand is a value in an expression: a path, a :value, or a function or
// arithmetic over operands.
type operand struct {
	kind operandKind
	path docPath
	val  *Value
	name string // the :value's placeholder, for messages
	args []*operand
}

type condKind int

const (
	cAnd condKind = iota
	cOr
	cNot
	cCompare
	cBetween
	cIn
	cExists
	cNotExists
	cType
	cBeginsWith
	cContains
)

// cond is a condition: a comparison, a function, or AND/OR/NOT of
// conditions.
type cond struct {
	kind condKind
	op   string // the comparator of cCompare
	subs []*cond
	args []*operand
}

// exprContext resolves one request's placeholders and records which were
// used: DynamoDB refuses undefined and unused ones alike.
type exprContext struct {
	names      map[string]string
	values     map[string]*Value
	usedNames  map[string]bool
	usedValues map[string]bool
	any        bool // some expression was parsed
}

func newExprContext(names map[string]string, values map[string]*Value) *exprContext {
	return &exprContext{names: names, values: values, usedNames: map[string]bool{}, usedValues: map[string]bool{}}
}

// checkInputs validates the placeholder maps themselves (before parsing).
func (x *exprContext) checkInputs() *apiError {
	if x.names != nil && len(x.names) == 0 {
		return validation("ExpressionAttributeNames must not be empty")
	}
	if x.values != nil && len(x.values) == 0 {
		return validation("ExpressionAttributeValues must not be empty")
	}
	for k := range x.names {
		if len(k) < 2 || k[0] != '#' || !allIdentChars(k[1:]) {
			return validation("ExpressionAttributeNames contains invalid key: Syntax error; key: %q", k)
		}
	}
	for k, v := range x.values {
		if len(k) < 2 || k[0] != ':' || !allIdentChars(k[1:]) {
			return validation("ExpressionAttributeValues contains invalid key: Syntax error; key: %q", k)
		}
		if err := v.check(1); err != nil {
			return validation("ExpressionAttributeValues contains invalid value: %s for key %s", err.message, k)
		}
	}
	return nil
}

func allIdentChars(s string) bool {
	for i := 0; i < len(s); i++ {
		if !isIdentChar(s[i]) {
			return false
		}
	}
	return true
}

// checkUnused refuses placeholders no expression used (after every
// expression of the request was parsed).
func (x *exprContext) checkUnused() *apiError {
	if !x.any {
		if x.names != nil {
			return validation("ExpressionAttributeNames can only be specified when using expressions")
		}
		if x.values != nil {
			return validation("ExpressionAttributeValues can only be specified when using expressions")
		}
		return nil
	}
	var unused []string
	for k := range x.names {
		if !x.usedNames[k] {
			unused = append(unused, k)
		}
	}
	if len(unused) > 0 {
		slices.Sort(unused)
		return validation("Value provided in ExpressionAttributeNames unused in expressions: keys: {%s}", strings.Join(unused, ", "))
	}
	for k := range x.values {
		if !x.usedValues[k] {
			unused = append(unused, k)
		}
	}
	if len(unused) > 0 {
		slices.Sort(unused)
		return validation("Value provided in ExpressionAttributeValues unused in expressions: keys: {%s}", strings.Join(unused, ", "))
	}
	return nil
}

// --- parser ---

type parser struct {
	kind string
	src  string
	toks []token
	pos  int
	x    *exprContext
	ops  int
}

func newParser(x *exprContext, kind, src string) (*parser, *apiError) {
	if len(src) > maxExprLen {
		return nil, validation("Invalid %s: Expression size has exceeded the maximum allowed size; expression size: %d", kind, len(src))
	}
	if strings.TrimSpace(src) == "" {
		return nil, validation("Invalid %s: The expression can not be empty;", kind)
	}
	toks, err := lex(kind, src)
	if err != nil {
		return nil, err
	}
	x.any = true
	return &parser{kind: kind, src: src, toks: toks, x: x}, nil
}

func (p *parser) peek() token { return p.toks[p.pos] }
func (p *parser) next() token {
	t := p.toks[p.pos]
	if t.kind != tEOF {
		p.pos++
	}
	return t
}

func (p *parser) errAt(t token) *apiError { return syntaxErr(p.kind, p.src, p.toks[:p.tokIndex(t)], t) }

func (p *parser) tokIndex(t token) int {
	for i, u := range p.toks {
		if u.from == t.from && u.kind == t.kind {
			return i
		}
	}
	return len(p.toks) - 1
}

func (p *parser) isPunct(s string) bool { t := p.peek(); return t.kind == tPunct && t.text == s }
func (p *parser) isKeyword(s string) bool {
	t := p.peek()
	return t.kind == tIdent && strings.EqualFold(t.text, s)
}

func (p *parser) expectPunct(s string) *apiError {
	if !p.isPunct(s) {
		return p.errAt(p.peek())
	}
	p.next()
	return nil
}

func (p *parser) expectEOF() *apiError {
	if t := p.peek(); t.kind != tEOF {
		return p.errAt(t)
	}
	return nil
}

func (p *parser) countOp() *apiError {
	if p.ops++; p.ops > maxOperators {
		return validation("Invalid %s: The expression contains too many operators; operator count: %d", p.kind, p.ops)
	}
	return nil
}

// path parses a document path.
func (p *parser) path() (docPath, *apiError) {
	first, err := p.pathName()
	if err != nil {
		return nil, err
	}
	path := docPath{{name: first}}
	for {
		switch {
		case p.isPunct("."):
			p.next()
			name, err := p.pathName()
			if err != nil {
				return nil, err
			}
			path = append(path, pathElem{name: name})
		case p.isPunct("["):
			p.next()
			t := p.next()
			if t.kind != tNum {
				return nil, p.errAt(t)
			}
			i, convErr := strconv.Atoi(t.text)
			if convErr != nil {
				return nil, p.errAt(t)
			}
			if err := p.expectPunct("]"); err != nil {
				return nil, err
			}
			path = append(path, pathElem{index: i, isIndex: true})
		default:
			if len(path) > maxDepth {
				return nil, validation("Invalid %s: The document path has too many nesting levels; nesting levels: %d", p.kind, len(path))
			}
			return path, nil
		}
	}
}

// pathName parses one name of a path: an identifier that is no reserved
// word, or a #placeholder.
func (p *parser) pathName() (string, *apiError) {
	t := p.next()
	switch t.kind {
	case tName:
		v, ok := p.x.names[t.text]
		if !ok {
			return "", validation("Invalid %s: An expression attribute name used in the document path is not defined; attribute name: %s", p.kind, t.text)
		}
		p.x.usedNames[t.text] = true
		return v, nil
	case tIdent:
		if reserved[strings.ToUpper(t.text)] {
			return "", validation("Invalid %s: Attribute name is a reserved keyword; reserved keyword: %s", p.kind, t.text)
		}
		return t.text, nil
	}
	return "", p.errAt(t)
}

// value resolves a :value placeholder.
func (p *parser) value() (*operand, *apiError) {
	t := p.next()
	if t.kind != tValue {
		return nil, p.errAt(t)
	}
	v, ok := p.x.values[t.text]
	if !ok {
		return nil, validation("Invalid %s: An expression attribute value used in expression is not defined; attribute value: %s", p.kind, t.text)
	}
	p.x.usedValues[t.text] = true
	return &operand{kind: oValue, val: v, name: t.text}, nil
}

// isCall reports whether the next tokens are a function call.
func (p *parser) isCall() bool {
	return p.peek().kind == tIdent && p.pos+1 < len(p.toks) && p.toks[p.pos+1].kind == tPunct && p.toks[p.pos+1].text == "("
}

// args parses a call's parenthesized arguments with arg.
func (p *parser) args(fn string, arg func() (*operand, *apiError)) ([]*operand, *apiError) {
	if err := p.expectPunct("("); err != nil {
		return nil, err
	}
	var out []*operand
	for {
		a, err := arg()
		if err != nil {
			return nil, err
		}
		out = append(out, a)
		if p.isPunct(",") {
			p.next()
			continue
		}
		if err := p.expectPunct(")"); err != nil {
			return nil, err
		}
		return out, nil
	}
}

func (p *parser) arity(fn string, args []*operand, n int) *apiError {
	if len(args) != n {
		return validation("Invalid %s: Incorrect number of operands for operator or function; operator or function: %s, number of operands: %d", p.kind, fn, len(args))
	}
	return nil
}

// --- conditions ---

// parseCondition parses a condition expression (also filters and key
// conditions, which key.go checks further).
func parseCondition(x *exprContext, kind, src string) (*cond, *apiError) {
	p, err := newParser(x, kind, src)
	if err != nil {
		return nil, err
	}
	c, err := p.or()
	if err != nil {
		return nil, err
	}
	if err := p.expectEOF(); err != nil {
		return nil, err
	}
	return c, nil
}

func (p *parser) or() (*cond, *apiError)  { return p.binary("OR", cOr, p.and) }
func (p *parser) and() (*cond, *apiError) { return p.binary("AND", cAnd, p.not) }

// binary parses operands (of the next tighter level) joined by keyword,
// left to right.
func (p *parser) binary(keyword string, k condKind, operand func() (*cond, *apiError)) (*cond, *apiError) {
	left, err := operand()
	if err != nil {
		return nil, err
	}
	for p.isKeyword(keyword) {
		p.next()
		if err := p.countOp(); err != nil {
			return nil, err
		}
		right, err := operand()
		if err != nil {
			return nil, err
		}
		left = &cond{kind: k, subs: []*cond{left, right}}
	}
	return left, nil
}

func (p *parser) not() (*cond, *apiError) {
	if p.isKeyword("NOT") {
		p.next()
		if err := p.countOp(); err != nil {
			return nil, err
		}
		c, err := p.not()
		if err != nil {
			return nil, err
		}
		return &cond{kind: cNot, subs: []*cond{c}}, nil
	}
	return p.primary()
}

// condFuncs are the functions that are conditions by themselves.
var condFuncs = map[string]condKind{
	"attribute_exists": cExists, "attribute_not_exists": cNotExists, "attribute_type": cType,
	"begins_with": cBeginsWith, "contains": cContains,
}

func (p *parser) primary() (*cond, *apiError) {
	if p.isPunct("(") {
		p.next()
		c, err := p.or()
		if err != nil {
			return nil, err
		}
		if err := p.expectPunct(")"); err != nil {
			return nil, err
		}
		return c, nil
	}
	if p.isCall() {
		name := p.peek().text
		if k, ok := condFuncs[name]; ok {
			p.next()
			return p.condFunc(name, k)
		}
	}
	left, err := p.condOperand()
	if err != nil {
		return nil, err
	}
	t := p.peek()
	switch {
	case t.kind == tPunct && slices.Contains([]string{"=", "<>", "<", "<=", ">", ">="}, t.text):
		p.next()
		right, err := p.condOperand()
		if err != nil {
			return nil, err
		}
		if err := p.countOp(); err != nil {
			return nil, err
		}
		c := &cond{kind: cCompare, op: t.text, args: []*operand{left, right}}
		if t.text != "=" && t.text != "<>" {
			if err := p.orderable(t.text, left, right); err != nil {
				return nil, err
			}
		}
		return c, nil
	case p.isKeyword("BETWEEN"):
		p.next()
		lo, err := p.condOperand()
		if err != nil {
			return nil, err
		}
		if !p.isKeyword("AND") {
			return nil, p.errAt(p.peek())
		}
		p.next()
		hi, err := p.condOperand()
		if err != nil {
			return nil, err
		}
		if err := p.countOp(); err != nil {
			return nil, err
		}
		if err := p.orderable("BETWEEN", left, lo, hi); err != nil {
			return nil, err
		}
		if lo.kind == oValue && hi.kind == oValue {
			if c, ok := compare(lo.val, hi.val); ok && c > 0 {
				return nil, validation("Invalid %s: The BETWEEN operator requires upper bound to be greater than or equal to lower bound; lower bound operand: AttributeValue: {%s:%s}, upper bound operand: AttributeValue: {%s:%s}",
					p.kind, lo.val.kind(), scalarText(lo.val), hi.val.kind(), scalarText(hi.val))
			}
		}
		return &cond{kind: cBetween, args: []*operand{left, lo, hi}}, nil
	case p.isKeyword("IN"):
		p.next()
		list, err := p.args("IN", p.condOperand)
		if err != nil {
			return nil, err
		}
		if len(list) > maxInOperand {
			return nil, validation("Invalid %s: The IN operator is provided with too many operands; number of operands: %d", p.kind, len(list))
		}
		if err := p.countOp(); err != nil {
			return nil, err
		}
		return &cond{kind: cIn, args: append([]*operand{left}, list...)}, nil
	}
	return nil, p.errAt(t)
}

// condOperand parses an operand of a condition: a path, a :value or
// size(path).
func (p *parser) condOperand() (*operand, *apiError) {
	t := p.peek()
	switch {
	case t.kind == tValue:
		return p.value()
	case p.isCall():
		p.next()
		switch t.text {
		case "size":
			args, err := p.args("size", p.condOperand)
			if err != nil {
				return nil, err
			}
			if err := p.arity("size", args, 1); err != nil {
				return nil, err
			}
			if args[0].kind != oPath {
				return nil, p.operandType("size", args[0])
			}
			if err := p.countOp(); err != nil {
				return nil, err
			}
			return &operand{kind: oSize, args: args}, nil
		case "attribute_exists", "attribute_not_exists", "attribute_type", "begins_with", "contains":
			return nil, validation("Invalid %s: The function is not allowed to be used this way in an expression; function: %s", p.kind, t.text)
		case "if_not_exists", "list_append":
			return nil, validation("Invalid %s: The function is not allowed to be used in this type of expression; function: %s", p.kind, t.text)
		}
		return nil, validation("Invalid %s: Invalid function name; function: %s", p.kind, t.text)
	case t.kind == tIdent || t.kind == tName:
		path, err := p.path()
		if err != nil {
			return nil, err
		}
		return &operand{kind: oPath, path: path}, nil
	}
	return nil, p.errAt(p.next())
}

// condFunc parses the arguments of a function that is a condition.
func (p *parser) condFunc(name string, k condKind) (*cond, *apiError) {
	args, err := p.args(name, p.condOperand)
	if err != nil {
		return nil, err
	}
	if err := p.countOp(); err != nil {
		return nil, err
	}
	n := 2
	if k == cExists || k == cNotExists {
		n = 1
	}
	if err := p.arity(name, args, n); err != nil {
		return nil, err
	}
	switch k {
	case cExists, cNotExists, cType:
		if args[0].kind != oPath {
			return nil, p.operandType(name, args[0])
		}
	}
	switch k {
	case cType:
		t := args[1]
		if t.kind != oValue || t.val.kind() != typeS {
			return nil, p.operandType(name, t)
		}
		if !slices.Contains(attrTypes, *t.val.S) {
			return nil, validation("Invalid %s: Invalid attribute type name found; type: %s, valid types: {B,NULL,SS,BOOL,L,BS,N,NS,S,M}", p.kind, *t.val.S)
		}
	case cBeginsWith:
		if t := args[1]; t.kind == oValue && t.val.kind() != typeS && t.val.kind() != typeB {
			return nil, p.operandType(name, t)
		}
	}
	return &cond{kind: k, args: args}, nil
}

var attrTypes = []string{typeS, typeSS, typeN, typeNS, typeB, typeBS, typeBOOL, typeNULL, typeL, typeM}

// orderable refuses :values that no order applies to (<, BETWEEN: only
// numbers, strings and binary).
func (p *parser) orderable(op string, ops ...*operand) *apiError {
	for _, o := range ops {
		if o.kind != oValue {
			continue
		}
		switch o.val.kind() {
		case typeN, typeS, typeB:
		default:
			return p.operandType(op, o)
		}
	}
	return nil
}

func (p *parser) operandType(fn string, o *operand) *apiError {
	t := "path"
	if o.kind == oValue {
		t = o.val.kind()
	} else if o.kind != oPath {
		t = "function"
	}
	return validation("Invalid %s: Incorrect operand type for operator or function; operator or function: %s, operand type: %s", p.kind, fn, t)
}

func scalarText(v *Value) string {
	switch v.kind() {
	case typeS:
		return *v.S
	case typeN:
		return *v.N
	case typeB:
		return fmt.Sprintf("%x", *v.B)
	}
	return ""
}

// --- projections ---

// parseProjection parses a ProjectionExpression: paths, none overlapping.
func parseProjection(x *exprContext, src string) ([]docPath, *apiError) {
	p, err := newParser(x, kindProjection, src)
	if err != nil {
		return nil, err
	}
	var paths []docPath
	for {
		path, err := p.path()
		if err != nil {
			return nil, err
		}
		paths = append(paths, path)
		if !p.isPunct(",") {
			break
		}
		p.next()
	}
	if err := p.expectEOF(); err != nil {
		return nil, err
	}
	if err := checkOverlap(kindProjection, paths); err != nil {
		return nil, err
	}
	return paths, nil
}

func checkOverlap(kind string, paths []docPath) *apiError {
	for i := range paths {
		for j := i + 1; j < len(paths); j++ {
			if paths[i].overlaps(paths[j]) {
				return validation("Invalid %s: Two document paths overlap with each other; must remove or rewrite one of these paths; path one: %s, path two: %s",
					kind, paths[i], paths[j])
			}
		}
	}
	return nil
}

// --- updates ---

// setAction is one SET: path = value (an operand, or operand ± operand).
type setAction struct {
	path docPath
	val  *operand
}

// addAction is one ADD or DELETE: path and a :value.
type addAction struct {
	path docPath
	val  *operand
}

// update is a parsed UpdateExpression.
type update struct {
	sets    []setAction
	removes []docPath
	adds    []addAction
	deletes []addAction
}

// paths returns every path the update writes.
func (u *update) paths() []docPath {
	var out []docPath
	for _, s := range u.sets {
		out = append(out, s.path)
	}
	out = append(out, u.removes...)
	for _, a := range u.adds {
		out = append(out, a.path)
	}
	for _, d := range u.deletes {
		out = append(out, d.path)
	}
	return out
}

// parseUpdate parses an UpdateExpression: SET, REMOVE, ADD and DELETE
// clauses, each at most once, in any order.
func parseUpdate(x *exprContext, src string) (*update, *apiError) {
	p, err := newParser(x, kindUpdate, src)
	if err != nil {
		return nil, err
	}
	u := &update{}
	seen := map[string]bool{}
	for p.peek().kind != tEOF {
		t := p.next()
		clause := strings.ToUpper(t.text)
		if t.kind != tIdent || !slices.Contains([]string{"SET", "REMOVE", "ADD", "DELETE"}, clause) {
			return nil, p.errAt(t)
		}
		if seen[clause] {
			return nil, validation("Invalid UpdateExpression: The %q section can only be used once in an update expression;", clause)
		}
		seen[clause] = true
		for {
			if err := p.updateAction(u, clause); err != nil {
				return nil, err
			}
			if !p.isPunct(",") {
				break
			}
			p.next()
		}
	}
	if len(seen) == 0 {
		return nil, p.errAt(p.peek())
	}
	if err := checkOverlap(kindUpdate, u.paths()); err != nil {
		return nil, err
	}
	return u, nil
}

func (p *parser) updateAction(u *update, clause string) *apiError {
	path, err := p.path()
	if err != nil {
		return err
	}
	if err := p.countOp(); err != nil {
		return err
	}
	switch clause {
	case "SET":
		if err := p.expectPunct("="); err != nil {
			return err
		}
		v, err := p.setValue()
		if err != nil {
			return err
		}
		u.sets = append(u.sets, setAction{path: path, val: v})
	case "REMOVE":
		u.removes = append(u.removes, path)
	case "ADD", "DELETE":
		if p.peek().kind != tValue {
			return p.errAt(p.peek())
		}
		v, err := p.value()
		if err != nil {
			return err
		}
		k := v.val.kind()
		if clause == "ADD" && k != typeN && k != typeSS && k != typeNS && k != typeBS ||
			clause == "DELETE" && k != typeSS && k != typeNS && k != typeBS {
			return validation("Invalid UpdateExpression: Incorrect operand type for operator or function; operator: %s, operand type: %s", clause, longType(k))
		}
		if clause == "ADD" {
			u.adds = append(u.adds, addAction{path: path, val: v})
		} else {
			u.deletes = append(u.deletes, addAction{path: path, val: v})
		}
	}
	return nil
}

// longType is the type name DynamoDB uses in ADD and DELETE messages.
func longType(k string) string {
	switch k {
	case typeS:
		return "STRING"
	case typeN:
		return "NUMBER"
	case typeB:
		return "BINARY"
	case typeBOOL:
		return "BOOLEAN"
	case typeM:
		return "MAP"
	case typeL:
		return "LIST"
	}
	return k
}

// setValue parses a SET's right side: an operand, or two joined by + or -.
func (p *parser) setValue() (*operand, *apiError) {
	left, err := p.setOperand()
	if err != nil {
		return nil, err
	}
	if p.isPunct("+") || p.isPunct("-") {
		op := p.next().text
		if err := p.countOp(); err != nil {
			return nil, err
		}
		right, err := p.setOperand()
		if err != nil {
			return nil, err
		}
		k := oPlus
		if op == "-" {
			k = oMinus
		}
		return &operand{kind: k, args: []*operand{left, right}}, nil
	}
	return left, nil
}

// setOperand parses an operand of a SET: a path, a :value, if_not_exists
// or list_append.
func (p *parser) setOperand() (*operand, *apiError) {
	t := p.peek()
	switch {
	case t.kind == tValue:
		return p.value()
	case p.isCall():
		p.next()
		if err := p.countOp(); err != nil {
			return nil, err
		}
		switch t.text {
		case "if_not_exists", "list_append":
			args, err := p.args(t.text, p.setOperand)
			if err != nil {
				return nil, err
			}
			if err := p.arity(t.text, args, 2); err != nil {
				return nil, err
			}
			if t.text == "if_not_exists" {
				if args[0].kind != oPath {
					return nil, p.operandType(t.text, args[0])
				}
				return &operand{kind: oIfNotExists, args: args}, nil
			}
			for _, a := range args {
				if a.kind == oValue && a.val.kind() != typeL {
					return nil, p.operandType(t.text, a)
				}
			}
			return &operand{kind: oListAppend, args: args}, nil
		case "attribute_exists", "attribute_not_exists", "attribute_type", "begins_with", "contains", "size":
			return nil, validation("Invalid UpdateExpression: The function is not allowed in an update expression; function: %s", t.text)
		}
		return nil, validation("Invalid UpdateExpression: Invalid function name; function: %s", t.text)
	case t.kind == tIdent || t.kind == tName:
		path, err := p.path()
		if err != nil {
			return nil, err
		}
		return &operand{kind: oPath, path: path}, nil
	}
	return nil, p.errAt(p.next())
}
