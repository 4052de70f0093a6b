package badinput_test

import (
	"encoding/json"
	"io"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/internal/badinput"
)

func TestJSON_OneMessagePerKindOfError(t *testing.T) {
	var obj struct {
		Lease int `json:"lease_seconds"`
	}
	unmarshal := func(b string) error { return json.Unmarshal([]byte(b), &obj) }
	tests := []struct {
		name string
		err  error
		want string
	}{
		{name: "syntax", err: unmarshal(`{"lease_seconds" 1}`), want: `body: malformed JSON at byte 18: invalid character '1' after object key`},
		{name: "truncated", err: unmarshal(`{"lease_seconds": `), want: `body: malformed JSON at byte 18: unexpected end of JSON input`},
		{name: "a field's type", err: unmarshal(`{"lease_seconds": "60"}`), want: `lease_seconds: must be an integer, not string`},
		{name: "not an object", err: unmarshal(`[1]`), want: `body: must be a JSON object, not array`},
		{name: "a stream that ends", err: io.ErrUnexpectedEOF, want: `body: malformed JSON: unexpected end of JSON input`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := badinput.JSON(tt.err)
			var bad *badinput.Error
			require.ErrorAs(t, err, &bad)
			assert.Equal(t, tt.want, err.Error())
		})
	}
	assert.NoError(t, badinput.JSON(nil))
}

func TestCheckJSON_WellFormedOrEmptyIsNil(t *testing.T) {
	assert.NoError(t, badinput.CheckJSON(nil))
	assert.NoError(t, badinput.CheckJSON([]byte(" \n")))
	assert.NoError(t, badinput.CheckJSON([]byte(`{"a": [1, "x"]}`)))
	assert.NoError(t, badinput.CheckJSON([]byte(`[1]`)), "its shape is the route's to check")
	assert.EqualError(t, badinput.CheckJSON([]byte(`{"a": 1}}`)), `body: malformed JSON at byte 9: invalid character '}' after top-level value`)
}
