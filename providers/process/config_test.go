package process

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestConfig_WithDefaults_FillsOnlyUnsetFields(t *testing.T) {
	got := Config{AgentBinary: "agent", Dir: "/d", StopGrace: time.Second}.WithDefaults()
	assert.Equal(t, Config{
		AgentBinary:       "agent",
		Dir:               "/d",
		GatewayID:         DefaultGatewayID,
		StartTimeout:      DefaultStartTimeout,
		StopGrace:         time.Second,
		LaunchConcurrency: DefaultLaunchConcurrency,
		Path:              DefaultPath,
		Lang:              DefaultLang,
	}, got)
	require.NoError(t, got.Validate())
}

func TestConfig_Validate_NamesTheField(t *testing.T) {
	valid := Config{AgentBinary: "agent", Dir: "/d"}.WithDefaults()
	tests := []struct {
		name   string
		modify func(*Config)
		field  string
	}{
		{name: "no agent binary", modify: func(c *Config) { c.AgentBinary = "" }, field: "AgentBinary"},
		{name: "no dir", modify: func(c *Config) { c.Dir = "" }, field: "Dir"},
		{name: "no gateway id", modify: func(c *Config) { c.GatewayID = "" }, field: "GatewayID"},
		{name: "negative start timeout", modify: func(c *Config) { c.StartTimeout = -time.Second }, field: "StartTimeout"},
		{name: "zero stop grace", modify: func(c *Config) { c.StopGrace = 0 }, field: "StopGrace"},
		{name: "no concurrency", modify: func(c *Config) { c.LaunchConcurrency = 0 }, field: "LaunchConcurrency"},
		{name: "too much concurrency", modify: func(c *Config) { c.LaunchConcurrency = 65 }, field: "LaunchConcurrency"},
		{name: "no path", modify: func(c *Config) { c.Path = "" }, field: "Path"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := valid
			tt.modify(&c)
			err := c.Validate()
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.field+":")
		})
	}
}

func TestNew_BadConfigFails(t *testing.T) {
	notExecutable := filepath.Join(t.TempDir(), "agent")
	require.NoError(t, os.WriteFile(notExecutable, []byte("#!/bin/sh\n"), 0o600))
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{name: "missing binary", cfg: Config{AgentBinary: "/nonexistent/execagent", Dir: t.TempDir()}, want: "AgentBinary"},
		{name: "binary not executable", cfg: Config{AgentBinary: notExecutable, Dir: t.TempDir()}, want: "AgentBinary"},
		{name: "no dir", cfg: Config{AgentBinary: "/bin/true"}, want: "Dir"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := New(tt.cfg, nil)
			require.Error(t, err)
			assert.Nil(t, p)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
}
