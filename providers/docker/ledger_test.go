package docker

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/docker/docker/pkg/jsonmessage"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestLedger_WritesAtOnceButCoalescesUses(t *testing.T) {
	path := filepath.Join(t.TempDir(), "docker", "images.json")
	l, err := loadLedger(path)
	require.NoError(t, err)
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	require.NoError(t, l.add(ledgerEntry{Ref: "r/a:1", Image: "r/a:1", ID: "sha256:a", Size: 10, Pulled: t0, LastUsed: t0}))
	require.NoError(t, l.pin("r/p:1"))
	fi, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())

	l.touch("r/a:1", t0.Add(time.Hour))
	l.touch("r/a:1", t0.Add(time.Minute)) // earlier: no change
	l.touch("r/unknown:1", t0.Add(time.Hour))
	again, err := loadLedger(path)
	require.NoError(t, err)
	e, _ := again.get("r/a:1")
	assert.Equal(t, t0, e.LastUsed, "a use waits for the flush")

	require.NoError(t, l.flush())
	again, err = loadLedger(path)
	require.NoError(t, err)
	e, ok := again.get("r/a:1")
	require.True(t, ok)
	assert.Equal(t, t0.Add(time.Hour), e.LastUsed)
	assert.True(t, again.isPinned("r/p:1"))
	_, ok = again.get("r/unknown:1")
	assert.False(t, ok, "a use of an image the ledger does not hold adds nothing")

	require.NoError(t, again.remove("r/a:1"))
	entries, pinned := again.snapshot()
	assert.Empty(t, entries)
	assert.Equal(t, []string{"r/p:1"}, pinned)
	var f ledgerFile
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &f))
	assert.Equal(t, ledgerFile{Version: ledgerVersion, Images: []ledgerEntry{}, Pinned: []string{"r/p:1"}}, f)
}

func TestLedger_UnreadableFileNamesIt(t *testing.T) {
	dir := t.TempDir()
	for name, content := range map[string]string{"bad.json": "{", "old.json": `{"version": 99}`} {
		path := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
		_, err := loadLedger(path)
		require.Error(t, err)
		assert.Contains(t, err.Error(), path)
	}
	l, err := loadLedger("")
	require.NoError(t, err, "no file: in memory")
	require.NoError(t, l.add(ledgerEntry{Ref: "r"}))
	require.NoError(t, l.flush())
}

func TestChooseEvictions_LeastRecentlyUsedFirstSkippingTheKept(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	entry := func(ref string, minutes int, size int64) ledgerEntry {
		return ledgerEntry{Ref: ref, Size: size, LastUsed: t0.Add(time.Duration(minutes) * time.Minute)}
	}
	entries := []ledgerEntry{entry("new", 30, 100), entry("kept", 0, 100), entry("old", 10, 100), entry("mid", 20, 100)}
	keepOnly := func(kept ...string) (keeper, *[]string) {
		var asked []string
		return func(e ledgerEntry) (string, error) {
			asked = append(asked, e.Ref)
			for _, k := range kept {
				if e.Ref == k {
					return "in use", nil
				}
			}
			return "", nil
		}, &asked
	}
	refs := func(es []ledgerEntry) []string {
		var out []string
		for _, e := range es {
			out = append(out, e.Ref)
		}
		return out
	}
	tests := []struct {
		name   string
		budget int64
		kept   []string
		want   []string
		over   int64
		asked  []string
	}{
		{name: "within budget: nothing asked", budget: 400, asked: nil},
		{name: "no budget", budget: 0, asked: nil},
		{name: "one over", budget: 350, want: []string{"kept"}, asked: []string{"kept"}},
		{name: "the kept one is skipped", budget: 350, kept: []string{"kept"}, want: []string{"old"}, asked: []string{"kept", "old"}},
		{name: "two to remove", budget: 200, kept: []string{"kept"}, want: []string{"old", "mid"}, asked: []string{"kept", "old", "mid"}},
		{name: "cannot be met", budget: 50, kept: []string{"kept", "new"}, want: []string{"old", "mid"}, over: 150, asked: []string{"kept", "old", "mid", "new"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			keep, asked := keepOnly(tt.kept...)
			victims, over, err := chooseEvictions(entries, tt.budget, keep)
			require.NoError(t, err)
			assert.Equal(t, tt.want, refs(victims))
			assert.Equal(t, tt.over, over)
			assert.Equal(t, tt.asked, *asked)
		})
	}
}

func TestProgressOf_AddsUpTheLayersDownloads(t *testing.T) {
	layers := map[string]layerProgress{}
	msgs := []jsonmessage.JSONMessage{
		{ID: "a", Status: "Pulling fs layer"},
		{ID: "b", Status: "Pulling fs layer"},
		{ID: "c", Status: "Already exists"},
		{ID: "a", Status: "Downloading", Progress: &jsonmessage.JSONProgress{Current: 10, Total: 100}},
		{ID: "b", Status: "Downloading", Progress: &jsonmessage.JSONProgress{Current: 5, Total: 50}},
		{ID: "a", Status: "Download complete"},
	}
	for _, m := range msgs {
		progressOf(layers, m)
	}
	done, total := sumProgress(layers)
	assert.Equal(t, int64(105), done)
	assert.Equal(t, int64(150), total)
	assert.False(t, progressOf(layers, jsonmessage.JSONMessage{ID: "x", Status: "Digest: sha256:…"}))
}
