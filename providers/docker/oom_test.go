package docker

import (
	"context"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// inspections answers ContainerInspect from a script, one answer a call
// (the last repeats), and counts the calls.
type inspections struct {
	answers []container.InspectResponse
	calls   int
}

func (s *inspections) ContainerInspect(context.Context, string) (container.InspectResponse, error) {
	a := s.answers[min(s.calls, len(s.answers)-1)]
	s.calls++
	return a, nil
}

func exited(code int, oom bool, finished time.Time) container.InspectResponse {
	return container.InspectResponse{ContainerJSONBase: &container.ContainerJSONBase{
		ID:    "c1",
		State: &container.State{Status: container.StateExited, ExitCode: code, OOMKilled: oom, FinishedAt: finished.Format(time.RFC3339Nano)},
	}}
}

// TestInspectSettled_WaitsForTheOOMEvent: the engine marks a container
// OOM-killed when the kernel's OOM event arrives, which can be after the
// exit: a fresh 137 exit is asked again until it is marked (the interleaving
// make flake-hunt caught: an OOM described as "SIGKILL, e.g. docker kill").
func TestInspectSettled_WaitsForTheOOMEvent(t *testing.T) {
	now := time.Now()
	tests := []struct {
		name    string
		answers []container.InspectResponse
		oom     bool
		calls   int
	}{
		{"the OOM mark comes after the exit", []container.InspectResponse{exited(137, false, now), exited(137, false, now), exited(137, true, now)}, true, 3},
		{"marked at once", []container.InspectResponse{exited(137, true, now)}, true, 1},
		{"another exit code is final", []container.InspectResponse{exited(1, false, now)}, false, 1},
		{"an old 137 exit is final", []container.InspectResponse{exited(137, false, now.Add(-time.Minute))}, false, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := &inspections{answers: tt.answers}
			info, err := inspectSettled(context.Background(), s, "c1", func() time.Time { return now })
			require.NoError(t, err)
			assert.Equal(t, tt.oom, info.State.OOMKilled)
			assert.Equal(t, tt.calls, s.calls)
		})
	}
}

// A 137 exit that the engine never marks is asked about until
// oomEventGrace after the exit, no longer.
func TestInspectSettled_GivesUpAfterTheGrace(t *testing.T) {
	start := time.Now()
	s := &inspections{answers: []container.InspectResponse{exited(137, false, start)}}
	info, err := inspectSettled(context.Background(), s, "c1", time.Now)
	require.NoError(t, err)
	assert.False(t, info.State.OOMKilled)
	assert.GreaterOrEqual(t, time.Since(start), oomEventGrace)
	assert.Greater(t, s.calls, 1)
}
