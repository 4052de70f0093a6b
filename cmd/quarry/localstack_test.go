package main

import (
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var update = flag.Bool("update", false, "rewrite the committed LocalStack init hook")

// hookPath is the committed LocalStack init hook.
var hookPath = filepath.Join("..", "..", "localstack", "init", "ready.d", "10-quarry-tables.sh")

func TestLocalStackHook_MatchesCommittedHook(t *testing.T) {
	got, err := localStackHook()
	require.NoError(t, err)
	if *update {
		require.NoError(t, os.WriteFile(hookPath, []byte(got), 0o755))
	}
	want, err := os.ReadFile(hookPath)
	require.NoError(t, err, "the hook is missing: go test ./cmd/quarry -run TestLocalStackHook -update")
	assert.Equal(t, string(want), got, "the committed hook differs from the table definitions: go test ./cmd/quarry -run TestLocalStackHook -update")
	assert.Contains(t, got, "create_table quarry-model-relay '", "the relay's table too")
	assert.Contains(t, got, "create_table quarry-checkpoints '", "the S3 checkpoint store's table too")
	fi, err := os.Stat(hookPath)
	require.NoError(t, err)
	assert.NotZero(t, fi.Mode()&0o100, "LocalStack runs only executable hooks")
}
