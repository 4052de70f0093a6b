package docker

import (
	"archive/tar"
	"bufio"
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

func gzipped(t testing.TB, b []byte) []byte {
	t.Helper()
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, err := zw.Write(b)
	require.NoError(t, err)
	require.NoError(t, zw.Close())
	return gz.Bytes()
}

func TestCheckLayerArchive_AcceptsTheWorkDirAloneAndConsumesNothing(t *testing.T) {
	in := agentArchive(t, "/home/sandbox",
		&tar.Header{Name: "home/sandbox/", Typeflag: tar.TypeDir, Mode: 0o755},
		&tar.Header{Name: "home/sandbox/big", Typeflag: tar.TypeReg, Mode: 0o644, Size: 200 << 10},
	)
	for name, src := range map[string][]byte{"tar": in, "tar+gzip": gzipped(t, in)} {
		t.Run(name, func(t *testing.T) {
			br := bufio.NewReaderSize(bytes.NewReader(src), layerHeaderPeek)
			require.NoError(t, checkLayerArchive(br, "/home/sandbox"))
			rest, err := io.ReadAll(br)
			require.NoError(t, err)
			assert.Equal(t, src, rest, "the whole archive is left for the unpack")
		})
	}
}

func TestCheckLayerArchive_RefusesOtherRoots(t *testing.T) {
	wd := "/home/sandbox"
	other := agentArchive(t, "/tmp", &tar.Header{Name: "tmp/", Typeflag: tar.TypeDir})
	var noHeader bytes.Buffer
	tw := tar.NewWriter(&noHeader)
	require.NoError(t, tw.WriteHeader(&tar.Header{Name: "home/sandbox/", Typeflag: tar.TypeDir}))
	require.NoError(t, tw.Close())
	tests := map[string][]byte{
		"other roots":             other,
		"other roots, gzip":       gzipped(t, other),
		"another work dir's":      agentArchive(t, "/home/other"),
		"no header":               noHeader.Bytes(),
		"an empty archive":        nil,
		"a gzip stream cut short": []byte{0x1f, 0x8b, 0, 0},
		"not an archive":          []byte("hello"),
	}
	for name, in := range tests {
		t.Run(name, func(t *testing.T) {
			err := checkLayerArchive(bufio.NewReaderSize(bytes.NewReader(in), layerHeaderPeek), wd)
			assert.ErrorIs(t, err, providers.ErrNoLayer)
		})
	}
}

func TestLayerDirs_TheWorkDirIsTheUsers(t *testing.T) {
	var b bytes.Buffer
	require.NoError(t, layerDirs(&b, "/home/sandbox/work", 1000, 1001))
	hdrs := readTar(t, b.Bytes())
	require.Len(t, hdrs, 3)
	for i, name := range []string{"home/", "home/sandbox/", "home/sandbox/work/"} {
		assert.Equal(t, name, hdrs[i].Name)
		assert.Equal(t, byte(tar.TypeDir), hdrs[i].Typeflag)
	}
	assert.Equal(t, []int{0, 0, 1000}, []int{hdrs[0].Uid, hdrs[1].Uid, hdrs[2].Uid})
	assert.Equal(t, 1001, hdrs[2].Gid)
	assert.Equal(t, int64(0o755), hdrs[0].Mode)
}

func FuzzCheckLayerArchive(f *testing.F) {
	f.Add(agentArchive(f, "/home/sandbox", &tar.Header{Name: "home/sandbox/a", Typeflag: tar.TypeReg, Size: 2}))
	f.Add(gzipped(f, agentArchive(f, "/home/sandbox")))
	f.Add([]byte{0x1f, 0x8b, 0, 0})
	f.Fuzz(func(t *testing.T, in []byte) {
		br := bufio.NewReaderSize(bytes.NewReader(in), layerHeaderPeek)
		err := checkLayerArchive(br, "/home/sandbox")
		rest, rerr := io.ReadAll(br)
		require.NoError(t, rerr)
		require.Equal(t, in, rest, "the check consumes nothing")
		if err != nil {
			return
		}
		// What it accepts starts with the agent's header naming the work
		// dir alone, in the work dir.
		var r io.Reader = bytes.NewReader(in)
		if bytes.HasPrefix(in, []byte{0x1f, 0x8b}) {
			zr, zerr := gzip.NewReader(r)
			require.NoError(t, zerr)
			r = zr
		}
		hdr, herr := tar.NewReader(r).Next()
		require.NoError(t, herr)
		require.Equal(t, byte(tar.TypeXGlobalHeader), hdr.Typeflag)
		require.Equal(t, `["/home/sandbox"]`, strings.ReplaceAll(hdr.PAXRecords[agentapi.PAXRoots], " ", ""))
		require.Equal(t, "/home/sandbox", hdr.PAXRecords[agentapi.PAXWorkdir])
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
	for _, medium := range []string{LayerMemory, LayerDisk} {
		t.Run(medium, func(t *testing.T) { tasksShareTheLayer(t, medium) })
	}
}

func tasksShareTheLayer(t *testing.T, medium string) {
	needDocker(t)
	e := newTestEnv(t)
	p := e.open(t, func(c *Config) { c.LayerMedium = medium })
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
	holders := 0
	for _, c := range e.containers(t) {
		if c.Labels[labelVolume] == volumeHelper {
			holders++
			assert.Equal(t, "running", c.State, "a holder runs")
		}
	}
	if medium == LayerMemory {
		assert.Equal(t, 1, holders, "one container holds the layer's tmpfs mounted")
	} else {
		assert.Zero(t, holders, "a layer on disk needs no container")
	}

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
	for _, c := range e.containers(t) {
		assert.NotEqual(t, volumeHelper, c.Labels[labelVolume], "and its holder: %s", c.Names)
	}
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

// The agent's restore decides about the archive, as in a sandbox: bytes
// that are not the checkpoint's (its SHA-256 differs) fail the prepare
// with the agent's own message, and leave nothing.
func TestProvider_Layers_AnArchiveTheAgentRefusesLeavesNothing(t *testing.T) {
	e, p := dockerProvider(t)
	ctx := context.Background()
	s := spec("cowrefused", imageBusybox)
	archive := agentArchive(t, DefaultWorkdir,
		&tar.Header{Name: "home/sandbox/", Typeflag: tar.TypeDir, Mode: 0o755},
		&tar.Header{Name: "home/sandbox/f", Typeflag: tar.TypeReg, Mode: 0o644, Size: 10},
	)
	err := p.PrepareLayer(ctx, providers.LayerRequest{Spec: s, Key: strings.Repeat("d", 64), Roots: []string{DefaultWorkdir},
		Open: func(context.Context) (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(archive)), nil }})
	require.Error(t, err)
	assert.NotErrorIs(t, err, providers.ErrNoLayer)
	assert.Contains(t, err.Error(), "the body hashes to", "the agent's own refusal")
	assert.Empty(t, e.layerVolumes(t), "the incomplete layer is removed")
	assert.Empty(t, e.containers(t), "and the unpack's container")
}

// prepareSmallLayer prepares a layer of a one-file archive of the work dir
// with p for pool s, and returns its key.
func prepareSmallLayer(t *testing.T, p *Provider, s providers.Spec) string {
	t.Helper()
	archive := agentArchive(t, DefaultWorkdir,
		&tar.Header{Name: "home/sandbox/", Typeflag: tar.TypeDir, Mode: 0o755},
		&tar.Header{Name: "home/sandbox/f", Typeflag: tar.TypeReg, Mode: 0o644, Size: 3},
	)
	sum := sha256.Sum256(archive)
	key := hex.EncodeToString(sum[:])
	require.NoError(t, p.PrepareLayer(context.Background(), providers.LayerRequest{Spec: s, Key: key, Roots: []string{DefaultWorkdir},
		Open: func(context.Context) (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(archive)), nil }}))
	return key
}

// A layer no task uses goes once idle QUARRY_DOCKER_LAYER_IDLE, whether
// no task ever started on it or its tasks stopped before that time, with no
// other event to trigger it; one a task uses stays.
func TestProvider_Layers_IdleLayersGoByThemselves(t *testing.T) {
	needDocker(t)
	e := newTestEnv(t)
	p := e.open(t, func(c *Config) { c.LayerIdle = time.Second })
	s := spec("cowidle", imageBusybox)
	gone := func() bool { return len(e.layerVolumes(t)[volumeLayer]) == 0 }

	prepareSmallLayer(t, p, s)
	require.Len(t, e.layerVolumes(t)[volumeLayer], 1)
	require.Eventually(t, gone, waitTimeout, 50*time.Millisecond, "a layer no task started on goes when idle")

	key := prepareSmallLayer(t, p, s)
	on := s
	on.Options = map[string]string{providers.OptionLayer: key}
	task := launchOne(t, p, on, "cowidle-"+randomHex(t, 4))
	assert.Equal(t, "xxx", execIn(t, agentOf(t, task), "cat f").Stdout)
	require.NoError(t, p.Stop(context.Background(), task.ID, "test"))
	require.Eventually(t, gone, waitTimeout, 50*time.Millisecond, "a layer whose task stopped goes when idle")
}

// A layer an earlier process of the gateway kept (idle not yet reached
// when it closed) is found and released by the next one.
func TestProvider_Layers_TheNextProcessSweepsKeptLayers(t *testing.T) {
	needDocker(t)
	e := newTestEnv(t)
	first := e.open(t, func(c *Config) { c.LayerIdle = time.Hour })
	prepareSmallLayer(t, first, spec("cowsweep", imageBusybox))
	require.NoError(t, first.Close(context.Background()))
	require.Len(t, e.layerVolumes(t)[volumeLayer], 1, "kept: its idle time has not passed")

	e.open(t, func(c *Config) { c.LayerIdle = time.Second })
	require.Eventually(t, func() bool { return len(e.layerVolumes(t)[volumeLayer]) == 0 }, waitTimeout, 50*time.Millisecond,
		"the next process removes it once idle")
}

// A layer in memory lives while its holder runs: when the holder died (an
// engine restart, a kill), the next prepare finds no marker in an empty
// tmpfs and unpacks it again, and tasks start on it with its files.
func TestProvider_Layers_AMemoryLayerWhoseHolderDiedIsUnpackedAgain(t *testing.T) {
	needDocker(t)
	e := newTestEnv(t)
	p := e.open(t, func(c *Config) { c.LayerMedium = LayerMemory })
	s := spec("cowheld", imageBusybox)
	key := prepareSmallLayer(t, p, s)
	var holder string
	for _, c := range e.containers(t) {
		if c.Labels[labelVolume] == volumeHelper {
			holder = c.ID
		}
	}
	require.NotEmpty(t, holder)
	require.NoError(t, e.cli.ContainerKill(context.Background(), holder, "KILL"))

	require.Equal(t, key, prepareSmallLayer(t, p, s))
	on := s
	on.Options = map[string]string{providers.OptionLayer: key}
	task := launchOne(t, p, on, "cowheld-"+randomHex(t, 4))
	assert.Equal(t, "xxx", execIn(t, agentOf(t, task), "cat f").Stdout)
	n := 0
	for _, c := range e.containers(t) {
		if c.Labels[labelVolume] == volumeHelper {
			n++
			assert.NotEqual(t, holder, c.ID, "the dead holder was removed")
		}
	}
	assert.Equal(t, 1, n)
}

// errReader fails every read with err.
type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }
