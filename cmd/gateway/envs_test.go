package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/warmpool"
)

func TestBuildEnvs(t *testing.T) {
	file := filepath.Join(t.TempDir(), "envs.yaml")
	require.NoError(t, os.WriteFile(file, []byte("envs: [{id: game, pool: default, command: [python3, game.py]}]"), 0o600))
	pools := []warmpool.PoolConfig{{Name: "default"}}
	tests := []struct {
		name     string
		cfg      EnvsConfig
		envs     int
		contains string
	}{
		{name: "not configured", cfg: EnvsConfig{}},
		{name: "file", cfg: EnvsConfig{File: file}, envs: 1},
		{name: "document", cfg: EnvsConfig{Doc: `{"envs": [{"id": "a", "pool": "default", "command": ["x"]}, {"id": "b", "pool": "default", "command": ["y"]}]}`}, envs: 2},
		{name: "both", cfg: EnvsConfig{File: file, Doc: "envs: []"}, contains: "set one, not both"},
		{name: "missing file", cfg: EnvsConfig{File: file + ".nope"}, contains: "QUARRY_ENVS_FILE"},
		{name: "invalid document", cfg: EnvsConfig{Doc: "envs: [{id: a}]"}, contains: "QUARRY_ENVS: envs[0].pool"},
		{name: "unknown pool", cfg: EnvsConfig{Doc: "envs: [{id: a, pool: gpu, command: [x]}]"}, contains: `pool "gpu"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg, err := buildEnvs(tt.cfg, pools)
			if tt.contains != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.contains)
				return
			}
			require.NoError(t, err)
			if tt.envs == 0 {
				assert.Nil(t, reg)
				return
			}
			require.NotNil(t, reg)
			assert.Len(t, reg.List(), tt.envs)
		})
	}
}
