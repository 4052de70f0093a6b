//go:build integration

package tests

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/client"
	"github.com/quarryhq/quarry/internal/testenv"
)

// TestAPIFuzz_OpenAPI runs schemathesis against a live gateway from its own
// gateway/openapi.json: every operation, with examples, the schema's
// boundary cases (the coverage phase) and generated requests (valid and
// not), with a real sandbox's id as {id}. It fails on any 500 (a Quarry
// 500 is an error its classification did not know), on a 5xx the document
// does not declare, on a status the operation does not declare, and on an
// answer whose content type the operation does not declare.
//
// The gateway runs the Docker provider: the fuzzer's commands, paths and
// archives land in an unprivileged container, never on this host. No class
// is configured, so no generated image reaches a registry, and image
// builds are off (their default).
//
// The archive routes' raw bodies are serialized as bytes
// (tests/apifuzz/quarry_hooks.py). QUARRY_APIFUZZ_SEED replays a run (a run prints its seed);
// QUARRY_APIFUZZ_TIME is its time budget (default 60s).
func TestAPIFuzz_OpenAPI(t *testing.T) {
	py := testenv.SchemathesisPython(t)
	d := requireDocker(t)
	g := d.startGateway(`pools:
  - name: default
    image: quarry-test/bash:latest
    cpu: 0.5
    memory: 256Mi
    min_warm: 1
    max_total: 6
`)
	g.waitReady("default", 1)
	c := ctx(t)
	sbx, err := g.client().CreateSandbox(c, client.CreateSandboxRequest{LeaseSeconds: 900})
	require.NoError(t, err)

	seed := time.Now().UnixNano() % 1_000_000_007
	if s := os.Getenv("QUARRY_APIFUZZ_SEED"); s != "" {
		seed, err = strconv.ParseInt(s, 10, 64)
		require.NoError(t, err, "QUARRY_APIFUZZ_SEED")
	}
	budget := 60 * time.Second
	if s := os.Getenv("QUARRY_APIFUZZ_TIME"); s != "" {
		budget, err = time.ParseDuration(s)
		require.NoError(t, err, "QUARRY_APIFUZZ_TIME")
	}
	dir := t.TempDir()
	config := filepath.Join(dir, "schemathesis.toml")
	require.NoError(t, os.WriteFile(config, []byte(fmt.Sprintf(`
# The sandbox every {id} names (other ids are generated too, in the negative cases).
[parameters]
"path.id" = %q

# The answers that are not server errors: every non-5xx, and the 5xx the
# document declares for classified failures (an agent that does not answer,
# a store or provider unavailable, a deadline, a full disk). 500 is not
# among them: it is a bug.
[checks.not_a_server_error]
expected-statuses = ["1XX", "2XX", "3XX", "4XX", 502, 503, 504, 507]
`, sbx.ID)), 0o644))
	t.Logf("apifuzz: seed %d, %s (replay: QUARRY_APIFUZZ_SEED=%d)", seed, budget, seed)

	schema, err := filepath.Abs("../gateway/openapi.json")
	require.NoError(t, err)
	runCtx, cancel := context.WithTimeout(c, budget+3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(runCtx, filepath.Join(filepath.Dir(py), "schemathesis"), "--config-file", config, "--no-color",
		"run", schema,
		"--url", g.url(),
		"--header", "Authorization: Bearer "+g.key,
		"--header", "X-API-Key: "+g.key, // E2B's control plane
		"--checks", "not_a_server_error,status_code_conformance,content_type_conformance",
		"--phases", "examples,coverage,fuzzing",
		"--max-examples", "8",
		"--max-time", strconv.Itoa(int(budget.Seconds())),
		"--seed", strconv.FormatInt(seed, 10),
		"--workers", "1",
		"--request-timeout", "60",
		"--suppress-health-check", "all",
		"--report", "junit", "--report-dir", dir,
	)
	hooks, err := filepath.Abs("apifuzz")
	require.NoError(t, err)
	cmd.Env = append(os.Environ(), "SCHEMATHESIS_TELEMETRY=false", "NO_COLOR=1",
		"SCHEMATHESIS_HOOKS=quarry_hooks", "PYTHONPATH="+hooks)
	cmd.Dir = dir // its caches (.schemathesis, .hypothesis) stay out of the tree
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("schemathesis (seed %d) failed: %v\n%s", seed, err, out)
	}
	t.Logf("schemathesis:\n%s", lastLines(string(out), 25))
}

// lastLines is the end of s: its last n lines.
func lastLines(s string, n int) string {
	end := len(s)
	for i := len(s) - 1; i >= 0 && n > 0; i-- {
		if s[i] == '\n' && i < end-1 {
			n--
			if n == 0 {
				return s[i+1:]
			}
		}
	}
	return s
}
