// Package badinput holds Quarry's one type for bad input: a request (or a
// config file) that a person can fix. Every package that validates input
// returns an *Error; internal/errclass classifies it as a 400 bad_request,
// and every API surface renders it the same way.
//
// It imports nothing from Quarry, so that every contract package can use it.
package badinput

import "fmt"

// Error is bad input that a person can fix: Field names what is wrong (a
// JSON field such as "lease_seconds" or "body.choices", a query parameter,
// a header), Message says what is wrong with it and, where it helps, what
// would be right.
type Error struct {
	Field   string
	Message string
}

func (e *Error) Error() string { return e.Field + ": " + e.Message }

// New returns an *Error for field, its message formatted from format and
// args as fmt.Sprintf does.
func New(field, format string, args ...any) error {
	return &Error{Field: field, Message: fmt.Sprintf(format, args...)}
}
