package execagent

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

// readFile reads a file (or a range) through the agent.
func readFile(t testing.TB, a *testAgent, path string, offset, length int64) []byte {
	t.Helper()
	rc, err := a.client.ReadFile(context.Background(), path, offset, length)
	require.NoError(t, err)
	defer rc.Close()
	b, err := io.ReadAll(rc)
	require.NoError(t, err)
	return b
}

func TestFiles_WriteRead_BinaryRoundTrip(t *testing.T) {
	a := newTestAgent(t, nil)
	ctx := context.Background()
	data := make([]byte, 256*1024)
	for i := range data {
		data[i] = byte(i*7 + i/256)
	}
	res, err := a.client.WriteFile(ctx, "deep/er/blob.bin", 0o600, bytes.NewReader(data))
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(a.cfg.Workdir, "deep/er/blob.bin"), res.Path)
	assert.Equal(t, int64(len(data)), res.Bytes)

	got := readFile(t, a, "deep/er/blob.bin", 0, 0)
	assert.Equal(t, data, got)

	tests := []struct {
		name           string
		offset, length int64
		want           []byte
	}{
		{"range", 1000, 24, data[1000:1024]},
		{"offset to end", int64(len(data)) - 5, 0, data[len(data)-5:]},
		{"length past end", int64(len(data)) - 3, 100, data[len(data)-3:]},
		{"offset past end", int64(len(data)) + 10, 0, []byte{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := readFile(t, a, res.Path, tt.offset, tt.length)
			assert.Equal(t, tt.want, got)
		})
	}

	fi, err := a.client.Stat(ctx, "deep/er/blob.bin")
	require.NoError(t, err)
	assert.Equal(t, "blob.bin", fi.Name)
	assert.Equal(t, int64(len(data)), fi.Size)
	assert.Equal(t, "0600", fi.Mode)
	assert.False(t, fi.IsDir)
	assert.WithinDuration(t, time.Now(), fi.ModTime, time.Hour)
}

func TestFiles_Write_ModeAndReplace(t *testing.T) {
	a := newTestAgent(t, nil)
	ctx := context.Background()
	_, err := a.client.WriteFile(ctx, "run.sh", 0o755, bytes.NewReader([]byte("#!/bin/sh\necho hi\n")))
	require.NoError(t, err)
	res, err := a.client.Exec(ctx, agentapi.ExecRequest{Argv: []string{"./run.sh"}})
	require.NoError(t, err)
	assert.Equal(t, "hi\n", res.Stdout)
	_, err = a.client.WriteFile(ctx, "run.sh", 0, bytes.NewReader([]byte("x")))
	require.NoError(t, err)
	fi, err := a.client.Stat(ctx, "run.sh")
	require.NoError(t, err)
	assert.Equal(t, "0644", fi.Mode, "default mode")
	assert.Equal(t, int64(1), fi.Size)

	ents, err := os.ReadDir(a.cfg.Workdir)
	require.NoError(t, err)
	assert.Len(t, ents, 1, "no temporary file left behind")

	tests := []struct {
		name   string
		path   string
		query  string
		status int
	}{
		{"bad mode", "x", "&mode=999", http.StatusBadRequest},
		{"directory", ".", "", http.StatusBadRequest},
		{"parent is a file", "run.sh/x", "", http.StatusBadRequest},
		{"missing path", "", "", http.StatusBadRequest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := a.client.DoRaw(ctx, http.MethodPut, agentapi.RouteFiles+"?path="+tt.path+tt.query, bytes.NewReader([]byte("x")), nil)
			assert.Equal(t, tt.status, apiError(t, err).Status)
		})
	}
}

func TestFiles_CreateExclusive_OneWinnerNoPartialFile(t *testing.T) {
	a := newTestAgent(t, nil)
	ctx := context.Background()
	const writers = 12
	errs := make([]error, writers)
	var wg sync.WaitGroup
	for i := range writers {
		wg.Go(func() {
			_, errs[i] = a.client.CreateFile(ctx, "lock/owner", 0o600, strings.NewReader(fmt.Sprintf("writer-%02d", i)))
		})
	}
	wg.Wait()
	winners := 0
	for _, err := range errs {
		if err == nil {
			winners++
			continue
		}
		ae := apiError(t, err)
		assert.Equal(t, http.StatusConflict, ae.Status)
		assert.Contains(t, ae.Message, "already exists")
	}
	assert.Equal(t, 1, winners)
	got := string(readFile(t, a, "lock/owner", 0, 0))
	assert.Regexp(t, `^writer-\d\d$`, got, "the winner's content, whole")
	fi, err := a.client.Stat(ctx, "lock/owner")
	require.NoError(t, err)
	assert.Equal(t, "0600", fi.Mode)
	ents, err := os.ReadDir(filepath.Join(a.cfg.Workdir, "lock"))
	require.NoError(t, err)
	assert.Len(t, ents, 1, "no temporary file left behind")

	_, err = a.client.WriteFile(ctx, "lock/owner", 0, strings.NewReader("replaced"))
	require.NoError(t, err, "a plain write still replaces")
	require.NoError(t, a.client.DeleteFile(ctx, "lock/owner"))
	_, err = a.client.CreateFile(ctx, "lock/owner", 0, strings.NewReader("again"))
	require.NoError(t, err, "created again after delete")
}

func TestFiles_Delete(t *testing.T) {
	a := newTestAgent(t, nil)
	ctx := context.Background()
	_, err := a.client.WriteFile(ctx, "d/f", 0, strings.NewReader("x"))
	require.NoError(t, err)
	require.NoError(t, os.Symlink(filepath.Join(a.cfg.Workdir, "d", "f"), filepath.Join(a.cfg.Workdir, "link")))

	tests := []struct {
		name   string
		path   string
		status int // 0: removed
	}{
		{name: "symlink, not its target", path: "link"},
		{name: "directory not empty", path: "d", status: http.StatusBadRequest},
		{name: "file", path: "d/f"},
		{name: "empty directory", path: "d"},
		{name: "missing", path: "d", status: http.StatusNotFound},
		{name: "no path", path: "", status: http.StatusBadRequest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := a.client.DeleteFile(ctx, tt.path)
			if tt.status != 0 {
				assert.Equal(t, tt.status, apiError(t, err).Status)
				return
			}
			require.NoError(t, err)
			_, err = os.Lstat(filepath.Join(a.cfg.Workdir, tt.path))
			assert.ErrorIs(t, err, os.ErrNotExist)
		})
	}
}

func TestFiles_Limits_413(t *testing.T) {
	a := newTestAgent(t, func(c *Config) { c.MaxReadBytes = 100; c.MaxUploadBytes = 200 })
	ctx := context.Background()
	_, err := a.client.WriteFile(ctx, "f", 0, bytes.NewReader(make([]byte, 150)))
	require.NoError(t, err)
	_, err = a.client.ReadFile(ctx, "f", 0, 0)
	ae := apiError(t, err)
	assert.Equal(t, http.StatusRequestEntityTooLarge, ae.Status)
	assert.Equal(t, agentapi.CodeTooLarge, ae.Code)
	assert.Contains(t, ae.Message, "offset and length")
	got := readFile(t, a, "f", 100, 0)
	assert.Len(t, got, 50, "a range under the limit is fine")

	_, err = a.client.WriteFile(ctx, "g", 0, bytes.NewReader(make([]byte, 201)))
	assert.Equal(t, http.StatusRequestEntityTooLarge, apiError(t, err).Status)
	_, err = os.Stat(filepath.Join(a.cfg.Workdir, "g"))
	assert.ErrorIs(t, err, os.ErrNotExist, "a refused upload leaves nothing")
	_, err = a.client.DownloadArchive(ctx, ".", false)
	assert.Equal(t, http.StatusRequestEntityTooLarge, apiError(t, err).Status)
}

func TestFiles_StatAndList(t *testing.T) {
	a := newTestAgent(t, nil)
	ctx := context.Background()
	w := a.cfg.Workdir
	require.NoError(t, os.MkdirAll(filepath.Join(w, "d/sub"), 0o750))
	require.NoError(t, os.WriteFile(filepath.Join(w, "d/b.txt"), []byte("bb"), 0o640))
	require.NoError(t, os.Symlink("b.txt", filepath.Join(w, "d/link")))
	require.NoError(t, syscall.Mkfifo(filepath.Join(w, "d/fifo"), 0o600))

	l, err := a.client.ListDir(ctx, "d")
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(w, "d"), l.Path)
	require.Len(t, l.Entries, 4)
	byName := map[string]agentapi.FileInfo{}
	for _, e := range l.Entries {
		byName[e.Name] = e
	}
	assert.Equal(t, int64(2), byName["b.txt"].Size)
	assert.Equal(t, "0640", byName["b.txt"].Mode)
	assert.Equal(t, "b.txt", byName["link"].Symlink)
	assert.True(t, byName["sub"].IsDir)
	assert.Equal(t, "0750", byName["sub"].Mode)

	fi, err := a.client.Stat(ctx, filepath.Join(w, "d/link"))
	require.NoError(t, err)
	assert.Equal(t, "b.txt", fi.Symlink)

	tests := []struct {
		name   string
		call   func() error
		status int
	}{
		{"stat missing", func() error { _, err := a.client.Stat(ctx, "nope"); return err }, http.StatusNotFound},
		{"list missing", func() error { _, err := a.client.ListDir(ctx, "nope"); return err }, http.StatusNotFound},
		{"list a file", func() error { _, err := a.client.ListDir(ctx, "d/b.txt"); return err }, http.StatusBadRequest},
		{"read a directory", func() error { _, err := a.client.ReadFile(ctx, "d", 0, 0); return err }, http.StatusBadRequest},
		{"read missing", func() error { _, err := a.client.ReadFile(ctx, "nope", 0, 0); return err }, http.StatusNotFound},
		{"read a fifo", func() error { _, err := a.client.ReadFile(ctx, "d/fifo", 0, 0); return err }, http.StatusBadRequest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.status, apiError(t, tt.call()).Status)
		})
	}
}

// tarEntry is one entry of a test archive.
type tarEntry struct {
	name, body, link string
	typ              byte
	mode             int64
}

func makeTar(t testing.TB, gz bool, entries ...tarEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	var w io.Writer = &buf
	var zw *gzip.Writer
	if gz {
		zw = gzip.NewWriter(&buf)
		w = zw
	}
	tw := tar.NewWriter(w)
	for _, e := range entries {
		typ := e.typ
		if typ == 0 {
			typ = tar.TypeReg
		}
		mode := e.mode
		if mode == 0 {
			mode = 0o644
		}
		hdr := &tar.Header{Name: e.name, Typeflag: typ, Mode: mode, Linkname: e.link, ModTime: time.Unix(1700000000, 0)}
		if typ == tar.TypeReg {
			hdr.Size = int64(len(e.body))
		}
		require.NoError(t, tw.WriteHeader(hdr))
		if typ == tar.TypeReg {
			_, err := tw.Write([]byte(e.body))
			require.NoError(t, err)
		}
	}
	require.NoError(t, tw.Close())
	if zw != nil {
		require.NoError(t, zw.Close())
	}
	return buf.Bytes()
}

// readTar lists an archive as name -> body (directories and links as markers).
func readTar(t testing.TB, r io.Reader) map[string]string {
	t.Helper()
	out := map[string]string{}
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return out
		}
		require.NoError(t, err)
		switch hdr.Typeflag {
		case tar.TypeDir:
			out[hdr.Name] = "<dir>"
		case tar.TypeSymlink:
			out[hdr.Name] = "-> " + hdr.Linkname
		default:
			b, err := io.ReadAll(tr)
			require.NoError(t, err)
			out[hdr.Name] = string(b)
		}
	}
}

func TestFiles_Archive_UploadAndDownload(t *testing.T) {
	for _, gz := range []bool{false, true} {
		name := "tar"
		if gz {
			name = "tar.gz"
		}
		t.Run(name, func(t *testing.T) {
			a := newTestAgent(t, nil)
			ctx := context.Background()
			body := makeTar(t, gz,
				tarEntry{name: "./", typ: tar.TypeDir, mode: 0o755},
				tarEntry{name: "src/", typ: tar.TypeDir, mode: 0o755},
				tarEntry{name: "src/main.py", body: "print('hi')\n"},
				tarEntry{name: "bin/run", body: "#!/bin/sh\necho run\n", mode: 0o755},
				tarEntry{name: "link", typ: tar.TypeSymlink, link: "src/main.py"},
				tarEntry{name: "hard", typ: tar.TypeLink, link: "src/main.py"},
			)
			res, err := a.client.UploadArchive(ctx, "proj", bytes.NewReader(body))
			require.NoError(t, err)
			assert.Equal(t, filepath.Join(a.cfg.Workdir, "proj"), res.Path)
			assert.Equal(t, 5, res.Entries)
			out, err := a.client.Exec(ctx, agentapi.ExecRequest{Command: "cat link hard && ./bin/run", Cwd: "proj"})
			require.NoError(t, err)
			assert.Equal(t, "print('hi')\nprint('hi')\nrun\n", out.Stdout)
			fi, err := os.Stat(filepath.Join(a.cfg.Workdir, "proj/src/main.py"))
			require.NoError(t, err)
			assert.Equal(t, time.Unix(1700000000, 0), fi.ModTime())

			rc, err := a.client.DownloadArchive(ctx, "proj", gz)
			require.NoError(t, err)
			defer rc.Close()
			var r io.Reader = rc
			if gz {
				zr, err := gzip.NewReader(rc)
				require.NoError(t, err)
				r = zr
			}
			got := readTar(t, r)
			names := make([]string, 0, len(got))
			for n := range got {
				names = append(names, n)
			}
			sort.Strings(names)
			assert.Equal(t, []string{"bin/", "bin/run", "hard", "link", "src/", "src/main.py"}, names)
			assert.Equal(t, "-> src/main.py", got["link"])
			assert.Equal(t, "print('hi')\n", got["src/main.py"])
			assert.Equal(t, "print('hi')\n", got["hard"])
		})
	}
}

func TestFiles_Archive_RefusesEscapes(t *testing.T) {
	a := newTestAgent(t, nil)
	ctx := context.Background()
	outside := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(a.cfg.Workdir, "t"), 0o755))
	require.NoError(t, os.Symlink(outside, filepath.Join(a.cfg.Workdir, "t/existing-link")))
	tests := []struct {
		name    string
		entries []tarEntry
	}{
		{"absolute path", []tarEntry{{name: filepath.Join(outside, "abs"), body: "x"}}},
		{"dot dot", []tarEntry{{name: "../escape", body: "x"}}},
		{"dot dot inside", []tarEntry{{name: "a/../../escape", body: "x"}}},
		{"through a symlink in the archive", []tarEntry{
			{name: "evil", typ: tar.TypeSymlink, link: outside},
			{name: "evil/pwned", body: "x"},
		}},
		{"through an existing symlink", []tarEntry{{name: "existing-link/pwned", body: "x"}}},
		{"hard link to outside", []tarEntry{{name: "h", typ: tar.TypeLink, link: "../../etc/passwd"}}},
		{"device", []tarEntry{{name: "dev", typ: tar.TypeChar}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := a.client.UploadArchive(ctx, "t", bytes.NewReader(makeTar(t, false, tt.entries...)))
			ae := apiError(t, err)
			assert.Equal(t, http.StatusBadRequest, ae.Status)
			assert.Contains(t, ae.Message, "archive entry")
			ents, err := os.ReadDir(outside)
			require.NoError(t, err)
			assert.Empty(t, ents, "nothing was written outside the target")
			_, err = os.Stat(filepath.Join(a.cfg.Workdir, "escape"))
			assert.ErrorIs(t, err, os.ErrNotExist)
		})
	}
	t.Run("a file replaces an existing symlink instead of writing through it", func(t *testing.T) {
		target := filepath.Join(outside, "victim")
		require.NoError(t, os.WriteFile(target, []byte("keep"), 0o644))
		require.NoError(t, os.Symlink(target, filepath.Join(a.cfg.Workdir, "t/file-link")))
		_, err := a.client.UploadArchive(ctx, "t", bytes.NewReader(makeTar(t, false, tarEntry{name: "file-link", body: "new"})))
		require.NoError(t, err)
		b, err := os.ReadFile(target)
		require.NoError(t, err)
		assert.Equal(t, "keep", string(b))
		fi, err := os.Lstat(filepath.Join(a.cfg.Workdir, "t/file-link"))
		require.NoError(t, err)
		assert.True(t, fi.Mode().IsRegular())
		require.NoError(t, os.Remove(target))
	})
	t.Run("not an archive", func(t *testing.T) {
		_, err := a.client.UploadArchive(ctx, "t", bytes.NewReader([]byte("this is not a tar file, just some text that is long enough to fill a header block? no")))
		assert.Equal(t, http.StatusBadRequest, apiError(t, err).Status)
	})
	t.Run("extracted size over the limit", func(t *testing.T) {
		small := newTestAgent(t, func(c *Config) { c.MaxUploadBytes = 4096 })
		// Compresses to far below the limit, extracts above it.
		body := makeTar(t, true, tarEntry{name: "big", body: string(make([]byte, 100000))})
		require.Less(t, len(body), 4096)
		_, err := small.client.UploadArchive(ctx, "t", bytes.NewReader(body))
		assert.Equal(t, http.StatusRequestEntityTooLarge, apiError(t, err).Status)
	})
}

func TestFiles_NameTooLong_BadRequestNamingPath(t *testing.T) {
	a := newTestAgent(t, nil)
	ctx := context.Background()
	longName := filepath.Join(a.cfg.Workdir, strings.Repeat("n", 300))                         // one name over NAME_MAX
	longPath := filepath.Join(a.cfg.Workdir, strings.Repeat(strings.Repeat("d", 200)+"/", 25)) // over PATH_MAX
	for _, p := range []string{longName, longPath} {
		label := "long name"
		if p == longPath {
			label = "long path"
		}
		tests := []struct {
			name string
			call func() error
		}{
			{"read", func() error { _, err := a.client.ReadFile(ctx, p, 0, -1); return err }},
			{"stat", func() error { _, err := a.client.Stat(ctx, p); return err }},
			{"list", func() error { _, err := a.client.ListDir(ctx, p); return err }},
			{"write", func() error { _, err := a.client.WriteFile(ctx, p, 0o644, strings.NewReader("x")); return err }},
			{"create", func() error { _, err := a.client.CreateFile(ctx, p, 0o644, strings.NewReader("x")); return err }},
			{"delete", func() error { return a.client.DeleteFile(ctx, p) }},
			{"archive download", func() error { _, err := a.client.DownloadArchive(ctx, p, false); return err }},
			{"archive upload", func() error { _, err := a.client.UploadArchive(ctx, p, bytes.NewReader(nil)); return err }},
		}
		for _, tt := range tests {
			t.Run(label+" "+tt.name, func(t *testing.T) {
				ae := apiError(t, tt.call())
				assert.Equal(t, http.StatusBadRequest, ae.Status, ae.Message)
				assert.Equal(t, agentapi.CodeBadRequest, ae.Code)
				assert.True(t, strings.HasPrefix(ae.Message, "path: "), "message %q should name the path", ae.Message)
				assert.Contains(t, ae.Message, "too long")
			})
		}
	}
	t.Run("archive entry", func(t *testing.T) {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		require.NoError(t, tw.WriteHeader(&tar.Header{Name: strings.Repeat("e", 300), Mode: 0o644, Size: 1, Typeflag: tar.TypeReg}))
		_, err := tw.Write([]byte("x"))
		require.NoError(t, err)
		require.NoError(t, tw.Close())
		_, err = a.client.UploadArchive(ctx, "up", &buf)
		ae := apiError(t, err)
		assert.Equal(t, http.StatusBadRequest, ae.Status, ae.Message)
		assert.True(t, strings.HasPrefix(ae.Message, "body: "), ae.Message)
		assert.Contains(t, ae.Message, "too long")
	})
}

func TestFiles_ReadDirectory_RouteNeutralHint(t *testing.T) {
	a := newTestAgent(t, nil)
	_, err := a.client.ReadFile(context.Background(), a.cfg.Workdir, 0, -1)
	ae := apiError(t, err)
	assert.Equal(t, http.StatusBadRequest, ae.Status)
	assert.Contains(t, ae.Message, "is a directory")
	assert.NotContains(t, ae.Message, "/v1/")
}
