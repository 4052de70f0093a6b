package checkpointtest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/checkpoints"
	"github.com/quarryhq/quarry/internal/badinput"
	"github.com/quarryhq/quarry/internal/clock"
)

// Options sets the scale of the suite. Zero fields take the defaults noted
// on each field.
type Options struct {
	// LargeBytes is the size of the archive streamed in and out to check
	// memory (48 MiB).
	LargeBytes int64
	// MaxBuffered is how much the live heap may grow while that archive
	// streams (8 MiB): what the store buffers by design (an S3 store's
	// parts). It must be below half of LargeBytes, or the check proves
	// nothing.
	MaxBuffered int64
	// SharesBlobs: checkpoints with the same bytes share one stored blob
	// (a content-addressed store), which BlobCounter then counts once.
	SharesBlobs bool
	// Concurrent is how many checkpoints the concurrency tests put and
	// delete (32), Parallel how many goroutines do it at once (8).
	Concurrent int
	Parallel   int
}

func (o Options) withDefaults() Options {
	if o.LargeBytes <= 0 {
		o.LargeBytes = 48 << 20
	}
	if o.MaxBuffered <= 0 {
		o.MaxBuffered = 8 << 20
	}
	if o.Concurrent <= 0 {
		o.Concurrent = 32
	}
	if o.Parallel <= 0 {
		o.Parallel = 8
	}
	return o
}

// base is the suite's time: the clock starts there and checkpoints are
// created around it.
var base = time.Date(2030, 1, 2, 3, 4, 5, 6, time.UTC)

// Owners of the suite's checkpoints.
const (
	ownerA = "owner-a"
	ownerB = "owner-b"
)

// maxBytes is the limit of the suite's Puts that test no limit.
const maxBytes = 1 << 30

// Setup is what the suite builds a store with.
type Setup struct {
	// Clock is the store's clock: it tells time by it only.
	Clock clock.Clock
	// Budget is the store's budget (checkpoints.Budget; zero: none).
	Budget checkpoints.Budget
}

// env is one subtest's store and clock.
type env struct {
	t        *testing.T
	s        checkpoints.Store
	clock    *Clock
	opts     Options
	newStore func(t *testing.T, s Setup) checkpoints.Store
}

// Run runs the conformance suite. newStore returns a new, empty store
// built with s, for one subtest, and registers its own cleanup (which must
// tolerate a store the suite has already closed).
func Run(t *testing.T, newStore func(t *testing.T, s Setup) checkpoints.Store, opts Options) {
	opts = opts.withDefaults()
	require.Less(t, 2*opts.MaxBuffered, opts.LargeBytes, "Options: MaxBuffered must be below half of LargeBytes for the memory check to mean anything")
	tests := []struct {
		name string
		fn   func(e *env)
	}{
		{"Put_ComputesSizeAndSHA256", testPutComputes},
		{"PutOpen_EmptyArchive", testEmptyArchive},
		{"PutOpen_LargeArchiveStreamsByteForByte", testLargeStreamed},
		{"Put_OverMaxBytesKeepsNothing", testTooLarge},
		{"Put_ExactlyMaxBytesIsKept", testExactlyMax},
		{"Put_ExistingIDIsErrExists", testExists},
		{"Put_ReaderFailingMidwayKeepsNothing", testReaderFails},
		{"Put_ContextEndingMidwayKeepsNothing", testContextEnds},
		{"Put_BadMetadataReadsNothing", testBadMeta},
		{"Get_UnknownIsNotFound", testUnknown},
		{"Owners_AnotherOwnersIsNotFoundEverywhere", testOwners},
		{"List_LabelsNewestFirstAndLimit", testList},
		{"List_RefusesNoOwner", testListNoOwner},
		{"Delete_IsIdempotentAndReclaims", testDelete},
		{"Blobs_SameContent", testSameContent},
		{"Expiry_HidesAtExpiresAt", testExpiry},
		{"Purge_DeletesExpiredWithinBudget", testPurge},
		{"Open_CorruptionIsErrCorruptAtTheEnd", testCorruption},
		{"Concurrent_PutsAndDeletes", testConcurrent},
		{"Concurrent_PutsOfOneIDOneWins", testConcurrentSameID},
		{"Concurrent_DeleteAndPutOfSameContent", testSharedRace},
		{"Close_LaterCallsErrClosed", testClose},
		{"Budget_UsageCountsPutsAndDeletesFreeIt", testUsage},
		{"Budget_SameBytesCountOncePerOwner", testUsageShared},
		{"Budget_PerOwnerRefusesAndKeepsNothing", testBudgetOwner},
		{"Budget_TotalRefusesAcrossOwners", testBudgetTotal},
		{"Budget_StreamStopsWhereTheBudgetEnds", testBudgetStream},
		{"Budget_FailedPutsCountNothing", testBudgetFailed},
		{"Budget_ExpiredCountsUntilPurged", testBudgetExpired},
		{"Budget_ConcurrentPutsNeverPassIt", testBudgetConcurrent},
		{"Budget_UsageSurvivesReopen", testBudgetReopen},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := NewClock(base)
			tt.fn(&env{t: t, s: newStore(t, Setup{Clock: clk}), clock: clk, opts: opts, newStore: newStore})
		})
	}
}

func ctx() context.Context { return context.Background() }

// newMeta returns a checkpoint's metadata as the gateway sets it.
func newMeta(owner string, created time.Time, labels map[string]string) checkpoints.Checkpoint {
	return checkpoints.Checkpoint{
		ID: checkpoints.NewID(), Owner: owner, Pool: "default", Image: "quarry-test/bash", Sandbox: "sbx-suite",
		Paths: []string{"/work", "/etc/app"}, Exclude: []string{"*.pyc"}, Labels: labels, Format: "tar+gzip", Files: 42,
		CreatedAt: created, ExpiresAt: created.Add(time.Hour),
	}
}

func hexSum(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

// put stores data under m and checks what Put returns.
func (e *env) put(m checkpoints.Checkpoint, data []byte) checkpoints.Checkpoint {
	e.t.Helper()
	got, err := e.s.Put(ctx(), m, bytes.NewReader(data), maxBytes)
	require.NoError(e.t, err)
	return got
}

// read opens id for owner and reads it to the end.
func (e *env) read(id, owner string) ([]byte, checkpoints.Checkpoint, error) {
	e.t.Helper()
	rc, c, err := e.s.Open(ctx(), id, owner)
	if err != nil {
		return nil, c, err
	}
	defer func() { assert.NoError(e.t, rc.Close()) }()
	b, err := io.ReadAll(rc)
	return b, c, err
}

// blobs returns the store's BlobCounter count.
func (e *env) blobs() int {
	e.t.Helper()
	bc, ok := e.s.(BlobCounter)
	require.True(e.t, ok, "the store given to the suite must implement checkpointtest.BlobCounter (%T does not)", e.s)
	n, err := bc.Blobs(ctx())
	require.NoError(e.t, err)
	return n
}

// gone checks that id is not found for owner by Get, Open and List.
func (e *env) gone(id, owner string) {
	e.t.Helper()
	_, err := e.s.Get(ctx(), id, owner)
	assert.ErrorIs(e.t, err, checkpoints.ErrNotFound, "Get")
	rc, _, err := e.s.Open(ctx(), id, owner)
	assert.ErrorIs(e.t, err, checkpoints.ErrNotFound, "Open")
	if rc != nil {
		_ = rc.Close()
	}
	list, err := e.s.List(ctx(), checkpoints.Filter{Owner: owner, Limit: checkpoints.MaxListLimit})
	require.NoError(e.t, err)
	for _, c := range list {
		assert.NotEqual(e.t, id, c.ID, "List shows it")
	}
}

func testPutComputes(e *env) {
	t := e.t
	data := bytesOf(1, 200<<10)
	m := newMeta(ownerA, base, map[string]string{"run": "r1"})
	m.SHA256, m.SizeBytes = "ignored", 1
	got := e.put(m, data)

	want, err := checkpoints.CheckPut(m, maxBytes)
	require.NoError(t, err)
	want.SHA256, want.SizeBytes = hexSum(data), int64(len(data))
	assert.Equal(t, want, got, "Put returns the normalized metadata with the archive's sha256 and size")

	g, err := e.s.Get(ctx(), m.ID, ownerA)
	require.NoError(t, err)
	assert.Equal(t, got, g, "Get returns what Put returned")
	assert.Equal(t, ownerA, g.Owner)

	b, o, err := e.read(m.ID, ownerA)
	require.NoError(t, err, "an intact archive reads to io.EOF")
	assert.Equal(t, got, o, "Open returns the metadata")
	assert.True(t, bytes.Equal(data, b), "Open returns the bytes put")
}

func testEmptyArchive(e *env) {
	m := e.put(newMeta(ownerA, base, nil), nil)
	assert.Equal(e.t, int64(0), m.SizeBytes)
	assert.Equal(e.t, hexSum(nil), m.SHA256)
	b, _, err := e.read(m.ID, ownerA)
	require.NoError(e.t, err)
	assert.Empty(e.t, b)
}

func testLargeStreamed(e *env) {
	t := e.t
	size := e.opts.LargeBytes
	h := sha256.New()
	_, err := io.Copy(h, newSource(7, size))
	require.NoError(t, err)
	wantSum := hex.EncodeToString(h.Sum(nil))

	src := newSource(7, size)
	in := newHeap()
	src.every = in.sample
	m, err := e.s.Put(ctx(), newMeta(ownerA, base, nil), src, size)
	require.NoError(t, err, "an archive of exactly maxBytes is kept")
	assert.Equal(t, size, src.read, "Put reads the archive once")
	assert.Equal(t, size, m.SizeBytes)
	assert.Equal(t, wantSum, m.SHA256)
	assert.LessOrEqual(t, in.growth(), e.opts.MaxBuffered,
		"the live heap grew by %d MiB while a %d MiB archive streamed in: Put must not hold the archive", in.growth()>>20, size>>20)

	rc, _, err := e.s.Open(ctx(), m.ID, ownerA)
	require.NoError(t, err)
	defer func() { assert.NoError(t, rc.Close()) }()
	out := newHeap()
	want := newSource(7, size)
	got, exp := make([]byte, 256<<10), make([]byte, 256<<10)
	var n int64
	for {
		k, err := io.ReadFull(rc, got)
		if k > 0 {
			_, _ = io.ReadFull(want, exp[:k])
			require.True(t, bytes.Equal(exp[:k], got[:k]), "bytes %d to %d differ from what was put", n, n+int64(k))
			if n/sampleEvery != (n+int64(k))/sampleEvery {
				out.sample()
			}
			n += int64(k)
		}
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			break
		}
		require.NoError(t, err, "after %d bytes", n)
	}
	assert.Equal(t, size, n, "Open returns every byte")
	assert.LessOrEqual(t, out.growth(), e.opts.MaxBuffered,
		"the live heap grew by %d MiB while a %d MiB archive streamed out: Open must not hold the archive", out.growth()>>20, size>>20)
}

// tooLarge is the limit of the over-limit tests, and over an archive past
// it: both span several of an S3 store's parts.
const (
	tooLarge = 12<<20 + 1
	over     = 16 << 20
)

func testTooLarge(e *env) {
	t := e.t
	m := newMeta(ownerA, base, nil)
	src := newSource(3, over)
	_, err := e.s.Put(ctx(), m, src, tooLarge)
	require.ErrorIs(t, err, checkpoints.ErrTooLarge)
	assert.LessOrEqual(t, src.read, int64(tooLarge+1), "Put stops reading past maxBytes")
	e.gone(m.ID, ownerA)
	assert.Equal(t, 0, e.blobs(), "nothing of the refused archive is kept")

	small := bytesOf(3, 1000)
	_, err = e.s.Put(ctx(), newMeta(ownerA, base, nil), bytes.NewReader(small), 999)
	require.ErrorIs(t, err, checkpoints.ErrTooLarge, "one byte over")
	assert.Equal(t, 0, e.blobs())

	got := e.put(m, small)
	assert.Equal(t, m.ID, got.ID, "the refused id was not kept: it can be put again")
}

func testExactlyMax(e *env) {
	data := bytesOf(4, 1000)
	m, err := e.s.Put(ctx(), newMeta(ownerA, base, nil), bytes.NewReader(data), 1000)
	require.NoError(e.t, err)
	assert.Equal(e.t, int64(1000), m.SizeBytes)
}

func testExists(e *env) {
	t := e.t
	data := bytesOf(5, 10000)
	m := e.put(newMeta(ownerA, base, nil), data)
	for _, owner := range []string{ownerA, ownerB} {
		other := newMeta(owner, base.Add(time.Minute), nil)
		other.ID = m.ID
		src := newSource(6, 10000)
		_, err := e.s.Put(ctx(), other, src, maxBytes)
		require.ErrorIs(t, err, checkpoints.ErrExists, "owner %s", owner)
	}
	b, got, err := e.read(m.ID, ownerA)
	require.NoError(t, err)
	assert.Equal(t, m, got, "the first checkpoint is unchanged")
	assert.True(t, bytes.Equal(data, b))
	assert.Equal(t, 1, e.blobs(), "nothing of the refused Puts is kept")
	_, err = e.s.Get(ctx(), m.ID, ownerB)
	assert.ErrorIs(t, err, checkpoints.ErrNotFound, "a refused Put by another owner does not make it theirs")
}

func testReaderFails(e *env) {
	t := e.t
	boom := errors.New("the agent's stream broke")
	for _, after := range []int64{0, 100 << 10, 7 << 20} {
		m := newMeta(ownerA, base, nil)
		_, err := e.s.Put(ctx(), m, &failingReader{src: newSource(8, 20<<20), after: after, err: boom}, maxBytes)
		require.ErrorIs(t, err, boom, "failing after %d bytes: Put returns the reader's error", after)
		e.gone(m.ID, ownerA)
		assert.Equal(t, 0, e.blobs(), "failing after %d bytes: nothing is kept", after)
		e.put(m, bytesOf(8, 100))
		require.NoError(t, e.s.Delete(ctx(), m.ID, ownerA), "the id was not kept")
	}
}

func testContextEnds(e *env) {
	t := e.t
	for _, after := range []int64{1 << 20, 7 << 20} {
		c, cancel := context.WithCancel(ctx())
		m := newMeta(ownerA, base, nil)
		_, err := e.s.Put(c, m, &failingReader{src: newSource(9, 20<<20), after: after, cancel: cancel}, maxBytes)
		cancel()
		require.ErrorIs(t, err, context.Canceled, "cancelled after %d bytes", after)
		e.gone(m.ID, ownerA)
		assert.Equal(t, 0, e.blobs(), "cancelled after %d bytes: nothing is kept", after)
	}
}

func testBadMeta(e *env) {
	t := e.t
	for name, edit := range map[string]func(*checkpoints.Checkpoint){
		"bad id":        func(m *checkpoints.Checkpoint) { m.ID = "ckp-nope" },
		"no owner":      func(m *checkpoints.Checkpoint) { m.Owner = "" },
		"relative path": func(m *checkpoints.Checkpoint) { m.Paths = []string{"work"} },
		"no expiry":     func(m *checkpoints.Checkpoint) { m.ExpiresAt = time.Time{} },
	} {
		m := newMeta(ownerA, base, nil)
		edit(&m)
		src := newSource(10, 1000)
		_, err := e.s.Put(ctx(), m, src, maxBytes)
		var bad *badinput.Error
		require.ErrorAs(t, err, &bad, name)
		assert.Zero(t, src.read, "%s: refused before reading", name)
	}
	_, err := e.s.Put(ctx(), newMeta(ownerA, base, nil), newSource(10, 10), 0)
	var bad *badinput.Error
	require.ErrorAs(t, err, &bad, "maxBytes 0")
	assert.Equal(t, 0, e.blobs())
}

func testUnknown(e *env) {
	for _, id := range []string{checkpoints.NewID(), "ckp-nope", "", "../etc/passwd"} {
		e.gone(id, ownerA)
		assert.NoError(e.t, e.s.Delete(ctx(), id, ownerA), "Delete of an unknown id %q is nil", id)
	}
}

func testOwners(e *env) {
	t := e.t
	data := bytesOf(11, 5000)
	m := e.put(newMeta(ownerA, base, map[string]string{"run": "r1"}), data)
	e.gone(m.ID, ownerB)
	assert.ErrorIs(t, e.s.Delete(ctx(), m.ID, ownerB), checkpoints.ErrNotFound, "Delete of another owner's")
	list, err := e.s.List(ctx(), checkpoints.Filter{Owner: ownerB, Labels: map[string]string{"run": "r1"}})
	require.NoError(t, err)
	assert.Empty(t, list)

	b, _, err := e.read(m.ID, ownerA)
	require.NoError(t, err, "the owner's checkpoint survives another owner's Delete")
	assert.True(t, bytes.Equal(data, b))
}

func testList(e *env) {
	t := e.t
	var all []checkpoints.Checkpoint
	for i := range 6 {
		labels := map[string]string{"run": []string{"r1", "r2"}[i%2], "step": fmt.Sprint(i)}
		all = append(all, e.put(newMeta(ownerA, base.Add(time.Duration(i)*time.Second), labels), bytesOf(byte(20+i), 100)))
	}
	// Two at the same instant: the larger id lists first.
	for range 2 {
		all = append(all, e.put(newMeta(ownerA, base.Add(10*time.Second), map[string]string{"run": "r1", "tie": "y"}), bytesOf(30, 100)))
	}
	e.put(newMeta(ownerB, base.Add(time.Hour), map[string]string{"run": "r1"}), bytesOf(31, 100))
	slices.SortFunc(all, func(a, b checkpoints.Checkpoint) int {
		if checkpoints.Newer(a, b) {
			return -1
		}
		return 1
	})
	where := func(f func(checkpoints.Checkpoint) bool) []checkpoints.Checkpoint {
		var out []checkpoints.Checkpoint
		for _, c := range all {
			if f(c) {
				out = append(out, c)
			}
		}
		return out
	}
	tests := []struct {
		name   string
		filter checkpoints.Filter
		want   []checkpoints.Checkpoint
	}{
		{"all of an owner, newest first", checkpoints.Filter{Owner: ownerA}, all},
		{"one label", checkpoints.Filter{Owner: ownerA, Labels: map[string]string{"run": "r1"}},
			where(func(c checkpoints.Checkpoint) bool { return c.Labels["run"] == "r1" })},
		{"every label", checkpoints.Filter{Owner: ownerA, Labels: map[string]string{"run": "r2", "step": "3"}},
			where(func(c checkpoints.Checkpoint) bool { return c.Labels["step"] == "3" })},
		{"no match", checkpoints.Filter{Owner: ownerA, Labels: map[string]string{"run": "r3"}}, nil},
		{"limit", checkpoints.Filter{Owner: ownerA, Limit: 3}, all[:3]},
		{"limit with labels", checkpoints.Filter{Owner: ownerA, Labels: map[string]string{"run": "r2"}, Limit: 2},
			where(func(c checkpoints.Checkpoint) bool { return c.Labels["run"] == "r2" })[:2]},
		{"ties by id", checkpoints.Filter{Owner: ownerA, Labels: map[string]string{"tie": "y"}}, all[:2]},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := e.s.List(ctx(), tt.filter)
			require.NoError(t, err)
			assert.Equal(t, ids(tt.want), ids(got), "ids in order")
			if len(got) == len(tt.want) {
				for i := range got {
					assert.Equal(t, tt.want[i], got[i], "List returns each checkpoint's metadata as Put did")
				}
			}
		})
	}
}

func ids(cs []checkpoints.Checkpoint) []string {
	out := []string{}
	for _, c := range cs {
		out = append(out, c.ID)
	}
	return out
}

func testListNoOwner(e *env) {
	_, err := e.s.List(ctx(), checkpoints.Filter{})
	var bad *badinput.Error
	assert.ErrorAs(e.t, err, &bad)
}

func testDelete(e *env) {
	t := e.t
	keep := e.put(newMeta(ownerA, base, nil), bytesOf(40, 1000))
	m := e.put(newMeta(ownerA, base, nil), bytesOf(41, 1000))
	require.Equal(t, 2, e.blobs())
	require.NoError(t, e.s.Delete(ctx(), m.ID, ownerA))
	e.gone(m.ID, ownerA)
	require.NoError(t, e.s.Delete(ctx(), m.ID, ownerA), "a second Delete is nil")
	assert.Equal(t, 1, e.blobs(), "Delete removes the archive")
	_, err := e.s.Get(ctx(), keep.ID, ownerA)
	assert.NoError(t, err, "the other checkpoint stays")
}

func testSameContent(e *env) {
	t := e.t
	data := bytesOf(42, 50000)
	a := e.put(newMeta(ownerA, base, nil), data)
	b := e.put(newMeta(ownerB, base, nil), data)
	assert.Equal(t, a.SHA256, b.SHA256)
	want := 2
	if e.opts.SharesBlobs {
		want = 1
	}
	assert.Equal(t, want, e.blobs(), "SharesBlobs=%v", e.opts.SharesBlobs)
	require.NoError(t, e.s.Delete(ctx(), a.ID, ownerA))
	got, _, err := e.read(b.ID, ownerB)
	require.NoError(t, err, "deleting one checkpoint leaves the other's bytes")
	assert.True(t, bytes.Equal(data, got))
	assert.Equal(t, 1, e.blobs())
	require.NoError(t, e.s.Delete(ctx(), b.ID, ownerB))
	assert.Equal(t, 0, e.blobs(), "the last checkpoint's Delete removes the blob")
}

func testExpiry(e *env) {
	t := e.t
	m := e.put(newMeta(ownerA, base, nil), bytesOf(43, 1000))
	e.clock.Set(m.ExpiresAt.Add(-time.Nanosecond))
	_, err := e.s.Get(ctx(), m.ID, ownerA)
	require.NoError(t, err, "not expired a nanosecond before ExpiresAt")
	list, err := e.s.List(ctx(), checkpoints.Filter{Owner: ownerA})
	require.NoError(t, err)
	assert.Equal(t, []string{m.ID}, ids(list))

	e.clock.Set(m.ExpiresAt)
	e.gone(m.ID, ownerA)
	require.NoError(t, e.s.Delete(ctx(), m.ID, ownerA), "Delete of one's own expired checkpoint is nil")
	e.gone(m.ID, ownerA)
}

func testPurge(e *env) {
	t := e.t
	var expiring []checkpoints.Checkpoint
	for i := range 5 {
		m := newMeta(ownerA, base, nil)
		m.ExpiresAt = base.Add(time.Duration(i+1) * time.Minute)
		expiring = append(expiring, e.put(m, bytesOf(byte(50+i), 1000)))
	}
	var live []checkpoints.Checkpoint
	for i := range 2 {
		m := newMeta(ownerB, base, nil)
		m.ExpiresAt = base.Add(2 * time.Hour)
		live = append(live, e.put(m, bytesOf(byte(60+i), 1000)))
	}
	n, err := e.s.Purge(ctx(), base, 10)
	require.NoError(t, err)
	assert.Equal(t, 0, n, "nothing has expired yet")

	now := base.Add(10 * time.Minute)
	e.clock.Set(now)
	n, err = e.s.Purge(ctx(), now, 0)
	require.NoError(t, err)
	assert.Equal(t, 0, n, "budget 0 deletes nothing")
	assert.Equal(t, 7, e.blobs())
	total := 0
	for _, want := range []int{2, 2, 1, 0} {
		n, err := e.s.Purge(ctx(), now, 2)
		require.NoError(t, err)
		assert.Equal(t, want, n, "Purge deletes at most its budget, then what is left")
		total += n
	}
	assert.Equal(t, 5, total)
	assert.Equal(t, 2, e.blobs(), "purged archives are removed")
	for _, m := range expiring {
		require.NoError(t, e.s.Delete(ctx(), m.ID, ownerA), "a purged id is unknown")
	}
	for _, m := range live {
		_, err := e.s.Get(ctx(), m.ID, ownerB)
		assert.NoError(t, err, "a checkpoint that has not expired stays")
	}
}

func testCorruption(e *env) {
	t := e.t
	cr, ok := e.s.(Corrupter)
	require.True(t, ok, "the store given to the suite must implement checkpointtest.Corrupter (%T does not)", e.s)
	for i, tt := range []struct {
		name   string
		mutate func([]byte) []byte
	}{
		{"a flipped byte", func(b []byte) []byte { b[len(b)/2] ^= 0x40; return b }},
		{"the last byte missing", func(b []byte) []byte { return b[:len(b)-1] }},
		{"a byte more", func(b []byte) []byte { return append(b, 'x') }},
		{"empty", func([]byte) []byte { return nil }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			data := bytesOf(byte(70+i), 300<<10)
			m := e.put(newMeta(ownerA, base, nil), data)
			require.NoError(t, cr.Corrupt(ctx(), m.ID, tt.mutate))
			rc, _, err := e.s.Open(ctx(), m.ID, ownerA)
			require.NoError(t, err, "Open itself succeeds: the damage shows at the end of the stream")
			_, err = io.Copy(io.Discard, rc)
			assert.ErrorIs(t, err, checkpoints.ErrCorrupt, "reading to the end returns ErrCorrupt, not io.EOF")
			assert.NoError(t, rc.Close())
			got, err := e.s.Get(ctx(), m.ID, ownerA)
			require.NoError(t, err)
			assert.Equal(t, m, got, "the metadata is as put")
		})
	}
}

// parallel runs fn(i) for i in [0, n), at most p at once, and waits.
func parallel(n, p int, fn func(i int)) {
	sem := make(chan struct{}, p)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			fn(i)
		}()
	}
	wg.Wait()
}

func testConcurrent(e *env) {
	t := e.t
	n := e.opts.Concurrent
	metas := make([]checkpoints.Checkpoint, n)
	// Checkpoints i and i+1 (i even) share their bytes: a content-addressed
	// store shares and counts their blob under concurrent puts.
	seed := func(i int) byte { return byte(100 + i/2) }
	var failed atomic.Int32
	parallel(n, e.opts.Parallel, func(i int) {
		m, err := e.s.Put(ctx(), newMeta(ownerA, base.Add(time.Duration(i)*time.Millisecond), nil), newSource(seed(i), 20000), maxBytes)
		if !assert.NoError(t, err) {
			failed.Add(1)
		}
		metas[i] = m
	})
	require.Zero(t, failed.Load())
	// Delete every checkpoint i with i%4 == 1 or 2 (one of each pair of
	// pairs) while the others are read.
	deleted := func(i int) bool { return i%4 == 1 || i%4 == 2 }
	parallel(n, e.opts.Parallel, func(i int) {
		if deleted(i) {
			assert.NoError(t, e.s.Delete(ctx(), metas[i].ID, ownerA))
			return
		}
		b, _, err := e.read(metas[i].ID, ownerA)
		if assert.NoError(t, err) {
			assert.True(t, bytes.Equal(bytesOf(seed(i), 20000), b), "checkpoint %d reads back", i)
		}
	})
	var kept []string
	blobs := map[byte]bool{}
	for i, m := range metas {
		if deleted(i) {
			e.gone(m.ID, ownerA)
			continue
		}
		kept = append(kept, m.ID)
		blobs[seed(i)] = true
		b, _, err := e.read(m.ID, ownerA)
		require.NoError(t, err)
		assert.True(t, bytes.Equal(bytesOf(seed(i), 20000), b), "checkpoint %d reads back after the deletes", i)
	}
	list, err := e.s.List(ctx(), checkpoints.Filter{Owner: ownerA, Limit: n})
	require.NoError(t, err)
	assert.ElementsMatch(t, kept, ids(list))
	want := len(kept)
	if e.opts.SharesBlobs {
		want = len(blobs)
	}
	assert.Equal(t, want, e.blobs(), "what is kept is exactly what is left")
	e.usage(ownerA, int64(want)*20000, int64(want)*20000, "the usage is what is left")
}

func testConcurrentSameID(e *env) {
	t := e.t
	m := newMeta(ownerA, base, nil)
	var won atomic.Int32
	var winner atomic.Int32
	parallel(e.opts.Parallel, e.opts.Parallel, func(i int) {
		_, err := e.s.Put(ctx(), m, newSource(byte(150+i), 300<<10), maxBytes)
		if err == nil {
			won.Add(1)
			winner.Store(int32(i))
			return
		}
		assert.ErrorIs(t, err, checkpoints.ErrExists, "a Put that lost the race")
	})
	require.Equal(t, int32(1), won.Load(), "exactly one Put of an id wins")
	b, _, err := e.read(m.ID, ownerA)
	require.NoError(t, err)
	assert.True(t, bytes.Equal(bytesOf(byte(150+winner.Load()), 300<<10), b), "the winner's bytes are stored")
	assert.Equal(t, 1, e.blobs(), "the losers kept nothing")
}

func testSharedRace(e *env) {
	t := e.t
	data := bytesOf(200, 64<<10)
	for round := range 20 {
		a := e.put(newMeta(ownerA, base, nil), data)
		var b checkpoints.Checkpoint
		var wg sync.WaitGroup
		wg.Add(2)
		go func() {
			defer wg.Done()
			assert.NoError(t, e.s.Delete(ctx(), a.ID, ownerA))
		}()
		go func() {
			defer wg.Done()
			var err error
			b, err = e.s.Put(ctx(), newMeta(ownerA, base, nil), bytes.NewReader(data), maxBytes)
			assert.NoError(t, err)
		}()
		wg.Wait()
		got, _, err := e.read(b.ID, ownerA)
		require.NoError(t, err, "round %d: a Put racing a Delete of the same bytes keeps its archive", round)
		require.True(t, bytes.Equal(data, got), "round %d", round)
		require.NoError(t, e.s.Delete(ctx(), b.ID, ownerA))
	}
	assert.Equal(t, 0, e.blobs())
	e.usage(ownerA, 0, 0, "every racing Delete and Put is counted once")
}

func testClose(e *env) {
	t := e.t
	m := e.put(newMeta(ownerA, base, nil), bytesOf(210, 1000))
	require.NoError(t, e.s.Close())
	require.NoError(t, e.s.Close(), "closing twice is nil")
	_, err := e.s.Put(ctx(), newMeta(ownerA, base, nil), bytes.NewReader(nil), maxBytes)
	assert.ErrorIs(t, err, checkpoints.ErrClosed, "Put")
	_, err = e.s.Get(ctx(), m.ID, ownerA)
	assert.ErrorIs(t, err, checkpoints.ErrClosed, "Get")
	_, _, err = e.s.Open(ctx(), m.ID, ownerA)
	assert.ErrorIs(t, err, checkpoints.ErrClosed, "Open")
	_, err = e.s.List(ctx(), checkpoints.Filter{Owner: ownerA})
	assert.ErrorIs(t, err, checkpoints.ErrClosed, "List")
	assert.ErrorIs(t, e.s.Delete(ctx(), m.ID, ownerA), checkpoints.ErrClosed, "Delete")
	_, err = e.s.Purge(ctx(), base, 10)
	assert.ErrorIs(t, err, checkpoints.ErrClosed, "Purge")
	_, err = e.s.Usage(ctx(), ownerA)
	assert.ErrorIs(t, err, checkpoints.ErrClosed, "Usage")
}
