package agentapi

import (
	"encoding/base64"
	"fmt"
)

// EncodeOutput returns output bytes b as a JSON string carries them in
// encoding (see ExecRequest.Encoding): for EncodingBase64 standard base64
// (RFC 4648, padded), otherwise b as text, whose bytes that are not valid
// UTF-8 become U+FFFD once the string is JSON-encoded.
func EncodeOutput(encoding string, b []byte) string {
	if encoding == EncodingBase64 {
		return base64.StdEncoding.EncodeToString(b)
	}
	return string(b)
}

// DecodeOutput returns the bytes of output s carried in encoding, the
// inverse of EncodeOutput; it fails only for EncodingBase64 when s is not
// standard base64.
func DecodeOutput(encoding, s string) ([]byte, error) {
	if encoding != EncodingBase64 {
		return []byte(s), nil
	}
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return nil, fmt.Errorf("decode base64 output: %w", err)
	}
	return b, nil
}
