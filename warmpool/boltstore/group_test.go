package boltstore

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/warmpool"
)

// A group commit runs its writes in one transaction: a refused write
// leaves the others alone, and a write that fails otherwise rolls the
// group back, after which every write runs alone, so that only it fails.
func TestCommit_GroupOutcomes(t *testing.T) {
	s, err := Open(filepath.Join(t.TempDir(), "leases.db"), Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	ctx := t.Context()
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	recs := []warmpool.TaskRecord{{ID: "tsk-a", CreatedAt: now}, {ID: "tsk-b", CreatedAt: now}, {ID: "tsk-c", CreatedAt: now}}
	require.NoError(t, s.ReserveTasks(ctx, "p", 10, recs))
	put := func(id string, from warmpool.TaskState, fail error) *writeOp {
		return &writeOp{ctx: ctx, action: "test", done: make(chan error, 1), fn: func(t *tx) error {
			if fail != nil {
				return fail
			}
			old, ok, err := t.getTask(id)
			if err != nil || !ok {
				return errors.Join(err, warmpool.ErrNotFound)
			}
			if old.State != from {
				return warmpool.ErrConflict // a refusal, before any write
			}
			rec := old
			rec.State, rec.Version = warmpool.TaskReady, old.Version+1
			return t.putTask(&old, rec)
		}}
	}
	outcome := func(ops ...*writeOp) []error {
		s.commit(ops)
		var out []error
		for _, op := range ops {
			out = append(out, <-op.done)
		}
		return out
	}

	errs := outcome(put("tsk-a", warmpool.TaskLaunching, nil), put("tsk-b", warmpool.TaskReady, nil))
	require.NoError(t, errs[0])
	require.ErrorIs(t, errs[1], warmpool.ErrConflict, "refused")
	c, err := s.CountTasks(ctx, "p")
	require.NoError(t, err)
	assert.Equal(t, warmpool.TaskCounts{Launching: 2, Ready: 1}, c, "the refusal left its group's write alone")

	broken := errors.New("disk says no")
	errs = outcome(put("tsk-b", warmpool.TaskLaunching, nil), put("tsk-c", warmpool.TaskLaunching, broken), put("tsk-a", warmpool.TaskLaunching, nil))
	require.NoError(t, errs[0])
	require.ErrorIs(t, errs[1], broken)
	require.ErrorIs(t, errs[2], warmpool.ErrConflict, "ran alone after the rollback: tsk-a is ready already")
	c, err = s.CountTasks(ctx, "p")
	require.NoError(t, err)
	assert.Equal(t, warmpool.TaskCounts{Launching: 1, Ready: 2}, c, "only the failing write failed")

	canceled, cancel := context.WithCancel(ctx)
	cancel()
	op := put("tsk-c", warmpool.TaskLaunching, nil)
	op.ctx = canceled
	errs = outcome(op, put("tsk-x", warmpool.TaskLaunching, nil))
	require.ErrorIs(t, errs[0], context.Canceled, "a canceled write does not run")
	require.ErrorIs(t, errs[1], warmpool.ErrNotFound)
	got, err := s.GetTask(ctx, "tsk-c")
	require.NoError(t, err)
	assert.Equal(t, warmpool.TaskLaunching, got.State)
}
