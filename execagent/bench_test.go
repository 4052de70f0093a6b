package execagent

import (
	"bytes"
	stdgzip "compress/gzip"
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"

	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

// latencies collects per-operation durations and reports percentiles.
type latencies struct {
	mu sync.Mutex
	d  []time.Duration
}

func (l *latencies) add(d time.Duration) {
	l.mu.Lock()
	l.d = append(l.d, d)
	l.mu.Unlock()
}

// p50 returns the median latency (0 with none).
func (l *latencies) p50() time.Duration {
	if len(l.d) == 0 {
		return 0
	}
	slices.Sort(l.d)
	return l.d[(len(l.d)-1)/2]
}

// report adds p50 and p99 (in µs) to the benchmark's metrics.
func (l *latencies) report(b *testing.B) {
	if len(l.d) == 0 {
		return
	}
	slices.Sort(l.d)
	pct := func(p float64) float64 {
		return float64(l.d[int(p*float64(len(l.d)-1))].Microseconds())
	}
	b.ReportMetric(pct(0.50), "p50-µs")
	b.ReportMetric(pct(0.99), "p99-µs")
}

// BenchmarkSessionRun_True measures `true` in a session over loopback
// HTTP/1.1 with keep-alive: the agent's share of the gateway's p50 goal.
func BenchmarkSessionRun_True(b *testing.B) {
	benchSessionRun(b, "true", 0)
}

// BenchmarkSessionRun_False measures `false` in a session: every run after
// the first carries the previous exit code into $? (bash sources a status
// file, no fork); compare with BenchmarkSessionRun_True.
func BenchmarkSessionRun_False(b *testing.B) {
	benchSessionRun(b, "false", 1)
}

// benchSessionRun runs command in one session per iteration, expecting
// exit code code, and reports the latency percentiles.
func benchSessionRun(b *testing.B, command string, code int) {
	a := newTestAgent(b, nil)
	ctx := context.Background()
	id := newSession(b, a, agentapi.SessionCreateRequest{})
	req := agentapi.SessionRunRequest{Command: command}
	var lat latencies
	b.ResetTimer()
	for b.Loop() {
		t0 := time.Now()
		res, err := a.client.RunSession(ctx, id, req)
		lat.add(time.Since(t0))
		if err != nil || res.ExitCode != code {
			b.Fatalf("run: %v %+v", err, res)
		}
	}
	lat.report(b)
}

// BenchmarkSessionRun_Parallel64 runs `true` from 64 concurrent clients,
// each with its own session: throughput (runs/s) of the agent alone.
func BenchmarkSessionRun_Parallel64(b *testing.B) {
	const clients = 64
	a := newTestAgent(b, func(c *Config) { c.MaxSessions = clients })
	ctx := context.Background()
	ids := make(chan string, clients)
	for range clients {
		ids <- newSession(b, a, agentapi.SessionCreateRequest{})
	}
	var lat latencies
	b.SetParallelism((clients + 1) / 2) // GOMAXPROCS is 2 on the CI machine
	start := time.Now()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		id := <-ids
		defer func() { ids <- id }()
		for pb.Next() {
			t0 := time.Now()
			res, err := a.client.RunSession(ctx, id, agentapi.SessionRunRequest{Command: "true"})
			lat.add(time.Since(t0))
			if err != nil || res.ExitCode != 0 {
				b.Errorf("run: %v %+v", err, res)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "runs/s")
	lat.report(b)
}

// BenchmarkExec_True measures a one-shot `true` (a new bash per call).
func BenchmarkExec_True(b *testing.B) {
	a := newTestAgent(b, nil)
	ctx := context.Background()
	req := agentapi.ExecRequest{Command: "true"}
	var lat latencies
	for b.Loop() {
		t0 := time.Now()
		res, err := a.client.Exec(ctx, req)
		lat.add(time.Since(t0))
		if err != nil || res.ExitCode != 0 {
			b.Fatalf("exec: %v %+v", err, res)
		}
	}
	lat.report(b)
}

// BenchmarkSpawnBash is the baseline a session run is compared with:
// spawning `bash -c true` directly, without HTTP.
func BenchmarkSpawnBash(b *testing.B) {
	path, err := exec.LookPath("bash")
	require.NoError(b, err)
	var lat latencies
	for b.Loop() {
		t0 := time.Now()
		if err := exec.Command(path, "-c", "true").Run(); err != nil {
			b.Fatal(err)
		}
		lat.add(time.Since(t0))
	}
	lat.report(b)
}

// BenchmarkSessionExec_NoHTTP measures a session run without HTTP: the
// shell round trip alone.
func BenchmarkSessionExec_NoHTTP(b *testing.B) {
	a := newTestAgent(b, nil)
	id := newSession(b, a, agentapi.SessionCreateRequest{})
	ss, err := a.srv.sessions.get(id)
	require.NoError(b, err)
	var lat latencies
	for b.Loop() {
		t0 := time.Now()
		res, err := ss.exec(context.Background(), "true", time.Minute, 1<<20)
		lat.add(time.Since(t0))
		if err != nil || res.ExitCode != 0 {
			b.Fatalf("run: %v %+v", err, res)
		}
	}
	lat.report(b)
}

// BenchmarkCheckpoint measures GET /v1/checkpoint of the issue's
// workspaces (10 MB in 1k files, 100 MB in 10k files: makeWorkspace) over
// loopback HTTP, read to the end by the client, at each compression level,
// with the work dir on tmpfs (/dev/shm, like Docker's work dir) and on
// disk (the system's temporary directory). Reported: p50/p99 of the whole
// transfer, MB/s of the files, and the archive's size per file byte.
func BenchmarkCheckpoint(b *testing.B) {
	for _, fsys := range benchFileSystems() {
		for _, ws := range benchWorkspaces() {
			for _, level := range []string{agentapi.CompressionFast, agentapi.CompressionNone, agentapi.CompressionSmall} {
				b.Run(fsys.name+"/"+ws.name+"/"+level, func(b *testing.B) {
					a := benchAgent(b, fsys.dir, ws.w)
					var lat latencies
					var size int64
					for b.Loop() {
						t0 := time.Now()
						rc, _, err := a.client.CheckpointLevel(context.Background(), nil, nil, level)
						if err != nil {
							b.Fatal(err)
						}
						n, err := io.Copy(io.Discard, rc)
						_ = rc.Close()
						if err != nil {
							b.Fatal(err)
						}
						lat.add(time.Since(t0))
						size = n
					}
					b.SetBytes(ws.w.Bytes)
					b.ReportMetric(float64(size)/float64(ws.w.Bytes), "archive/byte")
					lat.report(b)
				})
			}
		}
	}
}

// BenchmarkRestore measures PUT /v1/checkpoint of the same workspaces in
// place (the tree is the checkpoint's plus one file created since, which
// the restore removes), of archives taken at the default compression
// (fast) and without (none): decompressing is most of a restore's CPU.
func BenchmarkRestore(b *testing.B) {
	for _, fsys := range benchFileSystems() {
		for _, ws := range benchWorkspaces() {
			for _, level := range []string{agentapi.CompressionFast, agentapi.CompressionNone} {
				b.Run(fsys.name+"/"+ws.name+"/"+level, func(b *testing.B) {
					benchRestore(b, fsys.dir, ws.w, level)
				})
			}
		}
	}
}

// benchRestore restores, again and again, a checkpoint at level of w in a
// work dir below base.
func benchRestore(b *testing.B, base string, w workspace, level string) {
	a := benchAgent(b, base, w)
	archive, _, hexSum := takeCheckpointAt(b, a, nil, nil, level)
	var lat latencies
	for b.Loop() {
		b.StopTimer()
		require.NoError(b, os.WriteFile(filepath.Join(a.cfg.Workdir, "created-since"), []byte("x"), 0o644))
		b.StartTimer()
		t0 := time.Now()
		if _, err := a.client.Restore(context.Background(), hexSum, bytes.NewReader(archive)); err != nil {
			b.Fatal(err)
		}
		lat.add(time.Since(t0))
	}
	b.SetBytes(w.Bytes)
	lat.report(b)
}

// BenchmarkRestoreVsCopy measures, side by side in one run, a restore in
// place of the 100 MB / 10k-file workspace (archived without compression,
// the gateway's default, and sent as the gateway sends it: vouched for, not
// hashed again) and `cp -a` of the same tree to a new directory on the same
// file system, alternating the two every iteration: issue 27's goal is the
// restore within 1.5x of the copy. Three changes are undone:
//   - one: a file created since, as after an episode that changed little
//     (the restore keeps every other file: extract_keep.go);
//   - every: the last byte of every file changed, as a write changes it
//     (its mtime moves, so the restore writes it without reading it);
//   - disguised: the same, each file's mtime put back, the worst case of
//     keeping (each file is read whole before its copy is written).
//
// Reported: the p50 of each (restore-p50-µs, cp-p50-µs) and their ratio
// (restore/cp).
func BenchmarkRestoreVsCopy(b *testing.B) {
	for _, fsys := range benchFileSystems() {
		for _, change := range []string{"one", "every", "disguised"} {
			b.Run(fsys.name+"/"+change, func(b *testing.B) {
				if _, err := exec.LookPath("cp"); err != nil {
					b.Skip("no cp on PATH")
				}
				a := benchAgent(b, fsys.dir, workspace100MB)
				archive, _, hexSum := takeCheckpointAt(b, a, nil, nil, agentapi.CompressionNone)
				copies := b.TempDir()
				if fsys.name == "shm" {
					var err error
					copies, err = os.MkdirTemp(fsys.dir, "quarry-cpbench-")
					require.NoError(b, err)
					b.Cleanup(func() { _ = os.RemoveAll(copies) })
				}
				restore := func() {
					body := vouched{Reader: bytes.NewReader(archive), vouch: hexSum}
					if _, err := a.client.Restore(context.Background(), hexSum, body); err != nil {
						b.Fatal(err)
					}
				}
				restore() // the workspace's files have sub-second mtimes, the archive's are in seconds
				var restores, cps latencies
				i := 0
				for b.Loop() {
					i++
					b.StopTimer()
					dst := filepath.Join(copies, strconv.Itoa(i))
					b.StartTimer()
					t0 := time.Now()
					if out, err := exec.Command("cp", "-a", a.cfg.Workdir, dst).CombinedOutput(); err != nil {
						b.Fatalf("cp -a: %v: %s", err, out)
					}
					cps.add(time.Since(t0))
					b.StopTimer()
					require.NoError(b, os.RemoveAll(dst))
					require.NoError(b, os.WriteFile(filepath.Join(a.cfg.Workdir, "created-since"), []byte("x"), 0o644))
					if change != "one" {
						flipLastBytes(b, a.cfg.Workdir, change == "disguised")
					}
					b.StartTimer()
					t0 = time.Now()
					restore()
					restores.add(time.Since(t0))
				}
				r, c := restores.p50(), cps.p50()
				b.ReportMetric(float64(r.Microseconds()), "restore-p50-µs")
				b.ReportMetric(float64(c.Microseconds()), "cp-p50-µs")
				b.ReportMetric(float64(r)/float64(c), "restore/cp")
			})
		}
	}
}

// flipLastBytes changes the last byte of every non-empty regular file
// below dir, keeping its size, and its mtime when disguise.
func flipLastBytes(b *testing.B, dir string, disguise bool) {
	b.Helper()
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		fi, err := d.Info()
		if err != nil || fi.Size() == 0 {
			return err
		}
		f, err := os.OpenFile(p, os.O_RDWR, 0)
		if err != nil {
			return err
		}
		last := make([]byte, 1)
		if _, err = f.ReadAt(last, fi.Size()-1); err == nil {
			_, err = f.WriteAt([]byte{last[0] ^ 0xff}, fi.Size()-1)
		}
		err = errors.Join(err, f.Close())
		if err == nil && disguise {
			err = os.Chtimes(p, fi.ModTime(), fi.ModTime())
		}
		return err
	})
	require.NoError(b, err)
}

type benchFS struct{ name, dir string }

// benchFileSystems are where the benchmark work dirs live: tmpfs and disk.
func benchFileSystems() []benchFS {
	return []benchFS{{"shm", "/dev/shm"}, {"disk", os.TempDir()}}
}

type benchWorkspace struct {
	name string
	w    workspace
}

func benchWorkspaces() []benchWorkspace {
	return []benchWorkspace{{"10MB", workspace10MB}, {"100MB", workspace100MB}}
}

// benchAgent starts an agent whose work dir, below base, holds w.
func benchAgent(b *testing.B, base string, w workspace) *testAgent {
	dir, err := os.MkdirTemp(base, "quarry-ckbench-")
	require.NoError(b, err)
	b.Cleanup(func() { _ = os.RemoveAll(dir) })
	makeWorkspace(b, dir, w, 1)
	return newTestAgent(b, func(c *Config) { c.Workdir = dir })
}

// BenchmarkCompressors compares, in memory, the compressors a checkpoint
// could use on the tar stream of the 100 MB workspace: klauspost's gzip
// Huffman-only (compression=fast) and fastest deflate (compression=small),
// the standard library's fastest deflate, and zstd's fastest level on one
// core and on all. Reported: MB/s of the tar stream and output size per
// input byte. It is what chose the levels (docs/BENCHMARKS.md,
// "Checkpoints").
func BenchmarkCompressors(b *testing.B) {
	a := benchAgent(b, "/dev/shm", workspace100MB)
	stream, _, _ := takeCheckpointAt(b, a, nil, nil, agentapi.CompressionNone) // a plain tar
	gz := func(level int) func(io.Writer) io.WriteCloser {
		return func(w io.Writer) io.WriteCloser { z, _ := gzip.NewWriterLevel(w, level); return z }
	}
	zst := func(conc int) func(io.Writer) io.WriteCloser {
		return func(w io.Writer) io.WriteCloser {
			z, _ := zstd.NewWriter(w, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(conc))
			return z
		}
	}
	tests := []struct {
		name string
		new  func(io.Writer) io.WriteCloser
	}{
		{"gzip-huffman", gz(gzip.HuffmanOnly)},
		{"gzip-bestspeed", gz(gzip.BestSpeed)},
		{"stdlib-gzip-bestspeed", func(w io.Writer) io.WriteCloser { z, _ := stdgzip.NewWriterLevel(w, stdgzip.BestSpeed); return z }},
		{"zstd-fastest-1core", zst(1)},
		{"zstd-fastest-allcores", zst(0)},
	}
	for _, tt := range tests {
		b.Run(tt.name, func(b *testing.B) {
			var out countWriter
			for b.Loop() {
				out = 0
				z := tt.new(&out)
				if _, err := z.Write(stream); err != nil {
					b.Fatal(err)
				}
				if err := z.Close(); err != nil {
					b.Fatal(err)
				}
			}
			b.SetBytes(int64(len(stream)))
			b.ReportMetric(float64(out)/float64(len(stream)), "out/byte")
		})
	}
}

// countWriter counts the bytes written to it.
type countWriter int64

func (c *countWriter) Write(p []byte) (int, error) { *c += countWriter(len(p)); return len(p), nil }
