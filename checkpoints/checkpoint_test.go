package checkpoints_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/checkpoints"
	"github.com/quarryhq/quarry/internal/badinput"
)

func TestNewID_IsValidAndUnique(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		id := checkpoints.NewID()
		require.True(t, checkpoints.ValidID(id), id)
		require.Len(t, id, 30)
		require.False(t, seen[id])
		seen[id] = true
	}
}

func TestValidID_RefusesOtherShapes(t *testing.T) {
	for _, id := range []string{"", "ckp-", "sbx-aaaaaaaaaaaaaaaaaaaaaaaaaa", "ckp-aaaaaaaaaaaaaaaaaaaaaaaaa", "ckp-aaaaaaaaaaaaaaaaaaaaaaaaaaa",
		"ckp-AAAAAAAAAAAAAAAAAAAAAAAAAA", "ckp-aaaaaaaaaaaaaaaaaaaaaaaaa1", "ckp-../../../../../../etc/pa"} {
		assert.False(t, checkpoints.ValidID(id), id)
	}
}

func meta() checkpoints.Checkpoint {
	created := time.Date(2030, 1, 2, 3, 4, 5, 6, time.FixedZone("x", 3600))
	return checkpoints.Checkpoint{
		ID: checkpoints.NewID(), Owner: "owner-hash", Pool: "default", Image: "host", Sandbox: "sbx-1",
		Paths: []string{"/work"}, Format: "tar+gzip", Files: 3,
		CreatedAt: created, ExpiresAt: created.Add(time.Hour),
	}
}

func TestCheckPut_Normalizes(t *testing.T) {
	m := meta()
	m.Exclude, m.Labels = []string{}, map[string]string{}
	m.SHA256, m.SizeBytes = "abc", 7
	got, err := checkpoints.CheckPut(m, 10)
	require.NoError(t, err)
	assert.Nil(t, got.Exclude)
	assert.Nil(t, got.Labels)
	assert.Empty(t, got.SHA256, "the store computes it")
	assert.Zero(t, got.SizeBytes)
	assert.Equal(t, time.UTC, got.CreatedAt.Location())
	assert.True(t, got.CreatedAt.Equal(m.CreatedAt))
	assert.Equal(t, time.UTC, got.ExpiresAt.Location())

	m.Labels = map[string]string{"a": "1"}
	got, err = checkpoints.CheckPut(m, 10)
	require.NoError(t, err)
	got.Labels["a"] = "2"
	assert.Equal(t, "1", m.Labels["a"], "the caller's map is not shared")
}

func TestCheckPut_RefusesBadMetadata(t *testing.T) {
	long := strings.Repeat("x", 300)
	tests := []struct {
		name  string
		edit  func(*checkpoints.Checkpoint)
		max   int64
		field string
	}{
		{name: "id", edit: func(m *checkpoints.Checkpoint) { m.ID = "ckp-nope" }, field: "id"},
		{name: "max bytes", edit: func(*checkpoints.Checkpoint) {}, max: -1, field: "max_bytes"},
		{name: "owner", edit: func(m *checkpoints.Checkpoint) { m.Owner = "" }, field: "owner"},
		{name: "format", edit: func(m *checkpoints.Checkpoint) { m.Format = "" }, field: "format"},
		{name: "long pool", edit: func(m *checkpoints.Checkpoint) { m.Pool = long }, field: "pool"},
		{name: "image control chars", edit: func(m *checkpoints.Checkpoint) { m.Image = "a\nb" }, field: "image"},
		{name: "no paths", edit: func(m *checkpoints.Checkpoint) { m.Paths = nil }, field: "paths"},
		{name: "relative path", edit: func(m *checkpoints.Checkpoint) { m.Paths = []string{"work"} }, field: "paths"},
		{name: "unclean path", edit: func(m *checkpoints.Checkpoint) { m.Paths = []string{"/work/../etc"} }, field: "paths"},
		{name: "too many paths", edit: func(m *checkpoints.Checkpoint) { m.Paths = make([]string, checkpoints.MaxPaths+1) }, field: "paths"},
		{name: "empty exclude", edit: func(m *checkpoints.Checkpoint) { m.Exclude = []string{""} }, field: "exclude"},
		{name: "too many labels", edit: func(m *checkpoints.Checkpoint) {
			m.Labels = map[string]string{}
			for i := range checkpoints.MaxLabels + 1 {
				m.Labels[strings.Repeat("k", i+1)] = "v"
			}
		}, field: "labels"},
		{name: "label key with =", edit: func(m *checkpoints.Checkpoint) { m.Labels = map[string]string{"a=b": "v"} }, field: "labels"},
		{name: "label value", edit: func(m *checkpoints.Checkpoint) { m.Labels = map[string]string{"k": long} }, field: "labels.k"},
		{name: "negative files", edit: func(m *checkpoints.Checkpoint) { m.Files = -1 }, field: "files"},
		{name: "no created", edit: func(m *checkpoints.Checkpoint) { m.CreatedAt = time.Time{} }, field: "created_at"},
		{name: "expiry before creation", edit: func(m *checkpoints.Checkpoint) { m.ExpiresAt = m.CreatedAt }, field: "expires_at"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := meta()
			tt.edit(&m)
			if tt.max == 0 {
				tt.max = 10
			}
			_, err := checkpoints.CheckPut(m, tt.max)
			var bad *badinput.Error
			require.ErrorAs(t, err, &bad)
			assert.Equal(t, tt.field, bad.Field)
		})
	}
}

func TestFilter_CheckResolvesLimit(t *testing.T) {
	_, err := checkpoints.Filter{}.Check()
	var bad *badinput.Error
	require.ErrorAs(t, err, &bad)
	assert.Equal(t, "owner", bad.Field)
	for _, tt := range []struct{ in, want int }{{0, 100}, {-5, 100}, {7, 7}, {1000, 1000}, {5000, 1000}} {
		f, err := checkpoints.Filter{Owner: "o", Limit: tt.in}.Check()
		require.NoError(t, err)
		assert.Equal(t, tt.want, f.Limit, "limit %d", tt.in)
	}
}

func TestFilter_MatchesEveryLabel(t *testing.T) {
	c := checkpoints.Checkpoint{Labels: map[string]string{"a": "1", "b": "2"}}
	assert.True(t, checkpoints.Filter{}.Matches(c))
	assert.True(t, checkpoints.Filter{Labels: map[string]string{"a": "1"}}.Matches(c))
	assert.True(t, checkpoints.Filter{Labels: map[string]string{"a": "1", "b": "2"}}.Matches(c))
	assert.False(t, checkpoints.Filter{Labels: map[string]string{"a": "2"}}.Matches(c))
	assert.False(t, checkpoints.Filter{Labels: map[string]string{"c": ""}}.Matches(c), "a missing label is not an empty one")
}

func TestNewer_CreatedThenID(t *testing.T) {
	t0 := time.Unix(100, 0)
	a := checkpoints.Checkpoint{ID: "ckp-a", CreatedAt: t0.Add(time.Second)}
	b := checkpoints.Checkpoint{ID: "ckp-b", CreatedAt: t0}
	c := checkpoints.Checkpoint{ID: "ckp-c", CreatedAt: t0}
	assert.True(t, checkpoints.Newer(a, b))
	assert.False(t, checkpoints.Newer(b, a))
	assert.True(t, checkpoints.Newer(c, b), "same time: the larger id first")
	assert.False(t, checkpoints.Newer(b, c))
}

func TestCheckpoint_ExpiredAtExpiresAt(t *testing.T) {
	c := checkpoints.Checkpoint{ExpiresAt: time.Unix(100, 0)}
	assert.False(t, c.Expired(time.Unix(99, 999)))
	assert.True(t, c.Expired(time.Unix(100, 0)))
	assert.True(t, c.Expired(time.Unix(101, 0)))
}

// countingReader counts what it gives.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

func sum(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

func TestDigestReader_HashesAndCounts(t *testing.T) {
	data := bytes.Repeat([]byte("checkpoint"), 10000)
	for _, max := range []int64{int64(len(data)), int64(len(data)) + 1, 1 << 30} {
		d := checkpoints.NewDigestReader(context.Background(), iotest.HalfReader(bytes.NewReader(data)), max)
		got, err := io.ReadAll(d)
		require.NoError(t, err, "max %d", max)
		assert.Equal(t, data, got)
		assert.Equal(t, int64(len(data)), d.Size())
		assert.Equal(t, sum(data), d.SHA256())
		assert.NoError(t, d.Err())
	}
}

func TestDigestReader_StopsPastMax(t *testing.T) {
	data := bytes.Repeat([]byte("x"), 100000)
	src := &countingReader{r: bytes.NewReader(data)}
	d := checkpoints.NewDigestReader(context.Background(), src, 1000)
	_, err := io.Copy(io.Discard, d)
	require.ErrorIs(t, err, checkpoints.ErrTooLarge)
	assert.Contains(t, err.Error(), "larger than 1000 bytes")
	assert.LessOrEqual(t, src.n, int64(1001), "reads at most maxBytes+1 bytes")
	_, err = d.Read(make([]byte, 10))
	assert.ErrorIs(t, err, checkpoints.ErrTooLarge, "sticky")
	assert.ErrorIs(t, d.Err(), checkpoints.ErrTooLarge)
}

func TestDigestReader_PassesReaderErrorsAndContext(t *testing.T) {
	boom := errors.New("boom")
	d := checkpoints.NewDigestReader(context.Background(), io.MultiReader(strings.NewReader("abc"), iotest.ErrReader(boom)), 100)
	_, err := io.ReadAll(d)
	require.ErrorIs(t, err, boom)
	assert.ErrorIs(t, d.Err(), boom)

	ctx, cancel := context.WithCancel(context.Background())
	d = checkpoints.NewDigestReader(ctx, strings.NewReader(strings.Repeat("a", 100)), 1000)
	_, err = d.Read(make([]byte, 10))
	require.NoError(t, err)
	cancel()
	_, err = d.Read(make([]byte, 10))
	assert.ErrorIs(t, err, context.Canceled)
	assert.ErrorIs(t, d.Err(), context.Canceled)
}

func TestVerifyReader(t *testing.T) {
	data := bytes.Repeat([]byte("0123456789"), 5000)
	flipped := bytes.Clone(data)
	flipped[len(flipped)/2] ^= 1
	boom := errors.New("boom")
	tests := []struct {
		name    string
		stored  io.Reader
		corrupt bool
		err     error
		msg     string
	}{
		{name: "intact", stored: bytes.NewReader(data)},
		{name: "flipped byte", stored: bytes.NewReader(flipped), corrupt: true, msg: "does not hash"},
		{name: "truncated", stored: bytes.NewReader(data[:len(data)-1]), corrupt: true, msg: "49999 bytes, not 50000"},
		{name: "longer", stored: io.MultiReader(bytes.NewReader(data), strings.NewReader("x")), corrupt: true, msg: "longer than its 50000 bytes"},
		{name: "read error passes", stored: io.MultiReader(bytes.NewReader(data[:10]), iotest.ErrReader(boom)), err: boom},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			closed := false
			rc := readCloser{Reader: iotest.HalfReader(tt.stored), close: func() { closed = true }}
			v := checkpoints.NewVerifyReader(rc, int64(len(data)), sum(data))
			got, err := io.ReadAll(v)
			switch {
			case tt.corrupt:
				require.ErrorIs(t, err, checkpoints.ErrCorrupt)
				assert.Contains(t, err.Error(), tt.msg)
				_, again := v.Read(make([]byte, 1))
				assert.ErrorIs(t, again, checkpoints.ErrCorrupt, "sticky: never io.EOF after corruption")
			case tt.err != nil:
				require.ErrorIs(t, err, tt.err)
				assert.NotErrorIs(t, err, checkpoints.ErrCorrupt)
			default:
				require.NoError(t, err)
				assert.Equal(t, data, got)
			}
			require.NoError(t, v.Close())
			assert.True(t, closed)
		})
	}
}

type readCloser struct {
	io.Reader
	close func()
}

func (r readCloser) Close() error { r.close(); return nil }

func TestConfig_DefaultsAndValidate(t *testing.T) {
	c := checkpoints.Config{}.WithDefaults()
	assert.Equal(t, checkpoints.StoreEmbedded, c.Store)
	assert.Equal(t, 7*24*time.Hour, c.Retention)
	assert.Equal(t, int64(4<<30), c.MaxBytes)
	require.NoError(t, checkpoints.Config{}.Validate())
	require.NoError(t, checkpoints.Config{Store: "s3"}.Validate())

	err := checkpoints.Config{Store: "disk", Retention: -time.Second, MaxBytes: -1}.Validate()
	require.Error(t, err)
	for _, v := range []string{"QUARRY_CHECKPOINT_STORE", "QUARRY_CHECKPOINT_RETENTION", "QUARRY_MAX_CHECKPOINT_BYTES"} {
		assert.Contains(t, err.Error(), v)
	}
}

func TestConfig_Stamp(t *testing.T) {
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.Local)
	m := checkpoints.Config{Retention: time.Hour}.Stamp(checkpoints.Checkpoint{ID: "x"}, now)
	assert.Equal(t, "x", m.ID)
	assert.True(t, m.CreatedAt.Equal(now))
	assert.Equal(t, time.UTC, m.CreatedAt.Location())
	assert.True(t, m.ExpiresAt.Equal(now.Add(time.Hour)))
}
