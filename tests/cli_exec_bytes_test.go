//go:build integration

package tests

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// cliRun is one run of the quarry binary: its stdout and stderr apart, and
// its exit status.
type cliRun struct {
	stdout, stderr []byte
	code           int
}

// quarryCLI runs the quarry binary against g with stdin.
func quarryCLI(t *testing.T, g *gatewayProc, stdin []byte, args ...string) cliRun {
	t.Helper()
	cmd := exec.Command(bins.quarry, args...)
	cmd.Env = append(os.Environ(), "QUARRY_URL="+g.url(), "QUARRY_API_KEY="+g.key)
	cmd.Stdin = bytes.NewReader(stdin)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		require.NoError(t, err)
	}
	return cliRun{out.Bytes(), errOut.Bytes(), cmd.ProcessState.ExitCode()}
}

// `quarry sandbox exec` against the real gateway, process provider and
// agents: stdout, stderr and stdin (-i) carry bytes exactly, and output is
// never lost silently (all of it arrives, or with --max-output the CLI
// fails saying so).
func TestE2E_CLI_ExecBytes(t *testing.T) {
	g := startGateway(t, defaultPools)
	r := quarryCLI(t, g, nil, "sandbox", "create")
	require.Equal(t, 0, r.code, "%s", r.stderr)
	id := strings.TrimSpace(string(r.stdout))

	t.Run("NUL and 0xff on stdout and stderr", func(t *testing.T) {
		r := quarryCLI(t, g, nil, "sandbox", "exec", id, `printf '\000\001\377'; printf '\377\000' >&2`)
		assert.Equal(t, cliRun{[]byte{0, 1, 0xff}, []byte{0xff, 0}, 0}, r)
	})

	t.Run("50 MB arrive whole", func(t *testing.T) {
		r := quarryCLI(t, g, nil, "sandbox", "exec", id, "yes | head -c 50000000")
		assert.Equal(t, 0, r.code, "%s", r.stderr)
		assert.Empty(t, r.stderr)
		assert.Equal(t, 50000000, len(r.stdout))
		assert.True(t, bytes.Equal(bytes.Repeat([]byte("y\n"), 25000000), r.stdout), "the output is yes's")
	})

	t.Run("over --max-output fails saying so", func(t *testing.T) {
		r := quarryCLI(t, g, nil, "sandbox", "exec", "--max-output", "1Mi", id, "yes | head -c 50000000")
		assert.Equal(t, 3, r.code, "the command succeeded: the CLI's own status for cut output")
		assert.Equal(t, 1<<20, len(r.stdout))
		assert.Contains(t, string(r.stderr), "output over --max-output 1048576 bytes")

		r = quarryCLI(t, g, nil, "sandbox", "exec", "--max-output", "1Mi", id, "yes | head -c 50000000; exit 9")
		assert.Equal(t, 9, r.code, "a failed command's status wins")
		assert.Contains(t, string(r.stderr), "--max-output")
	})

	t.Run("--max-output over the agent's maximum is refused", func(t *testing.T) {
		r := quarryCLI(t, g, nil, "sandbox", "exec", "--max-output", "1Gi", id, "echo never")
		assert.Equal(t, 1, r.code)
		assert.Empty(t, r.stdout)
		assert.Contains(t, string(r.stderr), "max_output_bytes: 1073741824 is above the agent's maximum")
	})

	data := make([]byte, 512<<10) // every byte value, NUL and 0xff among them
	rng := rand.New(rand.NewPCG(7, 7))
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	t.Run("binary stdin through cat", func(t *testing.T) {
		r := quarryCLI(t, g, data, "sandbox", "exec", "-i", id, "--", "cat")
		assert.Equal(t, 0, r.code, "%s", r.stderr)
		assert.True(t, bytes.Equal(data, r.stdout), "cat gave back %d bytes of %d", len(r.stdout), len(data))
	})

	t.Run("a tar written to stdout is a tar", func(t *testing.T) {
		r := quarryCLI(t, g, data, "sandbox", "exec", "-i", id, "mkdir -p t && cat > t/f.bin")
		require.Equal(t, 0, r.code, "%s", r.stderr)
		r = quarryCLI(t, g, nil, "sandbox", "exec", id, "tar c -C t f.bin")
		require.Equal(t, 0, r.code, "%s", r.stderr)
		tr := tar.NewReader(bytes.NewReader(r.stdout))
		h, err := tr.Next()
		require.NoError(t, err)
		assert.Equal(t, "f.bin", h.Name)
		got, err := io.ReadAll(tr)
		require.NoError(t, err)
		assert.True(t, bytes.Equal(data, got), "the file in the tar is the file")
	})
}
