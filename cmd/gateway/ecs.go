package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	awsecs "github.com/aws/aws-sdk-go-v2/service/ecs"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/kelseyhightower/envconfig"

	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/providers"
	"github.com/quarryhq/quarry/providers/ecs"
)

// ecsSetupTimeout bounds loading the AWS configuration and reading the
// token key secret at start-up.
const ecsSetupTimeout = 30 * time.Second

// ecsEnv is the ECS provider's part of the gateway's configuration, read by
// envconfig with the QUARRY_ECS prefix; each field is the ecs.Config field
// of the same name, and its variable is the name split into words
// (ExecutionRoleARN is QUARRY_ECS_EXECUTION_ROLE_ARN). Lists are comma
// separated. Empty values take ecs.Config's defaults. The region and
// endpoint are the AWS SDK's own (AWS_REGION, AWS_ENDPOINT_URL).
type ecsEnv struct {
	Cluster           string
	Subnets           []string
	SecurityGroups    []string      `split_words:"true"`
	AssignPublicIP    bool          `split_words:"true"`
	ExecutionRoleARN  string        `split_words:"true"`
	TaskRoleARN       string        `split_words:"true"`
	AgentImage        string        `split_words:"true"`
	AgentPort         int           `split_words:"true"`
	LogGroup          string        `split_words:"true"`
	CapacityProvider  string        `split_words:"true"`
	PlatformVersion   string        `split_words:"true"`
	StartTimeout      time.Duration `split_words:"true"`
	MaxStarting       int           `split_words:"true"`
	RunTaskRate       float64       `split_words:"true"`
	RunTaskBurst      int           `split_words:"true"`
	LaunchRate        float64       `split_words:"true"`
	LaunchBurst       int           `split_words:"true"`
	TagRate           float64       `split_words:"true"`
	TagBurst          int           `split_words:"true"`
	MaxAttempts       int           `split_words:"true"`
	PollInterval      time.Duration `split_words:"true"`
	TokenKeySecretARN string        `split_words:"true"`
	// TokenKey (hex) is the key itself; when unset the gateway reads the
	// secret TokenKeySecretARN names (secretsmanager:GetSecretValue).
	TokenKey string `split_words:"true"`

	// Taken from the gateway's own configuration.
	GatewayID string `ignored:"true"` // QUARRY_GATEWAY_ID
}

// makeECSProvider is the providerMakers entry of "ecs": it reads
// QUARRY_ECS_* and the AWS SDK's configuration and builds the provider.
func makeECSProvider(cfg Config, log *slog.Logger) (providers.Provider, error) {
	var env ecsEnv
	if err := envconfig.Process("QUARRY_ECS", &env); err != nil {
		return nil, fmt.Errorf("read QUARRY_ECS_* configuration: %w", err)
	}
	env.GatewayID = cfg.ManagerConfig.WithDefaults().GatewayID
	ctx, cancel := context.WithTimeout(context.Background(), ecsSetupTimeout)
	defer cancel()
	awsCfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		return nil, fmt.Errorf("ecs provider: load AWS configuration: %w", err)
	}
	if awsCfg.Region == "" {
		return nil, errors.New("AWS_REGION: no AWS region is configured (the ECS provider needs one)")
	}
	if env.TokenKey == "" && env.TokenKeySecretARN != "" {
		if env.TokenKey, err = readSecret(ctx, secretsmanager.NewFromConfig(awsCfg), env.TokenKeySecretARN); err != nil {
			return nil, err
		}
	}
	return newECSProvider(env, awsCfg.Region, awsecs.NewFromConfig(awsCfg), log)
}

// secretReader is the part of the Secrets Manager client the gateway uses.
type secretReader interface {
	GetSecretValue(ctx context.Context, in *secretsmanager.GetSecretValueInput, optFns ...func(*secretsmanager.Options)) (*secretsmanager.GetSecretValueOutput, error)
}

// readSecret returns the string value of a secret.
func readSecret(ctx context.Context, sm secretReader, arn string) (string, error) {
	out, err := sm.GetSecretValue(ctx, &secretsmanager.GetSecretValueInput{SecretId: aws.String(arn)})
	if err != nil {
		return "", fmt.Errorf("QUARRY_ECS_TOKEN_KEY_SECRET_ARN: read the token key secret: %w", err)
	}
	if out.SecretString == nil {
		return "", errors.New("QUARRY_ECS_TOKEN_KEY_SECRET_ARN: the secret has no string value (want the key in hex)")
	}
	return *out.SecretString, nil
}

// newECSProvider builds the ECS provider from its configuration on api.
func newECSProvider(env ecsEnv, region string, api ecs.API, log *slog.Logger) (providers.Provider, error) {
	var key []byte
	if env.TokenKey != "" {
		var err error
		if key, err = agentapi.ParseTokenKey(env.TokenKey); err != nil {
			return nil, fmt.Errorf("QUARRY_ECS_TOKEN_KEY (or its secret): %w", err)
		}
	}
	p, err := ecs.New(ecs.Config{
		Cluster:           env.Cluster,
		GatewayID:         env.GatewayID,
		Subnets:           env.Subnets,
		SecurityGroups:    env.SecurityGroups,
		AssignPublicIP:    env.AssignPublicIP,
		ExecutionRoleARN:  env.ExecutionRoleARN,
		TaskRoleARN:       env.TaskRoleARN,
		AgentImage:        env.AgentImage,
		TokenKey:          key,
		TokenKeySecretARN: env.TokenKeySecretARN,
		AgentPort:         env.AgentPort,
		LogGroup:          env.LogGroup,
		LogRegion:         region,
		CapacityProvider:  env.CapacityProvider,
		PlatformVersion:   env.PlatformVersion,
		StartTimeout:      env.StartTimeout,
		MaxStarting:       env.MaxStarting,
		RunTaskRate:       env.RunTaskRate,
		RunTaskBurst:      env.RunTaskBurst,
		LaunchRate:        env.LaunchRate,
		LaunchBurst:       env.LaunchBurst,
		TagRate:           env.TagRate,
		TagBurst:          env.TagBurst,
		MaxAttempts:       env.MaxAttempts,
		PollInterval:      env.PollInterval,
	}, api, log)
	if err != nil {
		return nil, fmt.Errorf("QUARRY_ECS_* (fields named as the variables, split into words): %w", err)
	}
	return p, nil
}
