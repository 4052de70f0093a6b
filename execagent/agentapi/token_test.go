package agentapi

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestDeriveToken_IsHMACOfDomainAndNonce(t *testing.T) {
	key := []byte(strings.Repeat("k", 32))
	m := hmac.New(sha256.New, key)
	m.Write([]byte("quarry agent token v1\x00nonce-1\x00"))
	want := hex.EncodeToString(m.Sum(nil))

	assert.Equal(t, want, DeriveToken(key, "nonce-1"))
	assert.NotEqual(t, DeriveToken(key, "nonce-1"), DeriveToken(key, "nonce-2"))
	assert.NotEqual(t, DeriveToken(key, "nonce-1"), DeriveToken([]byte(strings.Repeat("j", 32)), "nonce-1"))
	assert.Empty(t, DeriveToken(key, ""))
}

func TestParseTokenKey(t *testing.T) {
	good := strings.Repeat("ab", 32)
	tests := []struct {
		name    string
		in      string
		wantLen int
		wantErr string
	}{
		{name: "32 bytes", in: good, wantLen: 32},
		{name: "white space trimmed", in: "  " + good + "\n", wantLen: 32},
		{name: "longer key", in: good + "cdcd", wantLen: 34},
		{name: "too short", in: "abcd", wantErr: "at least 64 hex characters"},
		{name: "not hex", in: strings.Repeat("zz", 32), wantErr: "at least 64 hex characters"},
		{name: "too long", in: strings.Repeat("a", 2000), wantErr: "longer than"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key, err := ParseTokenKey(tt.in)
			if tt.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.wantErr)
				assert.NotContains(t, err.Error(), tt.in[:min(10, len(tt.in))], "the error must not quote the key")
				return
			}
			require.NoError(t, err)
			assert.Len(t, key, tt.wantLen)
		})
	}
}
