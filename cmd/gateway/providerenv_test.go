package main

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kelseyhightower/envconfig"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/providers/docker"
	"github.com/quarryhq/quarry/providers/ecs"
	"github.com/quarryhq/quarry/warmpool"
)

// envKeys returns the variables envconfig reads into spec, sorted.
func envKeys(t *testing.T, spec any) []string {
	t.Helper()
	var buf bytes.Buffer
	require.NoError(t, envconfig.Usagef("", spec, &buf, "{{range .}}{{usage_key .}}\n{{end}}"))
	keys := strings.Fields(buf.String())
	slices.Sort(keys)
	return keys
}

// unsetEnv unsets every variable envconfig reads into spec for the test, so
// that the caller's environment cannot change what the test sees.
func unsetEnv(t *testing.T, spec any) {
	t.Helper()
	for _, k := range envKeys(t, spec) {
		t.Setenv(k, "") // restores the variable after the test
		require.NoError(t, os.Unsetenv(k))
	}
}

// The provider variables are part of the gateway's interface (docs/CONFIG.md,
// docs/DOCKER.md, docs/ECS.md, deployments): envconfig reads them from the
// tags of docker.Config and ecs.Config, and renaming a field must not
// rename its variable.
func TestProviderConfig_VariableNames(t *testing.T) {
	assert.Equal(t, []string{
		"QUARRY_DOCKER_CONFIG",
		"QUARRY_DOCKER_HOST",
		"QUARRY_DOCKER_IMAGE_BUDGET",
		"QUARRY_DOCKER_LAUNCH_CONCURRENCY",
		"QUARRY_DOCKER_LAYER_IDLE",
		"QUARRY_DOCKER_LAYER_MEDIUM",
		"QUARRY_DOCKER_LAYER_TIMEOUT",
		"QUARRY_DOCKER_NETWORK",
		"QUARRY_DOCKER_PIDS_LIMIT",
		"QUARRY_DOCKER_PULL_CONCURRENCY",
		"QUARRY_DOCKER_PULL_TIMEOUT",
		"QUARRY_DOCKER_START_TIMEOUT",
		"QUARRY_DOCKER_TOKEN_KEY_FILE",
		"QUARRY_DOCKER_USER",
		"QUARRY_DOCKER_WORKDIR",
		"QUARRY_DOCKER_WORKDIR_SIZE_MB",
	}, envKeys(t, &docker.Config{}))
	assert.Equal(t, []string{
		"QUARRY_ECS_AGENT_IMAGE",
		"QUARRY_ECS_AGENT_PORT",
		"QUARRY_ECS_ASSIGN_PUBLIC_IP",
		"QUARRY_ECS_CAPACITY_PROVIDER",
		"QUARRY_ECS_CLUSTER",
		"QUARRY_ECS_DESCRIBE_BURST",
		"QUARRY_ECS_DESCRIBE_RATE",
		"QUARRY_ECS_EVENTS_QUEUE_URL",
		"QUARRY_ECS_EXECUTION_ROLE_ARN",
		"QUARRY_ECS_FAMILY_PREFIX",
		"QUARRY_ECS_LAUNCH_BURST",
		"QUARRY_ECS_LAUNCH_RATE",
		"QUARRY_ECS_LOG_GROUP",
		"QUARRY_ECS_MAX_ATTEMPTS",
		"QUARRY_ECS_MAX_QUEUED",
		"QUARRY_ECS_MAX_STARTING",
		"QUARRY_ECS_PLATFORM_VERSION",
		"QUARRY_ECS_POLL_INTERVAL",
		"QUARRY_ECS_REGISTER_BURST",
		"QUARRY_ECS_REGISTER_RATE",
		"QUARRY_ECS_RUN_TASK_BURST",
		"QUARRY_ECS_RUN_TASK_RATE",
		"QUARRY_ECS_SECURITY_GROUPS",
		"QUARRY_ECS_START_TIMEOUT",
		"QUARRY_ECS_SUBNETS",
		"QUARRY_ECS_TAG_BURST",
		"QUARRY_ECS_TAG_RATE",
		"QUARRY_ECS_TASK_ROLE_ARN",
		"QUARRY_ECS_TOKEN_KEY",
		"QUARRY_ECS_TOKEN_KEY_SECRET_ARN",
	}, envKeys(t, &ecsEnv{}))
}

// Each variable lands in its own field, parsed as its type.
func TestDockerConfig_EachVariableSetsItsField(t *testing.T) {
	unsetEnv(t, &docker.Config{})
	for k, v := range map[string]string{
		"QUARRY_DOCKER_HOST":               "tcp://127.0.0.1:2375",
		"QUARRY_DOCKER_USER":               "1000:1001",
		"QUARRY_DOCKER_WORKDIR":            "/work",
		"QUARRY_DOCKER_WORKDIR_SIZE_MB":    "256",
		"QUARRY_DOCKER_NETWORK":            "host",
		"QUARRY_DOCKER_PIDS_LIMIT":         "512",
		"QUARRY_DOCKER_START_TIMEOUT":      "90s",
		"QUARRY_DOCKER_LAUNCH_CONCURRENCY": "8",
		"QUARRY_DOCKER_TOKEN_KEY_FILE":     "/keys/docker.key",
		"QUARRY_DOCKER_CONFIG":             "/etc/quarry/docker",
		"QUARRY_DOCKER_PULL_CONCURRENCY":   "6",
		"QUARRY_DOCKER_PULL_TIMEOUT":       "20m",
		"QUARRY_DOCKER_IMAGE_BUDGET":       "20Gi",
	} {
		t.Setenv(k, v)
	}
	got, err := dockerConfig(Config{AgentBinary: "bin/execagent", DataDir: "/data", ManagerConfig: warmpool.Config{GatewayID: "gw-1"}})
	require.NoError(t, err)
	bin, err := filepath.Abs("bin/execagent")
	require.NoError(t, err)
	assert.Equal(t, docker.Config{
		Host: "tcp://127.0.0.1:2375", AgentBinary: bin, TokenKeyFile: "/keys/docker.key", GatewayID: "gw-1", RelayDir: "/data/relay",
		User: "1000:1001", Workdir: "/work", WorkdirSizeMB: 256, Network: "host", PidsLimit: 512,
		StartTimeout: 90 * time.Second, LaunchConcurrency: 8,
		DockerConfig: "/etc/quarry/docker", PullConcurrency: 6, PullTimeout: 20 * time.Minute, ImageBudget: 20 << 30,
		LedgerFile: "/data/docker/images.json",
	}, got)
}

// With no QUARRY_DOCKER_* set, the provider runs on the defaults that
// docs/DOCKER.md lists, its token key in $QUARRY_DATA_DIR/docker/token.key
// and the gateway id QUARRY_GATEWAY_ID's default; an unprefixed USER or
// HOST in the environment is never read.
func TestDockerConfig_Defaults(t *testing.T) {
	unsetEnv(t, &docker.Config{})
	t.Setenv("USER", "root")
	t.Setenv("HOST", "tcp://192.0.2.1:2375")
	t.Setenv("NETWORK", "none")
	got, err := dockerConfig(Config{AgentBinary: "/opt/execagent", DataDir: "/data"})
	require.NoError(t, err)
	assert.Equal(t, docker.Config{
		Host: "unix:///var/run/docker.sock", AgentBinary: "/opt/execagent", TokenKeyFile: "/data/docker/token.key", RelayDir: "/data/relay",
		GatewayID: "quarry", User: "65534:65534", Workdir: "/home/sandbox", Network: "bridge", PidsLimit: 1024,
		StartTimeout: 60 * time.Second, LaunchConcurrency: 4,
		PullConcurrency: 4, PullTimeout: 10 * time.Minute, LedgerFile: "/data/docker/images.json",
		LayerTimeout: 5 * time.Minute, LayerIdle: 10 * time.Minute, LayerMedium: "memory",
	}, got.WithDefaults())
}

func TestDockerConfig_BadValueNamesTheVariable(t *testing.T) {
	for k, v := range map[string]string{
		"QUARRY_DOCKER_PIDS_LIMIT":   "many",
		"QUARRY_DOCKER_IMAGE_BUDGET": "lots",
		"QUARRY_DOCKER_PULL_TIMEOUT": "soon",
	} {
		t.Run(k, func(t *testing.T) {
			unsetEnv(t, &docker.Config{})
			t.Setenv(k, v)
			_, err := dockerConfig(Config{AgentBinary: "/opt/execagent", DataDir: "/data"})
			require.Error(t, err)
			assert.Contains(t, err.Error(), k)
		})
	}
}

// The image budget reads bytes or a size with a binary unit.
func TestDockerConfig_ImageBudgetSizes(t *testing.T) {
	for v, want := range map[string]docker.Bytes{"1073741824": 1 << 30, "20Gi": 20 << 30, "512Mi": 512 << 20, "20G": 20 << 30, "0": 0} {
		unsetEnv(t, &docker.Config{})
		t.Setenv("QUARRY_DOCKER_IMAGE_BUDGET", v)
		got, err := dockerConfig(Config{AgentBinary: "/opt/execagent", DataDir: "/data"})
		require.NoError(t, err, v)
		assert.Equal(t, want, got.ImageBudget, v)
	}
}

func TestECSConfig_EachVariableSetsItsField(t *testing.T) {
	unsetEnv(t, &ecsEnv{})
	key := strings.Repeat("ab", 32)
	for k, v := range map[string]string{
		"QUARRY_ECS_CLUSTER":              "quarry",
		"QUARRY_ECS_SUBNETS":              "subnet-0123456789abcdef0,subnet-0123456789abcdef1",
		"QUARRY_ECS_SECURITY_GROUPS":      "sg-0123456789abcdef0",
		"QUARRY_ECS_ASSIGN_PUBLIC_IP":     "true",
		"QUARRY_ECS_EXECUTION_ROLE_ARN":   "arn:aws:iam::123456789012:role/exec",
		"QUARRY_ECS_TASK_ROLE_ARN":        "arn:aws:iam::123456789012:role/task",
		"QUARRY_ECS_AGENT_IMAGE":          "agent:1",
		"QUARRY_ECS_AGENT_PORT":           "9000",
		"QUARRY_ECS_LOG_GROUP":            "/quarry",
		"QUARRY_ECS_CAPACITY_PROVIDER":    "FARGATE_SPOT:3,FARGATE:1",
		"QUARRY_ECS_PLATFORM_VERSION":     "1.4.0",
		"QUARRY_ECS_START_TIMEOUT":        "7m",
		"QUARRY_ECS_MAX_STARTING":         "50",
		"QUARRY_ECS_MAX_QUEUED":           "500",
		"QUARRY_ECS_DESCRIBE_RATE":        "12.5",
		"QUARRY_ECS_DESCRIBE_BURST":       "13",
		"QUARRY_ECS_EVENTS_QUEUE_URL":     "https://sqs.eu-west-1.amazonaws.com/123456789012/quarry-ecs-events",
		"QUARRY_ECS_RUN_TASK_RATE":        "5.5",
		"QUARRY_ECS_RUN_TASK_BURST":       "6",
		"QUARRY_ECS_LAUNCH_RATE":          "7.5",
		"QUARRY_ECS_LAUNCH_BURST":         "80",
		"QUARRY_ECS_TAG_RATE":             "9.5",
		"QUARRY_ECS_TAG_BURST":            "11",
		"QUARRY_ECS_MAX_ATTEMPTS":         "4",
		"QUARRY_ECS_POLL_INTERVAL":        "3s",
		"QUARRY_ECS_TOKEN_KEY_SECRET_ARN": "arn:aws:secretsmanager:us-east-1:123456789012:secret:k",
		"QUARRY_ECS_TOKEN_KEY":            key,
	} {
		t.Setenv(k, v)
	}
	env, err := readECSEnv(Config{ManagerConfig: warmpool.Config{GatewayID: "gw-1"}})
	require.NoError(t, err)
	got, err := env.config("eu-west-1")
	require.NoError(t, err)
	assert.Equal(t, ecs.Config{
		Cluster:          "quarry",
		GatewayID:        "gw-1",
		Subnets:          []string{"subnet-0123456789abcdef0", "subnet-0123456789abcdef1"},
		SecurityGroups:   []string{"sg-0123456789abcdef0"},
		AssignPublicIP:   true,
		ExecutionRoleARN: "arn:aws:iam::123456789012:role/exec", TaskRoleARN: "arn:aws:iam::123456789012:role/task",
		AgentImage: "agent:1", AgentPort: 9000,
		TokenKey:          bytes.Repeat([]byte{0xab}, 32),
		TokenKeySecretARN: "arn:aws:secretsmanager:us-east-1:123456789012:secret:k",
		LogGroup:          "/quarry", LogRegion: "eu-west-1",
		CapacityProvider: "FARGATE_SPOT:3,FARGATE:1", PlatformVersion: "1.4.0",
		StartTimeout: 7 * time.Minute, MaxStarting: 50, MaxQueued: 500,
		RunTaskRate: 5.5, RunTaskBurst: 6, LaunchRate: 7.5, LaunchBurst: 80, TagRate: 9.5, TagBurst: 11,
		DescribeRate: 12.5, DescribeBurst: 13,
		MaxAttempts: 4, PollInterval: 3 * time.Second,
		EventsQueueURL: "https://sqs.eu-west-1.amazonaws.com/123456789012/quarry-ecs-events",
	}, got)
}

// With no QUARRY_ECS_* set, the provider runs on the defaults that
// docs/CONFIG.md lists, with the gateway id QUARRY_GATEWAY_ID's default;
// unprefixed variables are never read.
func TestECSConfig_Defaults(t *testing.T) {
	unsetEnv(t, &ecsEnv{})
	t.Setenv("CLUSTER", "other")
	t.Setenv("SUBNETS", "subnet-0123456789abcdef9")
	t.Setenv("AGENT_PORT", "1")
	env, err := readECSEnv(Config{})
	require.NoError(t, err)
	got, err := env.config("us-east-1")
	require.NoError(t, err)
	assert.Equal(t, ecs.Config{
		GatewayID: "quarry", LogRegion: "us-east-1", AgentPort: 8000, CapacityProvider: "FARGATE", PlatformVersion: "LATEST",
		StartTimeout: 5 * time.Minute, MaxStarting: 1900, MaxQueued: 20000,
		RunTaskRate: 20, RunTaskBurst: 20, LaunchRate: 20, LaunchBurst: 100, TagRate: 20, TagBurst: 20,
		DescribeRate: 20, DescribeBurst: 40, RegisterRate: 1, RegisterBurst: 20, FamilyPrefix: "quarry-",
		MaxAttempts: 8, RetryBase: 250 * time.Millisecond, RetryMax: 10 * time.Second, PollInterval: 2 * time.Second,
		EventsWait: 20 * time.Second,
	}, got.WithDefaults())
}
