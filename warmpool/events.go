package warmpool

import (
	"context"
	"errors"
	"sync"

	"github.com/quarryhq/quarry/providers"
)

const (
	// eventWorkers bounds the task events of one provider handled at once.
	eventWorkers = 8
	// eventBuffer is the channel a provider's Watch sends on; the events
	// wait in the bounded queue (Config.EventQueue) behind it.
	eventBuffer = 64
)

// Outcomes of a task event, the "outcome" label of quarry_task_events_total.
const (
	eventHandled = "handled"
	eventIgnored = "ignored"
	eventDropped = "dropped"
)

// watchEvents runs a provider's Watch and handles its events until ctx ends
// or the watch ends for good. While it runs, the walks describe none of
// that provider's tasks; when it ends, they describe again. Events wait in
// a queue of Config.EventQueue; one that finds it full is dropped (counted,
// and the next walk of each of the provider's pools describes), so a slow
// store never stalls the provider's event source.
func (m *Manager) watchEvents(ctx context.Context, name string, w providers.Watcher) {
	m.setWatching(name, true)
	wctx, cancel := context.WithCancel(ctx)
	in := make(chan providers.TaskEvent, eventBuffer)
	queue := make(chan providers.TaskEvent, m.cfg.EventQueue)
	var pump, workers sync.WaitGroup
	pump.Add(1)
	go func() {
		defer pump.Done()
		for {
			select {
			case <-wctx.Done():
				return
			case ev := <-in:
				select {
				case queue <- ev:
				default:
					m.metrics.taskEvents.WithLabelValues(name, eventDropped).Inc()
					m.resyncProvider(name)
				}
			}
		}
	}()
	for range eventWorkers {
		workers.Add(1)
		go func() {
			defer workers.Done()
			for ev := range queue {
				m.metrics.taskEvents.WithLabelValues(name, m.handleEvent(ctx, name, ev)).Inc()
			}
		}()
	}
	err := w.Watch(wctx, in)
	cancel()
	pump.Wait()
	close(queue)
	workers.Wait()
	m.setWatching(name, false)
	m.resyncProvider(name)
	if ctx.Err() == nil {
		m.log.Warn("task events ended for good: the walks describe this provider's tasks again", "provider", name, "err", err)
	}
}

// handleEvent checks one task event against the store's record and acts
// on it: a stopped ready task is replaced, a stopped leased task's lease
// ends as lost, a stopped launching task is given up (this replica's
// starter, when it starts it, learns at once), a running one makes the
// starter check it now. Events are hints: they may repeat, arrive out of
// order or be stale, and every decision is a conditional write.
func (m *Manager) handleEvent(ctx context.Context, provider string, ev providers.TaskEvent) string {
	if ev.Name == "" {
		return eventIgnored // only the walks can match it to a record
	}
	if ev.State == providers.TaskRunning {
		if p := m.pool(ev.Pool); p != nil && p.start.nudge(ev.Name) {
			return eventHandled
		}
		return eventIgnored
	}
	if ev.State != providers.TaskStopped {
		return eventIgnored
	}
	sctx, cancel := context.WithTimeout(ctx, m.cfg.StoreTimeout)
	rec, err := m.store.GetTask(sctx, ev.Name)
	cancel()
	if err != nil {
		if !errors.Is(err, ErrNotFound) && ctx.Err() == nil {
			m.log.Warn("task event: read the task", "provider", provider, "task", ev.Name, "err", err)
		}
		return eventIgnored
	}
	p := m.lookupPool(ctx, rec.Pool)
	if p == nil || rec.Provider != provider || rec.ProviderID != "" && ev.ID != "" && rec.ProviderID != ev.ID {
		return eventIgnored // another pool's, or another task under the name
	}
	reason := stoppedReason(providers.Task{Reason: ev.Reason})
	switch rec.State {
	case TaskReady:
		p.log.Warn("a ready task stopped; replacing it", "task", rec.ID, "reason", reason)
		if r, ok := m.transition(ctx, p, rec, TaskStopping, reason); ok {
			r.AgentURL = "" // dead: no fence
			m.stopAll(ctx, []TaskRecord{r})
		}
	case TaskLeased:
		if r, ok := m.taskDied(ctx, p, rec, reason); ok {
			m.stopAll(ctx, []TaskRecord{r})
		}
	case TaskLaunching:
		if p.start.nudge(rec.ID) {
			return eventHandled // its next check describes it and gives it up
		}
		if p.isColdStart(rec.ID) {
			return eventHandled // its cold start describes it
		}
		if r, ok := m.transition(ctx, p, rec, TaskStopping, "launch failed: "+reason); ok {
			m.stopAll(ctx, []TaskRecord{r})
		}
	case TaskStopping:
		m.stopAll(ctx, []TaskRecord{rec})
	}
	return eventHandled
}

// watching reports whether provider name delivers task events now.
func (m *Manager) watching(name string) bool {
	m.watchMu.Lock()
	defer m.watchMu.Unlock()
	return m.watchers[name]
}

func (m *Manager) setWatching(name string, on bool) {
	m.watchMu.Lock()
	defer m.watchMu.Unlock()
	m.watchers[name] = on
}

// resyncProvider makes the next walk of every pool of provider name
// describe its tasks.
func (m *Manager) resyncProvider(name string) {
	for _, p := range m.allPools() {
		if p.cfg.Provider == name {
			p.setResync()
		}
	}
}
