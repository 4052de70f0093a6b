package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/kelseyhightower/envconfig"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/modelservice/dynamobroker"
	"github.com/quarryhq/quarry/providers/docker"
)

// Every variable the gateway reads is QUARRY_-prefixed and spelled out in
// full in its tag: envconfig falls back to a tag's bare name when the
// prefixed one is unset, so a prefix given to Process would let an unrelated
// ADDR or LOG_LEVEL in the environment configure the gateway.
func TestConfig_EveryVariableIsQuarryPrefixed(t *testing.T) {
	specs := map[string]any{"gateway": &Config{}, "relay": &RelayConfig{}, "relay dynamodb": &dynamobroker.Config{}, "docker": &docker.Config{}, "ecs": &ecsEnv{}}
	for name, spec := range specs {
		var buf bytes.Buffer
		require.NoError(t, envconfig.Usagef("", spec, &buf, "{{range .}}{{usage_key .}}\n{{end}}"), name)
		keys := strings.Fields(buf.String())
		require.NotEmpty(t, keys, name)
		for _, k := range keys {
			assert.True(t, strings.HasPrefix(k, "QUARRY_"), "%s: variable %s", name, k)
		}
	}
}

func TestConfig_UnprefixedVariablesAreIgnored(t *testing.T) {
	t.Setenv("ADDR", "0.0.0.0:1")
	t.Setenv("LOG_LEVEL", "error")
	var cfg Config
	require.NoError(t, envconfig.Process("", &cfg))
	assert.Equal(t, "127.0.0.1:8080", cfg.Addr)
	assert.Equal(t, "info", cfg.LogLevel)
}
