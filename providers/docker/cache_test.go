package docker

import (
	"context"
	"io"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/docker/docker/api/types/image"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/providers"
)

const refA = "127.0.0.1:5055/t/a:1"

// Twenty callers of one image the engine lacks cause one pull; a caller
// that stops waiting does not stop it for the others.
func TestImageCache_ConcurrentPreparesShareOnePull(t *testing.T) {
	e := newFakeEngine()
	e.serve(refA, 100)
	e.gate = make(chan struct{})
	e.started = make(chan string, 1)
	c := newTestCache(t, e.api())

	quitter, quit := context.WithCancel(context.Background())
	quitErr := make(chan error, 1)
	go func() {
		_, err := c.prepare(quitter, providers.Spec{Image: refA, Class: "default"})
		quitErr <- err
	}()
	assert.Equal(t, refA, <-e.started, "the pull starts")

	const n = 20
	var wg sync.WaitGroup
	infos := make([]providers.ImageInfo, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			infos[i], errs[i] = c.prepare(context.Background(), providers.Spec{Image: refA, Class: "default"})
		})
	}
	quit()
	require.ErrorIs(t, <-quitErr, context.Canceled)
	assert.Equal(t, 1, flights(c), "the pull goes on")
	close(e.gate)
	wg.Wait()
	for i := range n {
		require.NoError(t, errs[i])
		assert.Equal(t, providers.ImageReady, infos[i].State)
		assert.Equal(t, int64(100), infos[i].SizeBytes)
	}
	assert.Equal(t, 1, e.pullsOf(refA), "one pull for every caller")
	assert.Equal(t, 1.0, testutil.ToFloat64(c.metrics.pullsStarted))
	waitNoFlights(t, c) // a caller may have found the image pulled before the pull's record
	entry, ok := c.ledger.get(refA)
	require.True(t, ok, "an on-demand pool's pull is in the ledger")
	assert.Equal(t, int64(100), entry.Size)

	// The image is there now: one inspection, no pull.
	_, err := c.prepare(context.Background(), providers.Spec{Image: refA, Class: "default"})
	require.NoError(t, err)
	assert.Equal(t, 1, e.pullsOf(refA))
}

func TestImageCache_AtMostPullConcurrencyPullsAtOnce(t *testing.T) {
	e := newFakeEngine()
	refs := []string{"127.0.0.1:5055/t/a:1", "127.0.0.1:5055/t/b:1", "127.0.0.1:5055/t/c:1", "127.0.0.1:5055/t/d:1"}
	for _, r := range refs {
		e.serve(r, 10)
	}
	e.gate = make(chan struct{})
	e.started = make(chan string, len(refs))
	c := newTestCache(t, e.api(), func(c *Config) { c.PullConcurrency = 2 })
	var wg sync.WaitGroup
	errs := make([]error, len(refs))
	for i, r := range refs {
		wg.Go(func() { _, errs[i] = c.prepare(context.Background(), providers.Spec{Image: r, Class: "x"}) })
	}
	defer wg.Wait()
	<-e.started
	<-e.started
	require.Eventually(t, func() bool { return flights(c) == len(refs) }, waitTimeout, time.Millisecond, "every caller joined its pull")
	infos, err := c.images(context.Background())
	require.NoError(t, err)
	require.Len(t, infos, 4, "pulls under way and waiting for a slot are reported")
	for _, info := range infos {
		assert.Equal(t, providers.ImagePulling, info.State)
	}
	close(e.gate)
	wg.Wait()
	for i := range refs {
		require.NoError(t, errs[i])
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	assert.Equal(t, 2, e.maxRun)
}

func TestImageCache_FailedPullLeavesNoLedgerEntryAndIsReported(t *testing.T) {
	e := newFakeEngine()
	c := newTestCache(t, e.api())
	missing := "127.0.0.1:5055/t/missing:1"
	info, err := c.prepare(context.Background(), providers.Spec{Image: missing, Class: "x"})
	var ie *providers.ImageError
	require.ErrorAs(t, err, &ie)
	assert.Equal(t, providers.ImageNotFound, ie.Kind)
	assert.Equal(t, providers.ImageFailed, info.State)
	_, ok := c.ledger.get(missing)
	assert.False(t, ok)
	infos, err := c.images(context.Background())
	require.NoError(t, err)
	require.Len(t, infos, 1)
	assert.Equal(t, providers.ImageFailed, infos[0].State)
	assert.Contains(t, infos[0].Reason, "manifest unknown")
	assert.Equal(t, 1.0, testutil.ToFloat64(c.metrics.pulls.WithLabelValues("not_found")))

	e.serve(missing, 5) // pushed since: the next prepare pulls again
	_, err = c.prepare(context.Background(), providers.Spec{Image: missing, Class: "x"})
	require.NoError(t, err)
	infos, err = c.images(context.Background())
	require.NoError(t, err)
	require.Len(t, infos, 1)
	assert.Equal(t, providers.ImageReady, infos[0].State, "the failure is forgotten")
}

func TestImageCache_ConfiguredPoolsImagesArePinnedAndNotInTheLedger(t *testing.T) {
	e := newFakeEngine()
	e.serve(refA, 10)
	c := newTestCache(t, e.api())
	_, err := c.prepare(context.Background(), providers.Spec{Image: refA})
	require.NoError(t, err)
	_, inLedger := c.ledger.get(refA)
	assert.False(t, inLedger, "only on-demand pools' pulls are the cache's")
	assert.True(t, c.ledger.isPinned(refA))
	infos, err := c.images(context.Background())
	require.NoError(t, err)
	require.Len(t, infos, 1)
	assert.True(t, infos[0].Pinned)
}

// The budget removes the least recently used image that nothing keeps:
// not the pinned one, not the one a container uses, not the one a launch
// needs (all older), nor the one just pulled.
func TestImageCache_BudgetRemovesTheLeastRecentlyUsedUnusedImage(t *testing.T) {
	e := newFakeEngine()
	refs := map[string]string{}
	for _, n := range []string{"pinned", "used", "launching", "old", "new"} {
		refs[n] = "127.0.0.1:5055/t/" + n + ":1"
		e.serve(refs[n], 100)
	}
	c := newTestCache(t, e.api(), func(c *Config) { c.ImageBudget = 450 })
	ctx := context.Background()
	prepare := func(n, class string) {
		t.Helper()
		_, err := c.prepare(ctx, providers.Spec{Image: refs[n], Class: class})
		require.NoError(t, err)
		waitNoFlights(t, c) // its budget pass ran
	}
	prepare("pinned", "x")
	prepare("pinned", "") // a configured pool's launch pins it
	prepare("used", "x")
	ins, err := e.api().inspect(ctx, refs["used"])
	require.NoError(t, err)
	e.used[ins.ID] = true
	prepare("launching", "x")
	release := c.use(imageRef{name: refs["launching"]})
	defer release()
	prepare("old", "x")
	assert.Empty(t, e.removed, "400 bytes: within the budget")

	prepare("new", "x") // 500 bytes
	assert.Equal(t, []string{refs["old"]}, e.removed, "pinned, used and launching are older but kept")
	assert.Equal(t, 1.0, testutil.ToFloat64(c.metrics.evictions))
	assert.Equal(t, 0.0, testutil.ToFloat64(c.metrics.budgetUnmet))
	assert.Equal(t, 400.0, testutil.ToFloat64(c.metrics.ledgerBytes))
}

func TestImageCache_BudgetThatCannotBeMetIsCounted(t *testing.T) {
	e := newFakeEngine()
	big := "127.0.0.1:5055/t/big:1"
	e.serve(big, 1000)
	c := newTestCache(t, e.api(), func(c *Config) { c.ImageBudget = 10 })
	_, err := c.prepare(context.Background(), providers.Spec{Image: big, Class: "x"})
	require.NoError(t, err)
	waitNoFlights(t, c)
	assert.Empty(t, e.removed, "the image just pulled is needed by its launch")
	assert.Equal(t, 1.0, testutil.ToFloat64(c.metrics.budgetUnmet))
}

func TestImageCache_ForgetImage(t *testing.T) {
	e := newFakeEngine()
	e.serve(refA, 10)
	dir := t.TempDir()
	e.has["docker.io/library/local:latest"] = e.registry[refA] // on the engine, never pulled by the provider
	cfg := Config{AgentBinary: "/a", TokenKeyFile: "/k", LedgerFile: filepath.Join(dir, "images.json")}.WithDefaults()
	c, err := newImageCache(cfg, e.api(), discardLogger())
	require.NoError(t, err)
	defer c.close()
	p := &Provider{img: c, logger: discardLogger()}
	ctx := context.Background()
	_, err = c.prepare(ctx, providers.Spec{Image: refA, Class: "x"})
	require.NoError(t, err)
	waitNoFlights(t, c) // the pull's budget pass ran

	require.NoError(t, p.ForgetImage(ctx, providers.Spec{Image: "local"}, ""))
	assert.Empty(t, e.removed, "an image the provider did not pull is not its to remove")
	require.NoError(t, p.ForgetImage(ctx, providers.Spec{Image: refA}, ""))
	assert.Equal(t, []string{refA}, e.removed)
	_, ok := c.ledger.get(refA)
	assert.False(t, ok)
	require.NoError(t, p.ForgetImage(ctx, providers.Spec{Image: refA}, ""), "idempotent")
	assert.Len(t, e.removed, 1)
}

// flights returns how many pulls c has in flight.
func flights(c *imageCache) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.flights)
}

// waitNoFlights waits until c's pulls, and the budget's passes after
// them, are over.
func waitNoFlights(t *testing.T, c *imageCache) {
	t.Helper()
	require.Eventually(t, func() bool { return flights(c) == 0 }, waitTimeout, time.Millisecond, "pulls in flight")
}

// A pull waiting for a slot when the provider closes ends with an error,
// and no pull starts after Close.
func TestImageCache_CloseEndsPullsAndStartsNone(t *testing.T) {
	e := newFakeEngine()
	e.serve(refA, 10)
	e.gate = make(chan struct{})
	e.started = make(chan string, 1)
	c := newTestCache(t, e.api())
	errc := make(chan error, 1)
	go func() {
		_, err := c.prepare(context.Background(), providers.Spec{Image: refA, Class: "x"})
		errc <- err
	}()
	<-e.started
	require.NoError(t, c.close())
	require.ErrorIs(t, <-errc, errClosed)
	_, err := c.prepare(context.Background(), providers.Spec{Image: refA, Class: "x"})
	require.ErrorIs(t, err, errClosed)
	assert.Equal(t, 1, e.pullsOf(refA))
}

// The gateway registers the provider's collectors (cmd/gateway's
// registerProviderMetrics): they must be valid and distinct.
func TestProvider_Collectors_Register(t *testing.T) {
	p := &Provider{img: newTestCache(t, newFakeEngine().api())}
	reg := prometheus.NewRegistry()
	for _, c := range p.Collectors() {
		require.NoError(t, reg.Register(c))
	}
	p.img.metrics.pulls.WithLabelValues("ready").Inc()
	families, err := reg.Gather()
	require.NoError(t, err)
	var names []string
	for _, f := range families {
		names = append(names, f.GetName())
	}
	assert.Subset(t, names, []string{"quarry_docker_image_cache_bytes", "quarry_docker_image_preparations_total"})
}

// Images reports a pull's progress from its stream while it runs.
func TestImageCache_ImagesReportsAPullsProgress(t *testing.T) {
	e := newFakeEngine()
	e.serve(refA, 10)
	api := e.api()
	pr, pw := io.Pipe()
	api.pull = func(context.Context, string, image.PullOptions) (io.ReadCloser, error) { return pr, nil }
	c := newTestCache(t, api)
	done := make(chan error, 1)
	go func() {
		_, err := c.prepare(context.Background(), providers.Spec{Image: refA, Class: "x"})
		done <- err
	}()
	_, err := io.WriteString(pw, `{"status":"Downloading","id":"l1","progressDetail":{"current":300,"total":1000}}`+"\n"+
		`{"status":"Downloading","id":"l2","progressDetail":{"current":0,"total":24}}`+"\n")
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		infos, err := c.images(context.Background())
		return err == nil && len(infos) == 1 && infos[0].BytesDone == 300 && infos[0].BytesTotal == 1024
	}, waitTimeout, time.Millisecond, "the pull's progress is reported")
	e.mu.Lock()
	e.has[refA] = e.registry[refA] // what the pull brought
	e.mu.Unlock()
	_, err = io.WriteString(pw, `{"status":"Pull complete","id":"l1"}`+"\n")
	require.NoError(t, err)
	require.NoError(t, pw.Close())
	require.NoError(t, <-done)
}
