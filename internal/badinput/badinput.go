// Package badinput holds Quarry's one type for bad input: a request (or a
// config file) that a person can fix. Every package that validates input
// returns an *Error; errclass classifies it as a 400 bad_request,
// and every API surface renders it the same way. json.go reads a JSON
// body's decoding error into one (the one message for malformed JSON).
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

// Printable reports whether s is printable ASCII (spaces allowed): the
// rule for ids, header values and label values that are echoed back.
func Printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}

// Alnum reports whether b is an ASCII letter or digit.
func Alnum(b byte) bool {
	return (b >= 'a' && b <= 'z') || (b >= 'A' && b <= 'Z') || (b >= '0' && b <= '9')
}
