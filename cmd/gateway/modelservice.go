package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/kelseyhightower/envconfig"

	"github.com/quarryhq/quarry/internal/secretfile"
	"github.com/quarryhq/quarry/modelservice"
	"github.com/quarryhq/quarry/modelservice/dynamobroker"
	"github.com/quarryhq/quarry/modelservice/membroker"
	"github.com/quarryhq/quarry/warmpool"
)

// RelayConfig is the model relay's configuration (docs/MODELSERVICE.md),
// read by newModelRelay with the QUARRY_ prefix. The embedded
// modelservice.Config carries QUARRY_SANDBOX_GATEWAY_URL and the
// QUARRY_RELAY_* limits.
type RelayConfig struct {
	// Broker is "memory" (one gateway) or "dynamodb" (replicas).
	Broker string `envconfig:"QUARRY_RELAY_BROKER" default:"memory"`
	// Secret keys the relay tokens; replicas must share it. Unset with the
	// memory broker: generated once into $QUARRY_DATA_DIR/relay-secret.
	Secret string `envconfig:"QUARRY_RELAY_SECRET"`
	// Retention is how long exchanges stay in transcripts after their
	// request's deadline.
	Retention time.Duration `envconfig:"QUARRY_RELAY_RETENTION" default:"24h"`
	// MemoryMaxBytes bounds the bodies the memory broker holds.
	MemoryMaxBytes int64 `envconfig:"QUARRY_RELAY_MEMORY_MAX_BYTES" default:"1073741824"`

	modelservice.Config
}

// relayDynamoConfig is the DynamoDB broker's configuration: envconfig
// fills dynamobroker.Config from QUARRY_RELAY_DYNAMODB_* (its tags name
// the variables; unset ones take its defaults), with the relay's
// retention; Validate's error names the variable.
func relayDynamoConfig(rc RelayConfig) (dynamobroker.Config, error) {
	var dc dynamobroker.Config
	if err := envconfig.Process("", &dc); err != nil {
		return dc, fmt.Errorf("read QUARRY_RELAY_DYNAMODB_* configuration: %w", err)
	}
	dc.Retention = rc.Retention
	return dc, dc.Validate()
}

// relaySecretFile is where the generated relay secret is kept.
const relaySecretFile = "relay-secret"

// Validate checks the values envconfig could parse; errors name the
// variable.
func (c RelayConfig) Validate() error {
	switch c.Broker {
	case "memory":
	case "dynamodb":
		if c.Secret == "" {
			return errors.New("QUARRY_RELAY_SECRET: required with QUARRY_RELAY_BROKER=dynamodb (every replica must verify every relay token)")
		}
	default:
		return fmt.Errorf("QUARRY_RELAY_BROKER: unknown broker %q (known: memory, dynamodb)", c.Broker)
	}
	if c.Secret != "" && len(c.Secret) < modelservice.MinSecretLen {
		return fmt.Errorf("QUARRY_RELAY_SECRET: %d characters; at least %d are required", len(c.Secret), modelservice.MinSecretLen)
	}
	if c.Retention <= 0 {
		return fmt.Errorf("QUARRY_RELAY_RETENTION: %s is not a positive duration", c.Retention)
	}
	if c.MemoryMaxBytes < 1 {
		return fmt.Errorf("QUARRY_RELAY_MEMORY_MAX_BYTES: %d; at least 1", c.MemoryMaxBytes)
	}
	return nil
}

// newModelRelay reads the relay's configuration (QUARRY_RELAY_*,
// QUARRY_SANDBOX_GATEWAY_URL), opens its broker and builds the relay
// Service for the gateway (gateway.Deps.Model), whose LeaseEnv is
// warmpool.Deps.LeaseEnv. addr is QUARRY_ADDR: without
// QUARRY_SANDBOX_GATEWAY_URL, sandboxes reach the gateway at http://addr
// (127.0.0.1 for an unspecified host; with port 0 they cannot, and a
// warning says so). leases is the lease store. The
// returned function stops the relay and closes its broker.
func newModelRelay(ctx context.Context, dataDir, addr string, pools []warmpool.PoolConfig, leases modelservice.LeaseReader, log *slog.Logger) (*modelservice.Service, func(context.Context) error, error) {
	var rc RelayConfig
	if err := envconfig.Process("", &rc); err != nil {
		return nil, nil, fmt.Errorf("read QUARRY_RELAY_* configuration: %w", err)
	}
	if err := rc.Validate(); err != nil {
		return nil, nil, err
	}
	log = log.With("component", "model-relay")
	// Set explicitly, it is every sandbox's relay address; else sandboxes
	// whose provider names an address of its own (Docker: the agent's
	// forwarder to the relay socket) use that.
	rc.SandboxURLFixed = rc.SandboxURL != ""
	if rc.SandboxURL == "" {
		u, err := sandboxURL(addr)
		if err != nil {
			return nil, nil, err
		}
		if strings.HasSuffix(u, ":0") {
			log.Warn("QUARRY_ADDR's port is 0: sandboxes cannot reach the model relay; set QUARRY_SANDBOX_GATEWAY_URL")
		}
		rc.SandboxURL = u
	}
	secret := rc.Secret
	if secret == "" {
		var err error
		if secret, err = loadOrCreateRelaySecret(dataDir); err != nil {
			return nil, nil, err
		}
	}
	tokens, err := modelservice.NewTokens([]byte(secret))
	if err != nil {
		return nil, nil, fmt.Errorf("QUARRY_RELAY_SECRET: %w", err)
	}
	var broker modelservice.Broker
	switch rc.Broker {
	case "dynamodb":
		dc, err := relayDynamoConfig(rc)
		if err != nil {
			return nil, nil, err
		}
		awsCfg, err := config.LoadDefaultConfig(ctx)
		if err != nil {
			return nil, nil, fmt.Errorf("load AWS configuration: %w", err)
		}
		if awsCfg.Region == "" {
			return nil, nil, errors.New("AWS_REGION: no AWS region is configured (QUARRY_RELAY_BROKER=dynamodb)")
		}
		broker = dynamobroker.New(dc, dynamodb.NewFromConfig(awsCfg), log)
	default:
		broker = membroker.New(membroker.Config{Retention: rc.Retention, MaxBytes: rc.MemoryMaxBytes})
	}
	svc, err := modelservice.New(rc.Config, modelservice.Deps{Broker: broker, Leases: leases, Tokens: tokens, Pools: pools, Logger: log})
	if err != nil {
		_ = broker.Close(ctx)
		return nil, nil, err
	}
	if err := svc.Start(ctx); err != nil {
		_ = broker.Close(ctx)
		return nil, nil, err
	}
	log.Info("model relay ready", "broker", rc.Broker, "sandbox_url", svc.Config().SandboxURL)
	return svc, func(ctx context.Context) error {
		return errors.Join(svc.Close(ctx), broker.Close(ctx))
	}, nil
}

// sandboxURL is the gateway's URL for sandboxes on this host, from
// QUARRY_ADDR (useless to sandboxes when its port is 0: the caller warns).
func sandboxURL(addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("QUARRY_ADDR: want host:port, got %q", addr)
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port), nil
}

// loadOrCreateRelaySecret returns the relay secret saved in
// dir/relay-secret, generating and saving one (mode 0600) on first use.
func loadOrCreateRelaySecret(dir string) (string, error) {
	secret, _, err := secretfile.LoadOrCreate(filepath.Join(dir, relaySecretFile),
		func() (string, error) { return modelservice.NewSecret(), nil },
		func(s string) error {
			if len(s) < modelservice.MinSecretLen {
				return fmt.Errorf("shorter than %d characters", modelservice.MinSecretLen)
			}
			return nil
		})
	if err != nil {
		return "", fmt.Errorf("relay secret file: %w (delete it or set QUARRY_RELAY_SECRET)", err)
	}
	return secret, nil
}
