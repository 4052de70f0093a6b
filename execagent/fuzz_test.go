package execagent

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

// Fuzz targets of the agent's parsers of untrusted input. `go test` runs
// each on its seeds and on the corpus in testdata/fuzz/<target>; make test
// fuzzes each for a short time (scripts/fuzz.sh).

// FuzzArchiveUpload sends any bytes as an archive upload into "t" of a
// workdir that holds a sentinel file. Whatever the archive (names with
// .., absolute paths, links out of the target, devices, modes, sizes,
// truncated or gzip'd streams), the answer is 200 or a 4xx (507 for a full
// disk), and nothing outside "t" appears or changes: no entry escapes, and
// no staging directory is left.
func FuzzArchiveUpload(f *testing.F) {
	for _, seed := range [][]tarEntry{
		{{name: "a.txt", body: "a"}, {name: "d/", typ: tar.TypeDir}, {name: "d/b.txt", body: "b"}},
		{{name: "../escape.txt", body: "x"}},
		{{name: "/abs.txt", body: "x"}},
		{{name: "l", typ: tar.TypeSymlink, link: "../sentinel"}, {name: "l/x", body: "through the link"}},
		{{name: "h", typ: tar.TypeLink, link: "../sentinel"}},
		{{name: "dev", typ: tar.TypeChar}},
		{{name: "x", body: "1"}, {name: "x", typ: tar.TypeDir}, {name: "x/y", body: "2"}},
		{{name: "ro/", typ: tar.TypeDir, mode: 0o555}, {name: "ro/f", body: "in a read-only dir"}},
	} {
		f.Add(makeTar(f, false, seed...))
	}
	f.Add(makeTar(f, true, tarEntry{name: "z.txt", body: "gzip'd"}))
	f.Add([]byte("not a tar"))
	f.Add([]byte{})

	a := newTestAgent(f, func(c *Config) { c.MaxUploadBytes = 1 << 20 })
	w := a.cfg.Workdir
	sentinel := filepath.Join(w, "sentinel")
	if err := os.WriteFile(sentinel, []byte("untouched"), 0o644); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, archive []byte) {
		// An upload that does not end within 10 s is a hang: a failure.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := a.client.UploadArchive(ctx, "t", bytes.NewReader(archive))
		var ae *agentapi.Error
		if err != nil && (!errors.As(err, &ae) || ae.Status >= 500 && ae.Status != 507) {
			t.Fatalf("upload answered %v", err)
		}
		top, rerr := os.ReadDir(w)
		if rerr != nil {
			t.Fatal(rerr)
		}
		var names []string
		for _, e := range top {
			names = append(names, e.Name())
		}
		if slices.ContainsFunc(names, func(n string) bool { return n != "t" && n != "sentinel" }) {
			t.Fatalf("the workdir holds %v: only t and sentinel may be there", names)
		}
		if b, rerr := os.ReadFile(sentinel); rerr != nil || string(b) != "untouched" {
			t.Fatalf("the sentinel changed: %q, %v", b, rerr)
		}
		makeWritable(filepath.Join(w, "t"))
		if rerr := os.RemoveAll(filepath.Join(w, "t")); rerr != nil {
			t.Fatal(rerr)
		}
	})
}

// makeWritable gives the owner write and search permission on every
// directory under dir (an archive may make read-only ones), so that the
// next input starts from an empty target.
func makeWritable(dir string) {
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			_ = os.Chmod(p, 0o755)
		}
		return nil
	})
}

// FuzzReadEnvelope reads Connect's enveloped messages from any bytes: it
// ends (EOF, a message or an error), never reads a message over its limit,
// and never panics.
func FuzzReadEnvelope(f *testing.F) {
	f.Add([]byte{0, 0, 0, 0, 2, '{', '}'})
	f.Add([]byte{1, 0, 0, 0, 0})
	f.Add([]byte{0, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{0, 0, 0, 0, 9, '{'})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, body []byte) {
		r := bytes.NewReader(body)
		for range len(body) + 1 {
			msg, err := readEnvelope(r, 64)
			if err != nil {
				return
			}
			if len(msg) > 64 {
				t.Fatalf("a message of %d bytes passed the limit of 64", len(msg))
			}
		}
		t.Fatalf("more messages than bytes in %q", body)
	})
}

// FuzzDecodeProto decodes any body as a Start request, as every unary and
// stream request is decoded: an error or a request, never a panic.
func FuzzDecodeProto(f *testing.F) {
	f.Add([]byte(`{"process":{"cmd":"/bin/sh","args":["-c","true"],"envs":{"A":"1"}},"tag":"t"}`))
	f.Add([]byte(`{"process":{"cmd":1}}`))
	f.Add([]byte(`{"pty":{"size":{"cols":-1,"rows":4294967296}}}`))
	f.Add([]byte(`{"stdin":"yes","process_config":null}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, body []byte) {
		var req pbStartRequest
		_ = decodeProto(body, &req)
	})
}
