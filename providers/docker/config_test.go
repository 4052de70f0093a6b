package docker

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/providers/providertest"
)

func TestConfig_WithDefaults_FillsUnsetFields(t *testing.T) {
	c := Config{AgentBinary: "/bin/agent", TokenKeyFile: "/k"}.WithDefaults()
	assert.Equal(t, Config{
		Host: DefaultHost, AgentBinary: "/bin/agent", TokenKeyFile: "/k", GatewayID: DefaultGatewayID,
		User: DefaultUser, Workdir: DefaultWorkdir, Network: DefaultNetwork, PidsLimit: DefaultPidsLimit,
		StartTimeout: DefaultStartTimeout, LaunchConcurrency: DefaultLaunchConcurrency,
		PullConcurrency: DefaultPullConcurrency, PullTimeout: DefaultPullTimeout,
		LayerTimeout: DefaultLayerTimeout, LayerIdle: DefaultLayerIdle, LayerMedium: LayerMemory,
	}, c)
	require.NoError(t, c.Validate())
}

func TestConfig_Validate_NamesTheField(t *testing.T) {
	valid := Config{AgentBinary: "/bin/agent", TokenKeyFile: "/k"}.WithDefaults()
	tests := []struct {
		name   string
		modify func(*Config)
		want   string
	}{
		{name: "host without scheme", modify: func(c *Config) { c.Host = "/var/run/docker.sock" }, want: "Host: want an endpoint"},
		{name: "no agent", modify: func(c *Config) { c.AgentBinary = "" }, want: "AgentBinary: must be set"},
		{name: "relative agent", modify: func(c *Config) { c.AgentBinary = "bin/execagent" }, want: "AgentBinary: must be an absolute path"},
		{name: "no key file", modify: func(c *Config) { c.TokenKeyFile = "" }, want: "TokenKeyFile: must be set"},
		{name: "no gateway id", modify: func(c *Config) { c.GatewayID = "" }, want: "GatewayID: must be set"},
		{name: "negative layer timeout", modify: func(c *Config) { c.LayerTimeout = -time.Second }, want: "LayerTimeout: must be positive"},
		{name: "negative layer idle", modify: func(c *Config) { c.LayerIdle = -time.Second }, want: "LayerIdle: must not be negative"},
		{name: "layer medium", modify: func(c *Config) { c.LayerMedium = "ssd" }, want: `LayerMedium: must be "memory" or "disk", got "ssd"`},
		{name: "user name", modify: func(c *Config) { c.User = "nobody" }, want: `User: want a numeric uid or uid:gid, got "nobody"`},
		{name: "user with bad gid", modify: func(c *Config) { c.User = "1000:x" }, want: "User: want a numeric"},
		{name: "negative uid", modify: func(c *Config) { c.User = "-1" }, want: "User: want a numeric"},
		{name: "relative workdir", modify: func(c *Config) { c.Workdir = "home" }, want: "Workdir: must be an absolute path"},
		{name: "unclean workdir", modify: func(c *Config) { c.Workdir = "/home/../tmp" }, want: "Workdir: must be a clean path"},
		{name: "root workdir", modify: func(c *Config) { c.Workdir = "/" }, want: "Workdir: must not be /"},
		{name: "workdir in the agent's directory", modify: func(c *Config) { c.Workdir = agentDir + "/w" }, want: "Workdir: must not be in /.quarry"},
		{name: "workdir in /proc", modify: func(c *Config) { c.Workdir = "/proc" }, want: "Workdir: must not be in /proc"},
		{name: "workdir size", modify: func(c *Config) { c.WorkdirSizeMB = -1 }, want: "WorkdirSizeMB: must be between 1"},
		{name: "no network", modify: func(c *Config) { c.Network = "none" }, want: "Network: \"none\" leaves the agent unreachable"},
		{name: "container network", modify: func(c *Config) { c.Network = "container:x" }, want: "Network: sharing another container's network"},
		{name: "pids limit", modify: func(c *Config) { c.PidsLimit = 3 }, want: "PidsLimit: must be between 16"},
		{name: "start timeout", modify: func(c *Config) { c.StartTimeout = -time.Second }, want: "StartTimeout: must be positive"},
		{name: "concurrency", modify: func(c *Config) { c.LaunchConcurrency = 65 }, want: "LaunchConcurrency: must be between 1 and 64"},
		{name: "pull concurrency", modify: func(c *Config) { c.PullConcurrency = -1 }, want: "PullConcurrency: must be between 1 and 64"},
		{name: "pull timeout", modify: func(c *Config) { c.PullTimeout = -time.Second }, want: "PullTimeout: must be positive"},
		{name: "image budget", modify: func(c *Config) { c.ImageBudget = -1 }, want: "ImageBudget: must not be negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := valid
			tt.modify(&c)
			err := c.Validate()
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
			assert.Contains(t, err.Error(), "docker provider config")
		})
	}
}

func TestNew_RefusesAgentsThatCannotRunInAnImage(t *testing.T) {
	dir := t.TempDir()
	script := filepath.Join(dir, "agent.sh")
	require.NoError(t, os.WriteFile(script, []byte("#!/bin/sh\n"), 0o755))
	notExec := filepath.Join(dir, "agent")
	require.NoError(t, os.WriteFile(notExec, []byte{0x7f, 'E', 'L', 'F'}, 0o644))
	tests := []struct {
		name  string
		agent string
		want  string
	}{
		{name: "missing", agent: filepath.Join(dir, "none"), want: "no such file"},
		{name: "not executable", agent: notExec, want: "is not an executable file"},
		{name: "not ELF", agent: script, want: "is not an ELF executable"},
		{name: "dynamic", agent: "/bin/sh", want: "is dynamically linked"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(Config{AgentBinary: tt.agent, TokenKeyFile: filepath.Join(dir, "key")}, nil)
			require.Error(t, err)
			assert.Contains(t, err.Error(), "AgentBinary")
			assert.Contains(t, err.Error(), tt.want)
		})
	}
}

func TestNew_UnreachableEngineNamesTheHost(t *testing.T) {
	dir := t.TempDir()
	agent := providertest.BuildAgent(t)
	host := "unix://" + filepath.Join(dir, "no-docker.sock")
	_, err := New(Config{AgentBinary: agent, TokenKeyFile: filepath.Join(dir, "key"), Host: host}, nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no Docker engine answers at "+host)
}
