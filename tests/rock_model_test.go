//go:build integration

package tests

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/internal/testenv"
)

// ROLL's loop through ROCK's unmodified SDK: ModelService installed,
// started and watched in a Docker sandbox of the Python image, an agent
// calling it as an OpenAI endpoint for five turns, the trainer answering
// each with anti_call_llm. Every request the trainer got carries the whole
// conversation so far (so every answer reached the agent, in order), and
// the agent logged every answer.
func TestRock_Docker_ModelServiceLoop(t *testing.T) {
	py := testenv.RockPython(t)
	d := requireDocker(t)
	g := d.startGateway(dockerPythonPool(""))
	g.waitReady("py", 1)
	const turns = 5
	steps := runRockDriver(t, py, "model_driver.py",
		"ROCK_BASE_URL="+g.url(), "QUARRY_API_KEY="+g.key, "ROCK_IMAGE="+dockerImagePython,
		fmt.Sprintf("TURNS=%d", turns))

	health := step(t, steps, "start_service")
	assert.EqualValues(t, 0, health["exit_code"])
	assert.Contains(t, health["health"], "healthy")

	loop := step(t, steps, "loop")
	reqs, _ := loop["requests"].([]any)
	require.Len(t, reqs, turns, "one request per turn: %v", loop)
	for i, r := range reqs {
		body, _ := json.Marshal(r)
		var req struct {
			Model    string `json:"model"`
			Messages []struct {
				Role, Content string
			} `json:"messages"`
		}
		require.NoError(t, json.Unmarshal(body, &req))
		assert.Equal(t, "policy", req.Model)
		require.Len(t, req.Messages, 2*i+1, "request %d carries the conversation so far", i+1)
		for j := 0; j < i; j++ {
			assert.Equal(t, fmt.Sprintf("answer %d", j+1), req.Messages[2*j+1].Content, "request %d, answer %d", i+1, j+1)
		}
		last := req.Messages[2*i].Content
		assert.True(t, strings.HasPrefix(last, fmt.Sprintf("turn %d:", i+1)), "request %d asks turn %d: %q", i+1, i+1, last)
	}
	assert.EqualValues(t, turns, loop["answered"], "the loop ended with SESSION_END in answer to the last answer")

	ans := step(t, steps, "answers")
	got, _ := ans["answers"].([]any)
	require.Len(t, got, turns, "agent log: %v", ans["agent_log"])
	for i, a := range got {
		m := a.(map[string]any)
		assert.EqualValues(t, i+1, m["turn"])
		assert.Equal(t, fmt.Sprintf("answer %d", i+1), m["content"])
	}
	assert.NotEqual(t, "0", step(t, steps, "stop_service")["probe_exit"], "the model service is down after stop")
	step(t, steps, "stopped")
}
