package execagent

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Stat answers envd's EntryInfo: types, the mode string, sizes as strings,
// a symlink's target and its target's type.
func TestEnvd_Stat_EntryInfo(t *testing.T) {
	a := newTestAgent(t, nil)
	w := a.cfg.Workdir
	f := filepath.Join(w, "f.txt")
	require.NoError(t, os.WriteFile(f, []byte("hello"), 0o640))
	require.NoError(t, os.Chmod(f, 0o640))
	require.NoError(t, os.Mkdir(filepath.Join(w, "d"), 0o750))
	require.NoError(t, os.Symlink(f, filepath.Join(w, "link")))
	require.NoError(t, os.Symlink("nowhere", filepath.Join(w, "dangling")))
	tests := []struct {
		name, path string
		want       map[string]any // fields checked
	}{
		{name: "a file, relative", path: "f.txt", want: map[string]any{"name": "f.txt", "type": fileTypeFile, "path": f,
			"size": "5", "mode": float64(0o640), "permissions": "-rw-r-----"}},
		{name: "~/", path: "~/f.txt", want: map[string]any{"path": f}},
		{name: "a directory", path: filepath.Join(w, "d"), want: map[string]any{"type": fileTypeDirectory,
			"mode": float64(0o750), "permissions": "drwxr-x---"}},
		{name: "a symlink to a file", path: "link", want: map[string]any{"type": fileTypeFile, "symlinkTarget": f,
			"mode": float64(0o640), "permissions": "Lrwxrwxrwx"}},
		{name: "a dangling symlink", path: "dangling", want: map[string]any{"type": fileTypeSymlink, "symlinkTarget": "nowhere"}},
		{name: "the home", path: "", want: map[string]any{"path": w, "type": fileTypeDirectory}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := rpcOK(t, a, "filesystem.Filesystem/Stat", fmt.Sprintf(`{"path":%q}`, tt.path))["entry"].(map[string]any)
			for k, v := range tt.want {
				assert.Equal(t, v, e[k], k)
			}
			assert.NotEmpty(t, e["owner"])
			assert.NotEmpty(t, e["group"])
			mt, err := time.Parse(time.RFC3339Nano, e["modifiedTime"].(string))
			require.NoError(t, err)
			assert.WithinDuration(t, time.Now(), mt, time.Hour)
		})
	}
	_, hasTarget := rpcOK(t, a, "filesystem.Filesystem/Stat", `{"path":"f.txt"}`)["entry"].(map[string]any)["symlinkTarget"]
	assert.False(t, hasTarget, "symlinkTarget is absent (not empty) for a file")
	status, out := rpc(t, a, "filesystem.Filesystem/Stat", `{"path":"~other/x"}`)
	assert.Equal(t, http.StatusBadRequest, status, "%v", out)
}

// entryPaths lists the paths of a ListDir answer.
func entryPaths(out map[string]any) []string {
	var ps []string
	ents, _ := out["entries"].([]any)
	for _, e := range ents {
		ps = append(ps, e.(map[string]any)["path"].(string))
	}
	return ps
}

func TestEnvd_ListDir_DepthAndBounds(t *testing.T) {
	a := newTestAgent(t, func(c *Config) { c.MaxListEntries = 5 })
	w := a.cfg.Workdir
	require.NoError(t, os.MkdirAll(filepath.Join(w, "t", "a", "b"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(w, "t", "a", "b", "c.txt"), nil, 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(w, "t", "x.txt"), nil, 0o644))
	require.NoError(t, os.Symlink(filepath.Join(w, "t"), filepath.Join(w, "tl")))
	tests := []struct {
		name, req string
		want      []string
	}{
		{name: "depth 0 is 1", req: `{"path":"t"}`, want: []string{"t/a", "t/x.txt"}},
		{name: "depth 2", req: `{"path":"t","depth":2}`, want: []string{"t/a", "t/a/b", "t/x.txt"}},
		{name: "depth 3", req: `{"path":"t","depth":3}`, want: []string{"t/a", "t/a/b", "t/a/b/c.txt", "t/x.txt"}},
		{name: "through a symlink, shown under it", req: `{"path":"tl"}`, want: []string{"tl/a", "tl/x.txt"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var want []string
			for _, p := range tt.want {
				want = append(want, filepath.Join(w, p))
			}
			assert.Equal(t, want, entryPaths(rpcOK(t, a, "filesystem.Filesystem/ListDir", tt.req)))
		})
	}
	refusals := []struct {
		name, req  string
		wantStatus int
		wantCode   string
	}{
		{name: "missing", req: `{"path":"nope"}`, wantStatus: http.StatusNotFound, wantCode: connectNotFound},
		{name: "a file", req: `{"path":"t/x.txt"}`, wantStatus: http.StatusBadRequest, wantCode: connectInvalidArgument},
		{name: "over MaxListEntries", req: `{"path":"","depth":10}`, wantStatus: http.StatusTooManyRequests, wantCode: connectResourceExhausted},
	}
	for _, tt := range refusals {
		t.Run(tt.name, func(t *testing.T) {
			status, out := rpc(t, a, "filesystem.Filesystem/ListDir", tt.req)
			assert.Equal(t, tt.wantStatus, status, "%v", out)
			assert.Equal(t, tt.wantCode, out["code"])
		})
	}
}

func TestEnvd_MakeDirMoveRemove(t *testing.T) {
	a := newTestAgent(t, nil)
	w := a.cfg.Workdir
	e := rpcOK(t, a, "filesystem.Filesystem/MakeDir", `{"path":"n/e/w"}`)["entry"].(map[string]any)
	assert.Equal(t, filepath.Join(w, "n/e/w"), e["path"])
	assert.Equal(t, fileTypeDirectory, e["type"])
	require.NoError(t, os.WriteFile(filepath.Join(w, "f"), []byte("x"), 0o644))
	e = rpcOK(t, a, "filesystem.Filesystem/Move", `{"source":"f","destination":"m/o/ved"}`)["entry"].(map[string]any)
	assert.Equal(t, filepath.Join(w, "m/o/ved"), e["path"])
	assert.Equal(t, "ved", e["name"])
	assert.NoFileExists(t, filepath.Join(w, "f"))
	assert.Equal(t, map[string]any{}, rpcOK(t, a, "filesystem.Filesystem/Remove", `{"path":"m"}`))
	assert.NoDirExists(t, filepath.Join(w, "m"))
	assert.Equal(t, map[string]any{}, rpcOK(t, a, "filesystem.Filesystem/Remove", `{"path":"m"}`), "nothing there is no error")
	refusals := []struct {
		name, method, req string
		wantCode          string
	}{
		{name: "make an existing directory", method: "MakeDir", req: `{"path":"n"}`, wantCode: connectAlreadyExists},
		{name: "make a directory over a file", method: "MakeDir", req: `{"path":"n/e/w/../../../m"}`, wantCode: ""},
		{name: "move what is not there", method: "Move", req: `{"source":"gone","destination":"x"}`, wantCode: connectNotFound},
		{name: "move without a destination", method: "Move", req: `{"source":"n"}`, wantCode: connectInvalidArgument},
		{name: "remove without a path", method: "Remove", req: `{}`, wantCode: connectInvalidArgument},
	}
	require.NoError(t, os.WriteFile(filepath.Join(w, "file"), nil, 0o644))
	refusals[1].req, refusals[1].wantCode = `{"path":"file"}`, connectInvalidArgument
	for _, tt := range refusals {
		t.Run(tt.name, func(t *testing.T) {
			status, out := rpc(t, a, "filesystem.Filesystem/"+tt.method, tt.req)
			assert.Equal(t, tt.wantCode, out["code"], "%d %v", status, out)
			assert.Equal(t, connectStatus(tt.wantCode), status)
		})
	}
}

// watchEvents collects "TYPE name" of a GetWatcherEvents answer.
func watchEvents(out map[string]any) []string {
	var evs []string
	list, _ := out["events"].([]any)
	for _, e := range list {
		m := e.(map[string]any)
		evs = append(evs, fmt.Sprintf("%s %s", m["type"], m["name"]))
	}
	return evs
}

// A polled watcher (the sync SDK's watch_dir) sees creates, writes,
// removes and, when recursive, new subdirectories' files.
func TestEnvd_Watcher_PolledRecursive(t *testing.T) {
	a := newTestAgent(t, nil)
	w := a.cfg.Workdir
	id := rpcOK(t, a, "filesystem.Filesystem/CreateWatcher", `{"path":"","recursive":true,"include_entry":true}`)["watcherId"].(string)
	require.NotEmpty(t, id)
	require.NoError(t, os.WriteFile(filepath.Join(w, "a.txt"), []byte("x"), 0o644))
	require.NoError(t, os.Mkdir(filepath.Join(w, "sub"), 0o755))
	var seen []string
	var entries []any
	poll := func() {
		out := rpcOK(t, a, "filesystem.Filesystem/GetWatcherEvents", fmt.Sprintf(`{"watcherId":%q}`, id))
		seen = append(seen, watchEvents(out)...)
		list, _ := out["events"].([]any)
		for _, e := range list {
			if en := e.(map[string]any)["entry"]; en != nil {
				entries = append(entries, en)
			}
		}
	}
	eventually(t, func() bool { poll(); return slices.Contains(seen, eventCreate+" sub") }, "the new directory: %v", seen)
	require.NoError(t, os.WriteFile(filepath.Join(w, "sub", "b.txt"), []byte("y"), 0o644))
	require.NoError(t, os.Remove(filepath.Join(w, "a.txt")))
	want := []string{eventCreate + " a.txt", eventWrite + " a.txt", eventCreate + " sub", eventCreate + " sub/b.txt",
		eventWrite + " sub/b.txt", eventRemove + " a.txt"}
	eventually(t, func() bool {
		poll()
		return !slices.ContainsFunc(want, func(e string) bool { return !slices.Contains(seen, e) })
	}, "all events: want %v, got %v", want, seen)
	assert.NotEmpty(t, entries, "include_entry: creates and writes carry the entry")

	// A file the agent writes (an upload) is staged under another name
	// and renamed into place: the watcher reports the rename's CREATE of
	// the name only.
	seen = nil
	upStatus, body := filesReq(t, a, http.MethodPost, url.Values{"path": {"up.txt"}}, "application/octet-stream", strings.NewReader("u"))
	require.Equal(t, http.StatusOK, upStatus, "%s", body)
	eventually(t, func() bool { poll(); return slices.Contains(seen, eventCreate+" up.txt") }, "the upload: %v", seen)
	// A barrier: inotify queues a watch's events in order, so once the
	// marker's CREATE is seen, any event of the staged file was too.
	require.NoError(t, os.WriteFile(filepath.Join(w, "marker"), nil, 0o644))
	eventually(t, func() bool { poll(); return slices.Contains(seen, eventCreate+" marker") }, "the marker: %v", seen)
	seen = slices.DeleteFunc(seen, func(e string) bool { return strings.HasSuffix(e, " marker") })
	assert.Equal(t, []string{eventCreate + " up.txt"}, seen, "no events of the staged file")
	rpcOK(t, a, "filesystem.Filesystem/RemoveWatcher", fmt.Sprintf(`{"watcherId":%q}`, id))
	status, _ := rpc(t, a, "filesystem.Filesystem/GetWatcherEvents", fmt.Sprintf(`{"watcherId":%q}`, id))
	assert.Equal(t, http.StatusNotFound, status)
	status, _ = rpc(t, a, "filesystem.Filesystem/RemoveWatcher", fmt.Sprintf(`{"watcherId":%q}`, id))
	assert.Equal(t, http.StatusNotFound, status)
}

func TestEnvd_Watcher_Refusals(t *testing.T) {
	a := newTestAgent(t, nil)
	require.NoError(t, os.WriteFile(filepath.Join(a.cfg.Workdir, "f"), nil, 0o644))
	tests := []struct {
		name, req string
		wantCode  string
	}{
		{name: "missing", req: `{"path":"nope"}`, wantCode: connectNotFound},
		{name: "a file", req: `{"path":"f"}`, wantCode: connectInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, out := rpc(t, a, "filesystem.Filesystem/CreateWatcher", tt.req)
			assert.Equal(t, tt.wantCode, out["code"])
			st := openStream(t, a, "filesystem.Filesystem/WatchDir", []string{tt.req})
			assert.Nil(t, st.next())
			assert.Equal(t, tt.wantCode, st.endError())
		})
	}
}

// A watcher whose events are not read fails once it holds
// envdMaxWatchEvents, and says so on the next read.
func TestEnvd_Watcher_UnreadEventsAreBounded(t *testing.T) {
	a := newTestAgent(t, nil)
	id := rpcOK(t, a, "filesystem.Filesystem/CreateWatcher", `{"path":""}`)["watcherId"].(string)
	a.srv.watchers.mu.Lock()
	wt := a.srv.watchers.polled[id]
	a.srv.watchers.mu.Unlock()
	for range envdMaxWatchEvents + 1 {
		wt.push(pbFilesystemEvent{Name: "x", Type: eventWrite})
	}
	status, out := rpc(t, a, "filesystem.Filesystem/GetWatcherEvents", fmt.Sprintf(`{"watcherId":%q}`, id))
	assert.Equal(t, http.StatusTooManyRequests, status)
	assert.Equal(t, connectResourceExhausted, out["code"])
	assert.Contains(t, out["message"], "were not read")
}

// WatchDir (the async SDK's watch_dir) streams start, then events.
func TestEnvd_WatchDir_Streams(t *testing.T) {
	a := newTestAgent(t, nil)
	w := a.cfg.Workdir
	require.NoError(t, os.Mkdir(filepath.Join(w, "d"), 0o755))
	st := openStream(t, a, "filesystem.Filesystem/WatchDir", []string{`{"path":"d"}`}, "Connect-Timeout-Ms: 20000")
	assert.Equal(t, map[string]any{"start": map[string]any{}}, st.next())
	var once sync.Once
	var got []string
	for !slices.Contains(got, eventCreate+" f") {
		once.Do(func() { require.NoError(t, os.WriteFile(filepath.Join(w, "d", "f"), []byte("x"), 0o644)) })
		m := st.next()
		require.NotNil(t, m, "the stream ended: %v", st.end)
		if fe, ok := m["filesystem"].(map[string]any); ok {
			got = append(got, fmt.Sprintf("%s %s", fe["type"], fe["name"]))
			_, hasEntry := fe["entry"]
			assert.False(t, hasEntry, "no entry unless asked for")
		}
	}
	st.close()
	eventually(t, func() bool {
		a.srv.watchers.mu.Lock()
		defer a.srv.watchers.mu.Unlock()
		return a.srv.watchers.open == 0
	}, "the stream's watcher is closed when the client leaves")
}

func TestEventTypes_AsFsnotifyNamesThem(t *testing.T) {
	tests := []struct {
		mask uint32
		want string
	}{
		{mask: 0x100, want: eventCreate},              // IN_CREATE
		{mask: 0x80, want: eventCreate},               // IN_MOVED_TO
		{mask: 0x40, want: eventRename},               // IN_MOVED_FROM
		{mask: 0x800, want: eventRename},              // IN_MOVE_SELF
		{mask: 0x4, want: eventChmod},                 // IN_ATTRIB
		{mask: 0x2, want: eventWrite},                 // IN_MODIFY
		{mask: 0x200, want: eventRemove},              // IN_DELETE
		{mask: 0x400, want: eventRemove},              // IN_DELETE_SELF
		{mask: 0x100 | 0x40000000, want: eventCreate}, // IN_CREATE|IN_ISDIR
		{mask: 0x4 | 0x2, want: eventChmod + " " + eventWrite},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, strings.Join(eventTypes(tt.mask), " "), "mask %#x", tt.mask)
	}
}

// The JSON of a ListDir answer is a list of entries (checked once whole).
func TestEnvd_ListDir_WireShape(t *testing.T) {
	a := newTestAgent(t, nil)
	require.NoError(t, os.WriteFile(filepath.Join(a.cfg.Workdir, "f"), []byte("abc"), 0o644))
	b, _ := json.Marshal(rpcOK(t, a, "filesystem.Filesystem/ListDir", `{"path":""}`))
	assert.Regexp(t, `^\{"entries":\[\{"group":"[^"]+","mode":420,"modifiedTime":"[^"]+","name":"f","owner":"[^"]+","path":"[^"]+/f","permissions":"-rw-r--r--","size":"3","type":"FILE_TYPE_FILE"\}\]\}$`, string(b))
}
