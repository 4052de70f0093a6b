package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	awsecs "github.com/aws/aws-sdk-go-v2/service/ecs"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/kelseyhightower/envconfig"

	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/providers"
	"github.com/quarryhq/quarry/providers/ecs"
	"github.com/quarryhq/quarry/providers/ecs/ddbrate"
	"github.com/quarryhq/quarry/warmpool/dynamostore"
)

// ecsSetupTimeout bounds loading the AWS configuration and reading the
// token key secret at start-up.
const ecsSetupTimeout = 30 * time.Second

// ecsEnv is the ECS provider's part of the gateway's configuration, read by
// envconfig: ecs.Config, whose tags name its QUARRY_ECS_* variables (unset
// ones take ecs.Config's defaults), and the token key in hex. The region and
// endpoint are the AWS SDK's own (AWS_REGION, AWS_ENDPOINT_URL).
type ecsEnv struct {
	ecs.Config
	// TokenKeyHex is the key itself (ecs.Config.TokenKey holds its bytes);
	// when unset the gateway reads the secret TokenKeySecretARN names
	// (secretsmanager:GetSecretValue).
	TokenKeyHex string `envconfig:"QUARRY_ECS_TOKEN_KEY"`
}

// readECSEnv reads QUARRY_ECS_* and takes the gateway id from the gateway's
// own configuration (QUARRY_GATEWAY_ID).
func readECSEnv(cfg Config) (ecsEnv, error) {
	var env ecsEnv
	if err := envconfig.Process("", &env); err != nil {
		return env, fmt.Errorf("read QUARRY_ECS_* configuration: %w", err)
	}
	env.GatewayID = cfg.ManagerConfig.WithDefaults().GatewayID
	return env, nil
}

// makeECSProvider is the providerMakers entry of "ecs": it reads
// QUARRY_ECS_* and the AWS SDK's configuration and builds the provider.
func makeECSProvider(cfg Config, log *slog.Logger) (providers.Provider, error) {
	env, err := readECSEnv(cfg)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), ecsSetupTimeout)
	defer cancel()
	awsCfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		return nil, fmt.Errorf("ecs provider: load AWS configuration: %w", err)
	}
	if awsCfg.Region == "" {
		return nil, errors.New("AWS_REGION: no AWS region is configured (the ECS provider needs one)")
	}
	if env.TokenKeyHex == "" && env.TokenKeySecretARN != "" {
		if env.TokenKeyHex, err = readSecret(ctx, secretsmanager.NewFromConfig(awsCfg), env.TokenKeySecretARN); err != nil {
			return nil, err
		}
	}
	deps := ecs.Deps{Logger: log}
	if env.EventsQueueURL != "" {
		deps.SQS = sqs.NewFromConfig(awsCfg)
	}
	if deps.Rate, deps.Register, err = sharedRates(ctx, cfg, env.Config, log); err != nil {
		return nil, err
	}
	return newECSProvider(env, awsCfg.Region, awsecs.NewFromConfig(awsCfg), deps)
}

// sharedRates returns the ECS rates every replica shares when the lease
// store is DynamoDB (ddbrate: items of the leases table): RunTask's, at the
// QUARRY_ECS_RUN_TASK_* and QUARRY_ECS_LAUNCH_* rates, and
// RegisterTaskDefinition's (calls only), at QUARRY_ECS_REGISTER_*; or nils
// (the provider's in-process buckets: the embedded store has one replica).
func sharedRates(ctx context.Context, cfg Config, c ecs.Config, log *slog.Logger) (run, register ecs.RateLimiter, err error) {
	if cfg.Store != "dynamodb" {
		return nil, nil, nil
	}
	awsCfg, err := loadAWS(ctx, cfg.DynamoConfig)
	if err != nil {
		return nil, nil, fmt.Errorf("ecs provider: shared rates: %w", err)
	}
	c = c.WithDefaults()
	db := dynamodb.NewFromConfig(awsCfg)
	table := cmp.Or(cfg.LeasesTable, dynamostore.DefaultLeasesTable)
	runs, err := ddbrate.New(db, ddbrate.Config{
		Table: table, CallRate: c.RunTaskRate, CallBurst: c.RunTaskBurst, TaskRate: c.LaunchRate, TaskBurst: c.LaunchBurst,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("QUARRY_ECS_RUN_TASK_*, QUARRY_ECS_LAUNCH_*: %w", err)
	}
	registers, err := ddbrate.New(db, ddbrate.Config{
		Table: table, Key: ddbrate.RegisterKey, CallRate: c.RegisterRate, CallBurst: c.RegisterBurst,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("QUARRY_ECS_REGISTER_*: %w", err)
	}
	log.Info("ecs provider: the RunTask and RegisterTaskDefinition rates are shared by every replica", "table", table,
		"run_task_rate", c.RunTaskRate, "launch_rate", c.LaunchRate, "register_rate", c.RegisterRate)
	return runs, registers, nil
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

// newECSProvider builds the ECS provider from its configuration on api:
// one that also reads the task state change events
// (providers.Watcher) when QUARRY_ECS_EVENTS_QUEUE_URL is set.
func newECSProvider(env ecsEnv, region string, api ecs.API, deps ecs.Deps) (providers.Provider, error) {
	c, err := env.config(region)
	if err != nil {
		return nil, err
	}
	var p providers.Provider
	if c.EventsQueueURL != "" {
		p, err = ecs.NewWatching(c, api, deps)
	} else {
		p, err = ecs.New(c, api, deps)
	}
	if err != nil {
		return nil, fmt.Errorf("QUARRY_ECS_* (fields named as the variables, split into words): %w", err)
	}
	return p, nil
}

// config returns env's ecs.Config with the token key parsed from hex and
// the log region set to the AWS SDK's region.
func (env ecsEnv) config(region string) (ecs.Config, error) {
	c := env.Config
	if env.TokenKeyHex != "" {
		var err error
		if c.TokenKey, err = agentapi.ParseTokenKey(env.TokenKeyHex); err != nil {
			return c, fmt.Errorf("QUARRY_ECS_TOKEN_KEY (or its secret): %w", err)
		}
	}
	c.LogRegion = region
	return c, nil
}
