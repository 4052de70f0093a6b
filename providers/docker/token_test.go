package docker

import (
	"os"
	"path/filepath"
	"sync"
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

func TestLoadOrCreateKey_CreatesOnceAndReusesIt(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "token.key")
	keys := make([]tokenKey, 8)
	errs := make([]error, 8)
	var wg sync.WaitGroup
	for i := range keys {
		wg.Go(func() { keys[i], errs[i] = loadOrCreateKey(path) })
	}
	wg.Wait()
	for i := range keys {
		require.NoError(t, errs[i])
		assert.Equal(t, keys[0], keys[i], "concurrent creators agree on one key")
	}
	assert.Len(t, keys[0], keyBytes)
	fi, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	di, err := os.Stat(filepath.Dir(path))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o700), di.Mode().Perm())

	again, err := loadOrCreateKey(path)
	require.NoError(t, err)
	assert.Equal(t, keys[0], again)
}

func TestLoadOrCreateKey_RefusesABadKeyFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "token.key")
	require.NoError(t, os.WriteFile(path, []byte("short\n"), 0o600))
	_, err := loadOrCreateKey(path)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "want at least 64 hex characters")
}
