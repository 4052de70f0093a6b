package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// entry is one file system entry as the copy tests compare them.
type entry struct {
	kind string // "dir", "file" or "link"
	mode fs.FileMode
	data digest
	link string
}

// digest is file content as its length and SHA-256, so that a failure
// shows a short difference.
type digest string

// contents maps digests back to bytes, for writeLocal.
type contents map[digest][]byte

// file is a regular file entry with data b, remembered in c.
func (c contents) file(mode fs.FileMode, b []byte) entry {
	d := digestOf(b)
	c[d] = b
	return entry{kind: "file", mode: mode, data: d}
}

func digestOf(b []byte) digest {
	return digest(fmt.Sprintf("%d bytes, sha256 %x", len(b), sha256.Sum256(b)))
}

// randomBytes returns n deterministic bytes covering every byte value.
func randomBytes(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, seed))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.UintN(256))
	}
	return b
}

// writeLocal creates the tree under dir, with exact modes; contents maps
// each digest of the tree to its bytes.
func writeLocal(t *testing.T, dir string, tree map[string]entry, c contents) {
	t.Helper()
	for name, e := range tree {
		p := filepath.Join(dir, filepath.FromSlash(name))
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		switch e.kind {
		case "dir":
			require.NoError(t, os.MkdirAll(p, 0o755))
		case "file":
			require.NoError(t, os.WriteFile(p, c[e.data], 0o600))
		case "link":
			require.NoError(t, os.Symlink(e.link, p))
			continue
		}
		require.NoError(t, os.Chmod(p, e.mode))
	}
}

// readLocal returns the tree under dir, dir itself excluded.
func readLocal(t *testing.T, dir string) map[string]entry {
	t.Helper()
	tree := map[string]entry{}
	require.NoError(t, filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		require.NoError(t, err)
		if p == dir {
			return nil
		}
		rel, err := filepath.Rel(dir, p)
		require.NoError(t, err)
		info, err := d.Info()
		require.NoError(t, err)
		e := entry{mode: info.Mode().Perm()}
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			e = entry{kind: "link"}
			e.link, err = os.Readlink(p)
			require.NoError(t, err)
		case d.IsDir():
			e.kind = "dir"
		default:
			e.kind = "file"
			b, err := os.ReadFile(p)
			require.NoError(t, err)
			e.data = digestOf(b)
		}
		tree[filepath.ToSlash(rel)] = e
		return nil
	}))
	return tree
}

// readFake returns the fake's tree under dir, dir itself excluded.
func readFake(f *fakeGateway, dir string) map[string]entry {
	f.mu.Lock()
	defer f.mu.Unlock()
	tree := map[string]entry{}
	for p, file := range f.files {
		rel, ok := strings.CutPrefix(p, dir+"/")
		if !ok {
			continue
		}
		switch {
		case file.dir:
			tree[rel] = entry{kind: "dir", mode: file.mode}
		case file.link != "":
			tree[rel] = entry{kind: "link", link: file.link}
		default:
			tree[rel] = entry{kind: "file", mode: file.mode, data: digestOf(file.data)}
		}
	}
	return tree
}

func TestRun_SandboxCp_FileBothWaysByteExact(t *testing.T) {
	f := newFakeGateway(t)
	id := f.mustCreate(t)
	local := t.TempDir()
	c := contents{}
	blob := c.file(0o750, randomBytes(300<<10, 1))
	writeLocal(t, local, map[string]entry{"blob.bin": blob, "into": {kind: "dir", mode: 0o755}}, c)
	src := filepath.Join(local, "blob.bin")

	tests := []struct {
		name       string
		args       []string
		check      func(t *testing.T)
		wantStderr string
	}{
		{"upload to a new path", []string{src, id + ":/data/x.bin"}, func(t *testing.T) {
			assert.Equal(t, blob, readFake(f, "/data")["x.bin"])
		}, ""},
		{"upload into an existing directory", []string{src, id + ":/data"}, func(t *testing.T) {
			assert.Equal(t, blob, readFake(f, "/data")["blob.bin"])
		}, ""},
		{"upload to a relative path with a trailing slash", []string{src, id + ":rel/"}, func(t *testing.T) {
			assert.Equal(t, blob, readFake(f, fakeWorkdir+"/rel")["blob.bin"])
		}, ""},
		{"download to a new path", []string{id + ":/data/x.bin", filepath.Join(local, "back.bin")}, func(t *testing.T) {
			assert.Equal(t, blob, readLocal(t, local)["back.bin"])
		}, ""},
		{"download into an existing directory", []string{id + ":/data/x.bin", filepath.Join(local, "into")}, func(t *testing.T) {
			assert.Equal(t, blob, readLocal(t, local)["into/x.bin"])
		}, ""},
		{"download a missing file", []string{id + ":/nope", filepath.Join(local, "nope")}, func(t *testing.T) {
			assert.NotContains(t, readLocal(t, local), "nope")
		}, "quarry: copy " + id + ":/nope to " + filepath.Join(local, "nope") + ": stat /nope: /nope: no such file or directory (404 not_found)\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := f.cli(t, "", append([]string{"sandbox", "cp"}, tt.args...)...)
			assert.Equal(t, tt.wantStderr, res.stderr)
			assert.Empty(t, res.stdout)
			tt.check(t)
		})
	}
}

func TestRun_SandboxCp_DirectoryTreeBothWaysByteExact(t *testing.T) {
	f := newFakeGateway(t)
	id := f.mustCreate(t)
	c := contents{}
	tree := map[string]entry{
		"a.txt":            c.file(0o644, []byte("hello\n")),
		"zero":             c.file(0o600, []byte{}),
		"bin":              {kind: "dir", mode: 0o750},
		"bin/run.sh":       c.file(0o755, []byte("#!/bin/sh\necho hi\n")),
		"deep":             {kind: "dir", mode: 0o755},
		"deep/er":          {kind: "dir", mode: 0o700},
		"deep/er/blob.bin": c.file(0o640, randomBytes(200<<10, 2)),
		"empty":            {kind: "dir", mode: 0o711},
		"link":             {kind: "link", link: "deep/er/blob.bin"},
		"name with spaces": c.file(0o644, []byte("\x00\xff\r\n")),
	}
	work := t.TempDir()
	src := filepath.Join(work, "proj")
	writeLocal(t, src, tree, c)
	require.Equal(t, tree, readLocal(t, src), "precondition: the local tree is as written")

	res := f.cli(t, "", "sandbox", "cp", src, id+":/work/proj")
	require.Equal(t, result{"", "", 0}, res)
	assert.Equal(t, tree, readFake(f, "/work/proj"), "upload")

	res = f.cli(t, "", "sandbox", "cp", src, id+":/work/proj")
	require.Equal(t, result{"", "", 0}, res)
	assert.Equal(t, tree, readFake(f, "/work/proj/proj"), "upload into an existing directory nests it")

	back := filepath.Join(work, "back")
	res = f.cli(t, "", "sandbox", "cp", id+":/work/proj", back)
	require.Equal(t, result{"", "", 0}, res)
	got := readLocal(t, back)
	for name := range tree {
		assert.Equal(t, tree[name], got[name], name)
	}
	assert.Len(t, got, 2*len(tree)+1, "the nested copy came too (plus proj itself)")

	into := filepath.Join(work, "into")
	require.NoError(t, os.Mkdir(into, 0o755))
	res = f.cli(t, "", "sandbox", "cp", id+":/work/proj/proj", into)
	require.Equal(t, result{"", "", 0}, res)
	assert.Equal(t, tree, readLocal(t, filepath.Join(into, "proj")), "download into an existing directory")
}

func TestRun_SandboxCp_Usage(t *testing.T) {
	tests := []struct {
		name       string
		args       []string
		wantStderr string
	}{
		{"both local", []string{"./a", "./b"}, "quarry: sandbox cp: exactly one of SRC and DST must be ID:PATH\n"},
		{"both remote", []string{"sbx-1:/a", "sbx-1:/b"}, "quarry: sandbox cp: exactly one of SRC and DST must be ID:PATH\n"},
		{"one argument", []string{"sbx-1:/a"}, "quarry: sandbox cp: missing arguments (see quarry sandbox cp -h)\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeGateway(t)
			res := f.cli(t, "", append([]string{"sandbox", "cp"}, tt.args...)...)
			assert.Equal(t, result{"", tt.wantStderr, 1}, res)
		})
	}
}

func TestSplitRemote(t *testing.T) {
	tests := []struct {
		arg          string
		wantID, want string
		wantOK       bool
	}{
		{"sbx-1:/tmp/x", "sbx-1", "/tmp/x", true},
		{"sbx-1:rel", "sbx-1", "rel", true},
		{"sbx-1:", "sbx-1", ".", true},
		{"./a:b", "", "", false},
		{"/abs/a:b", "", "", false},
		{":x", "", "", false},
		{"plain", "", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.arg, func(t *testing.T) {
			id, p, ok := splitRemote(tt.arg)
			assert.Equal(t, tt.wantOK, ok)
			assert.Equal(t, tt.wantID, id)
			assert.Equal(t, tt.want, p)
		})
	}
}

// tarOf builds a tar of the given headers, with data for regular files.
func tarOf(t *testing.T, hs ...*tar.Header) *bytes.Buffer {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, h := range hs {
		data := strings.Repeat("x", int(h.Size))
		require.NoError(t, tw.WriteHeader(h))
		_, err := tw.Write([]byte(data))
		require.NoError(t, err)
	}
	require.NoError(t, tw.Close())
	return &b
}

func TestExtractTar_StaysInsideTheDestination(t *testing.T) {
	outside := t.TempDir()
	tests := []struct {
		name    string
		hs      []*tar.Header
		wantErr string
	}{
		{"dot-dot name", []*tar.Header{{Typeflag: tar.TypeReg, Name: "../evil", Mode: 0o644, Size: 1}}, "outside the destination"},
		{"dot-dot inside a name", []*tar.Header{{Typeflag: tar.TypeReg, Name: "a/../../evil", Mode: 0o644, Size: 1}}, "outside the destination"},
		{"write through a symlink that leads out", []*tar.Header{
			{Typeflag: tar.TypeSymlink, Name: "out", Linkname: outside},
			{Typeflag: tar.TypeReg, Name: "out/pwned", Mode: 0o644, Size: 1},
		}, "extract out/pwned"},
		{"write through a relative symlink that leads out", []*tar.Header{
			{Typeflag: tar.TypeSymlink, Name: "up", Linkname: "../../../../../../../../" + outside},
			{Typeflag: tar.TypeReg, Name: "up/pwned", Mode: 0o644, Size: 1},
		}, "extract up/pwned"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dst := filepath.Join(t.TempDir(), "dst")
			err := extractTar(tarOf(t, tt.hs...), dst, func(string, byte) {})
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.wantErr)
			entries, err := os.ReadDir(outside)
			require.NoError(t, err)
			assert.Empty(t, entries, "nothing was written outside")
		})
	}
}

func TestExtractTar_SkipsOtherEntryTypes(t *testing.T) {
	dst := t.TempDir()
	var skipped []string
	err := extractTar(tarOf(t,
		&tar.Header{Typeflag: tar.TypeReg, Name: "/abs/f", Mode: 0o600, Size: 3},
		&tar.Header{Typeflag: tar.TypeFifo, Name: "fifo", Mode: 0o600},
		&tar.Header{Typeflag: tar.TypeLink, Name: "hard", Linkname: "abs/f"},
	), dst, func(name string, _ byte) { skipped = append(skipped, name) })
	require.NoError(t, err)
	assert.Equal(t, []string{"fifo", "hard"}, skipped)
	assert.Equal(t, map[string]entry{
		"abs":   {kind: "dir", mode: 0o755},
		"abs/f": {kind: "file", mode: 0o600, data: digestOf([]byte("xxx"))},
	}, readLocal(t, dst), "a leading slash is made relative to the destination")
}

// "-" is standard output as a destination (a file's bytes, a directory as
// a tar) and standard input as a source; it never becomes a file named "-".
func TestRun_SandboxCp_DashIsStandardInputAndOutput(t *testing.T) {
	f := newFakeGateway(t)
	id := f.mustCreate(t)
	data := "\x00\x01\xffbinary\n"
	cwd := t.TempDir()
	t.Chdir(cwd)

	res := f.cli(t, data, "sandbox", "cp", "-", id+":/data/in.bin")
	require.Equal(t, result{"", "", 0}, res)
	res = f.cli(t, "", "sandbox", "cp", id+":/data/in.bin", "-")
	assert.Equal(t, result{data, "", 0}, res, "the file's bytes on standard output")

	res = f.cli(t, "", "sandbox", "cp", id+":/data", "-")
	require.Equal(t, 0, res.code, res.stderr)
	tr := tar.NewReader(strings.NewReader(res.stdout))
	var names []string
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		names = append(names, h.Name)
	}
	assert.Contains(t, names, "in.bin", "a directory arrives as a tar: %v", names)

	res = f.cli(t, data, "sandbox", "cp", "-", id+":/data/")
	assert.Equal(t, 1, res.code)
	assert.Contains(t, res.stderr, "the destination must name a file")
	entries, err := os.ReadDir(cwd)
	require.NoError(t, err)
	assert.Empty(t, entries, "no file named - was made")
}
