package main

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPreviewSecret_GeneratedOnceUnderTheDataDir(t *testing.T) {
	dir := t.TempDir()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	first, err := previewSecret("", dir, "embedded", log)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, len(first), 32)
	again, err := previewSecret("", dir, "embedded", log)
	require.NoError(t, err)
	assert.Equal(t, first, again, "a restart signs with the same secret")
	fi, err := os.Stat(filepath.Join(dir, previewSecretFile))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())

	set, err := previewSecret("the-shared-secret-of-every-replica", dir, "dynamodb", log)
	require.NoError(t, err)
	assert.Equal(t, "the-shared-secret-of-every-replica", set)

	bad := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(bad, previewSecretFile), []byte("short\n"), 0o600))
	_, err = previewSecret("", bad, "embedded", log)
	require.Error(t, err)
	assert.True(t, strings.Contains(err.Error(), "QUARRY_PREVIEW_SECRET"), err.Error())
}
