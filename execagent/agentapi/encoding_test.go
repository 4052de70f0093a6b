package agentapi

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestOutputEncoding_RoundTrip(t *testing.T) {
	tests := []struct {
		name     string
		encoding string
		in       []byte
		wire     string
	}{
		{"base64 keeps every byte", EncodingBase64, []byte{0, 1, 0xff}, "AAH/"},
		{"base64 of nothing", EncodingBase64, nil, ""},
		{"utf-8 is the text itself", EncodingUTF8, []byte("héllo\n"), "héllo\n"},
		{"empty is utf-8", "", []byte("a\x00b"), "a\x00b"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wire := EncodeOutput(tt.encoding, tt.in)
			assert.Equal(t, tt.wire, wire)
			back, err := DecodeOutput(tt.encoding, wire)
			require.NoError(t, err)
			assert.Equal(t, string(tt.in), string(back))
		})
	}
}

func TestDecodeOutput_NotBase64Fails(t *testing.T) {
	for _, s := range []string{"%%%", "AAH", "AA H/"} {
		_, err := DecodeOutput(EncodingBase64, s)
		assert.ErrorContains(t, err, "decode base64 output", "%q", s)
	}
}
