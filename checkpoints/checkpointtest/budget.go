package checkpointtest

import (
	"bytes"
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/checkpoints"
)

// The budget's rules (checkpoints.Budget), held for every store.

// Reopener is implemented by a backend's test harness: it closes the store
// and opens another on the same data (a gateway's restart), so that the
// suite checks that what the store counts is durable.
type Reopener interface {
	// Reopen closes the store and returns a new one on its data, built
	// with the same Setup, with the test interfaces of the old one.
	Reopen(ctx context.Context) (checkpoints.Store, error)
}

// withBudget replaces the subtest's store with a new, empty one that has
// budget b.
func (e *env) withBudget(b checkpoints.Budget) {
	e.s = e.newStore(e.t, Setup{Clock: e.clock, Budget: b})
}

// usage checks owner's usage and the total.
func (e *env) usage(owner string, wantOwner, wantTotal int64, msg string) {
	e.t.Helper()
	u, err := e.s.Usage(ctx(), owner)
	require.NoError(e.t, err, msg)
	assert.Equal(e.t, checkpoints.Usage{Owner: wantOwner, Total: wantTotal}, u, "%s (owner %s)", msg, owner)
}

// refused checks that err is the refusal of a Put over the budget, as
// want says (Used and Need, and the limit's scope and bytes).
func (e *env) refused(err error, want checkpoints.BudgetError, msg string) {
	e.t.Helper()
	require.ErrorIs(e.t, err, checkpoints.ErrOverBudget, msg)
	var be *checkpoints.BudgetError
	require.ErrorAs(e.t, err, &be, msg)
	assert.Equal(e.t, want, *be, msg)
}

func testUsage(e *env) {
	t := e.t
	e.usage(ownerA, 0, 0, "an empty store")
	a := e.put(newMeta(ownerA, base, nil), bytesOf(80, 1000))
	b := e.put(newMeta(ownerA, base, nil), bytesOf(81, 2000))
	e.put(newMeta(ownerB, base, nil), bytesOf(82, 500))
	e.usage(ownerA, 3000, 3500, "each Put counts its archive's bytes")
	e.usage(ownerB, 500, 3500, "another owner's")
	e.usage("owner-none", 0, 3500, "an owner without checkpoints")

	require.NoError(t, e.s.Delete(ctx(), a.ID, ownerA))
	e.usage(ownerA, 2000, 2500, "Delete frees the bytes")
	require.NoError(t, e.s.Delete(ctx(), a.ID, ownerA))
	e.usage(ownerA, 2000, 2500, "a second Delete frees nothing")
	assert.ErrorIs(t, e.s.Delete(ctx(), b.ID, ownerB), checkpoints.ErrNotFound)
	e.usage(ownerA, 2000, 2500, "another owner's Delete frees nothing")
	require.NoError(t, e.s.Delete(ctx(), b.ID, ownerA))
	e.usage(ownerA, 0, 500, "the owner's last Delete")
}

func testUsageShared(e *env) {
	t := e.t
	data := bytesOf(83, 4000)
	a1 := e.put(newMeta(ownerA, base, nil), data)
	a2 := e.put(newMeta(ownerA, base, nil), data)
	e.put(newMeta(ownerB, base, nil), data)
	// A content-addressed store keeps one blob for all three: it counts
	// once per owner. A store of one object per checkpoint counts each.
	two := int64(8000)
	if e.opts.SharesBlobs {
		two = 4000
	}
	e.usage(ownerA, two, two+4000, "two checkpoints of an owner with the same bytes")
	e.usage(ownerB, 4000, two+4000, "another owner's usage does not depend on A's checkpoints")
	require.NoError(t, e.s.Delete(ctx(), a1.ID, ownerA))
	e.usage(ownerA, 4000, 8000, "deleting one of the two")
	require.NoError(t, e.s.Delete(ctx(), a2.ID, ownerA))
	e.usage(ownerA, 0, 4000, "deleting the owner's last checkpoint of the bytes frees them")
}

func testBudgetOwner(e *env) {
	t := e.t
	e.withBudget(checkpoints.Budget{PerOwner: 10000})
	e.put(newMeta(ownerA, base, nil), bytesOf(84, 6000))
	m := newMeta(ownerA, base, nil)
	_, err := e.s.Put(ctx(), m, bytes.NewReader(bytesOf(85, 5000)), maxBytes)
	e.refused(err, checkpoints.BudgetError{Scope: checkpoints.ScopeOwner, Limit: 10000, Used: 6000, Need: 4001, AtLeast: true},
		"6000 + 5000 bytes are over 10000: the Put stopped reading past the 4000 left")
	e.gone(m.ID, ownerA)
	assert.Equal(t, 1, e.blobs(), "nothing of the refused Put is kept")
	e.usage(ownerA, 6000, 6000, "a refused Put counts nothing")

	got := e.put(m, bytesOf(85, 4000))
	assert.Equal(t, m.ID, got.ID, "the refused id was not kept, and 6000 + 4000 fit exactly")
	e.usage(ownerA, 10000, 10000, "at the limit")
	_, err = e.s.Put(ctx(), newMeta(ownerA, base, nil), bytes.NewReader(bytesOf(86, 1)), maxBytes)
	e.refused(err, checkpoints.BudgetError{Scope: checkpoints.ScopeOwner, Limit: 10000, Used: 10000, Need: 1, AtLeast: true}, "one byte more")
	e.put(newMeta(ownerA, base, nil), nil)
	e.put(newMeta(ownerB, base, nil), bytesOf(87, 10000))
	e.usage(ownerB, 10000, 20000, "the limit is per owner: another owner has its own")

	require.NoError(t, e.s.Delete(ctx(), got.ID, ownerA))
	e.put(newMeta(ownerA, base, nil), bytesOf(88, 4000))
	e.usage(ownerA, 10000, 20000, "a Delete makes room")
}

func testBudgetTotal(e *env) {
	e.withBudget(checkpoints.Budget{PerOwner: 8000, Total: 10000})
	e.put(newMeta(ownerA, base, nil), bytesOf(90, 6000))
	m := newMeta(ownerB, base, nil)
	_, err := e.s.Put(ctx(), m, bytes.NewReader(bytesOf(91, 5000)), maxBytes)
	e.refused(err, checkpoints.BudgetError{Scope: checkpoints.ScopeTotal, Limit: 10000, Used: 6000, Need: 4001, AtLeast: true},
		"B's 5000 bytes are within its own limit, but not within the total's 4000 left")
	e.gone(m.ID, ownerB)
	e.usage(ownerB, 0, 6000, "nothing counted")
	_, err = e.s.Put(ctx(), newMeta(ownerA, base, nil), bytes.NewReader(bytesOf(92, 3000)), maxBytes)
	e.refused(err, checkpoints.BudgetError{Scope: checkpoints.ScopeOwner, Limit: 8000, Used: 6000, Need: 2001, AtLeast: true},
		"the tighter limit is the one named")
	e.put(newMeta(ownerB, base, nil), bytesOf(91, 4000))
	e.usage(ownerA, 6000, 10000, "the total at its limit")
}

func testBudgetStream(e *env) {
	t := e.t
	e.withBudget(checkpoints.Budget{PerOwner: 1 << 20})
	src := newSource(93, over)
	_, err := e.s.Put(ctx(), newMeta(ownerA, base, nil), src, maxBytes)
	e.refused(err, checkpoints.BudgetError{Scope: checkpoints.ScopeOwner, Limit: 1 << 20, Need: 1<<20 + 1, AtLeast: true}, "a 16 MiB archive, 1 MiB left")
	assert.LessOrEqual(t, src.read, int64(1<<20+1), "Put stops reading past what the budget leaves")
	assert.Equal(t, 0, e.blobs(), "nothing of it is kept")

	src = newSource(94, over)
	_, err = e.s.Put(ctx(), newMeta(ownerA, base, nil), src, 1<<19)
	require.ErrorIs(t, err, checkpoints.ErrTooLarge, "maxBytes below the budget's room is ErrTooLarge")
	assert.NotErrorIs(t, err, checkpoints.ErrOverBudget)
	e.usage(ownerA, 0, 0, "nothing counted")
}

func testBudgetFailed(e *env) {
	t := e.t
	e.withBudget(checkpoints.Budget{PerOwner: 64 << 20, Total: 64 << 20})
	kept := e.put(newMeta(ownerA, base, nil), bytesOf(95, 1000))
	boom := errors.New("the agent's stream broke")
	for _, after := range []int64{0, 100 << 10, 7 << 20} {
		_, err := e.s.Put(ctx(), newMeta(ownerA, base, nil), &failingReader{src: newSource(96, 20<<20), after: after, err: boom}, maxBytes)
		require.ErrorIs(t, err, boom)
		c, cancel := context.WithCancel(ctx())
		_, err = e.s.Put(c, newMeta(ownerA, base, nil), &failingReader{src: newSource(97, 20<<20), after: after + 1, cancel: cancel}, maxBytes)
		cancel()
		require.ErrorIs(t, err, context.Canceled)
	}
	_, err := e.s.Put(ctx(), newMeta(ownerA, base, nil), newSource(98, over), tooLarge)
	require.ErrorIs(t, err, checkpoints.ErrTooLarge)
	dup := newMeta(ownerA, base, nil)
	dup.ID = kept.ID
	_, err = e.s.Put(ctx(), dup, newSource(99, 1000), maxBytes)
	require.ErrorIs(t, err, checkpoints.ErrExists)
	e.usage(ownerA, 1000, 1000, "Puts that failed midway, too large or on a taken id count nothing")
}

func testBudgetExpired(e *env) {
	t := e.t
	e.withBudget(checkpoints.Budget{PerOwner: 10000})
	m := newMeta(ownerA, base, nil)
	m.ExpiresAt = base.Add(time.Minute)
	e.put(m, bytesOf(100, 8000))
	e.clock.Set(m.ExpiresAt)
	e.gone(m.ID, ownerA)
	e.usage(ownerA, 8000, 8000, "an expired checkpoint counts until Purge removes it: its bytes are stored")
	_, err := e.s.Put(ctx(), newMeta(ownerA, base, nil), bytes.NewReader(bytesOf(101, 5000)), maxBytes)
	require.ErrorIs(t, err, checkpoints.ErrOverBudget)
	n, err := e.s.Purge(ctx(), m.ExpiresAt, 10)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	e.usage(ownerA, 0, 0, "Purge frees it")
	e.put(newMeta(ownerA, base, nil), bytesOf(101, 5000))
}

func testBudgetConcurrent(e *env) {
	t := e.t
	const size, fit = 10000, 3
	for _, tc := range []struct {
		name   string
		budget checkpoints.Budget
		owner  func(i int) string
	}{
		{"per owner", checkpoints.Budget{PerOwner: fit*size + size/2}, func(int) string { return ownerA }},
		{"total", checkpoints.Budget{Total: fit*size + size/2}, func(i int) string { return []string{ownerA, ownerB}[i%2] }},
	} {
		e.withBudget(tc.budget)
		var won, refused atomic.Int32
		n := max(e.opts.Parallel, fit+2)
		parallel(n, n, func(i int) {
			_, err := e.s.Put(ctx(), newMeta(tc.owner(i), base, nil), newSource(byte(110+i), size), maxBytes)
			switch {
			case err == nil:
				won.Add(1)
			case errors.Is(err, checkpoints.ErrOverBudget):
				refused.Add(1)
			default:
				assert.NoError(t, err, "%s: Put %d", tc.name, i)
			}
		})
		assert.Equal(t, int32(fit), won.Load(), "%s: %d Puts of %d bytes at once, room for %d: exactly that many are kept", tc.name, n, size, fit)
		assert.Equal(t, int32(n-fit), refused.Load(), "%s: the others are refused", tc.name)
		assert.Equal(t, fit, e.blobs(), "%s: the refused kept nothing", tc.name)
		u, err := e.s.Usage(ctx(), ownerA)
		require.NoError(t, err)
		assert.Equal(t, int64(fit*size), u.Total, "%s: the count is exact", tc.name)
	}
}

func testBudgetReopen(e *env) {
	t := e.t
	e.withBudget(checkpoints.Budget{PerOwner: 10000})
	a := e.put(newMeta(ownerA, base, nil), bytesOf(120, 6000))
	e.put(newMeta(ownerB, base, nil), bytesOf(121, 3000))
	r, ok := e.s.(Reopener)
	require.True(t, ok, "the store given to the suite must implement checkpointtest.Reopener (%T does not)", e.s)
	s, err := r.Reopen(ctx())
	require.NoError(t, err)
	e.s = s
	e.usage(ownerA, 6000, 9000, "the counts survive a restart")
	_, err = e.s.Put(ctx(), newMeta(ownerA, base, nil), bytes.NewReader(bytesOf(122, 5000)), maxBytes)
	e.refused(err, checkpoints.BudgetError{Scope: checkpoints.ScopeOwner, Limit: 10000, Used: 6000, Need: 4001, AtLeast: true},
		"the reopened store refuses what does not fit")
	require.NoError(t, e.s.Delete(ctx(), a.ID, ownerA))
	e.usage(ownerA, 0, 3000, "a Delete after the restart frees what was counted before it")
}
