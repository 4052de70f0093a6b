package execagent

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

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
		onlyTargetChanged(t, w, err)
		makeWritable(filepath.Join(w, "t"))
		if rerr := os.RemoveAll(filepath.Join(w, "t")); rerr != nil {
			t.Fatal(rerr)
		}
	})
}

// onlyTargetChanged fails t unless the work dir w holds only "t" and its
// "sentinel" file, unchanged: answer is what the call answered.
func onlyTargetChanged(t *testing.T, w string, answer error) {
	t.Helper()
	top, err := os.ReadDir(w)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range top {
		names = append(names, e.Name())
	}
	if slices.ContainsFunc(names, func(n string) bool { return n != "t" && n != "sentinel" }) {
		t.Fatalf("the workdir holds %v: only t and sentinel may be there (answer: %v)", names, answer)
	}
	if b, err := os.ReadFile(filepath.Join(w, "sentinel")); err != nil || string(b) != "untouched" {
		t.Fatalf("the sentinel changed: %q, %v", b, err)
	}
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

// FuzzRestoreArchive restores a checkpoint archive whose roots header
// names one root, "t" of the work dir (recorded as /sandbox/t, taken in
// /sandbox, so the corpus does not depend on where the test's work dir
// is), followed by any bytes as its entries, as a tar or gzip-compressed
// (both formats a restore takes). Whatever the entries (names
// outside the root, links out of it, the root's entry twice or missing,
// devices, sizes, truncated streams), the answer is 200 or a 4xx (507 for
// a full disk) within 10 s; nothing outside "t" appears or changes; no
// staging directory is left; and a refused restore leaves "t" as it was.
func FuzzRestoreArchive(f *testing.F) {
	for _, seed := range [][]tarEntry{
		{{name: "sandbox/t/", typ: tar.TypeDir}, {name: "sandbox/t/a.txt", body: "a"}, {name: "sandbox/t/d/", typ: tar.TypeDir}},
		{{name: "sandbox/t", body: "the root as a file"}},
		{{name: "sandbox/t/", typ: tar.TypeDir}, {name: "sandbox/x.txt", body: "beside the root"}},
		{{name: "sandbox/t/", typ: tar.TypeDir}, {name: "sandbox/t/../../escape", body: "x"}},
		{{name: "sandbox/t/", typ: tar.TypeDir}, {name: "sandbox/t/h", typ: tar.TypeLink, link: "sandbox/sentinel"}},
		{{name: "sandbox/t/", typ: tar.TypeDir}, {name: "sandbox/t/l", typ: tar.TypeSymlink, link: "../sentinel"}, {name: "sandbox/t/l/x", body: "through the link"}},
		{{name: "sandbox/t/", typ: tar.TypeDir}, {name: "sandbox/t/", typ: tar.TypeDir}},
		{{name: "sandbox/t/a.txt", body: "before its root"}},
		{{name: "sandbox/t/", typ: tar.TypeDir}, {name: "sandbox/t/dev", typ: tar.TypeChar}},
	} {
		for _, plain := range []bool{false, true} { // tar+gzip and tar: a restore takes both
			f.Add(makeTar(f, false, seed...), plain)
		}
	}
	f.Add([]byte("not a tar"), false)
	f.Add([]byte{}, true)

	a := newTestAgent(f, func(c *Config) { c.MaxUploadBytes = 1 << 20 })
	w := a.cfg.Workdir
	sentinel := filepath.Join(w, "sentinel")
	if err := os.WriteFile(sentinel, []byte("untouched"), 0o644); err != nil {
		f.Fatal(err)
	}
	root := filepath.Join(w, "t")
	reset := func(t testing.TB) {
		makeWritable(root)
		if err := os.RemoveAll(root); err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(root, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, "keep.txt"), []byte("before"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	f.Fuzz(func(t *testing.T, entries []byte, plain bool) {
		reset(t)
		body := checkpointBody(t, entries, plain)
		sum := sha256.Sum256(body)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := a.client.Restore(ctx, hex.EncodeToString(sum[:]), bytes.NewReader(body))
		var ae *agentapi.Error
		if err != nil && (!errors.As(err, &ae) || ae.Status >= 500 && ae.Status != 507) {
			t.Fatalf("restore answered %v", err)
		}
		onlyTargetChanged(t, w, err)
		if err == nil {
			return
		}
		in, rerr := os.ReadDir(root)
		if rerr != nil {
			t.Fatalf("a refused restore (%v) changed t: %v", err, rerr)
		}
		if len(in) != 1 || in[0].Name() != "keep.txt" {
			t.Fatalf("a refused restore (%v) left t holding %v", err, in)
		}
		if b, rerr := os.ReadFile(filepath.Join(root, "keep.txt")); rerr != nil || string(b) != "before" {
			t.Fatalf("a refused restore (%v) changed t/keep.txt: %q, %v", err, b, rerr)
		}
	})
}

// checkpointBody is a checkpoint archive (gzip'd tar) of the root
// /sandbox/t taken in /sandbox: its roots header, then entries as they
// are.
func checkpointBody(t testing.TB, entries []byte, plain bool) []byte {
	var tarBuf bytes.Buffer
	tw := tar.NewWriter(&tarBuf)
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeXGlobalHeader, Name: "pax_global_header",
		PAXRecords: map[string]string{agentapi.PAXRoots: `["/sandbox/t"]`, agentapi.PAXWorkdir: "/sandbox"}}); err != nil {
		t.Fatal(err)
	}
	if err := tw.Flush(); err != nil {
		t.Fatal(err)
	}
	tarBuf.Write(entries)
	if plain {
		return tarBuf.Bytes()
	}
	var out bytes.Buffer
	zw := gzip.NewWriter(&out)
	if _, err := zw.Write(tarBuf.Bytes()); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

// FuzzPTYFrames attaches to a PTY (running cat: whatever the frames carry
// is typed into something harmless) over a raw connection, sends any bytes
// as the client's WebSocket frames, and closes its side. Whatever the
// frames (unmasked, reserved bits, bad opcodes, lengths past the message
// limit, fragments, control frames too long, a truncated frame), the agent
// ends the connection within 10 s of the client's end, lets the PTY's
// client go (its count returns to 0), and keeps serving.
func FuzzPTYFrames(f *testing.F) {
	f.Add(wsFrame(0x2, true, []byte("hello\n")))
	f.Add(wsFrame(0x1, true, []byte(`{"type":"resize","cols":100,"rows":30}`)))
	f.Add(wsFrame(0x1, true, []byte(`{"type":"resize","cols":-1}`)))
	f.Add(wsFrame(0x2, false, []byte("unmasked")))
	f.Add([]byte{0x02, 0x84, 1, 2, 3, 4, 'a', 'b', 'c', 'd', 0x80, 0x82, 1, 2, 3, 4, 'e', 'f'}) // a fragmented message
	f.Add([]byte{0x82, 0xff, 0, 0, 0, 0, 0x7f, 0xff, 0xff, 0xff, 1, 2, 3, 4})
	f.Add(wsFrame(0x9, true, bytes.Repeat([]byte("p"), 200)))
	f.Add(wsFrame(0x8, true, []byte{0x03, 0xe8, 'b', 'y', 'e'}))
	f.Add(wsFrame(0x3, true, []byte("reserved opcode")))
	f.Add([]byte{0x82})
	f.Add([]byte{})

	a := newTestAgent(f, nil)
	ctx := context.Background()
	var pty agentapi.PTYInfo
	ensurePTY := func(t testing.TB) {
		if pty.ID != "" {
			if info, err := a.client.GetPTY(ctx, pty.ID); err == nil && info.State == "running" {
				return
			}
		}
		var err error
		if pty, err = a.client.CreatePTY(ctx, agentapi.PTYCreateRequest{Command: []string{"cat"}}); err != nil {
			t.Fatal(err)
		}
	}
	f.Fuzz(func(t *testing.T, frames []byte) {
		ensurePTY(t)
		conn, err := net.Dial("tcp", strings.TrimPrefix(a.url, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
		fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: agent\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
			"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"+
			"Sec-WebSocket-Protocol: %s\r\nAuthorization: Bearer %s\r\n\r\n",
			agentapi.PTYPath(pty.ID, "/attach"), agentapi.PTYSubprotocol, testToken)
		br := bufio.NewReader(conn)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("handshake: %v", err)
		}
		if resp.StatusCode != http.StatusSwitchingProtocols {
			t.Fatalf("handshake: %s", resp.Status)
		}
		_, _ = conn.Write(frames) // the agent may close first
		_ = conn.(*net.TCPConn).CloseWrite()
		if _, err := io.Copy(io.Discard, br); err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatalf("the agent did not end the connection within 10 s of the client's end")
			}
		}
		require.Eventually(t, func() bool {
			info, err := a.client.GetPTY(ctx, pty.ID)
			return err != nil || info.Clients == 0
		}, 10*time.Second, 5*time.Millisecond, "the PTY still counts clients 10 s after the connection ended")
		if _, err := a.client.Health(ctx); err != nil {
			t.Fatalf("the agent stopped serving: %v", err)
		}
	})
}

// wsFrame is one final WebSocket frame of opcode op carrying payload,
// masked (as a client's must be) or not.
func wsFrame(op byte, masked bool, payload []byte) []byte {
	b := []byte{0x80 | op}
	mask := byte(0)
	if masked {
		mask = 0x80
	}
	switch n := len(payload); {
	case n < 126:
		b = append(b, mask|byte(n))
	case n < 1<<16:
		b = append(b, mask|126, byte(n>>8), byte(n))
	default:
		b = append(b, mask|127, 0, 0, 0, 0, byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
	}
	if !masked {
		return append(b, payload...)
	}
	key := []byte{0x11, 0x22, 0x33, 0x44}
	b = append(b, key...)
	for i, c := range payload {
		b = append(b, c^key[i%4])
	}
	return b
}
