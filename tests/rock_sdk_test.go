//go:build integration

package tests

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/client"
	"github.com/quarryhq/quarry/internal/testenv"
)

// runRockDriver runs a Python driver from tests/rock with py, a python with
// ROCK's SDK (testenv.RockPython), and returns its steps by name
// ("STEP {json}" lines).
func runRockDriver(t *testing.T, py, script string, env ...string) map[string]map[string]any {
	t.Helper()
	c, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(c, py, "rock/"+script)
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	steps := make(map[string]map[string]any)
	sc := bufio.NewScanner(&stdout)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "STEP ")
		if !ok {
			continue
		}
		var step map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &step), line)
		steps[step["step"].(string)] = step
	}
	require.NoError(t, err, "driver %s failed\nstdout:\n%s\nstderr:\n%s", script, stdout.String(), stderr.String())
	require.NotContains(t, steps, "crash", "stderr:\n%s", stderr.String())
	return steps
}

// step returns a driver step, failing the test when the driver did not
// reach it.
func step(t *testing.T, steps map[string]map[string]any, name string) map[string]any {
	t.Helper()
	s, ok := steps[name]
	require.True(t, ok, "the driver did not reach step %q (steps: %v)", name, steps)
	return s
}

func TestRock_SDKDrivesSandbox(t *testing.T) {
	py := testenv.RockPython(t)
	g := startGateway(t, defaultPools)
	g.waitReady("default", 1)
	driveRockSandbox(t, py, g, false)
}

// ROCK's SDK on sandboxes that are Docker containers of an image that is
// not ROCK's (static bash and busybox, an unprivileged user), with the
// real exit codes of nohup jobs (QUARRY_ROCK_NOHUP_EXIT=real).
func TestRock_Docker_SDKDrivesSandbox(t *testing.T) {
	py := testenv.RockPython(t)
	d := requireDocker(t)
	g := d.startGateway(fmt.Sprintf(`pools:
  - name: default
    image: %s
    cpu: 0.5
    memory: 256Mi
    min_warm: 1
    max_total: 3
`, dockerImageBash), withEnv("QUARRY_ROCK_NOHUP_EXIT=real"))
	g.waitReady("default", 1)
	driveRockSandbox(t, py, g, true)
}

// driveRockSandbox runs tests/rock/sandbox_driver.py (ROCK's SDK, unmodified,
// with py) against g, whose default pool serves ROCK's default image, and
// checks every step; realExit: g runs with QUARRY_ROCK_NOHUP_EXIT=real.
func driveRockSandbox(t *testing.T, py string, g *gatewayProc, realExit bool) {
	t.Helper()
	chosen := fmt.Sprintf("rock-e2e-%d", time.Now().UnixNano())
	steps := runRockDriver(t, py, "sandbox_driver.py",
		"ROCK_BASE_URL="+g.url(), "QUARRY_API_KEY="+g.key, "ROCK_SANDBOX_ID="+chosen)

	bad := step(t, steps, "bad_image")
	assert.Equal(t, true, bad["raised"])
	assert.Equal(t, "BadRequestRockError", bad["type"])
	assert.Contains(t, bad["message"], "no pool serves image")

	start := step(t, steps, "start")
	assert.Equal(t, true, start["is_alive"])
	id, _ := start["sandbox_id"].(string)
	assert.True(t, strings.HasPrefix(id, "sbx-"), "sandbox id %q is a lease id", id)

	att := step(t, steps, "attach")
	assert.Equal(t, id, att["restart_id"], "a second start with the same sandbox_id is the same sandbox")
	assert.Equal(t, "attached", att["output"])

	normal := step(t, steps, "arun_normal")
	assert.Equal(t, "hello\noops", normal["output"])
	assert.EqualValues(t, 0, normal["exit_code"])
	assert.Equal(t, "run69", step(t, steps, "arun_many")["output"])

	st := step(t, steps, "session_state")
	assert.Equal(t, "/tmp/rockwork\nbar hi", st["output"])

	fail := step(t, steps, "arun_fail")
	assert.Equal(t, true, fail["raised"])
	assert.Contains(t, fail["message"], "exit code 7")

	ok := step(t, steps, "nohup_ok")
	assert.Equal(t, "fine\nto-file", ok["output"])
	assert.EqualValues(t, 0, ok["exit_code"])

	nf := step(t, steps, "nohup_fail")
	if realExit {
		assert.EqualValues(t, 1, nf["exit_code"], "a failed nohup command reports a non-zero exit code")
		assert.Contains(t, nf["output"], "exited with code 3")
		assert.Contains(t, nf["output"], "failing")
		assert.Contains(t, nf["failure_reason"], "exited with code 3")
	} else {
		assert.EqualValues(t, 0, nf["exit_code"], "by default a nohup job that ran reads as success, as ROCK answers: %v", nf)
		assert.Equal(t, "failing", nf["output"])
	}

	cwd := step(t, steps, "nohup_cwd")
	assert.Equal(t, "/tmp/rockwork", cwd["output"], "nohup commands run in the session's directory")

	files := step(t, steps, "files")
	assert.Equal(t, true, files["write_success"])
	assert.Equal(t, "héllo\nwörld\n", files["content"])

	up := step(t, steps, "upload")
	assert.Equal(t, true, up["success"], up["message"])
	assert.Equal(t, "uploaded bytes\x00\x01 end", up["content"])

	ex := step(t, steps, "execute")
	assert.Equal(t, "argv-ok\n", ex["stdout"])
	assert.EqualValues(t, 4, ex["exit_code"])
	assert.Equal(t, "42\n", ex["shell_stdout"])

	closed := step(t, steps, "closed_session")
	assert.Equal(t, true, closed["raised"])
	assert.Contains(t, closed["message"], "does not exist")

	stop := step(t, steps, "stop")
	assert.Equal(t, true, stop["alive_before"])
	assert.Equal(t, false, stop["alive_after"])
	after := step(t, steps, "after_stop")
	assert.Equal(t, true, after["raised"])
	assert.Contains(t, after["message"], "released")

	// Nothing is left leased: the SDK's stop released the lease.
	sbs, err := g.client().ListSandboxes(ctx(t), client.ListSandboxesRequest{State: "active"})
	require.NoError(t, err)
	assert.Empty(t, sbs)
}
