package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/modelservice/dynamobroker"
)

func TestRelayConfig_Validate_NamesTheVariable(t *testing.T) {
	ok := RelayConfig{Broker: "memory", Retention: 1, MemoryMaxBytes: 1}
	tests := []struct {
		name   string
		mutate func(*RelayConfig)
		want   string
	}{
		{name: "defaults", mutate: func(*RelayConfig) {}},
		{name: "unknown broker", mutate: func(c *RelayConfig) { c.Broker = "redis" }, want: "QUARRY_RELAY_BROKER"},
		{name: "dynamodb needs a shared secret", mutate: func(c *RelayConfig) { c.Broker = "dynamodb" }, want: "QUARRY_RELAY_SECRET"},
		{name: "short secret", mutate: func(c *RelayConfig) { c.Secret = "short" }, want: "QUARRY_RELAY_SECRET"},
		{name: "retention", mutate: func(c *RelayConfig) { c.Retention = 0 }, want: "QUARRY_RELAY_RETENTION"},
		{name: "memory bound", mutate: func(c *RelayConfig) { c.MemoryMaxBytes = 0 }, want: "QUARRY_RELAY_MEMORY_MAX_BYTES"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := ok
			tc.mutate(&c)
			err := c.Validate()
			if tc.want == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// Every QUARRY_RELAY_DYNAMODB_* variable reaches the DynamoDB broker
// (before, the gateway copied three of them by hand and ignored the
// others), and a bad one is refused naming it.
func TestRelayDynamoConfig_ReadsEveryVariable(t *testing.T) {
	env := map[string]string{
		"QUARRY_RELAY_DYNAMODB_TABLE":          "relay-t",
		"QUARRY_RELAY_DYNAMODB_AWAIT_POLL":     "70ms",
		"QUARRY_RELAY_DYNAMODB_CLAIM_POLL_MIN": "10ms",
		"QUARRY_RELAY_DYNAMODB_CLAIM_POLL_MAX": "900ms",
		"QUARRY_RELAY_DYNAMODB_RECHECK":        "3s",
		"QUARRY_RELAY_DYNAMODB_RECHECK_MAX":    "40s",
		"QUARRY_RELAY_DYNAMODB_CALL_TIMEOUT":   "7s",
		"QUARRY_RELAY_DYNAMODB_QUEUE_SHARDS":   "32",
	}
	for k, v := range env {
		t.Setenv(k, v)
	}
	dc, err := relayDynamoConfig(RelayConfig{Retention: 2 * time.Hour})
	require.NoError(t, err)
	assert.Equal(t, dynamobroker.Config{Table: "relay-t", Retention: 2 * time.Hour, AwaitPoll: 70 * time.Millisecond,
		ClaimPollMin: 10 * time.Millisecond, ClaimPollMax: 900 * time.Millisecond, Recheck: 3 * time.Second,
		RecheckMax: 40 * time.Second, CallTimeout: 7 * time.Second, QueueShards: 32}, dc)

	t.Setenv("QUARRY_RELAY_DYNAMODB_QUEUE_SHARDS", "1000")
	_, err = relayDynamoConfig(RelayConfig{Retention: time.Hour})
	assert.ErrorContains(t, err, "QUARRY_RELAY_DYNAMODB_QUEUE_SHARDS")
}

// Every variable the DynamoDB broker reads has a row in docs/CONFIG.md
// (three of them had none while the gateway copied its settings by hand).
func TestRelayDynamoConfig_EveryVariableIsDocumented(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "CONFIG.md"))
	require.NoError(t, err)
	keys := envKeys(t, &dynamobroker.Config{})
	require.Contains(t, keys, "QUARRY_RELAY_DYNAMODB_QUEUE_SHARDS")
	for _, k := range keys {
		assert.True(t, strings.Contains(string(doc), "| `"+k+"` |"), "docs/CONFIG.md has no row for %s", k)
	}
}

func TestSandboxURL_FromTheListenAddress(t *testing.T) {
	tests := []struct{ addr, want string }{
		{"127.0.0.1:8080", "http://127.0.0.1:8080"},
		{"0.0.0.0:9000", "http://127.0.0.1:9000"},
		{":7000", "http://127.0.0.1:7000"},
		{"[::]:7000", "http://127.0.0.1:7000"},
		{"10.0.0.5:8080", "http://10.0.0.5:8080"},
	}
	for _, tc := range tests {
		t.Run(tc.addr, func(t *testing.T) {
			got, err := sandboxURL(tc.addr)
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
	_, err := sandboxURL("8080")
	assert.Error(t, err)
}

func TestLoadOrCreateRelaySecret_GeneratesOnceThenReuses(t *testing.T) {
	dir := t.TempDir()
	first, err := loadOrCreateRelaySecret(dir)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, len(first), 32)
	st, err := os.Stat(filepath.Join(dir, relaySecretFile))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), st.Mode().Perm())
	again, err := loadOrCreateRelaySecret(dir)
	require.NoError(t, err)
	assert.Equal(t, first, again)

	require.NoError(t, os.WriteFile(filepath.Join(dir, relaySecretFile), []byte(strings.Repeat("x", 5)), 0o600))
	_, err = loadOrCreateRelaySecret(dir)
	assert.ErrorContains(t, err, "QUARRY_RELAY_SECRET")
}
