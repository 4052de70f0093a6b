package process

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/providers"
)

func TestValidateSpec(t *testing.T) {
	tests := []struct {
		name string
		spec providers.Spec
		want string // substring of the reason; "" means valid
	}{
		{name: "empty image", spec: providers.Spec{Pool: "p"}},
		{name: "host image with everything", spec: providers.Spec{Pool: "p", Image: "host", CPU: 2, MemoryMB: 512,
			Env: map[string]string{"A": "1", "PATH": "/bin"}, Labels: map[string]string{"team": "rl"}}},
		{name: "no pool", spec: providers.Spec{}, want: "pool: must be set"},
		{name: "docker image", spec: providers.Spec{Pool: "p", Image: "ubuntu:24.04"}, want: `image "ubuntu:24.04"`},
		{name: "negative cpu", spec: providers.Spec{Pool: "p", CPU: -1}, want: "cpu"},
		{name: "negative memory", spec: providers.Spec{Pool: "p", MemoryMB: -1}, want: "memory"},
		{name: "disk is refused, not ignored", spec: providers.Spec{Pool: "p", DiskMB: 1024}, want: "disk: the process provider cannot bound a sandbox's disk"},
		{name: "env name with =", spec: providers.Spec{Pool: "p", Env: map[string]string{"A=B": "1"}}, want: `env "A=B"`},
		{name: "empty env name", spec: providers.Spec{Pool: "p", Env: map[string]string{"": "1"}}, want: `env ""`},
		{name: "reserved env", spec: providers.Spec{Pool: "p", Env: map[string]string{"QUARRY_AGENT_TOKEN": "x"}}, want: `env "QUARRY_AGENT_TOKEN"`},
		{name: "NUL in env value", spec: providers.Spec{Pool: "p", Env: map[string]string{"A": "a\x00b"}}, want: `env "A"`},
		{name: "reserved label", spec: providers.Spec{Pool: "p", Labels: map[string]string{providers.LabelPool: "x"}}, want: `labels "quarry.pool"`},
		{name: "options", spec: providers.Spec{Pool: "p", Options: map[string]string{"network": "host"}}, want: `options "network"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := validateSpec(tt.spec)
			if tt.want == "" {
				assert.NoError(t, err)
				return
			}
			var lerr *providers.LaunchError
			require.ErrorAs(t, err, &lerr)
			assert.ErrorIs(t, err, providers.ErrInvalidSpec)
			assert.Contains(t, lerr.Reason, tt.want)
			assert.Equal(t, tt.spec.Pool, lerr.Pool)
			assert.Equal(t, tt.spec.Image, lerr.Image)
		})
	}
}

func TestValidateName(t *testing.T) {
	tests := []struct {
		name  string
		input string
		ok    bool
	}{
		{name: "typical", input: "tsk-01HXYZ_a.b", ok: true},
		{name: "longest", input: strings.Repeat("a", maxNameLen), ok: true},
		{name: "empty", input: ""},
		{name: "too long", input: strings.Repeat("a", maxNameLen+1)},
		{name: "dot", input: "."},
		{name: "dot dot", input: ".."},
		{name: "hidden", input: ".task"},
		{name: "slash", input: "a/b"},
		{name: "parent escape", input: "../x"},
		{name: "space", input: "a b"},
		{name: "unicode", input: "tâche"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := validateName(tt.input)
			if tt.ok {
				assert.NoError(t, err)
			} else {
				assert.Error(t, err)
			}
		})
	}
}

func TestAgentEnv_MinimalEnvPlusSpecAndAgentSettings(t *testing.T) {
	cfg := Config{AgentBinary: "a", Dir: "/d"}.WithDefaults()
	got := agentEnv(cfg, "/d/t1", "/d/t1/work", "tok", map[string]string{"LANG": "en_US.UTF-8", "A": "1"})
	assert.Equal(t, []string{
		"A=1",
		"HOME=/d/t1/work",
		"LANG=en_US.UTF-8",
		"PATH=" + DefaultPath,
		"QUARRY_AGENT_ADDR=127.0.0.1:0",
		"QUARRY_AGENT_ADDR_FILE=/d/t1/agent.addr",
		"QUARRY_AGENT_OWNER_DIR=/d/t1",
		"QUARRY_AGENT_TOKEN=tok",
		"QUARRY_AGENT_WORKDIR=/d/t1/work",
	}, got)
}
