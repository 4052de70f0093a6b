package docker

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/events"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/providers"
	"github.com/quarryhq/quarry/providers/providertest"
)

func TestEventOf_MapsTheEnginesContainerEvents(t *testing.T) {
	p := &Provider{cfg: Config{GatewayID: "gw"}}
	ours := map[string]string{providers.LabelManaged: "true", providers.LabelGateway: "gw", providers.LabelTask: "t-1", providers.LabelPool: "py", "image": "quarry-test/bash"}
	at := time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)
	msg := func(action events.Action, attrs map[string]string, extra ...string) events.Message {
		a := map[string]string{}
		for k, v := range attrs {
			a[k] = v
		}
		for i := 0; i+1 < len(extra); i += 2 {
			a[extra[i]] = extra[i+1]
		}
		return events.Message{Type: events.ContainerEventType, Action: action, Actor: events.Actor{ID: "c1", Attributes: a}, TimeNano: at.UnixNano()}
	}
	ooms := map[string]bool{}
	tests := []struct {
		name string
		m    events.Message
		want *providers.TaskEvent
	}{
		{"start", msg(events.ActionStart, ours), &providers.TaskEvent{ID: "c1", Name: "t-1", Pool: "py", State: providers.TaskRunning, At: at}},
		{"killed", msg(events.ActionDie, ours, "exitCode", "137"), &providers.TaskEvent{ID: "c1", Name: "t-1", Pool: "py", State: providers.TaskStopped,
			Reason: "the container exited with code 137 (SIGKILL, e.g. docker kill)", At: at}},
		{"oom then die", msg(events.ActionOOM, ours), nil},
		{"the die after the oom", msg(events.ActionDie, ours, "exitCode", "137"), &providers.TaskEvent{ID: "c1", Name: "t-1", Pool: "py", State: providers.TaskStopped,
			Reason: "the container exited with code 137 (killed for running out of memory)", At: at}},
		{"removed", msg(events.ActionDestroy, ours), &providers.TaskEvent{ID: "c1", Name: "t-1", Pool: "py", State: providers.TaskStopped, Reason: "the container was removed", At: at}},
		{"another gateway's", msg(events.ActionDie, ours, providers.LabelGateway, "other"), nil},
		{"not managed", msg(events.ActionDie, map[string]string{providers.LabelGateway: "gw"}), nil},
		{"an action not asked for", msg(events.ActionPause, ours), nil},
		{"not a container", events.Message{Type: events.NetworkEventType, Action: events.ActionDestroy, Actor: events.Actor{ID: "n1", Attributes: ours}}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := p.eventOf(tt.m, ooms)
			if tt.want == nil {
				assert.False(t, ok, "%+v", got)
				return
			}
			require.True(t, ok)
			assert.Equal(t, *tt.want, got)
		})
	}
	assert.Empty(t, ooms, "an OOM is forgotten once its die came")
}

// collect runs p.Watch until the test ends and returns its events.
func collect(t *testing.T, p *Provider) <-chan providers.TaskEvent {
	events, _ := providertest.StartWatch(t, p, waitTimeout)
	return events
}

// waitEvent returns the first event of ch that match accepts.
func waitEvent(t *testing.T, ch <-chan providers.TaskEvent, what string, match func(providers.TaskEvent) bool) providers.TaskEvent {
	t.Helper()
	deadline := time.After(waitTimeout)
	for {
		select {
		case e := <-ch:
			if match(e) {
				return e
			}
		case <-deadline:
			t.Fatalf("no event: %s", what)
		}
	}
}

func TestProvider_Watch_ReportsTheEnginesEvents(t *testing.T) {
	e, p := dockerProvider(t)
	other := newTestEnv(t).open(t) // another gateway's containers: none of its events come
	s := spec("watch", imageBusybox)
	killed := launchOne(t, p, s, "w-killed")
	stopped := launchOne(t, p, s, "w-stopped")
	bystander := launchOne(t, other, s, "w-bystander")
	events := collect(t, p)
	time.Sleep(200 * time.Millisecond) // the stream is connected (it replays from its start anyway)

	started := launchOne(t, p, s, "w-started")
	ev := waitEvent(t, events, "w-started runs", func(e providers.TaskEvent) bool { return e.ID == started.ID })
	assert.Equal(t, providers.TaskEvent{ID: started.ID, Name: "w-started", Pool: "watch", State: providers.TaskRunning, At: ev.At}, ev)
	assert.WithinDuration(t, time.Now(), ev.At, time.Minute)

	require.NoError(t, e.cli.ContainerKill(context.Background(), killed.ID, "KILL"))
	ev = waitEvent(t, events, "w-killed dies", func(e providers.TaskEvent) bool { return e.ID == killed.ID })
	assert.Equal(t, providers.TaskStopped, ev.State)
	assert.Equal(t, "w-killed", ev.Name)
	assert.Equal(t, "the container exited with code 137 (SIGKILL, e.g. docker kill)", ev.Reason)

	require.NoError(t, p.Stop(context.Background(), stopped.ID, "lease released"))
	ev = waitEvent(t, events, "w-stopped removed", func(e providers.TaskEvent) bool { return e.ID == stopped.ID && e.Reason == reasonRemoved })
	assert.Equal(t, providers.TaskStopped, ev.State)

	require.NoError(t, e.cli.ContainerKill(context.Background(), bystander.ID, "KILL"))
	require.NoError(t, p.Stop(context.Background(), started.ID, "end")) // an event after the bystander's
	waitEvent(t, events, "w-started removed", func(e providers.TaskEvent) bool {
		require.NotEqual(t, bystander.ID, e.ID, "another gateway's container")
		return e.ID == started.ID && e.Reason == reasonRemoved
	})
}

// brokenStream is the engine's client whose event stream breaks once:
// its first Events call waits until the test says, then fails (as a
// restarted engine's stream does); the next ones are the engine's.
type brokenStream struct {
	dockerAPI
	mu     sync.Mutex
	calls  []events.ListOptions
	broken chan struct{} // closed by the test: the first stream breaks
}

func (b *brokenStream) Events(ctx context.Context, o events.ListOptions) (<-chan events.Message, <-chan error) {
	b.mu.Lock()
	b.calls = append(b.calls, o)
	first := len(b.calls) == 1
	b.mu.Unlock()
	if !first {
		return b.dockerAPI.Events(ctx, o)
	}
	errs := make(chan error, 1)
	go func() {
		select {
		case <-b.broken:
			errs <- context.DeadlineExceeded // any error: the stream is gone
		case <-ctx.Done():
			errs <- ctx.Err()
		}
	}()
	return make(chan events.Message), errs
}

// A container that dies while the stream is down is reported after the
// reconnection: Watch asks the engine for the events since then.
func TestProvider_Watch_ReconnectsAndReplaysWhatItMissed(t *testing.T) {
	e, p := dockerProvider(t)
	b := &brokenStream{dockerAPI: p.api, broken: make(chan struct{})}
	p.api = b
	task := launchOne(t, p, spec("watch", imageBusybox), "w-missed")
	events := collect(t, p)
	require.Eventually(t, func() bool { b.mu.Lock(); defer b.mu.Unlock(); return len(b.calls) == 1 }, waitTimeout, time.Millisecond)

	require.NoError(t, e.cli.ContainerKill(context.Background(), task.ID, "KILL")) // while nothing listens
	eventually(t, "w-missed exited", func() error {
		info, err := e.cli.ContainerInspect(context.Background(), task.ID)
		if err == nil && info.State.Status != container.StateExited {
			err = assert.AnError
		}
		return err
	})
	close(b.broken)

	ev := waitEvent(t, events, "w-missed dies, after the reconnection", func(e providers.TaskEvent) bool { return e.ID == task.ID })
	assert.Equal(t, providers.TaskStopped, ev.State)
	assert.Contains(t, ev.Reason, "exited with code 137")
	b.mu.Lock()
	defer b.mu.Unlock()
	require.GreaterOrEqual(t, len(b.calls), 2)
	assert.Equal(t, b.calls[0].Since, b.calls[1].Since, "no event came before the break: from the first connection's time")
	assert.NotEmpty(t, b.calls[1].Since)
}
