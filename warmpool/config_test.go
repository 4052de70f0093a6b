package warmpool_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/internal/badinput"
	"github.com/quarryhq/quarry/warmpool"
)

func TestParsePools_YAMLAndJSONWithDefaults(t *testing.T) {
	tests := []struct {
		name string
		doc  string
	}{
		{name: "yaml", doc: "pools:\n  - name: default\n    min_warm: 2\n    max_total: 16\n    memory: 2Gi\n"},
		{name: "json", doc: `{"pools": [{"name": "default", "min_warm": 2, "max_total": 16, "memory": 2048}]}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pools, err := warmpool.ParsePools([]byte(tc.doc))
			require.NoError(t, err)
			require.Len(t, pools, 1)
			p := pools[0]
			assert.Equal(t, "default", p.Name)
			assert.Empty(t, p.Provider, "an empty provider is left for cmd/ to default")
			assert.Equal(t, 2, p.MinWarm)
			assert.Equal(t, 16, p.MaxTotal)
			assert.Equal(t, warmpool.MiB(2048), p.Memory)
			assert.Equal(t, warmpool.DefaultCPU, p.CPU)
			assert.Equal(t, warmpool.DefaultLeaseSeconds, p.DefaultLeaseSeconds)
			assert.Equal(t, warmpool.DefaultMaxLeaseSeconds, p.MaxLeaseSeconds)
			assert.Equal(t, warmpool.DefaultStartupTimeoutSeconds, p.StartupTimeoutSeconds)
		})
	}
}

func TestParsePools_RejectsWithActionableMessages(t *testing.T) {
	tests := []struct {
		name string
		doc  string
		want []string // substrings of the error
	}{
		{name: "empty file", doc: "  \n", want: []string{"pools", "empty"}},
		{name: "no pools", doc: "pools: []", want: []string{"at least one pool"}},
		{name: "unknown field", doc: "pools:\n  - name: a\n    max_total: 1\n    min_warmm: 1\n", want: []string{`unknown field "min_warmm"`}},
		{name: "unknown top-level field", doc: "pool: []", want: []string{`unknown field "pool"`}},
		{name: "duplicate key", doc: "pools:\n  - name: a\n    max_total: 1\n    max_total: 2\n", want: []string{"max_total"}},
		{name: "bad name", doc: "pools:\n  - name: Big_Pool\n    max_total: 1\n", want: []string{"pools[0].name", "lowercase"}},
		{name: "min_warm above max_total", doc: "pools:\n  - name: a\n    min_warm: 5\n    max_total: 2\n", want: []string{"pools[0].min_warm", "above max_total 2"}},
		{name: "no max_total", doc: "pools:\n  - name: a\n", want: []string{"pools[0].max_total", "between 1 and"}},
		{name: "negative min_warm", doc: "pools:\n  - name: a\n    min_warm: -1\n    max_total: 2\n", want: []string{"pools[0].min_warm", "negative"}},
		{name: "default lease above max", doc: "pools:\n  - name: a\n    max_total: 2\n    default_lease_seconds: 700\n    max_lease_seconds: 600\n", want: []string{"pools[0].default_lease_seconds", "max_lease_seconds (600)"}},
		{name: "max lease too long", doc: "pools:\n  - name: a\n    max_total: 2\n    max_lease_seconds: 99999999\n", want: []string{"pools[0].max_lease_seconds"}},
		{name: "duplicate names", doc: "pools:\n  - name: a\n    max_total: 2\n  - name: b\n    max_total: 2\n  - name: a\n    max_total: 2\n", want: []string{"pools[2].name", "pools[0]", "unique"}},
		{name: "bad memory", doc: "pools:\n  - name: a\n    max_total: 2\n    memory: lots\n", want: []string{`"lots"`, "512Mi"}},
		{name: "bad disk", doc: "pools:\n  - name: a\n    max_total: 2\n    disk: lots\n", want: []string{"disk:", `"lots"`, "512Mi"}},
		{name: "disk too large", doc: "pools:\n  - name: a\n    max_total: 2\n    disk: 2Ti\n", want: []string{"pools[0].disk", "between 1 MiB and 1048576 MiB"}},
		{name: "cpu out of range", doc: "pools:\n  - name: a\n    max_total: 2\n    cpu: 100\n", want: []string{"pools[0].cpu"}},
		{name: "reserved label", doc: "pools:\n  - name: a\n    max_total: 2\n    labels: {quarry.pool: x}\n", want: []string{"pools[0].labels", "reserved"}},
		{name: "bad env key", doc: "pools:\n  - name: a\n    max_total: 2\n    env: {\"A-B\": x}\n", want: []string{"pools[0].env", `"A-B"`}},
		{name: "several problems at once", doc: "pools:\n  - name: A\n    max_total: 0\n", want: []string{"pools[0].name", "pools[0].max_total"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := warmpool.ParsePools([]byte(tc.doc))
			require.Error(t, err)
			for _, w := range tc.want {
				assert.Contains(t, err.Error(), w)
			}
		})
	}
}

func TestParsePools_Disk(t *testing.T) {
	tests := []struct {
		name string
		doc  string
		want warmpool.DiskMiB
	}{
		{name: "unset is the provider's default", doc: "pools:\n  - name: a\n    max_total: 1\n", want: 0},
		{name: "yaml with a unit", doc: "pools:\n  - name: a\n    max_total: 1\n    disk: 2Gi\n", want: 2048},
		{name: "json in MiB", doc: `{"pools": [{"name": "a", "max_total": 1, "disk": 16}]}`, want: 16},
		{name: "json string", doc: `{"pools": [{"name": "a", "max_total": 1, "disk": "512Mi"}]}`, want: 512},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pools, err := warmpool.ParsePools([]byte(tc.doc))
			require.NoError(t, err)
			require.Len(t, pools, 1)
			assert.Equal(t, tc.want, pools[0].Disk)
			assert.Equal(t, warmpool.DefaultMemory, pools[0].Memory, "disk is separate from memory")
		})
	}
}

func TestParsePools_ValidationErrorsNameTheField(t *testing.T) {
	_, err := warmpool.ParsePools([]byte("pools:\n  - name: a\n    min_warm: 3\n    max_total: 1\n"))
	var ve *badinput.Error
	require.True(t, errors.As(err, &ve))
	assert.Equal(t, "pools[0].min_warm", ve.Field)
}

func TestMiB_UnmarshalJSON(t *testing.T) {
	tests := []struct {
		in      string
		want    warmpool.MiB
		wantErr bool
	}{
		{in: `512`, want: 512},
		{in: `"512Mi"`, want: 512},
		{in: `"2Gi"`, want: 2048},
		{in: `"512m"`, want: 512},
		{in: `"1g"`, want: 1024},
		{in: `"1G"`, want: 1024},
		{in: `"1024"`, want: 1024},
		{in: `"4GiB"`, want: 4096},
		{in: `" 3 Gi "`, want: 3072},
		{in: `"1Ti"`, want: 1 << 20},
		{in: `1.5`, wantErr: true},
		{in: `-1`, wantErr: true},
		{in: `"1.5Gi"`, wantErr: true},
		{in: `"512Ki"`, wantErr: true},
		{in: `"Gi"`, wantErr: true},
		{in: `"99999999999Gi"`, wantErr: true},
		{in: `true`, wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			var m warmpool.MiB
			err := json.Unmarshal([]byte(tc.in), &m)
			if tc.wantErr {
				require.Error(t, err)
				assert.Contains(t, err.Error(), "memory")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, m)
		})
	}
}

func TestLoadPools_ShippedDefaultPool(t *testing.T) {
	pools, err := warmpool.LoadPools(filepath.Join("..", "config", "pools.yaml"))
	require.NoError(t, err)
	require.Len(t, pools, 1)
	p := pools[0]
	assert.Equal(t, "default", p.Name)
	assert.Empty(t, p.Provider, "the gateway's default provider")
	assert.Equal(t, "host", p.Image)
	assert.Equal(t, 2, p.MinWarm)
	assert.Equal(t, 16, p.MaxTotal)
	assert.LessOrEqual(t, p.DefaultLeaseSeconds, p.MaxLeaseSeconds)
}

func TestLoadPools_FileErrorsNameTheFile(t *testing.T) {
	dir := t.TempDir()
	_, err := warmpool.LoadPools(filepath.Join(dir, "missing.yaml"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "missing.yaml")

	bad := filepath.Join(dir, "bad.yaml")
	require.NoError(t, os.WriteFile(bad, []byte("pools:\n  - name: a\n    max_total: 0\n"), 0o600))
	_, err = warmpool.LoadPools(bad)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "bad.yaml")
	assert.Contains(t, err.Error(), "pools[0].max_total")

	huge := filepath.Join(dir, "huge.yaml")
	require.NoError(t, os.WriteFile(huge, make([]byte, 2<<20), 0o600))
	_, err = warmpool.LoadPools(huge)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "larger than")
}

func TestPoolConfig_ProviderOptions_LeavesOutServiceOptions(t *testing.T) {
	tests := []struct {
		name    string
		options map[string]string
		want    map[string]string
	}{
		{name: "none", options: nil, want: nil},
		{name: "only the relay's", options: map[string]string{"model.timeout_seconds": "3", "model.name": "p"}, want: nil},
		{name: "mixed", options: map[string]string{"model.upstream_url": "http://x", "network": "host"}, want: map[string]string{"network": "host"}},
		{name: "a provider option that merely contains model", options: map[string]string{"modelx": "1"}, want: map[string]string{"modelx": "1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, warmpool.PoolConfig{Options: tt.options}.ProviderOptions())
		})
	}
}
