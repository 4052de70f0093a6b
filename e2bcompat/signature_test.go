package e2bcompat

import (
	"crypto/sha256"
	"encoding/base64"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestFileSignature pins the SDK's form (e2b/sandbox/signature.py): "v1_"
// and the unpadded standard base64 of SHA-256 over
// "path:operation:user:token[:expiration]".
func TestFileSignature(t *testing.T) {
	sig := func(raw string) string {
		sum := sha256.Sum256([]byte(raw))
		return "v1_" + base64.RawStdEncoding.EncodeToString(sum[:])
	}
	assert.Equal(t, sig("/home/user/a.txt:read::tok"), FileSignature("/home/user/a.txt", OpRead, "", "tok", 0))
	assert.Equal(t, sig("a.txt:write:root:tok:1800000000"), FileSignature("a.txt", OpWrite, "root", "tok", 1_800_000_000))
	assert.NotContains(t, FileSignature("x", OpRead, "", "t", 0), "=", "unpadded")
	assert.NotEqual(t, FileSignature("x", OpRead, "", "t", 0), FileSignature("x", OpWrite, "", "t", 0))
}
