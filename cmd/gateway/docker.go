package main

import (
	"fmt"
	"log/slog"
	"path/filepath"

	"github.com/kelseyhightower/envconfig"

	"github.com/quarryhq/quarry/providers"
	"github.com/quarryhq/quarry/providers/docker"
)

// makeDockerProvider is the providerMakers entry of "docker": it reads its
// configuration (dockerConfig) and builds the provider, which connects to
// the engine (an error names QUARRY_DOCKER_HOST's value).
func makeDockerProvider(cfg Config, log *slog.Logger) (providers.Provider, error) {
	dc, err := dockerConfig(cfg)
	if err != nil {
		return nil, err
	}
	p, err := docker.New(dc, log)
	if err != nil {
		return nil, fmt.Errorf("QUARRY_DOCKER_* (fields named as the variables, split into words): %w", err)
	}
	return p, nil
}

// dockerConfig is the Docker provider's configuration: envconfig fills
// docker.Config from QUARRY_DOCKER_* (its tags name the variables; unset
// ones take docker.Config's defaults), and the gateway's own configuration
// gives the agent binary (QUARRY_AGENT_BINARY, made absolute), the gateway
// id (QUARRY_GATEWAY_ID), the token key file's default place,
// $QUARRY_DATA_DIR/docker/token.key, the image ledger's,
// $QUARRY_DATA_DIR/docker/images.json, and the model relay socket's
// directory (relayDir), which containers get mounted.
func dockerConfig(cfg Config) (docker.Config, error) {
	var dc docker.Config
	if err := envconfig.Process("", &dc); err != nil {
		return dc, fmt.Errorf("read QUARRY_DOCKER_* configuration: %w", err)
	}
	bin, err := agentBinary(cfg.AgentBinary)
	if err != nil {
		return dc, err
	}
	if dc.AgentBinary, err = filepath.Abs(bin); err != nil {
		return dc, fmt.Errorf("QUARRY_AGENT_BINARY: %w", err)
	}
	if dc.TokenKeyFile == "" {
		dc.TokenKeyFile = filepath.Join(cfg.DataDir, "docker", "token.key")
	}
	dc.LedgerFile = filepath.Join(cfg.DataDir, "docker", "images.json")
	dc.GatewayID = cfg.ManagerConfig.WithDefaults().GatewayID
	if dc.RelayDir, err = relayDir(cfg.DataDir); err != nil {
		return dc, err
	}
	return dc, nil
}
