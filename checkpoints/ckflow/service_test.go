package ckflow

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/checkpoints"
	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/internal/badinput"
	"github.com/quarryhq/quarry/warmpool"
)

func TestService_Take_StreamsTheArchiveIntoTheStore(t *testing.T) {
	e := newEnv(t, checkpoints.Budget{})
	ck, err := e.svc.Take(context.Background(), e.lease, TakeRequest{Exclude: []string{"*.pyc"}, Labels: map[string]string{"step": "1"}})
	require.NoError(t, err)

	assert.True(t, checkpoints.ValidID(ck.ID), ck.ID)
	assert.Equal(t, owner, ck.Owner)
	assert.Equal(t, pool, ck.Pool)
	assert.Equal(t, image, ck.Image, "the pool's image")
	assert.Equal(t, "sbx-1", ck.Sandbox)
	assert.Equal(t, []string{"/work"}, ck.Paths, "the roots the agent resolved")
	assert.Equal(t, []string{"*.pyc"}, ck.Exclude)
	assert.Equal(t, map[string]string{"step": "1"}, ck.Labels)
	assert.Equal(t, 3, ck.Files)
	assert.Equal(t, e.now, ck.CreatedAt, "stamped by the clock")
	assert.Equal(t, e.now.Add(checkpoints.DefaultRetention), ck.ExpiresAt)
	assert.Equal(t, int64(len(e.agent.archive)), ck.SizeBytes)
	assert.Equal(t, agentapi.CompressionFast, e.agent.compression, "at the configured level")

	rc, _, err := e.store.Open(context.Background(), ck.ID, owner)
	require.NoError(t, err)
	defer rc.Close()
	b, err := io.ReadAll(rc)
	require.NoError(t, err)
	assert.Equal(t, e.agent.archive, b, "the agent's archive, as it streamed")
	assert.Equal(t, 1, e.metrics.taken)
	assert.Empty(t, e.metrics.failed)
}

func TestService_Take_Failures(t *testing.T) {
	broken := errors.New("connection reset by peer")
	refusal := &agentapi.Error{Status: http.StatusNotFound, Code: agentapi.CodeNotFound, Message: "no such path"}
	for _, tc := range []struct {
		name   string
		budget checkpoints.Budget
		mutate func(*env)
		check  func(t *testing.T, e *env, err error)
	}{
		{
			name:   "the agent refuses: its answer goes through CallFailed",
			mutate: func(e *env) { e.agent.CheckpointFn = failCheckpoint(refusal) },
			check: func(t *testing.T, e *env, err error) {
				var cf *callFailedError
				require.ErrorAs(t, err, &cf)
				assert.Equal(t, []error{refusal}, e.leases.callFailed)
				assert.Empty(t, e.metrics.failed, "the store was not reached")
			},
		},
		{
			name: "the agent's stream breaks: the stream's error goes through CallFailed",
			mutate: func(e *env) {
				e.agent.CheckpointFn = func(context.Context, []string, []string, string) (io.ReadCloser, agentapi.CheckpointInfo, error) {
					return &brokenReader{data: []byte("half an archive"), err: broken}, agentapi.CheckpointInfo{Format: agentapi.FormatTarGzip, Roots: []string{"/work"}}, nil
				}
			},
			check: func(t *testing.T, e *env, err error) {
				var cf *callFailedError
				require.ErrorAs(t, err, &cf)
				assert.ErrorIs(t, err, broken)
				assert.Equal(t, map[string]int{OpCreate: 1}, e.metrics.failed)
			},
		},
		{
			name:   "over the size limit: the store's ErrTooLarge",
			mutate: func(e *env) { e.agent.archive = bytes.Repeat([]byte("x"), 8<<10) },
			check: func(t *testing.T, e *env, err error) {
				assert.ErrorIs(t, err, checkpoints.ErrTooLarge)
				assert.Empty(t, e.leases.callFailed, "the store's failure, not the agent's")
				assert.Equal(t, map[string]int{OpCreate: 1}, e.metrics.failed)
			},
		},
		{
			name:   "over the budget: a BudgetError, refused for its variable",
			budget: checkpoints.Budget{PerOwner: 1 << 10},
			check: func(t *testing.T, e *env, err error) {
				var be *checkpoints.BudgetError
				require.ErrorAs(t, err, &be)
				assert.Equal(t, map[string]int{"QUARRY_CHECKPOINT_BUDGET_PER_KEY": 1}, e.metrics.refused)
				assert.Equal(t, map[string]int{OpCreate: 1}, e.metrics.failed)
			},
		},
		{
			name:   "an unknown pool: the agent is not called",
			mutate: func(e *env) { e.lease.Pool = "gone" },
			check: func(t *testing.T, e *env, err error) {
				assert.ErrorIs(t, err, errUnknownPool)
				assert.Empty(t, e.agent.compression, "no archive asked for")
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, tc.budget, func(c *Config, _ *Deps) { c.Checkpoints.MaxBytes = 4 << 10 })
			if tc.mutate != nil {
				tc.mutate(e)
			}
			_, err := e.svc.Take(context.Background(), e.lease, TakeRequest{})
			require.Error(t, err)
			tc.check(t, e, err)
			assert.Empty(t, e.kept(t), "nothing kept")
			assert.Zero(t, e.metrics.taken)
		})
	}
}

// failCheckpoint returns a CheckpointFn that fails with err.
func failCheckpoint(err error) func(context.Context, []string, []string, string) (io.ReadCloser, agentapi.CheckpointInfo, error) {
	return func(context.Context, []string, []string, string) (io.ReadCloser, agentapi.CheckpointInfo, error) {
		return nil, agentapi.CheckpointInfo{}, err
	}
}

func TestCheckTake_RefusesBadExcludesAndLabels(t *testing.T) {
	assert.NoError(t, CheckTake(TakeRequest{Paths: []string{"rel", "/abs"}, Labels: map[string]string{"a": "b"}}))
	var bad *badinput.Error
	assert.ErrorAs(t, CheckTake(TakeRequest{Labels: map[string]string{"a=b": "c"}}), &bad)
}

func TestService_Restore_StreamsTheCheckpointIntoTheAgent(t *testing.T) {
	e := newEnv(t, checkpoints.Budget{})
	ck := e.take(t)
	res, err := e.svc.Restore(context.Background(), e.lease, ck)
	require.NoError(t, err)
	assert.Equal(t, agentapi.RestoreResult{Files: 3, Bytes: int64(len(e.agent.archive))}, res)
	assert.Equal(t, [][]byte{e.agent.archive}, e.agent.restored, "the stored archive, whole")
	assert.Equal(t, 1, e.metrics.restored)
}

func TestService_Restore_Failures(t *testing.T) {
	busy := &agentapi.Error{Status: http.StatusConflict, Code: agentapi.CodeBusy, Message: "another restore is running"}
	for _, tc := range []struct {
		name   string
		mutate func(*env, *Deps)
		check  func(t *testing.T, e *env, err error)
	}{
		{
			name: "a corrupt blob: the store's ErrCorrupt whatever the agent said, after a clean end of its body",
			mutate: func(e *env, d *Deps) {
				d.Store = corruptStore{e.store}
			},
			check: func(t *testing.T, e *env, err error) {
				assert.ErrorIs(t, err, checkpoints.ErrCorrupt)
				assert.Empty(t, e.leases.callFailed, "the agent did not fail")
				assert.Empty(t, e.agent.restored, "the agent refused the short body: nothing restored")
				assert.Equal(t, map[string]int{OpRestore: 1}, e.metrics.failed)
			},
		},
		{
			name: "the agent refuses: its answer goes through CallFailed",
			mutate: func(e *env, _ *Deps) {
				e.agent.RestoreFn = func(context.Context, string, io.Reader) (agentapi.RestoreResult, error) {
					return agentapi.RestoreResult{}, busy
				}
			},
			check: func(t *testing.T, e *env, err error) {
				assert.ErrorIs(t, err, busy)
				assert.Equal(t, []error{busy}, e.leases.callFailed)
				assert.Equal(t, map[string]int{OpRestore: 1}, e.metrics.failed)
			},
		},
		{
			name: "another owner's lease: not found, the agent not called",
			mutate: func(e *env, _ *Deps) {
				e.lease.Owner = "owner-b"
			},
			check: func(t *testing.T, e *env, err error) {
				assert.ErrorIs(t, err, checkpoints.ErrNotFound)
				assert.Empty(t, e.metrics.failed, "a store read, not a failed restore")
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var deps *Deps
			e := newEnv(t, checkpoints.Budget{}, func(_ *Config, d *Deps) { deps = d })
			ck := e.take(t)
			tc.mutate(e, deps)
			svc, err := New(e.svc.cfg, *deps)
			require.NoError(t, err)
			_, err = svc.Restore(context.Background(), e.lease, ck)
			require.Error(t, err)
			tc.check(t, e, err)
			assert.Zero(t, e.metrics.restored)
		})
	}
}

func TestService_Resolve(t *testing.T) {
	e := newEnv(t, checkpoints.Budget{})
	ck := e.take(t)
	ctx := context.Background()

	got, p, err := e.svc.Resolve(ctx, owner, ck.ID, "")
	require.NoError(t, err)
	assert.Equal(t, ck.ID, got.ID)
	assert.Equal(t, pool, p, "no pool: the checkpoint's")

	for _, tc := range []struct {
		name, owner, id, pool string
		check                 func(t *testing.T, err error)
	}{
		{name: "unknown", owner: owner, id: checkpoints.NewID(), check: notFound},
		{name: "malformed", owner: owner, id: "ckp-short", check: notFound},
		{name: "another owner's", owner: "owner-b", id: ck.ID, check: notFound},
		{name: "unknown pool", owner: owner, id: ck.ID, pool: "nope", check: func(t *testing.T, err error) { assert.ErrorIs(t, err, errUnknownPool) }},
		{name: "another image", owner: owner, id: ck.ID, pool: "py", check: func(t *testing.T, err error) {
			var bad *badinput.Error
			require.ErrorAs(t, err, &bad)
			assert.Contains(t, err.Error(), `"img:1"`)
			assert.Contains(t, err.Error(), `"python:3.12"`)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := e.svc.Resolve(ctx, tc.owner, tc.id, tc.pool)
			require.Error(t, err)
			tc.check(t, err)
		})
	}
}

func notFound(t *testing.T, err error) { assert.ErrorIs(t, err, checkpoints.ErrNotFound) }

func TestService_AcquireRestored(t *testing.T) {
	req := warmpool.AcquireRequest{Pool: pool, Owner: owner, LeaseSeconds: 60}
	t.Run("restored before it is handed out", func(t *testing.T) {
		e := newEnv(t, checkpoints.Budget{})
		ck := e.take(t)
		l, replayed, err := e.svc.AcquireRestored(context.Background(), req, ck)
		require.NoError(t, err)
		assert.False(t, replayed)
		assert.Equal(t, "sbx-new-1", l.ID)
		assert.Len(t, e.agent.restored, 1)
		assert.Empty(t, e.leases.released)
	})
	t.Run("a failed restore releases the sandbox", func(t *testing.T) {
		var deps *Deps
		e := newEnv(t, checkpoints.Budget{}, func(_ *Config, d *Deps) { deps = d })
		ck := e.take(t)
		deps.Store = corruptStore{e.store}
		svc, err := New(e.svc.cfg, *deps)
		require.NoError(t, err)
		e.leases.ReleaseFn = func(context.Context, warmpool.Lease) error { return errors.New("release failed: logged") }
		l, _, err := svc.AcquireRestored(context.Background(), req, ck)
		assert.ErrorIs(t, err, checkpoints.ErrCorrupt)
		assert.Contains(t, err.Error(), "restore checkpoint "+ck.ID+" into a new sandbox of pool default")
		assert.Zero(t, l, "nothing handed out")
		require.Len(t, e.leases.released, 1)
		assert.Equal(t, "sbx-new-1", e.leases.released[0].ID)
	})
	t.Run("a replayed lease is returned as it is", func(t *testing.T) {
		e := newEnv(t, checkpoints.Budget{})
		ck := e.take(t)
		e.leases.AcquireFn = func(context.Context, warmpool.AcquireRequest) (warmpool.Lease, bool, error) {
			return warmpool.Lease{ID: "sbx-earlier"}, true, nil
		}
		l, replayed, err := e.svc.AcquireRestored(context.Background(), req, ck)
		require.NoError(t, err)
		assert.True(t, replayed)
		assert.Equal(t, "sbx-earlier", l.ID)
		assert.Empty(t, e.agent.restored, "not restored again")
	})
	t.Run("a failed acquire passes", func(t *testing.T) {
		e := newEnv(t, checkpoints.Budget{})
		ck := e.take(t)
		e.leases.AcquireFn = func(context.Context, warmpool.AcquireRequest) (warmpool.Lease, bool, error) {
			return warmpool.Lease{}, false, warmpool.ErrNoCapacity
		}
		_, _, err := e.svc.AcquireRestored(context.Background(), req, ck)
		assert.ErrorIs(t, err, warmpool.ErrNoCapacity)
		assert.Empty(t, e.agent.restored)
		assert.Empty(t, e.leases.released)
	})
}

// Forks: each its own lease with the checkpoint restored, of the source's
// pool, owner and env; a fork past the pool's room has its own error and
// the others succeed; the checkpoint is deleted unless kept.
func TestService_Fork(t *testing.T) {
	e := newEnv(t, checkpoints.Budget{})
	var (
		mu   sync.Mutex
		made int
	)
	e.leases.AcquireFn = func(_ context.Context, req warmpool.AcquireRequest) (warmpool.Lease, bool, error) {
		mu.Lock()
		defer mu.Unlock()
		if made == 3 {
			return warmpool.Lease{}, false, fmt.Errorf("pool %s is full: %w", req.Pool, warmpool.ErrNoCapacity)
		}
		made++
		return warmpool.Lease{ID: fmt.Sprintf("sbx-fork-%d", made), Pool: req.Pool, Owner: req.Owner}, false, nil
	}
	labels := map[string]string{"run": "r2"}
	ck, forks, err := e.svc.Fork(context.Background(), e.lease, ForkRequest{Count: 4, LeaseSeconds: 60, Labels: labels})
	require.NoError(t, err)
	require.Len(t, forks, 4)
	var ids []string
	failed := 0
	for _, f := range forks {
		if f.Err != nil {
			failed++
			assert.ErrorIs(t, f.Err, warmpool.ErrNoCapacity)
			continue
		}
		ids = append(ids, f.Lease.ID)
	}
	slices.Sort(ids)
	assert.Equal(t, 1, failed, "one fork past the pool's room")
	assert.Equal(t, []string{"sbx-fork-1", "sbx-fork-2", "sbx-fork-3"}, ids, "each fork its own lease")
	assert.Len(t, e.agent.restored, 3, "every fork restored")
	require.Len(t, e.leases.acquired, 4)
	for _, req := range e.leases.acquired {
		assert.Equal(t, warmpool.AcquireRequest{Pool: pool, Owner: owner, LeaseSeconds: 60, Env: e.lease.Env, Labels: labels}, req)
	}
	assert.Equal(t, "sbx-1", ck.Sandbox)
	assert.Empty(t, e.kept(t), "the fork's checkpoint is deleted")

	_, _, err = e.svc.Fork(context.Background(), e.lease, ForkRequest{Count: 1, KeepCheckpoint: true})
	require.NoError(t, err)
	assert.Len(t, e.kept(t), 1, "kept")

	for _, n := range []int{0, -1, MaxForks + 1} {
		_, _, err := e.svc.Fork(context.Background(), e.lease, ForkRequest{Count: n})
		var bad *badinput.Error
		assert.ErrorAs(t, err, &bad, "count %d", n)
	}
}

// A fork whose checkpoint cannot be taken makes no sandbox.
func TestService_Fork_TakeFailsMakesNothing(t *testing.T) {
	e := newEnv(t, checkpoints.Budget{PerOwner: 1 << 10})
	_, forks, err := e.svc.Fork(context.Background(), e.lease, ForkRequest{Count: 3})
	var be *checkpoints.BudgetError
	require.ErrorAs(t, err, &be)
	assert.Nil(t, forks)
	assert.Empty(t, e.leases.acquired, "no sandbox made")
	assert.Empty(t, e.kept(t))
}

func TestService_GetListDelete(t *testing.T) {
	e := newEnv(t, checkpoints.Budget{})
	ctx := context.Background()
	ck := e.take(t)
	got, err := e.svc.Get(ctx, ck.ID, owner)
	require.NoError(t, err)
	assert.Equal(t, ck.ID, got.ID)
	list, err := e.svc.List(ctx, checkpoints.Filter{Owner: owner})
	require.NoError(t, err)
	assert.Len(t, list, 1)

	_, err = e.svc.Get(ctx, ck.ID, "owner-b")
	assert.ErrorIs(t, err, checkpoints.ErrNotFound, "another owner's")
	assert.ErrorIs(t, e.svc.Delete(ctx, "ckp-short", owner), checkpoints.ErrNotFound, "malformed")
	for range 2 {
		assert.NoError(t, e.svc.Delete(ctx, ck.ID, owner), "idempotent")
	}
	_, err = e.svc.Get(ctx, ck.ID, owner)
	assert.ErrorIs(t, err, checkpoints.ErrNotFound)
}

func TestNew_RefusesMissingDepsAndBadConfig(t *testing.T) {
	e := newEnv(t, checkpoints.Budget{})
	good := Deps{Store: e.store, Leases: e.leases, Sandboxes: &fakeSandboxes{agent: e.agent}}
	_, err := New(e.svc.cfg, good)
	require.NoError(t, err)
	_, err = New(e.svc.cfg, Deps{Store: e.store})
	assert.ErrorContains(t, err, "required")
	cfg := e.svc.cfg
	cfg.ForkTimeout = 0
	_, err = New(cfg, good)
	assert.ErrorContains(t, err, "ForkTimeout")
}

// countingStore counts the blobs opened.
type countingStore struct {
	checkpoints.Store
	mu    sync.Mutex
	opens int
}

func (s *countingStore) Open(ctx context.Context, id, owner string) (io.ReadCloser, checkpoints.Checkpoint, error) {
	s.mu.Lock()
	s.opens++
	s.mu.Unlock()
	return s.Store.Open(ctx, id, owner)
}

// A fork of N reads the checkpoint from the store once and streams it into
// every fork at once; an agent that refuses it drops out (its sandbox
// released), and the others are restored all the same.
func TestService_Fork_ReadsTheCheckpointOnce(t *testing.T) {
	var counted *countingStore
	agents := map[string]*fakeAgent{}
	var mu sync.Mutex
	e := newEnv(t, checkpoints.Budget{}, func(_ *Config, d *Deps) {
		counted = &countingStore{Store: d.Store}
		d.Store = counted
		d.Sandboxes = &fakeSandboxes{AgentFn: func(l warmpool.Lease) Agent {
			mu.Lock()
			defer mu.Unlock()
			a, ok := agents[l.ID]
			if !ok {
				a = &fakeAgent{archive: bytes.Repeat([]byte("archive "), 1024)}
				if l.ID == "sbx-new-3" { // refuses at once, before reading the body
					a.RestoreFn = func(context.Context, string, io.Reader) (agentapi.RestoreResult, error) {
						return agentapi.RestoreResult{}, &agentapi.Error{Status: http.StatusInsufficientStorage, Code: agentapi.CodeInsufficientStorage, Message: "full"}
					}
				}
				agents[l.ID] = a
			}
			return a
		}}
	})
	// The source's archive: large enough for many chunks.
	src := &fakeAgent{archive: bytes.Repeat([]byte("0123456789abcdef"), 100_000)}
	agents[e.lease.ID] = src
	_, forks, err := e.svc.Fork(context.Background(), e.lease, ForkRequest{Count: 6})
	require.NoError(t, err)
	assert.Equal(t, 1, counted.opens, "the blob is read once for 6 forks")
	failed := 0
	for _, f := range forks {
		if f.Err != nil {
			failed++
			var ae *agentapi.Error
			assert.ErrorAs(t, f.Err, &ae, "the refusing agent's answer")
			continue
		}
		a := agents[f.Lease.ID]
		require.Len(t, a.restored, 1, "fork %s restored", f.Lease.ID)
		assert.Equal(t, src.archive, a.restored[0], "fork %s got the whole checkpoint", f.Lease.ID)
	}
	assert.Equal(t, 1, failed)
	require.Len(t, e.leases.released, 1, "the fork whose restore failed is released")
	assert.Equal(t, "sbx-new-3", e.leases.released[0].ID)
}

// A blob that turns out corrupt fails every fork (each agent refuses the
// short body, nothing half-restored is handed out), and each is released.
func TestService_Fork_CorruptCheckpointFailsEveryFork(t *testing.T) {
	e := newEnv(t, checkpoints.Budget{}, func(_ *Config, d *Deps) { d.Store = corruptStore{d.Store} })
	_, forks, err := e.svc.Fork(context.Background(), e.lease, ForkRequest{Count: 3})
	require.NoError(t, err)
	for _, f := range forks {
		assert.ErrorIs(t, f.Err, checkpoints.ErrCorrupt)
	}
	assert.Len(t, e.leases.released, 3)
	assert.Empty(t, e.agent.restored)
}

// The body an agent restores from carries the gateway's vouch: the
// checkpoint's SHA-256 when the store's reader ended cleanly (it checked
// every byte against it), nothing when it failed; the agent need not hash
// the body again (agentapi.TrailerVouchedSHA256).
func TestService_Restore_VouchesForWhatTheStoreChecked(t *testing.T) {
	for _, tc := range []struct {
		name    string
		corrupt bool
	}{{"a whole blob", false}, {"a corrupt blob", true}} {
		t.Run(tc.name, func(t *testing.T) {
			var mutate []func(*Config, *Deps)
			if tc.corrupt {
				mutate = append(mutate, func(_ *Config, d *Deps) { d.Store = corruptStore{d.Store} })
			}
			e := newEnv(t, checkpoints.Budget{}, mutate...)
			ck := e.take(t)
			var vouch string
			var isVouched bool
			e.agent.RestoreFn = func(_ context.Context, sum string, r io.Reader) (agentapi.RestoreResult, error) {
				vb, ok := r.(agentapi.VouchedBody)
				isVouched = ok
				_, err := io.ReadAll(r)
				require.NoError(t, err, "a failing store ends the body as if it were whole")
				if ok {
					vouch = vb.Vouch()
				}
				if vouch != sum {
					return agentapi.RestoreResult{}, &agentapi.Error{Status: http.StatusBadRequest, Code: agentapi.CodeBadRequest, Message: "not vouched for"}
				}
				return agentapi.RestoreResult{Files: 3}, nil
			}
			_, err := e.svc.Restore(context.Background(), e.lease, ck)
			require.True(t, isVouched, "the body is an agentapi.VouchedBody")
			if tc.corrupt {
				assert.ErrorIs(t, err, checkpoints.ErrCorrupt)
				assert.Empty(t, vouch)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, ck.SHA256, vouch)
		})
	}
}
