package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"regexp"
	"strconv"
	"strings"
)

// MiB is a size in mebibytes. In JSON it is a number (MiB) or a string
// with a binary unit: "512Mi", "2Gi", "1Ti", "512m", "1g", "512M", "2G",
// "512MiB", "2GiB", or "1024" (UnmarshalMiB).
type MiB int

// UnmarshalJSON accepts what UnmarshalMiB accepts. Its error is a
// *json.UnmarshalTypeError, which the decoder completes with the field's
// name.
func (m *MiB) UnmarshalJSON(data []byte) error {
	v, err := UnmarshalMiB("size", data)
	if err != nil {
		return &json.UnmarshalTypeError{Value: fmt.Sprintf("%s (a size is a number of MiB, or a string such as \"512Mi\" or \"2Gi\")", data),
			Type: reflect.TypeFor[MiB]()}
	}
	*m = MiB(v)
	return nil
}

var sizePattern = regexp.MustCompile(`^([0-9]+)\s*([A-Za-z]*)$`)

// UnmarshalMiB parses a JSON size as MiB documents: a whole, non-negative
// number of MiB, or a string with a binary unit. field names the field in
// its errors, which say what is accepted. The pools file (warmpool) and the
// API's requests read sizes with it.
func UnmarshalMiB(field string, data []byte) (int, error) {
	data = bytes.TrimSpace(data)
	if len(data) > 0 && data[0] == '"' {
		var s string
		if err := json.Unmarshal(data, &s); err != nil {
			return 0, fmt.Errorf("%s: %w", field, err)
		}
		return ParseMiB(field, s)
	}
	n, err := strconv.ParseInt(string(data), 10, 64)
	if err != nil || n < 0 || n > math.MaxInt32 {
		return 0, fmt.Errorf("%s: %s is not a whole, non-negative number of MiB (or a string such as \"512Mi\", \"2Gi\")", field, data)
	}
	return int(n), nil
}

// ParseMiB parses a size string ("512Mi", "2Gi", "1024"; see MiB); field
// names the field in its errors.
func ParseMiB(field, s string) (int, error) {
	bad := fmt.Errorf("%s: %q is not a size; use MiB as a number or a string such as \"512Mi\", \"2Gi\", \"512m\", \"1g\"", field, s)
	match := sizePattern.FindStringSubmatch(strings.TrimSpace(s))
	if match == nil {
		return 0, bad
	}
	n, err := strconv.ParseInt(match[1], 10, 64)
	if err != nil {
		return 0, bad
	}
	var mult int64
	switch match[2] {
	case "", "Mi", "MiB", "M", "m", "MB":
		mult = 1
	case "Gi", "GiB", "G", "g", "GB":
		mult = 1024
	case "Ti", "TiB", "T", "t", "TB":
		mult = 1024 * 1024
	default:
		return 0, bad
	}
	if n > math.MaxInt32/mult {
		return 0, fmt.Errorf("%s: %q is too large", field, s)
	}
	return int(n * mult), nil
}
