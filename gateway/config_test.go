package gateway

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

func TestConfig_ValidateNamesTheVariable(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*Config)
		want   string
	}{
		{name: "valid", mutate: func(*Config) {}},
		{name: "no keys", mutate: func(c *Config) { c.APIKeys = nil }, want: "QUARRY_API_KEYS: at least one"},
		{name: "empty key", mutate: func(c *Config) { c.APIKeys = []string{""} }, want: "QUARRY_API_KEYS: key 1"},
		{name: "key with space", mutate: func(c *Config) { c.APIKeys = []string{"a b"} }, want: "QUARRY_API_KEYS: key 1"},
		{name: "key too long", mutate: func(c *Config) { c.APIKeys = []string{strings.Repeat("k", 300)} }, want: "QUARRY_API_KEYS"},
		{name: "key too short", mutate: func(c *Config) { c.APIKeys = []string{testKey, "x"} }, want: "QUARRY_API_KEYS: key 2: must be at least 16 characters"},
		{name: "bad default pool", mutate: func(c *Config) { c.DefaultPool = "a b" }, want: "QUARRY_DEFAULT_POOL"},
		{name: "negative size", mutate: func(c *Config) { c.MaxJSONBody = -1 }, want: "QUARRY_MAX_JSON_BODY"},
		{name: "negative duration", mutate: func(c *Config) { c.IdleTimeout = -time.Second }, want: "QUARRY_IDLE_TIMEOUT"},
		{name: "checkpoint compression none", mutate: func(c *Config) { c.CheckpointCompression = "none" }},
		{name: "bad checkpoint compression", mutate: func(c *Config) { c.CheckpointCompression = "zstd" }, want: "QUARRY_CHECKPOINT_COMPRESSION"},
		{name: "upload below json", mutate: func(c *Config) { c.MaxJSONBody = 1000; c.MaxUploadBody = 10 }, want: "QUARRY_MAX_UPLOAD_BODY"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Config{APIKeys: []string{testKey}}
			tt.mutate(&c)
			err := c.Validate()
			if tt.want == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
}

func TestNew_RefusesBadConfigAndMissingManager(t *testing.T) {
	_, err := New(Config{}, Deps{Manager: newFakeManager("")})
	assert.ErrorContains(t, err, "QUARRY_API_KEYS")
	_, err = New(Config{APIKeys: []string{testKey}}, Deps{})
	assert.ErrorContains(t, err, "Manager")
}

// Agents are asked for stored blocks unless told otherwise: restores of
// them are about twice as fast (docs/BENCHMARKS.md, "Checkpoints").
func TestConfig_CheckpointCompressionDefaultsToNone(t *testing.T) {
	assert.Equal(t, agentapi.CompressionNone, Config{}.WithDefaults().CheckpointCompression)
	assert.Equal(t, agentapi.CompressionFast, Config{CheckpointCompression: agentapi.CompressionFast}.WithDefaults().CheckpointCompression)
}
