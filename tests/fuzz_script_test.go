//go:build integration

package tests

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeGo is a `go` that records its arguments and plays a fuzz run: with
// FAKE_GO_FAIL set it fails as Go's coordinator does when its -fuzztime
// deadline leaks (go.dev/issue/75804); otherwise it takes N/50,000 s for
// -fuzztime Nx and reports that rate and a corpus of 7.
const fakeGo = `#!/usr/bin/env bash
echo "$*" >>"$FAKE_GO_LOG"
ft=""; prev=""
for a in "$@"; do [ "$prev" = "-fuzztime" ] && ft="$a"; prev="$a"; done
if [ -n "$FAKE_GO_FAIL" ]; then
  printf -- '--- FAIL: FuzzX (8.10s)\n    context deadline exceeded\nFAIL\n'; exit 1
fi
n="${ft%x}"
sleep "$(awk -v n="$n" 'BEGIN { printf "%.3f", n / 50000 }')"
echo "fuzz: elapsed: 0s, execs: $n (50000/sec), new interesting: 0 (total: 7)"
echo PASS
`

// runFuzzScript runs scripts/fuzz.sh on one real target with fakeGo first
// on PATH, and returns its output, its exit code and fakeGo's calls.
func runFuzzScript(t *testing.T, env ...string) (string, int, []string) {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "go"), []byte(fakeGo), 0o755))
	log := filepath.Join(dir, "calls")
	cmd := exec.Command("./scripts/fuzz.sh")
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), "PATH="+dir+":"+os.Getenv("PATH"), "FAKE_GO_LOG="+log, "FUZZ=^FuzzReadEnvelope$")
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.CombinedOutput()
	code := 0
	if err != nil {
		var exit *exec.ExitError
		require.ErrorAs(t, err, &exit, "%s", out)
		code = exit.ExitCode()
	}
	data, _ := os.ReadFile(log)
	return string(out), code, strings.Fields(strings.ReplaceAll(strings.TrimSpace(string(data)), "\n", " \n "))
}

// fuzztimes are the -fuzztime values of the recorded calls.
func fuzztimes(calls []string) []string {
	var out []string
	for i, a := range calls {
		if a == "-fuzztime" && i+1 < len(calls) {
			out = append(out, calls[i+1])
		}
	}
	return out
}

// A duration is spent in rounds of a number of inputs: Go's coordinator is
// never given a deadline, the one that go.dev/issue/75804 can report as the
// target's failure.
func TestFuzzScript_DurationRunsInRoundsOfInputs(t *testing.T) {
	out, code, calls := runFuzzScript(t, "FUZZTIME=3s")
	require.Equal(t, 0, code, out)
	times := fuzztimes(calls)
	require.GreaterOrEqual(t, len(times), 3, "a build round and rounds of inputs: %s", out)
	for _, ft := range times {
		assert.Regexp(t, `^[0-9]+x$`, ft, "every -fuzztime is a count of inputs")
	}
	assert.Equal(t, []string{"1x", "107x", "1007x"}, times[:3],
		"the first round builds and tells the corpus (7), which each round replays before 100, then 1,000 new inputs")
	m := regexp.MustCompile(`FuzzReadEnvelope: ([0-9]+) new inputs in ([0-9]+) rounds, ([0-9]+\.[0-9]) s \(start-up ([0-9]+) ms a round\)`).FindStringSubmatch(out)
	require.NotNil(t, m, out)
	spent, err := strconv.ParseFloat(m[3], 64)
	require.NoError(t, err)
	startup, err := strconv.Atoi(m[4])
	require.NoError(t, err)
	// It stops only when what is left would go to a round's start-up
	// (and a quarter second); the time printed is cut to tenths.
	assert.GreaterOrEqual(t, spent+0.1+0.25+float64(startup)/1000, 3.0, "the rounds spend the budget: %s", out)
	rounds, err := strconv.Atoi(m[2])
	require.NoError(t, err)
	assert.Equal(t, len(times)-1, rounds, "the build round is not counted")
	assert.Contains(t, out, "== fuzz: 1 targets, 3s each, no failing input")
}

// A count is one round of that many inputs.
func TestFuzzScript_CountIsOneRound(t *testing.T) {
	out, code, calls := runFuzzScript(t, "FUZZTIME=500x")
	require.Equal(t, 0, code, out)
	assert.Equal(t, []string{"500x"}, fuzztimes(calls))
}

// A failure that wrote no input says so, and fails the run.
func TestFuzzScript_FailureWithoutInputFails(t *testing.T) {
	out, code, _ := runFuzzScript(t, "FAKE_GO_FAIL=1")
	assert.Equal(t, 1, code, out)
	assert.Contains(t, out, "context deadline exceeded")
	assert.Contains(t, out, "FuzzReadEnvelope failed without writing an input")
}

// A FUZZTIME that is neither a duration nor a count is refused before any
// target runs.
func TestFuzzScript_BadFuzztimeRefused(t *testing.T) {
	for _, bad := range []string{"8", "1.5s", "0s", "x", "8sx", "-1s"} {
		out, code, calls := runFuzzScript(t, "FUZZTIME="+bad)
		assert.Equal(t, 2, code, "%s: %s", bad, out)
		assert.Contains(t, out, "is neither a duration", bad)
		assert.Empty(t, calls, bad)
	}
}

// docs/RELIABILITY.md's table names every fuzz target in the tree.
func TestFuzzScript_EveryTargetDocumented(t *testing.T) {
	doc, err := os.ReadFile("../docs/RELIABILITY.md")
	require.NoError(t, err)
	out, err := exec.Command("grep", "-rhoE", "--include=*_test.go", "--exclude-dir=.cache", "--exclude-dir=node_modules",
		`^func Fuzz[A-Za-z0-9_]*\(f \*testing\.F\)`, "..").Output()
	require.NoError(t, err)
	targets := regexp.MustCompile(`Fuzz[A-Za-z0-9_]*`).FindAllString(string(out), -1)
	require.NotEmpty(t, targets)
	for _, target := range targets {
		assert.Contains(t, string(doc), "| `"+target+"` |", "docs/RELIABILITY.md's fuzz table lacks %s", target)
	}
}
