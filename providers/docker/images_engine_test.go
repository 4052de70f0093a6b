package docker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/internal/testenv"
	"github.com/quarryhq/quarry/providers"
)

// A task of an image that is only in the registry launches after
// PrepareImage pulled it, runs, and the next launch reuses the image
// without a pull.
func TestProvider_PrepareImage_PullsAnImageOnlyInTheRegistry(t *testing.T) {
	host := needRegistry(t)
	e := newTestEnv(t)
	ref, size := pushedImage(t, e, host, registryUser{}, "only-there", 64)
	p := e.openImages(t)
	start := time.Now()
	s := onDemandSpec("od", ref)

	info, err := p.PrepareImage(context.Background(), s)
	require.NoError(t, err)
	assert.Equal(t, providers.ImageReady, info.State)
	assert.Equal(t, ref, info.Image)
	assert.Equal(t, size, info.SizeBytes)
	assert.True(t, strings.HasPrefix(info.Digest, "sha256:"), info.Digest)
	task := launchOne(t, p, s, "od-"+randomHex(t, 4))
	res := execIn(t, agentOf(t, task), "wc -c < /data")
	assert.Equal(t, "65536\n", res.Stdout)
	assert.Equal(t, "default", task.Labels[providers.LabelClass])

	second := launchOne(t, p, s, "od-"+randomHex(t, 4))
	execIn(t, agentOf(t, second), "true")
	assert.Equal(t, 1, enginePulls(t, e, ref, start), "the second launch reuses the image")

	images, err := p.Images(context.Background())
	require.NoError(t, err)
	require.Len(t, images, 1)
	assert.Equal(t, ref, images[0].Image)
	assert.True(t, images[0].InUse)
	assert.False(t, images[0].Pinned)
	assert.False(t, images[0].LastUsed.Before(start), "the launches' use is recorded")
}

// A launch of an on-demand pool pulls by itself, with no PrepareImage first.
func TestProvider_Launch_OnDemandPoolPullsWithoutPrepare(t *testing.T) {
	host := needRegistry(t)
	e := newTestEnv(t)
	ref, _ := pushedImage(t, e, host, registryUser{}, "launch-pulls", 16)
	p := e.openImages(t)
	s := onDemandSpec("od", ref)
	task := launchOne(t, p, s, "lp-"+randomHex(t, 4))
	execIn(t, agentOf(t, task), "true")

	// A configured pool's launch never pulls.
	ref2, _ := pushedImage(t, e, host, registryUser{}, "configured", 16)
	_, err := p.Launch(context.Background(), spec("conf", ref2), []string{"cf-" + randomHex(t, 4)})
	var lerr *providers.LaunchError
	require.ErrorAs(t, err, &lerr)
	assert.Contains(t, lerr.Reason, "is not on the Docker engine")
}

func TestProvider_PrepareImage_TwentyCallersOnePull(t *testing.T) {
	host := needRegistry(t)
	e := newTestEnv(t)
	ref, _ := pushedImage(t, e, host, registryUser{}, "twenty", 256)
	p := e.openImages(t)
	start := time.Now()
	s := onDemandSpec("od", ref)
	var wg sync.WaitGroup
	errs := make([]error, 20)
	for i := range errs {
		wg.Go(func() { _, errs[i] = p.PrepareImage(context.Background(), s) })
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	assert.Equal(t, 1, enginePulls(t, e, ref, start), "the engine pulled once")
	assert.Equal(t, 1.0, testutil.ToFloat64(p.img.metrics.pullsStarted))
}

// Each failure is its own ImageError naming the image, the registry and
// its answer, and leaves no container and no ledger entry behind.
func TestProvider_PrepareImage_RegistryFailures(t *testing.T) {
	host := needRegistry(t)
	authHost, user, password := testenv.RegistryAuth(t)
	e := newTestEnv(t)
	present, _ := pushedImage(t, e, host, registryUser{}, "present", 16)
	private, _ := pushedImage(t, e, authHost, registryUser{Name: user, Password: password}, "private", 16)
	down := closedAddr(t)
	tests := []struct {
		name     string
		image    string
		registry string
		kind     providers.ImageErrorKind
		answer   string
	}{
		{name: "missing tag", image: strings.TrimSuffix(present, ":1") + ":nope", registry: host, kind: providers.ImageNotFound, answer: "manifest unknown"},
		{name: "missing repository", image: host + "/quarry-test-none/nothing:1", registry: host, kind: providers.ImageNotFound, answer: "manifest unknown"},
		{name: "registry down", image: down + "/quarry-test/x:1", registry: down, kind: providers.ImageUnreachable, answer: "connection refused"},
		{name: "registry answers 401", image: private, registry: authHost, kind: providers.ImageDenied, answer: "no basic auth credentials"},
	}
	p := e.openImages(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := onDemandSpec("bad", tt.image)
			_, err := p.PrepareImage(context.Background(), s)
			var ie *providers.ImageError
			require.ErrorAs(t, err, &ie)
			t.Logf("the engine's answer: %s", ie.Answer)
			assert.Equal(t, tt.kind, ie.Kind)
			assert.Equal(t, tt.image, ie.Image)
			assert.Equal(t, tt.registry, ie.Registry)
			assert.Contains(t, ie.Answer, tt.answer)

			tasks, err := p.Launch(context.Background(), s, []string{"bad-" + randomHex(t, 4)})
			assert.Empty(t, tasks)
			var lerr *providers.LaunchError
			require.ErrorAs(t, err, &lerr)
			require.ErrorAs(t, err, &ie, "the launch's error carries the image's")
			assert.Equal(t, tt.kind, ie.Kind)
			assert.Empty(t, e.containers(t), "no container is left behind")
			entries, _ := p.img.ledger.snapshot()
			assert.Empty(t, entries, "no ledger entry is left behind")
		})
	}

	// The same private image with the operator's credentials.
	dir := t.TempDir()
	auth := fmt.Sprintf(`{"auths": {%q: {"auth": %q}}}`, authHost, b64(user+":"+password))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "config.json"), []byte(auth), 0o600))
	withCreds := e.openImages(t, func(c *Config) { c.DockerConfig = dir })
	s := onDemandSpec("priv", private)
	info, err := withCreds.PrepareImage(context.Background(), s)
	require.NoError(t, err)
	assert.Equal(t, providers.ImageReady, info.State)
}

// The budget removes the least recently used image that no container
// uses and no configured pool pinned, and never one that is.
func TestProvider_ImageBudget_RemovesTheLeastRecentlyUsedUnusedImage(t *testing.T) {
	host := needRegistry(t)
	e := newTestEnv(t)
	names := []string{"pinned", "inuse", "lru", "recent", "last"}
	refs, sizes := map[string]string{}, map[string]int64{}
	var total int64
	for _, n := range names {
		refs[n], sizes[n] = pushedImage(t, e, host, registryUser{}, n, 128)
		total += sizes[n]
	}
	budget := total - sizes["lru"]/2 // the last pull goes over; removing lru alone meets it
	p := e.openImages(t, func(c *Config) { c.ImageBudget = Bytes(budget) })
	ctx := context.Background()
	onDemand := func(n string) providers.Spec { return onDemandSpec("od-"+n, refs[n]) }
	prepare := func(n string) {
		t.Helper()
		_, err := p.PrepareImage(ctx, onDemand(n))
		require.NoError(t, err)
		waitNoFlights(t, p.img)
	}

	prepare("pinned")
	pinnedTask := launchOne(t, p, spec("configured", refs["pinned"]), "pin-"+randomHex(t, 4)) // a configured pool's launch pins it
	require.NoError(t, p.Stop(ctx, pinnedTask.ID, "test"))                                    // and no container keeps it
	prepare("inuse")
	launchOne(t, p, onDemand("inuse"), "use-"+randomHex(t, 4))
	prepare("lru")
	prepare("recent")
	prepare("last")

	_, err := e.cli.ImageInspect(ctx, refs["lru"])
	assert.True(t, isNotFound(err), "the least recently used unused image is removed (err %v)", err)
	for _, n := range []string{"pinned", "inuse", "recent", "last"} {
		_, err := e.cli.ImageInspect(ctx, refs[n])
		assert.NoError(t, err, "%s is kept", n)
	}
	assert.Equal(t, 1.0, testutil.ToFloat64(p.img.metrics.evictions))
	images, err := p.Images(ctx)
	require.NoError(t, err)
	byImage := map[string]providers.ImageInfo{}
	for _, info := range images {
		byImage[info.Image] = info
	}
	assert.True(t, byImage[refs["pinned"]].Pinned)
	assert.True(t, byImage[refs["inuse"]].InUse)
	assert.NotContains(t, byImage, refs["lru"])
	assert.Len(t, images, 4)
}

func TestProvider_BuildImage_StreamsItsLogAndTheTagLaunches(t *testing.T) {
	e, p := dockerProvider(t)
	tag := "quarry-test-build-" + randomHex(t, 4) + ":1"
	t.Cleanup(func() { removeTestImage(t, e, "", registryUser{}, tag) })
	bctx := contextTar(t, "FROM "+imageBusybox+"\nCOPY hello.txt /hello.txt\nRUN echo built-here > /built && echo step-output\n",
		map[string][]byte{"hello.txt": []byte("hello\n")})
	var log strings.Builder
	info, err := p.BuildImage(context.Background(), providers.BuildRequest{Context: bctx, Tag: tag, Labels: map[string]string{"quarry-test": "1"}}, &log)
	require.NoError(t, err)
	assert.Equal(t, tag, info.Image)
	assert.Equal(t, providers.ImageReady, info.State)
	assert.Contains(t, log.String(), "Step 3/4 : RUN echo built-here")
	assert.Contains(t, log.String(), "step-output\n", "the step's own output is streamed")
	task := launchOne(t, p, spec("built", tag), "built-"+randomHex(t, 4))
	res := execIn(t, agentOf(t, task), "cat /hello.txt /built")
	assert.Equal(t, "hello\nbuilt-here\n", res.Stdout)
}

func TestProvider_BuildImage_FailuresAreBuildErrors(t *testing.T) {
	_, p := dockerProvider(t)
	tests := []struct {
		name, dockerfile string
		want             []string
	}{
		{name: "failing step", dockerfile: "FROM " + imageBusybox + "\nRUN echo failing-step && exit 3\n",
			want: []string{"Step 2/2 : RUN echo failing-step && exit 3", "returned a non-zero code: 3"}},
		{name: "bad Dockerfile", dockerfile: "FROM " + imageBusybox + "\nFOO bar\n", want: []string{"unknown instruction: FOO"}},
		{name: "missing file", dockerfile: "FROM " + imageBusybox + "\nCOPY missing /x\n", want: []string{"COPY failed", "missing"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tag := "quarry-test-build-" + randomHex(t, 4) + ":1"
			var log strings.Builder
			_, err := p.BuildImage(context.Background(), providers.BuildRequest{Context: contextTar(t, tt.dockerfile, map[string][]byte{}), Tag: tag}, &log)
			var be *providers.BuildError
			require.ErrorAs(t, err, &be)
			t.Logf("the engine's answer: %s", be.Message)
			assert.ErrorIs(t, err, providers.ErrInvalidSpec)
			assert.Equal(t, tag, be.Tag)
			for _, w := range tt.want {
				assert.Contains(t, be.Message, w)
			}
			_, err = engine(t).ImageInspect(context.Background(), tag)
			assert.True(t, isNotFound(err), "no image is tagged")
		})
	}
	_, err := p.BuildImage(context.Background(), providers.BuildRequest{Context: strings.NewReader("not a tar"), Tag: "quarry-test-build-x:1"}, &strings.Builder{})
	var be *providers.BuildError
	require.ErrorAs(t, err, &be, "a context that is no tar: %v", err)

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = p.BuildImage(ctx, providers.BuildRequest{Context: contextTar(t, "FROM "+imageBusybox+"\n", map[string][]byte{}), Tag: "quarry-test-build-y:1"}, &strings.Builder{})
	assert.True(t, errors.Is(err, context.Canceled), "%v", err)
}
