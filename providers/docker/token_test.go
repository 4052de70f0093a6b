package docker

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestTokenKey_Token_DependsOnEveryInput(t *testing.T) {
	k := tokenKey([]byte("0123456789abcdef0123456789abcdef"))
	base := k.token("gw", "tsk-a", "n1")
	assert.Len(t, base, 64)
	assert.Equal(t, base, k.token("gw", "tsk-a", "n1"), "deterministic")
	tests := []struct {
		name string
		got  string
	}{
		{name: "gateway", got: k.token("gw2", "tsk-a", "n1")},
		{name: "name", got: k.token("gw", "tsk-b", "n1")},
		{name: "nonce", got: k.token("gw", "tsk-a", "n2")},
		{name: "key", got: tokenKey([]byte("another key, another key, another")).token("gw", "tsk-a", "n1")},
		{name: "no ambiguous joins", got: k.token("gwt", "sk-a", "n1")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.NotEqual(t, base, tt.got)
		})
	}
	assert.Empty(t, k.token("gw", "tsk-a", ""), "no nonce, no token")
}

// File handling (modes, concurrent creators) is tested in internal/secretfile.
func TestLoadOrCreateKey_CreatesOnceAndReusesIt(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "token.key")
	key, err := loadOrCreateKey(path)
	require.NoError(t, err)
	assert.Len(t, key, keyBytes)
	again, err := loadOrCreateKey(path)
	require.NoError(t, err)
	assert.Equal(t, key, again)
}

func TestLoadOrCreateKey_RefusesABadKeyFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "token.key")
	require.NoError(t, os.WriteFile(path, []byte("short\n"), 0o600))
	_, err := loadOrCreateKey(path)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "want at least 64 hex characters")
}
