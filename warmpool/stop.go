package warmpool

import (
	"context"
	"errors"
	"fmt"

	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/providers"
)

// findTask returns the record of task id in pool (one read).
func (m *Manager) findTask(ctx context.Context, pool, id string) (TaskRecord, bool, error) {
	rec, err := m.store.GetTask(ctx, id)
	switch {
	case errors.Is(err, ErrNotFound):
		return TaskRecord{}, false, nil
	case err != nil:
		return TaskRecord{}, false, fmt.Errorf("read task %s: %w", id, err)
	}
	return rec, rec.Pool == pool, nil
}

// retire finishes an ended lease: it stops the task (fencing its agent
// first when the agent may still answer) and deletes its record. The
// lease's copy of the task's provider id and agent spares reading the
// record (a lease made before leases carried it reads it). Best effort
// with bounded calls: whatever fails is logged and left to the reconciler
// (the task is "stopping"); stopping and deleting again are no-ops.
func (m *Manager) retire(ctx context.Context, l Lease, fence bool) {
	log := m.log.With("pool", l.Pool, "lease", l.ID, "task", l.TaskID)
	rec, ok := m.leaseTask(l)
	if !ok {
		sctx, cancel := context.WithTimeout(ctx, m.cfg.StoreTimeout)
		var err error
		rec, ok, err = m.findTask(sctx, l.Pool, l.TaskID)
		cancel()
		if err != nil {
			log.Warn("retire task: the reconciler will stop it", "err", err)
			return
		}
		if !ok || rec.State != TaskStopping {
			return // the reconciler got there first
		}
	}
	if !fence {
		rec.AgentURL = ""
	}
	if err := m.stopTask(ctx, rec, "lease "+string(l.State)); err != nil {
		log.Warn("stop task: the reconciler will retry", "err", err)
	}
}

// leaseTask is the record of an ended lease's task (stopping) as the lease
// knows it; false when the lease does not name the provider's task or the
// provider that made it (a lease made before leases carried it: the
// task's record says).
func (m *Manager) leaseTask(l Lease) (TaskRecord, bool) {
	if l.ProviderTaskID == "" || l.Provider == "" {
		return TaskRecord{}, false
	}
	rec := TaskRecord{
		ID: l.TaskID, Pool: l.Pool, Provider: l.Provider, ProviderID: l.ProviderTaskID, State: TaskStopping,
		AgentURL: l.AgentURL, AgentToken: l.AgentToken, LeaseID: l.ID, Generation: l.Generation,
	}
	if !l.PausedAt.IsZero() {
		// A frozen agent answers no fence; it runs nothing until it is
		// removed, frozen.
		rec.AgentURL = ""
	}
	return rec, true
}

// stopTask stops a stopping task in its provider (finding it by name when
// its provider id is unknown) and deletes its record. A task that was
// leased is fenced first, when rec.AgentURL is set: an init with a higher
// generation makes its agent refuse a stale gateway's calls while the
// provider stops it (best effort; the caller clears AgentURL for a task
// known to be dead).
func (m *Manager) stopTask(ctx context.Context, rec TaskRecord, reason string) error {
	prov, err := m.providerOf(rec.Provider)
	if err != nil {
		return fmt.Errorf("stop task %s: %w", rec.ID, err)
	}
	if rec.LeaseID != "" && rec.AgentURL != "" {
		fctx, cancel := context.WithTimeout(ctx, m.cfg.HealthTimeout)
		_, err := m.agents.Init(fctx, rec.AgentURL, rec.AgentToken, agentapi.InitRequest{LeaseID: rec.LeaseID, Generation: rec.Generation + 1})
		cancel()
		if err != nil {
			m.log.Debug("fence agent", "pool", rec.Pool, "task", rec.ID, "err", err)
		}
	}
	pctx, cancel := context.WithTimeout(ctx, m.cfg.ProviderTimeout)
	defer cancel()
	ids := []string{rec.ProviderID}
	if rec.ProviderID == "" {
		found, err := prov.List(pctx, rec.Pool)
		if err != nil {
			return fmt.Errorf("find task %s by name: %w", rec.ID, err)
		}
		ids = ids[:0]
		for _, t := range found {
			if t.Name == rec.ID || t.Labels[providers.LabelTask] == rec.ID {
				ids = append(ids, t.ID)
			}
		}
	}
	for _, id := range ids {
		if err := prov.Stop(pctx, id, reason); err != nil {
			return fmt.Errorf("stop task %s: %w", rec.ID, err)
		}
	}
	sctx, cancel := context.WithTimeout(ctx, m.cfg.StoreTimeout)
	defer cancel()
	if err := m.store.DeleteTask(sctx, rec); err != nil {
		return fmt.Errorf("delete task %s: %w", rec.ID, err)
	}
	if p := m.pool(rec.Pool); p != nil {
		m.freed(p, rec.ID)
	}
	return nil
}

// freed notes that task id of p was deleted: a slot is free, so waiting
// acquires look again and the pool may refill.
func (m *Manager) freed(p *pool, id string) {
	p.forget(id)
	p.changed.broadcast()
	p.queue.poll()
	p.poke()
}

// stoppedReason says why a provider task stopped.
func stoppedReason(t providers.Task) string {
	if t.Reason == "" {
		return "its task stopped"
	}
	return "its task stopped: " + t.Reason
}
