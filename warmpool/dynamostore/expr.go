package dynamostore

import (
	"strconv"
	"strings"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// expr collects the placeholders of one request's expressions. Every
// attribute name goes through a placeholder, so none collides with a
// reserved word (state, owner, ttl, ...).
type expr struct {
	names  map[string]string
	values map[string]types.AttributeValue
	set    []string
	remove []string
	add    []string
}

func newExpr() *expr {
	return &expr{names: map[string]string{}, values: map[string]types.AttributeValue{}}
}

// n returns the placeholder of attribute name (names in this package are
// letters and underscores only).
func (e *expr) n(name string) string {
	p := "#" + name
	e.names[p] = name
	return p
}

// v returns a new placeholder for value v.
func (e *expr) v(v types.AttributeValue) string {
	p := ":v" + strconv.Itoa(len(e.values))
	e.values[p] = v
	return p
}

// Set adds "name = value" to the update's SET clause.
func (e *expr) Set(name string, v types.AttributeValue) {
	e.set = append(e.set, e.n(name)+" = "+e.v(v))
}

// Remove adds name to the update's REMOVE clause.
func (e *expr) Remove(names ...string) {
	for _, name := range names {
		e.remove = append(e.remove, e.n(name))
	}
}

// Add adds "name value" to the update's ADD clause (numbers: increment).
func (e *expr) Add(name string, v types.AttributeValue) {
	e.add = append(e.add, e.n(name)+" "+e.v(v))
}

// update returns the update expression of the SET, REMOVE and ADD calls.
func (e *expr) update() *string {
	var parts []string
	if len(e.set) > 0 {
		parts = append(parts, "SET "+strings.Join(e.set, ", "))
	}
	if len(e.remove) > 0 {
		parts = append(parts, "REMOVE "+strings.Join(e.remove, ", "))
	}
	if len(e.add) > 0 {
		parts = append(parts, "ADD "+strings.Join(e.add, ", "))
	}
	s := strings.Join(parts, " ")
	return &s
}

// Names and Values return the maps for the request (nil when empty, which
// DynamoDB requires).
func (e *expr) Names() map[string]string {
	if len(e.names) == 0 {
		return nil
	}
	return e.names
}

func (e *expr) Values() map[string]types.AttributeValue {
	if len(e.values) == 0 {
		return nil
	}
	return e.values
}

func ptr(s string) *string { return &s }
