package main

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/providers"
	"github.com/quarryhq/quarry/providers/ecs"
	"github.com/quarryhq/quarry/providers/ecs/ddbrate"
)

// setECSEnv sets a complete ECS configuration (no AWS call is made to build
// the provider when the key is given directly).
func setECSEnv(t *testing.T) {
	t.Setenv("AWS_REGION", "us-east-1")
	t.Setenv("AWS_ACCESS_KEY_ID", "test")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "test")
	t.Setenv("QUARRY_ECS_CLUSTER", "quarry")
	t.Setenv("QUARRY_ECS_SUBNETS", "subnet-0123456789abcdef0,subnet-0123456789abcdef1")
	t.Setenv("QUARRY_ECS_SECURITY_GROUPS", "sg-0123456789abcdef0")
	t.Setenv("QUARRY_ECS_EXECUTION_ROLE_ARN", "arn:aws:iam::123456789012:role/quarry-exec")
	t.Setenv("QUARRY_ECS_AGENT_IMAGE", "123456789012.dkr.ecr.us-east-1.amazonaws.com/quarry-agent:1")
	t.Setenv("QUARRY_ECS_TOKEN_KEY_SECRET_ARN", "arn:aws:secretsmanager:us-east-1:123456789012:secret:quarry-key")
	t.Setenv("QUARRY_ECS_TOKEN_KEY", strings.Repeat("ab", 32))
	t.Setenv("QUARRY_ECS_CAPACITY_PROVIDER", "FARGATE_SPOT:3,FARGATE:1")
}

func TestMakeECSProvider_ReadsQuarryECSVariables(t *testing.T) {
	setECSEnv(t)
	p, err := makeECSProvider(Config{}, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	assert.IsType(t, &ecs.Provider{}, p)
	assert.Implements(t, (*providers.ImagePreparer)(nil), p, "images on demand: task definitions registered on first use")
	assert.Implements(t, (*providers.ImageCache)(nil), p)
}

// With an events queue the provider learns task states from ECS's events
// (providers.Watcher); without one it is no Watcher.
func TestMakeECSProvider_EventsQueueMakesAWatcher(t *testing.T) {
	setECSEnv(t)
	p, err := makeECSProvider(Config{}, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	_, ok := p.(providers.Watcher)
	assert.False(t, ok)

	t.Setenv("QUARRY_ECS_EVENTS_QUEUE_URL", "https://sqs.us-east-1.amazonaws.com/123456789012/quarry-ecs-events")
	p, err = makeECSProvider(Config{}, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	assert.IsType(t, &ecs.Watching{}, p)
	_, ok = p.(providers.Watcher)
	assert.True(t, ok)

	t.Setenv("QUARRY_ECS_EVENTS_QUEUE_URL", "quarry-ecs-events")
	_, err = makeECSProvider(Config{}, slog.New(slog.DiscardHandler))
	assert.ErrorContains(t, err, "EventsQueueURL")
}

// With the DynamoDB store the replicas share the RunTask and
// RegisterTaskDefinition rates (items of the leases table); with the
// embedded store (one replica) the provider keeps its own buckets.
func TestSharedRates_WithTheDynamoDBStore(t *testing.T) {
	setECSEnv(t)
	log := slog.New(slog.DiscardHandler)
	run, register, err := sharedRates(context.Background(), Config{Store: "embedded"}, ecs.Config{}, log)
	require.NoError(t, err)
	assert.Nil(t, run)
	assert.Nil(t, register)
	run, register, err = sharedRates(context.Background(), Config{Store: "dynamodb"}, ecs.Config{}, log)
	require.NoError(t, err)
	assert.IsType(t, &ddbrate.Limiter{}, run)
	assert.IsType(t, &ddbrate.Limiter{}, register)
	_, _, err = sharedRates(context.Background(), Config{Store: "dynamodb"}, ecs.Config{RunTaskRate: -1}, log)
	assert.ErrorContains(t, err, "QUARRY_ECS_RUN_TASK_")
	_, _, err = sharedRates(context.Background(), Config{Store: "dynamodb"}, ecs.Config{RegisterRate: -1}, log)
	assert.ErrorContains(t, err, "QUARRY_ECS_REGISTER_")
	t.Setenv("QUARRY_STORE", "dynamodb")
	p, err := makeECSProvider(Config{Store: "dynamodb"}, log)
	require.NoError(t, err)
	assert.IsType(t, &ecs.Provider{}, p)
}

// The ECS provider's metrics are registered with the gateway's.
func TestRegisterProviderMetrics_TheECSProvidersCollectors(t *testing.T) {
	setECSEnv(t)
	p, err := makeECSProvider(Config{}, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	require.NoError(t, registerProviderMetrics(reg, map[string]providers.Provider{"ecs": p}))
	families, err := reg.Gather()
	require.NoError(t, err)
	var names []string
	for _, f := range families {
		names = append(names, f.GetName())
	}
	assert.Subset(t, names, []string{"quarry_ecs_launch_queued", "quarry_ecs_tasks_starting"})
	assert.Error(t, registerProviderMetrics(reg, map[string]providers.Provider{"ecs": p}), "twice is refused")
}

func TestMakeECSProvider_BadValueNamesTheVariable(t *testing.T) {
	tests := []struct {
		name, variable, value, want string
	}{
		{"no subnets", "QUARRY_ECS_SUBNETS", "", "Subnets"},
		{"bad security group", "QUARRY_ECS_SECURITY_GROUPS", "default", "SecurityGroups"},
		{"short key", "QUARRY_ECS_TOKEN_KEY", "abcd", "QUARRY_ECS_TOKEN_KEY"},
		{"bad strategy", "QUARRY_ECS_CAPACITY_PROVIDER", "FARGATE:many", "CapacityProvider"},
		{"bad duration", "QUARRY_ECS_START_TIMEOUT", "soon", "QUARRY_ECS"},
		{"bad register rate", "QUARRY_ECS_REGISTER_RATE", "-1", "RegisterRate"},
		{"bad family prefix", "QUARRY_ECS_FAMILY_PREFIX", "quarry/", "FamilyPrefix"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			setECSEnv(t)
			t.Setenv(tt.variable, tt.value)
			_, err := makeECSProvider(Config{}, slog.New(slog.DiscardHandler))
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
}

// fakeSecrets is a secretReader with a scriptable answer.
type fakeSecrets struct {
	get func(in *secretsmanager.GetSecretValueInput) (*secretsmanager.GetSecretValueOutput, error)
}

func (f fakeSecrets) GetSecretValue(_ context.Context, in *secretsmanager.GetSecretValueInput, _ ...func(*secretsmanager.Options)) (*secretsmanager.GetSecretValueOutput, error) {
	return f.get(in)
}

func TestReadSecret(t *testing.T) {
	arn := "arn:aws:secretsmanager:us-east-1:123456789012:secret:k"
	got, err := readSecret(context.Background(), fakeSecrets{get: func(in *secretsmanager.GetSecretValueInput) (*secretsmanager.GetSecretValueOutput, error) {
		assert.Equal(t, arn, aws.ToString(in.SecretId))
		return &secretsmanager.GetSecretValueOutput{SecretString: aws.String("abab")}, nil
	}}, arn)
	require.NoError(t, err)
	assert.Equal(t, "abab", got)

	_, err = readSecret(context.Background(), fakeSecrets{get: func(*secretsmanager.GetSecretValueInput) (*secretsmanager.GetSecretValueOutput, error) {
		return &secretsmanager.GetSecretValueOutput{SecretBinary: []byte{1}}, nil
	}}, arn)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no string value")

	_, err = readSecret(context.Background(), fakeSecrets{get: func(*secretsmanager.GetSecretValueInput) (*secretsmanager.GetSecretValueOutput, error) {
		return nil, assert.AnError
	}}, arn)
	require.ErrorIs(t, err, assert.AnError)
	assert.Contains(t, err.Error(), "QUARRY_ECS_TOKEN_KEY_SECRET_ARN")
}
