package main

import (
	"fmt"

	"github.com/kelseyhightower/envconfig"

	"github.com/quarryhq/quarry/envs"
	"github.com/quarryhq/quarry/warmpool"
)

// EnvsConfig is the env API's part of the gateway's configuration
// (docs/ENVS.md). Without either variable the env routes answer 404.
type EnvsConfig struct {
	// File is the env registry file (YAML or JSON).
	File string `envconfig:"QUARRY_ENVS_FILE"`
	// Doc is the registry document itself (Lambda has no file); exclusive
	// with File.
	Doc string `envconfig:"QUARRY_ENVS"`
}

// loadEnvs reads QUARRY_ENVS_FILE or QUARRY_ENVS and returns the env
// registry (nil when neither is set). Every env's pool must be one of
// pools.
func loadEnvs(pools []warmpool.PoolConfig) (*envs.Registry, error) {
	var cfg EnvsConfig
	if err := envconfig.Process("", &cfg); err != nil {
		return nil, fmt.Errorf("read QUARRY_ENVS* configuration: %w", err)
	}
	return buildEnvs(cfg, pools)
}

// buildEnvs is loadEnvs after the variables were read.
func buildEnvs(cfg EnvsConfig, pools []warmpool.PoolConfig) (*envs.Registry, error) {
	var (
		reg *envs.Registry
		err error
	)
	switch {
	case cfg.File != "" && cfg.Doc != "":
		return nil, fmt.Errorf("QUARRY_ENVS_FILE and QUARRY_ENVS: set one, not both")
	case cfg.File != "":
		if reg, err = envs.LoadRegistry(cfg.File); err != nil {
			return nil, fmt.Errorf("QUARRY_ENVS_FILE: %w", err)
		}
	case cfg.Doc != "":
		if reg, err = envs.ParseRegistry([]byte(cfg.Doc)); err != nil {
			return nil, fmt.Errorf("QUARRY_ENVS: %w", err)
		}
	default:
		return nil, nil
	}
	known := poolNames(pools)
	for _, s := range reg.List() {
		if s.Pool != "" && !known[s.Pool] { // an env of an image is checked when it is made
			return nil, fmt.Errorf("env registry: env %q uses pool %q, which is not in the pools file", s.ID, s.Pool)
		}
	}
	return reg, nil
}
