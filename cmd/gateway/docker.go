package main

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/kelseyhightower/envconfig"

	"github.com/quarryhq/quarry/providers"
	"github.com/quarryhq/quarry/providers/docker"
)

// dockerEnv is the Docker provider's part of the gateway's configuration,
// read by envconfig with the QUARRY_DOCKER prefix; each field is the
// docker.Config field of the same name, and its variable is the name split
// into words: WorkdirSizeMB is QUARRY_DOCKER_WORKDIR_SIZE_MB. (No envconfig
// tags: a tag also reads the unprefixed variable, USER or HOST, when the
// prefixed one is unset.) Empty values take docker.Config's defaults.
type dockerEnv struct {
	Host              string        // QUARRY_DOCKER_HOST, default unix:///var/run/docker.sock
	User              string        // QUARRY_DOCKER_USER, default 65534:65534
	Workdir           string        // QUARRY_DOCKER_WORKDIR, default /home/sandbox
	WorkdirSizeMB     int64         `split_words:"true"` // QUARRY_DOCKER_WORKDIR_SIZE_MB
	Network           string        // QUARRY_DOCKER_NETWORK, default bridge
	PidsLimit         int64         `split_words:"true"` // QUARRY_DOCKER_PIDS_LIMIT, default 1024
	StartTimeout      time.Duration `split_words:"true"` // QUARRY_DOCKER_START_TIMEOUT, default 60s
	LaunchConcurrency int           `split_words:"true"` // QUARRY_DOCKER_LAUNCH_CONCURRENCY, default 4
	// TokenKeyFile defaults to $QUARRY_DATA_DIR/docker/token.key.
	TokenKeyFile string `split_words:"true"` // QUARRY_DOCKER_TOKEN_KEY_FILE

	// Taken from the gateway's own configuration.
	AgentBinary string `ignored:"true"` // QUARRY_AGENT_BINARY (made absolute)
	DataDir     string `ignored:"true"` // QUARRY_DATA_DIR
	GatewayID   string `ignored:"true"` // QUARRY_GATEWAY_ID
}

// makeDockerProvider is the providerMakers entry of "docker": it reads
// QUARRY_DOCKER_* and builds the provider.
func makeDockerProvider(cfg Config, log *slog.Logger) (providers.Provider, error) {
	var env dockerEnv
	if err := envconfig.Process("QUARRY_DOCKER", &env); err != nil {
		return nil, fmt.Errorf("read QUARRY_DOCKER_* configuration: %w", err)
	}
	bin, err := agentBinary(cfg.AgentBinary)
	if err != nil {
		return nil, err
	}
	env.AgentBinary, env.DataDir, env.GatewayID = bin, cfg.DataDir, cfg.ManagerConfig.WithDefaults().GatewayID
	return newDockerProvider(env, log)
}

// newDockerProvider builds the Docker provider from its configuration. It
// connects to the engine (an error names QUARRY_DOCKER_HOST's value).
func newDockerProvider(env dockerEnv, log *slog.Logger) (providers.Provider, error) {
	bin, err := filepath.Abs(env.AgentBinary)
	if err != nil {
		return nil, fmt.Errorf("QUARRY_AGENT_BINARY: %w", err)
	}
	keyFile := env.TokenKeyFile
	if keyFile == "" {
		keyFile = filepath.Join(env.DataDir, "docker", "token.key")
	}
	p, err := docker.New(docker.Config{
		Host:              env.Host,
		AgentBinary:       bin,
		TokenKeyFile:      keyFile,
		GatewayID:         env.GatewayID,
		User:              env.User,
		Workdir:           env.Workdir,
		WorkdirSizeMB:     env.WorkdirSizeMB,
		Network:           env.Network,
		PidsLimit:         env.PidsLimit,
		StartTimeout:      env.StartTimeout,
		LaunchConcurrency: env.LaunchConcurrency,
	}, log)
	if err != nil {
		return nil, fmt.Errorf("QUARRY_DOCKER_* (fields named as the variables, split into words): %w", err)
	}
	return p, nil
}
