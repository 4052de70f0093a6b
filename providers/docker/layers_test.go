package docker

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/volume"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/providers"
)

// agentArchive builds an archive as the agent writes one of workdir:
// its global header, then entries.
func agentArchive(t testing.TB, workdir string, entries ...*tar.Header) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	roots, err := json.Marshal([]string{workdir})
	require.NoError(t, err)
	require.NoError(t, tw.WriteHeader(&tar.Header{Typeflag: tar.TypeXGlobalHeader, PAXRecords: map[string]string{
		agentapi.PAXRoots: string(roots), agentapi.PAXWorkdir: workdir,
	}}))
	for _, h := range entries {
		require.NoError(t, tw.WriteHeader(h))
		if h.Typeflag == tar.TypeReg {
			_, err := tw.Write(bytes.Repeat([]byte("x"), int(h.Size)))
			require.NoError(t, err)
		}
	}
	require.NoError(t, tw.Close())
	return buf.Bytes()
}

// readTar lists an archive's headers.
func readTar(t testing.TB, b []byte) []*tar.Header {
	t.Helper()
	var out []*tar.Header
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		require.NoError(t, err)
		out = append(out, h)
	}
}

func TestRewriteLayer_GivesEveryEntryToTheUserAndEndsWithTheMarker(t *testing.T) {
	in := agentArchive(t, "/home/sandbox",
		&tar.Header{Name: "home/sandbox/", Typeflag: tar.TypeDir, Mode: 0o755},
		&tar.Header{Name: "home/sandbox/run", Typeflag: tar.TypeReg, Mode: 0o6755, Size: 3},
		&tar.Header{Name: "home/sandbox/link", Typeflag: tar.TypeSymlink, Linkname: "/etc/passwd", Mode: 0o777},
	)
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, err := zw.Write(in)
	require.NoError(t, err)
	require.NoError(t, zw.Close())
	for name, src := range map[string][]byte{"tar": in, "tar+gzip": gz.Bytes()} {
		t.Run(name, func(t *testing.T) {
			var out bytes.Buffer
			require.NoError(t, rewriteLayer(&out, bytes.NewReader(src), "/home/sandbox", 1000, 1001, strings.Repeat("ab", 32)))
			hdrs := readTar(t, out.Bytes())
			require.Len(t, hdrs, 4, "the entries and the marker, no global header")
			for _, h := range hdrs[:3] {
				assert.Equal(t, 1000, h.Uid, h.Name)
				assert.Equal(t, 1001, h.Gid, h.Name)
			}
			assert.Equal(t, int64(0o755), hdrs[1].Mode, "setuid and setgid are dropped, as an unprivileged restore leaves them")
			assert.Equal(t, "/etc/passwd", hdrs[2].Linkname, "a link is kept as it is")
			assert.Equal(t, layerMarker, hdrs[3].Name, "the marker comes last")
		})
	}
}

func TestRewriteLayer_RefusesWhatARestoreWouldTreatOtherwise(t *testing.T) {
	wd := "/home/sandbox"
	tests := []struct {
		name string
		in   []byte
	}{
		{"an entry outside the work dir", agentArchive(t, wd, &tar.Header{Name: "etc/passwd", Typeflag: tar.TypeReg, Size: 1})},
		{"a sibling with the work dir's name as prefix", agentArchive(t, wd, &tar.Header{Name: "home/sandboxes/x", Typeflag: tar.TypeReg, Size: 1})},
		{"a path that is not clean", agentArchive(t, wd, &tar.Header{Name: "home/sandbox/../../etc/x", Typeflag: tar.TypeReg, Size: 1})},
		{"a hard link", agentArchive(t, wd, &tar.Header{Name: "home/sandbox/h", Typeflag: tar.TypeLink, Linkname: "home/sandbox/f"})},
		{"a device", agentArchive(t, wd, &tar.Header{Name: "home/sandbox/d", Typeflag: tar.TypeChar})},
		{"other roots", agentArchive(t, "/tmp", &tar.Header{Name: "tmp/", Typeflag: tar.TypeDir})},
		{"no header", func() []byte {
			var b bytes.Buffer
			tw := tar.NewWriter(&b)
			require.NoError(t, tw.WriteHeader(&tar.Header{Name: "home/sandbox/", Typeflag: tar.TypeDir}))
			require.NoError(t, tw.Close())
			return b.Bytes()
		}()},
		{"an empty archive", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := rewriteLayer(io.Discard, bytes.NewReader(tt.in), wd, 1, 1, strings.Repeat("0", 64))
			assert.ErrorIs(t, err, providers.ErrNoLayer)
		})
	}
}

func TestRewriteLayer_ReadsTheSourceToItsEnd(t *testing.T) {
	// The checkpoint store's reader fails at the end of a blob that does
	// not hash to its sha256: a layer must not be made of it.
	in := agentArchive(t, "/home/sandbox", &tar.Header{Name: "home/sandbox/f", Typeflag: tar.TypeReg, Mode: 0o644, Size: 3})
	corrupt := errors.New("checkpoint archive corrupt")
	err := rewriteLayer(io.Discard, io.MultiReader(bytes.NewReader(in), errReader{corrupt}), "/home/sandbox", 1, 1, strings.Repeat("0", 64))
	assert.ErrorIs(t, err, corrupt)
}

func FuzzRewriteLayer(f *testing.F) {
	f.Add(agentArchive(f, "/home/sandbox", &tar.Header{Name: "home/sandbox/a", Typeflag: tar.TypeReg, Size: 2}))
	f.Add([]byte{0x1f, 0x8b, 0, 0})
	f.Fuzz(func(t *testing.T, in []byte) {
		var out bytes.Buffer
		if err := rewriteLayer(&out, bytes.NewReader(in), "/home/sandbox", 7, 7, strings.Repeat("0", 64)); err != nil {
			return
		}
		// What it accepts unpacks below the work dir alone, the user's.
		hdrs := readTar(t, out.Bytes())
		require.NotEmpty(t, hdrs)
		require.Equal(t, layerMarker, hdrs[len(hdrs)-1].Name)
		for _, h := range hdrs[:len(hdrs)-1] {
			name := strings.TrimSuffix(h.Name, "/")
			require.True(t, name == "home/sandbox" || strings.HasPrefix(name, "home/sandbox/"), h.Name)
			require.Equal(t, 7, h.Uid)
			require.Contains(t, []byte{tar.TypeDir, tar.TypeReg, tar.TypeSymlink}, h.Typeflag)
			require.Zero(t, h.Mode&0o6000)
		}
	})
}

func TestResolve_LayerOptions(t *testing.T) {
	cfg := testConfig()
	s := spec("p", imageBusybox)
	s.Options = map[string]string{providers.OptionLayer: "nothex"}
	_, err := resolve(cfg, s)
	assert.ErrorIs(t, err, providers.ErrInvalidSpec)
	s.Options = map[string]string{OptionCow: "sometimes"}
	_, err = resolve(cfg, s)
	assert.ErrorIs(t, err, providers.ErrInvalidSpec)

	s.Options = nil
	set, err := resolve(cfg, s)
	require.NoError(t, err)
	assert.Empty(t, cowProblem(set), "a pool that bounds nothing may start on a layer")
	s.DiskMB = 64
	set, err = resolve(cfg, s)
	require.NoError(t, err)
	assert.Contains(t, cowProblem(set), "bounds its work directory to 64 MiB", "auto keeps a pool's disk bound")
	s.Options = map[string]string{OptionCow: cowAlways}
	set, err = resolve(cfg, s)
	require.NoError(t, err)
	assert.Empty(t, cowProblem(set))
	s.Options = map[string]string{OptionCow: cowAlways, OptionWorkdir: "/work"}
	set, err = resolve(cfg, s)
	require.NoError(t, err)
	assert.Contains(t, cowProblem(set), "directly below /")
}

// layerVolumes lists the namespace's volumes by role.
func (e *testEnv) layerVolumes(t testing.TB) map[string][]string {
	t.Helper()
	vols, err := e.cli.VolumeList(context.Background(), volume.ListOptions{Filters: filters.NewArgs(filters.Arg("label", providers.LabelGateway+"="+e.gatewayID))})
	require.NoError(t, err)
	out := map[string][]string{}
	for _, v := range vols.Volumes {
		out[v.Labels[labelVolume]] = append(out[v.Labels[labelVolume]], v.Name)
	}
	return out
}

// checkpointOf takes a checkpoint of the task's work dir through its agent.
func checkpointOf(t testing.TB, a *agentapi.Client) ([]byte, agentapi.CheckpointInfo) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rc, info, err := a.CheckpointLevel(ctx, nil, nil, agentapi.CompressionNone)
	require.NoError(t, err)
	defer rc.Close()
	b, err := io.ReadAll(rc)
	require.NoError(t, err)
	return b, info
}

func TestProvider_Layers_TasksShareTheLayerAndWriteTheirOwn(t *testing.T) {
	e, p := dockerProvider(t)
	ctx := context.Background()
	s := spec("cow", imageBusybox)
	src := agentOf(t, launchOne(t, p, s, "cow-src-"+randomHex(t, 4)))
	res := execIn(t, src, "mkdir -p d && echo base > d/f && echo keep > k && ln -s d/f link && chmod 700 d")
	require.Equal(t, 0, res.ExitCode, res.Stderr)
	archive, info := checkpointOf(t, src)
	sum := sha256.Sum256(archive)
	key := hex.EncodeToString(sum[:])

	var opens atomic.Int32
	req := providers.LayerRequest{Spec: s, Key: key, Roots: info.Roots, Open: func(context.Context) (io.ReadCloser, error) {
		opens.Add(1)
		return io.NopCloser(bytes.NewReader(archive)), nil
	}}
	require.NoError(t, p.PrepareLayer(ctx, req))
	require.NoError(t, p.PrepareLayer(ctx, req))
	assert.Equal(t, int32(1), opens.Load(), "a layer is unpacked once")

	on := s
	on.Options = map[string]string{providers.OptionLayer: key}
	a := launchOne(t, p, on, "cow-a-"+randomHex(t, 4))
	b := launchOne(t, p, on, "cow-b-"+randomHex(t, 4))
	agentA, agentB := agentOf(t, a), agentOf(t, b)
	const look = `cat d/f k; readlink link; stat -c '%u %a' . d d/f; touch mine && echo writable`
	want := "base\nkeep\nd/f\n65534 755\n65534 700\n65534 644\nwritable\n"
	for _, ag := range []*agentapi.Client{agentA, agentB} {
		res := execIn(t, ag, look)
		assert.Equal(t, want, res.Stdout, res.Stderr)
	}
	res = execIn(t, agentA, "echo changed > d/f && rm k && cat d/f")
	require.Equal(t, "changed\n", res.Stdout, res.Stderr)
	assert.Equal(t, "base\nkeep\n", execIn(t, agentB, "cat d/f k").Stdout, "a change in one task is not in another")
	c := launchOne(t, p, on, "cow-c-"+randomHex(t, 4))
	assert.Equal(t, "base\nkeep\n", execIn(t, agentOf(t, c), "cat d/f k").Stdout, "nor in the layer")

	vols := e.layerVolumes(t)
	assert.Len(t, vols[volumeLayer], 1)
	assert.Len(t, vols[volumeOverlay], 3, "one overlay per task")

	// Dropped while tasks use it: it stays until the last one stops.
	require.NoError(t, p.DropLayer(ctx, key))
	for _, task := range []providers.Task{a, b} {
		require.NoError(t, p.Stop(ctx, task.ID, "test"))
	}
	assert.Len(t, e.layerVolumes(t)[volumeLayer], 1, "a task still uses the layer")
	assert.Equal(t, "base\nkeep\n", execIn(t, agentOf(t, c), "cat d/f k").Stdout)
	require.NoError(t, p.Stop(ctx, c.ID, "test"))
	vols = e.layerVolumes(t)
	assert.Empty(t, vols[volumeLayer], "the last task's stop removes a dropped layer")
	assert.Empty(t, vols[volumeOverlay])
	assert.Empty(t, vols[volumeUpper])
	assert.Empty(t, vols[volumeWork])
}

func TestProvider_Layers_RefusedWhereTheyCannotServe(t *testing.T) {
	_, p := dockerProvider(t)
	ctx := context.Background()
	s := spec("nocow", imageBusybox)
	key := strings.Repeat("c", 64)
	open := func(context.Context) (io.ReadCloser, error) {
		t.Error("the archive is not read for a layer that is refused")
		return nil, errors.New("not read")
	}
	bounded := s
	bounded.DiskMB = 64
	err := p.PrepareLayer(ctx, providers.LayerRequest{Spec: bounded, Key: key, Roots: []string{DefaultWorkdir}, Open: open})
	assert.ErrorIs(t, err, providers.ErrNoLayer, "a pool's disk bound is kept")
	err = p.PrepareLayer(ctx, providers.LayerRequest{Spec: s, Key: key, Roots: []string{"/tmp"}, Open: open})
	assert.ErrorIs(t, err, providers.ErrNoLayer, "an archive of other paths is restored by copy")

	on := s
	on.Options = map[string]string{providers.OptionLayer: key}
	_, err = p.Launch(ctx, on, []string{"nolayer-" + randomHex(t, 4)})
	assert.ErrorIs(t, err, providers.ErrNotFound, "a task cannot start on a layer never prepared")
}

func TestProvider_Layers_ABrokenUnpackLeavesNothingAndIsTriedAgain(t *testing.T) {
	e, p := dockerProvider(t)
	ctx := context.Background()
	s := spec("cowbroken", imageBusybox)
	wd := DefaultWorkdir
	archive := agentArchive(t, wd,
		&tar.Header{Name: "home/sandbox/", Typeflag: tar.TypeDir, Mode: 0o755},
		&tar.Header{Name: "home/sandbox/big", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1 << 20},
	)
	sum := sha256.Sum256(archive)
	key := hex.EncodeToString(sum[:])
	broken := errors.New("the store's reader broke")
	req := providers.LayerRequest{Spec: s, Key: key, Roots: []string{wd}, Open: func(context.Context) (io.ReadCloser, error) {
		return io.NopCloser(io.MultiReader(bytes.NewReader(archive[:len(archive)/2]), errReader{broken})), nil
	}}
	err := p.PrepareLayer(ctx, req)
	require.ErrorIs(t, err, broken)
	assert.Empty(t, e.layerVolumes(t), "the incomplete layer is removed")
	assert.Empty(t, e.containers(t), "and the unpack's container")

	req.Open = func(context.Context) (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(archive)), nil }
	require.NoError(t, p.PrepareLayer(ctx, req), "the next attempt starts clean")
	on := s
	on.Options = map[string]string{providers.OptionLayer: key}
	task := launchOne(t, p, on, "cowok-"+randomHex(t, 4))
	assert.Equal(t, "1048576\n", execIn(t, agentOf(t, task), "wc -c < big").Stdout)
}

// errReader fails every read with err.
type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }
