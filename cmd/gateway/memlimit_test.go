package main

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/gateway"
	"github.com/quarryhq/quarry/warmpool"
)

// cgroupRoot writes files (path under root: content) into a new root.
func cgroupRoot(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for p, content := range files {
		f := filepath.Join(root, filepath.FromSlash(p))
		require.NoError(t, os.MkdirAll(filepath.Dir(f), 0o755))
		require.NoError(t, os.WriteFile(f, []byte(content), 0o644))
	}
	return root
}

func env(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestMemoryLimit(t *testing.T) {
	const gib = int64(1) << 30
	for _, tc := range []struct {
		name  string
		files map[string]string
		env   map[string]string
		want  int64
		from  string
	}{
		{name: "cgroup v2, the process's own cgroup (a namespace)", files: map[string]string{
			"proc/self/cgroup": "0::/\n", "sys/fs/cgroup/memory.max": "1073741824\n",
		}, want: gib, from: "sys/fs/cgroup/memory.max"},
		{name: "cgroup v2, a parent's limit is lower", files: map[string]string{
			"proc/self/cgroup":                   "0::/a/b\n",
			"sys/fs/cgroup/a/b/memory.max":       "max\n",
			"sys/fs/cgroup/a/memory.max":         "536870912\n",
			"sys/fs/cgroup/memory.max":           "1073741824\n",
			"sys/fs/cgroup/a/b/memory.swap.max":  "0\n",
			"sys/fs/cgroup/unrelated/memory.max": "1\n",
		}, want: gib / 2, from: "sys/fs/cgroup/a/memory.max"},
		{name: "cgroup v2, no limit", files: map[string]string{
			"proc/self/cgroup": "0::/a\n", "sys/fs/cgroup/a/memory.max": "max\n", "sys/fs/cgroup/memory.max": "max\n",
		}},
		{name: "cgroup v1, the path is not mounted (the container's root is its own)", files: map[string]string{
			"proc/self/cgroup":                           "4:memory:/docker/abc\n2:cpu,cpuacct:/docker/abc\n0::/\n",
			"sys/fs/cgroup/memory/memory.limit_in_bytes": "2147483648\n",
		}, want: 2 * gib, from: "sys/fs/cgroup/memory/memory.limit_in_bytes"},
		{name: "cgroup v1, unlimited", files: map[string]string{
			"proc/self/cgroup": "4:memory:/x\n", "sys/fs/cgroup/memory/x/memory.limit_in_bytes": "9223372036854771712\n",
		}},
		{name: "Lambda", files: map[string]string{"proc/self/cgroup": "0::/\n"},
			env: map[string]string{"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "1769"}, want: 1769 << 20, from: "AWS_LAMBDA_FUNCTION_MEMORY_SIZE"},
		{name: "Lambda below the cgroup", files: map[string]string{
			"proc/self/cgroup": "0::/\n", "sys/fs/cgroup/memory.max": "4294967296\n",
		}, env: map[string]string{"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "512"}, want: 512 << 20, from: "AWS_LAMBDA_FUNCTION_MEMORY_SIZE"},
		{name: "nothing to read"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := cgroupRoot(t, tc.files)
			got, from := memoryLimit(env(tc.env), root)
			assert.Equal(t, tc.want, got)
			if tc.from != "" && tc.from != "AWS_LAMBDA_FUNCTION_MEMORY_SIZE" {
				tc.from = filepath.Join(root, filepath.FromSlash(tc.from))
			}
			assert.Equal(t, tc.from, from)
		})
	}
}

func TestSetMemoryLimit(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	root := cgroupRoot(t, map[string]string{"proc/self/cgroup": "0::/\n", "sys/fs/cgroup/memory.max": "1000000000\n"})
	var sets []int64
	set := func(v int64) int64 { sets = append(sets, v); return 42 }

	setMemoryLimit(env(nil), root, set, log)
	assert.Equal(t, []int64{900_000_000}, sets, "90 % of the cgroup's limit when GOMEMLIMIT is unset")

	sets = nil
	setMemoryLimit(env(map[string]string{"GOMEMLIMIT": "300MiB"}), root, set, log)
	assert.Equal(t, []int64{-1}, sets, "GOMEMLIMIT, read by the runtime, is left as it is (only read back)")

	sets = nil
	setMemoryLimit(env(map[string]string{"GOMEMLIMIT": "off"}), root, set, log)
	assert.Equal(t, []int64{-1}, sets, "GOMEMLIMIT=off is the runtime's too")

	sets = nil
	setMemoryLimit(env(nil), cgroupRoot(t, map[string]string{"proc/self/cgroup": "0::/\n", "sys/fs/cgroup/memory.max": "max\n"}), set, log)
	assert.Empty(t, sets, "no limit found: nothing set")
}

func TestManagerAgentTransport_KeepsFewIdleConnections(t *testing.T) {
	tr := managerAgentTransport()
	assert.Equal(t, 2, tr.MaxIdleConnsPerHost)
	assert.Equal(t, 256, tr.MaxIdleConns, "a bound over all agents")
	assert.LessOrEqual(t, tr.IdleConnTimeout.Seconds(), 10.0)
}

func TestMaxAgentClients_SizedToThePools(t *testing.T) {
	pools := []warmpool.PoolConfig{{Name: "a", MaxTotal: 12_000}, {Name: "b", MaxTotal: 8_000}}
	assert.Equal(t, 20_000, maxAgentClients(0, pools), "every task the pools can hold")
	assert.Equal(t, gateway.DefaultMaxAgentClients, maxAgentClients(0, pools[:0]), "the default when the pools are smaller")
	assert.Equal(t, 500, maxAgentClients(500, pools), "QUARRY_MAX_AGENT_CLIENTS when set")
}
