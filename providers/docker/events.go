package docker

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/events"

	"github.com/quarryhq/quarry/providers"
)

// Bounds of Watch's reconnections and memory.
const (
	// watchBackoffMin and watchBackoffMax bound the pause before
	// reconnecting to the event stream (doubling from the first).
	watchBackoffMin = 250 * time.Millisecond
	watchBackoffMax = 30 * time.Second
	// watchHealthy is how long a stream must have lived for the next
	// reconnection to start from the shortest pause again.
	watchHealthy = 30 * time.Second
	// maxOOMs bounds the containers remembered as OOM-killed until their
	// die event comes (the reason says so).
	maxOOMs = 4096
	// reasonRemoved is the Reason of a container removed.
	reasonRemoved = "the container was removed"
)

// Watch delivers the state changes of this gateway's containers until ctx
// ends, then returns nil: from the engine's event stream (GET /events),
// filtered by the provider's labels, a container's start as running, its
// die as stopped (with the exit code, and the OOM kill the engine reported
// just before, in Describe's words) and its destroy as stopped ("the
// container was removed"). When the stream breaks (the engine restarts,
// the socket drops) it reconnects with backoff (250 ms doubling to 30 s)
// from the time of the last event it saw, so the engine replays what
// happened meanwhile (as far as its own buffer of recent events reaches);
// events may therefore repeat. It never fails for good: the engine may
// come back. Memory: the containers OOM-killed whose die has not come
// yet, at most 4,096.
func (p *Provider) Watch(ctx context.Context, out chan<- providers.TaskEvent) error {
	since := time.Now()
	backoff := watchBackoffMin
	ooms := map[string]bool{}
	for {
		connected := time.Now()
		last, err := p.watchStream(ctx, since, ooms, out)
		if ctx.Err() != nil {
			return nil
		}
		if !last.IsZero() {
			since = last
		}
		if time.Since(connected) >= watchHealthy {
			backoff = watchBackoffMin
		}
		p.logger.Warn("docker event stream ended; reconnecting", "host", p.cfg.Host, "backoff", backoff, "err", err)
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		backoff = min(2*backoff, watchBackoffMax)
	}
}

// watchStream reads one connection of the event stream from since until it
// breaks or ctx ends, and returns the time of the last event it read.
func (p *Provider) watchStream(ctx context.Context, since time.Time, ooms map[string]bool, out chan<- providers.TaskEvent) (time.Time, error) {
	f := p.filter("")
	f.Add("type", string(events.ContainerEventType))
	for _, a := range []events.Action{events.ActionStart, events.ActionDie, events.ActionOOM, events.ActionDestroy} {
		f.Add("event", string(a))
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	msgs, errs := p.api.Events(sctx, events.ListOptions{Since: timestamp(since), Filters: f})
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			return last, ctx.Err()
		case err := <-errs:
			return last, fmt.Errorf("read the engine's events: %w", err)
		case m := <-msgs:
			if m.TimeNano > 0 {
				last = time.Unix(0, m.TimeNano)
			}
			e, ok := p.eventOf(m, ooms)
			if !ok {
				continue
			}
			select {
			case out <- e:
			case <-ctx.Done():
				return last, ctx.Err()
			}
		}
	}
}

// eventOf maps one engine event of a container to the task's event; ok is
// false for an event that is no state change of this gateway's task (an
// OOM kill is remembered for the die that follows it).
func (p *Provider) eventOf(m events.Message, ooms map[string]bool) (providers.TaskEvent, bool) {
	attrs := m.Actor.Attributes
	if m.Type != events.ContainerEventType || !p.ours(attrs) {
		return providers.TaskEvent{}, false
	}
	id := m.Actor.ID
	e := providers.TaskEvent{ID: id, Name: attrs[providers.LabelTask], Pool: attrs[providers.LabelPool], At: time.Unix(0, m.TimeNano).UTC()}
	switch m.Action {
	case events.ActionStart:
		e.State = providers.TaskRunning
	case events.ActionOOM:
		if len(ooms) < maxOOMs {
			ooms[id] = true
		}
		return providers.TaskEvent{}, false
	case events.ActionDie:
		code, _ := strconv.Atoi(attrs["exitCode"])
		v := view{id: id, labels: attrs, state: container.StateExited, detailed: true, exitCode: code, oomKilled: ooms[id]}
		delete(ooms, id)
		e.State, e.Reason = providers.TaskStopped, stoppedReason(v)
	case events.ActionDestroy:
		delete(ooms, id)
		e.State, e.Reason = providers.TaskStopped, reasonRemoved
	default:
		return providers.TaskEvent{}, false
	}
	return e, true
}

// timestamp formats t as the engine's since parameter (seconds.nanoseconds).
func timestamp(t time.Time) string {
	return fmt.Sprintf("%d.%09d", t.Unix(), t.Nanosecond())
}
