package ecs

import (
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ecs/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestFargateSize(t *testing.T) {
	tests := []struct {
		name    string
		cpu     float64
		mem     int
		wantCPU int
		wantMem int
		wantErr string
	}{
		{name: "zero is the smallest", wantCPU: 256, wantMem: 512},
		{name: "quarter vcpu 1 GiB", cpu: 0.25, mem: 1024, wantCPU: 256, wantMem: 1024},
		{name: "quarter vcpu 600 MiB rounds up", cpu: 0.25, mem: 600, wantCPU: 256, wantMem: 1024},
		{name: "quarter vcpu 3 GiB needs half a vcpu", cpu: 0.25, mem: 3000, wantCPU: 512, wantMem: 3072},
		{name: "half vcpu default memory", cpu: 0.5, wantCPU: 512, wantMem: 1024},
		{name: "0.3 vcpu rounds up", cpu: 0.3, mem: 512, wantCPU: 512, wantMem: 1024},
		{name: "1 vcpu 2 GiB", cpu: 1, mem: 2048, wantCPU: 1024, wantMem: 2048},
		{name: "2 vcpu 5000 MiB", cpu: 2, mem: 5000, wantCPU: 2048, wantMem: 5120},
		{name: "4 vcpu 30 GiB", cpu: 4, mem: 30720, wantCPU: 4096, wantMem: 30720},
		{name: "8 vcpu steps of 4 GiB", cpu: 8, mem: 17000, wantCPU: 8192, wantMem: 20480},
		{name: "16 vcpu steps of 8 GiB", cpu: 16, mem: 40000, wantCPU: 16384, wantMem: 40960},
		{name: "memory picks the cpu", mem: 60000, wantCPU: 8192, wantMem: 61440},
		{name: "too many vcpus", cpu: 17, wantErr: "cpu: Fargate tasks have 0.25 to 16 vCPUs"},
		{name: "negative cpu", cpu: -1, wantErr: "cpu:"},
		{name: "too much memory", cpu: 16, mem: 130000, wantErr: "memory_mb:"},
		{name: "negative memory", mem: -5, wantErr: "memory_mb:"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cpu, mem, err := fargateSize(tt.cpu, tt.mem)
			if tt.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.wantCPU, cpu)
			assert.Equal(t, tt.wantMem, mem)
		})
	}
}

func TestParseStrategy(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    []types.CapacityProviderStrategyItem
		wantErr bool
	}{
		{name: "fargate", in: "FARGATE", want: []types.CapacityProviderStrategyItem{{CapacityProvider: aws.String("FARGATE"), Weight: 1}}},
		{name: "spot with fallback", in: "FARGATE_SPOT:3, FARGATE:1:2", want: []types.CapacityProviderStrategyItem{
			{CapacityProvider: aws.String("FARGATE_SPOT"), Weight: 3},
			{CapacityProvider: aws.String("FARGATE"), Weight: 1, Base: 2},
		}},
		{name: "empty", in: " ", wantErr: true},
		{name: "bad weight", in: "FARGATE:x", wantErr: true},
		{name: "too many fields", in: "FARGATE:1:1:1", wantErr: true},
		{name: "bad name", in: "FAR GATE", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseStrategy(tt.in)
			if tt.wantErr {
				assert.Error(t, err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestRenderTaskDef(t *testing.T) {
	cfg := testConfig().WithDefaults()
	spec := testSpec()
	set, err := resolve(cfg, spec)
	require.NoError(t, err)
	in := renderTaskDef(cfg, spec, set)

	assert.Regexp(t, `^quarry-py-[0-9a-f]{16}$`, aws.ToString(in.Family))
	assert.Equal(t, []types.Compatibility{types.CompatibilityFargate}, in.RequiresCompatibilities)
	assert.Equal(t, types.NetworkModeAwsvpc, in.NetworkMode)
	assert.Equal(t, "512", aws.ToString(in.Cpu))
	assert.Equal(t, "1024", aws.ToString(in.Memory))
	assert.Equal(t, cfg.ExecutionRoleARN, aws.ToString(in.ExecutionRoleArn))
	assert.Nil(t, in.TaskRoleArn, "sandboxes get no AWS role by default")
	assert.Equal(t, DefaultUser, aws.ToString(in.ContainerDefinitions[1].User), "unprivileged by default")
	require.NotNil(t, in.ContainerDefinitions[1].LinuxParameters)
	assert.Contains(t, in.ContainerDefinitions[1].LinuxParameters.Capabilities.Drop, "NET_RAW")
	require.Len(t, in.Volumes, 1)
	assert.Equal(t, "quarry-agent", aws.ToString(in.Volumes[0].Name))
	require.Len(t, in.ContainerDefinitions, 2)

	initC, box := in.ContainerDefinitions[0], in.ContainerDefinitions[1]
	assert.Equal(t, "quarry-agent-init", aws.ToString(initC.Name))
	assert.Equal(t, cfg.AgentImage, aws.ToString(initC.Image))
	assert.False(t, aws.ToBool(initC.Essential))
	assert.Equal(t, []string{"cp", "/execagent", "/.quarry/execagent"}, initC.EntryPoint)
	assert.Equal(t, "/.quarry", aws.ToString(initC.MountPoints[0].ContainerPath))
	assert.False(t, aws.ToBool(initC.MountPoints[0].ReadOnly))

	assert.Equal(t, "sandbox", aws.ToString(box.Name))
	assert.Equal(t, "python:3.12-slim", aws.ToString(box.Image))
	assert.True(t, aws.ToBool(box.Essential))
	assert.Equal(t, []string{"/.quarry/execagent"}, box.EntryPoint)
	assert.Empty(t, box.Command, "the image's CMD is not passed to the agent")
	assert.Equal(t, []types.ContainerDependency{{ContainerName: aws.String("quarry-agent-init"), Condition: types.ContainerConditionSuccess}}, box.DependsOn)
	assert.True(t, aws.ToBool(box.MountPoints[0].ReadOnly), "the sandbox cannot replace the agent")
	assert.Equal(t, int32(8000), aws.ToInt32(box.PortMappings[0].ContainerPort))
	assert.Equal(t, []types.Secret{{Name: aws.String("QUARRY_AGENT_TOKEN_KEY"), ValueFrom: aws.String(cfg.TokenKeySecretARN)}}, box.Secrets)
	env := map[string]string{}
	for _, kv := range box.Environment {
		env[aws.ToString(kv.Name)] = aws.ToString(kv.Value)
	}
	assert.Equal(t, map[string]string{"QUARRY_AGENT_ADDR": "0.0.0.0:8000", "QUARRY_AGENT_WORKDIR": sandboxWorkdir,
		"QUARRY_AGENT_TOKEN_NONCE_FROM": "ecs-task-arn", "A": "1"}, env, "the agent derives its token from its task ARN")
	require.NotNil(t, box.LogConfiguration)
	assert.Equal(t, types.LogDriverAwslogs, box.LogConfiguration.LogDriver)
	assert.Equal(t, map[string]string{"awslogs-group": "/quarry/sandboxes", "awslogs-region": "us-east-1", "awslogs-stream-prefix": "sandbox"}, box.LogConfiguration.Options)
	assert.LessOrEqual(t, aws.ToInt32(box.MemoryReservation)+aws.ToInt32(initC.MemoryReservation), int32(1024))
	tags := tagMap(in.Tags)
	assert.Equal(t, map[string]string{"quarry.managed": "true", "quarry.pool": "py", "quarry.gateway": "gw-test"}, tags)

	again := renderTaskDef(cfg, spec, set)
	assert.Equal(t, aws.ToString(in.Family), aws.ToString(again.Family), "the family is a function of the content")
	spec.Env["A"] = "2"
	changed := renderTaskDef(cfg, spec, set)
	assert.NotEqual(t, aws.ToString(in.Family), aws.ToString(changed.Family))

	cfg.LogGroup = ""
	assert.Nil(t, renderTaskDef(cfg, spec, set).ContainerDefinitions[1].LogConfiguration)
}

func TestFargateDisk(t *testing.T) {
	tests := []struct {
		name    string
		diskMB  int
		want    int
		wantErr bool
	}{
		{name: "unset: Fargate's default", diskMB: 0, want: 0},
		{name: "smallest", diskMB: 21 * 1024, want: 21},
		{name: "largest", diskMB: 200 * 1024, want: 200},
		{name: "below Fargate's settable range", diskMB: 16, wantErr: true},
		{name: "20 GiB is the default, not a setting", diskMB: 20 * 1024, wantErr: true},
		{name: "above 200 GiB", diskMB: 201 * 1024, wantErr: true},
		{name: "not whole GiB", diskMB: 21*1024 + 1, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := fargateDisk(tt.diskMB)
			if tt.wantErr {
				require.Error(t, err)
				assert.Contains(t, err.Error(), "disk: Fargate's ephemeral storage is a whole number of GiB from 21 to 200")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestRenderTaskDef_DiskIsEphemeralStorage(t *testing.T) {
	cfg := testConfig().WithDefaults()
	spec := testSpec()
	set, err := resolve(cfg, spec)
	require.NoError(t, err)
	plain := renderTaskDef(cfg, spec, set)
	assert.Nil(t, plain.EphemeralStorage, "without disk: Fargate's default, and the family of pools without disk is unchanged")

	spec.DiskMB = 50 * 1024
	set, err = resolve(cfg, spec)
	require.NoError(t, err)
	in := renderTaskDef(cfg, spec, set)
	require.NotNil(t, in.EphemeralStorage)
	assert.Equal(t, int32(50), in.EphemeralStorage.SizeInGiB)
	assert.NotEqual(t, aws.ToString(plain.Family), aws.ToString(in.Family), "another disk is another definition")
}

func TestResolve_OptionsOverrideConfig(t *testing.T) {
	spec := testSpec()
	spec.Options = map[string]string{
		"capacity_provider": "FARGATE_SPOT", "subnets": "subnet-0aaaaaaaaaaaaaaaa, subnet-0bbbbbbbbbbbbbbbb",
		"security_groups": "sg-0cccccccccccccccc", "assign_public_ip": "true", "arch": "arm64", "user": "1000:1000",
	}
	set, err := resolve(testConfig().WithDefaults(), spec)
	require.NoError(t, err)
	assert.Equal(t, "FARGATE_SPOT", aws.ToString(set.strategy[0].CapacityProvider))
	assert.Equal(t, []string{"subnet-0aaaaaaaaaaaaaaaa", "subnet-0bbbbbbbbbbbbbbbb"}, set.subnets)
	assert.Equal(t, []string{"sg-0cccccccccccccccc"}, set.sgs)
	assert.True(t, set.publicIP)
	assert.Equal(t, types.CPUArchitectureArm64, set.arch)
	assert.Equal(t, "1000:1000", aws.ToString(renderTaskDef(testConfig().WithDefaults(), spec, set).ContainerDefinitions[1].User))

	cfg := testConfig().WithDefaults()
	cfg.AgentImage = ""
	_, err = resolve(cfg, testSpec())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "options.task_definition: required")
}

func TestFamily_SanitizesAndBoundsPool(t *testing.T) {
	assert.Equal(t, "quarry-a_b-c-0123", family(DefaultFamilyPrefix, "a.b-c", "0123"))
	assert.Equal(t, "prod_i-x-0123", family("prod_", "i-x", "0123"), "the prefix the Terraform module sets")
	long := family(DefaultFamilyPrefix, strings.Repeat("p", 400), "0123456789abcdef")
	assert.Equal(t, "quarry-"+strings.Repeat("p", 200)+"-0123456789abcdef", long, "the pool cut to 200 (today's families)")
	longer := family(strings.Repeat("x", 40), strings.Repeat("p", 400), "0123456789abcdef")
	assert.Len(t, longer, 255)
}
