package ecs

import (
	"errors"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/providers"
)

func TestRenderTaskDefinition_MatchesWhatLaunchRegisters(t *testing.T) {
	f := newFake()
	p := newTestProvider(t, testConfig(), f)
	_, err := p.Launch(testCtx(t), testSpec(), []string{"r-0"})
	require.NoError(t, err)
	require.Len(t, f.taskDefs, 1)
	var registered string
	for fam := range f.taskDefs {
		registered = fam
	}

	got, err := RenderTaskDefinition(testConfig(), testSpec())
	require.NoError(t, err)
	assert.Equal(t, registered, aws.ToString(got.Family), "same content, same family")
	require.Len(t, got.ContainerDefinitions, 2)
	assert.Equal(t, SandboxContainer, aws.ToString(got.ContainerDefinitions[1].Name))
}

func TestRenderTaskDefinition_Errors(t *testing.T) {
	tests := []struct {
		name   string
		cfg    func(*Config)
		spec   func(*providers.Spec)
		want   string
		isSpec bool
	}{
		{name: "invalid config names the field", cfg: func(c *Config) { c.Cluster = "" }, want: "Cluster: must be set"},
		{name: "invalid spec names the field", spec: func(s *providers.Spec) { s.Image = "" }, want: "image: must be set", isSpec: true},
		{name: "supplied task definition", spec: func(s *providers.Spec) {
			s.Options = map[string]string{optTaskDefinition: "quarry-own:3"}
		}, want: "options.task_definition: the pool supplies its own", isSpec: true},
		{name: "disk Fargate cannot give", spec: func(s *providers.Spec) { s.DiskMB = 10 * 1024 },
			want: "disk: Fargate's ephemeral storage is a whole number of GiB from 21 to 200", isSpec: true},
		{name: "disk with a supplied task definition", spec: func(s *providers.Spec) {
			s.DiskMB, s.Options = 30*1024, map[string]string{optTaskDefinition: "quarry-own:3"}
		}, want: "disk: the pool supplies its own task definition", isSpec: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, spec := testConfig(), testSpec()
			if tt.cfg != nil {
				tt.cfg(&cfg)
			}
			if tt.spec != nil {
				tt.spec(&spec)
			}
			got, err := RenderTaskDefinition(cfg, spec)
			require.Error(t, err)
			assert.Nil(t, got)
			assert.Contains(t, err.Error(), tt.want)
			var le *providers.LaunchError
			assert.Equal(t, tt.isSpec, errors.As(err, &le) && errors.Is(err, providers.ErrInvalidSpec))
		})
	}
}
