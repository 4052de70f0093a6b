//go:build integration

package tests

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/quarryhq/quarry/internal/testenv"
)

// ROCK's nohup mode through the unmodified SDK with the gateway holding a
// job's "kill -0" check for at most 4 s (QUARRY_ROCK_POLL_HOLD; 8 s by
// default), longer than the check timeout of a wait_timeout of 3 s. The SDK sleeps at least 5 s between two checks, so an arun that
// ends in less than 5 s ended on its first check, which only the hold
// answers as soon as the job exits. Every case returns what ROCK's SDK
// documents: the command's output, exit_code 0 (1 with the real code in
// failure_reason for a failed command, 1 with "did not complete" when
// wait_timeout passed first).
func TestRock_NohupChecksEndWithTheJob(t *testing.T) {
	py := testenv.RockPython(t)
	g := startGateway(t, defaultPools, withEnv("QUARRY_ROCK_POLL_HOLD=4s"))
	g.waitReady("default", 1)
	steps := runRockDriver(t, py, "nohup_driver.py", "ROCK_BASE_URL="+g.url(), "QUARRY_API_KEY="+g.key)
	const sdkSleep = 5.0 // the SDK's shortest sleep between two checks
	for _, name := range []string{"quick", "quick_fail", "exits_in_sleep", "outlives_hold", "unrelated_alive", "unrelated_gone", "timeout_3", "timeout_10", "timeout_60"} {
		t.Logf("%-16s %.3f s", name, step(t, steps, name)["seconds"])
	}

	quick := step(t, steps, "quick")
	assert.Equal(t, "quick", quick["output"])
	assert.EqualValues(t, 0, quick["exit_code"])
	assert.Less(t, quick["seconds"], sdkSleep, "a quick job ends on its first check")

	fail := step(t, steps, "quick_fail")
	assert.EqualValues(t, 0, fail["exit_code"], "a job that ran reads as success, as on ROCK (QUARRY_ROCK_NOHUP_EXIT=rock)")
	assert.Contains(t, fail["output"], "failing")
	assert.Less(t, fail["seconds"], sdkSleep)

	late := step(t, steps, "exits_in_sleep")
	assert.Equal(t, "late", late["output"], "a job that ends while the SDK sleeps: %v", late)
	assert.EqualValues(t, 0, late["exit_code"])
	assert.GreaterOrEqual(t, late["seconds"], 6.0)

	long := step(t, steps, "outlives_hold")
	assert.Equal(t, "long", long["output"], "a job still running at the second check: %v", long)
	assert.EqualValues(t, 0, long["exit_code"])
	assert.GreaterOrEqual(t, long["seconds"], 11.0)
	assert.Less(t, long["seconds"], 11+sdkSleep, "the second check ended with the job, not after another sleep")

	alive := step(t, steps, "unrelated_alive")
	assert.EqualValues(t, 0, alive["exit_code"], "kill -0 of a live process that is no nohup job: %v", alive)
	assert.Less(t, alive["seconds"], 4.0, "not held")
	gone := step(t, steps, "unrelated_gone")
	assert.NotEqualValues(t, 0, gone["exit_code"], "kill -0 of no process fails: %v", gone)
	assert.Contains(t, gone["output"], "No such process")
	assert.Less(t, gone["seconds"], 4.0, "not held")

	t3 := step(t, steps, "timeout_3")
	assert.EqualValues(t, 1, t3["exit_code"], "wait_timeout 3 s for a 6 s job: %v", t3)
	assert.Contains(t, t3["failure_reason"], "did not complete within")
	assert.Contains(t, t3["failure_reason"], "(timeout: 3s)")
	t10 := step(t, steps, "timeout_10")
	assert.Equal(t, "in-time", t10["output"], "wait_timeout 10 s for a 2 s job: %v", t10)
	assert.EqualValues(t, 0, t10["exit_code"])
	assert.Less(t, t10["seconds"], 2+sdkSleep)
	t60 := step(t, steps, "timeout_60")
	assert.Equal(t, "at-once", t60["output"])
	assert.EqualValues(t, 0, t60["exit_code"])
	assert.Less(t, t60["seconds"], sdkSleep)

	after := step(t, steps, "after")
	assert.Equal(t, "still-usable", after["output"])
}
