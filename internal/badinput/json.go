package badinput

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"reflect"
)

// JSON returns the bad input that err, from decoding a request body with
// encoding/json's Unmarshal, is: the one message of every route for a
// malformed body, "body: malformed JSON at byte N: <what is wrong>"; a value
// of the wrong type names its field ("lease_seconds: must be an integer,
// not string"), a body of the wrong type is "body: must be a JSON object,
// not array". nil for nil.
func JSON(err error) error {
	var (
		syn *json.SyntaxError
		typ *json.UnmarshalTypeError
	)
	switch {
	case err == nil:
		return nil
	case errors.As(err, &typ) && typ.Field != "":
		return New(typ.Field, "must be %s, not %s", jsonType(typ.Type), typ.Value)
	case errors.As(err, &typ):
		return New("body", "must be a JSON object, not %s", typ.Value)
	case errors.As(err, &syn):
		return New("body", "malformed JSON at byte %d: %s", syn.Offset, syn.Error())
	case errors.Is(err, io.ErrUnexpectedEOF):
		return New("body", "malformed JSON: unexpected end of JSON input")
	default:
		return New("body", "invalid JSON: %s", err.Error())
	}
}

// CheckJSON returns JSON's error for b when b is not well-formed JSON, and
// nil when it is or when b is empty (only white space: whether a route takes
// no body is the route's to say). It reads b once and allocates nothing when
// b is well-formed.
func CheckJSON(b []byte) error {
	if len(bytes.TrimSpace(b)) == 0 || json.Valid(b) {
		return nil
	}
	return JSON(json.Unmarshal(b, new(json.RawMessage)))
}

// jsonType names a Go type as a JSON type.
func jsonType(t reflect.Type) string {
	if t == nil {
		return "a JSON value"
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Map, reflect.Struct:
		return "an object"
	case reflect.Slice, reflect.Array:
		return "an array"
	default:
		return t.Kind().String()
	}
}
