//go:build integration

package tests

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/client"
	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/internal/testenv"
	"github.com/quarryhq/quarry/internal/testimages"
)

// imagesPools is a Docker gateway's pools file for images on demand: a
// configured pool, and a class that serves every image of the test
// registries (both on 127.0.0.1), none warm, up to 24 sandboxes.
const imagesPools = `pools:
  - name: plain
    image: quarry-test/busybox:latest
    cpu: 0.25
    memory: 128Mi
    min_warm: 0
    max_total: 2
classes:
  - name: default
    provider: docker
    cpu: 0.25
    memory: 128Mi
    max_memory: 256Mi
    max_total: 24
    images: ["127.0.0.1:*/**"]
    warm_max: 0
`

// registryImage builds an image of the test busybox plus a layer of layerKB
// KiB, pushes it to the registry at host (as user, when set) under a name of
// the test's own and removes it from the engine, so that it is only in the
// registry; the engine's copy and the registry's are removed when the test
// ends (after the test's containers).
func (d *dockerTest) registryImage(host string, user testimages.User, name string, layerKB int) string {
	d.t.Helper()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	ref := fmt.Sprintf("%s/quarry-e2e-%s/%s:1", host, hex.EncodeToString(b), name)
	data := make([]byte, layerKB<<10)
	_, _ = rand.Read(data)
	d.t.Cleanup(func() {
		d.removeAll()
		if err := testimages.Remove(context.Background(), d.cli, host, user, ref); err != nil {
			d.t.Error(err)
		}
	})
	_, err := testimages.BuildPushed(ctx(d.t), d.cli, dockerImageBusybox, host, user, ref, data)
	require.NoError(d.t, err)
	return ref
}

// pulls counts the engine's pulls of ref since t0.
func (d *dockerTest) pulls(ref string, t0 time.Time) int {
	d.t.Helper()
	n, err := testimages.Pulls(ctx(d.t), d.cli, ref, t0)
	require.NoError(d.t, err)
	return n
}

// A sandbox of an image that is only in a registry: pulled once, run, and
// the next sandbox of the image reuses its pool and the pulled image.
func TestImages_Docker_AnImageOnlyInTheRegistry(t *testing.T) {
	d := requireDocker(t)
	host := testenv.Registry(t)
	ref := d.registryImage(host, testimages.User{}, "only-there", 64)
	g := d.startGateway(imagesPools, withEnv("QUARRY_POOL_TOUCH_INTERVAL=100ms"))
	c, cx := g.client(), ctx(t)
	t0 := time.Now()

	sb, err := c.CreateSandbox(cx, client.CreateSandboxRequest{Image: ref, Memory: 256})
	require.NoError(t, err)
	assert.Equal(t, ref, sb.Image)
	assert.True(t, strings.HasPrefix(sb.Pool, "i-"), "an on-demand pool: %s", sb.Pool)
	res, err := c.Exec(cx, sb.ID, agentapi.ExecRequest{Command: "wc -c < /data; id -u"})
	require.NoError(t, err)
	assert.Equal(t, fmt.Sprintf("%d\n65534\n", 64<<10), res.Stdout, "the image's own layer, as the unprivileged user")
	_, err = c.DeleteSandbox(cx, sb.ID)
	require.NoError(t, err)

	again, err := c.CreateSandbox(cx, client.CreateSandboxRequest{Image: ref, Memory: 256})
	require.NoError(t, err)
	assert.Equal(t, sb.Pool, again.Pool, "the same image and size: the same pool")
	assert.Equal(t, 1, d.pulls(ref, t0), "pulled once")

	eventually(t, dockerWait, "GET /v1/images lists the pool, its two acquires counted", func() error {
		images, err := c.Images(cx)
		if err != nil {
			return err
		}
		for _, im := range images {
			if im.Pool != sb.Pool {
				continue
			}
			if im.Image != ref || im.State != "ready" || im.PoolState != "active" || im.SizeBytes <= 0 || im.Acquires != 2 {
				return fmt.Errorf("the pool's image: %+v", im)
			}
			return nil
		}
		return fmt.Errorf("no image of pool %s in %+v", sb.Pool, images)
	})
}

// Twenty sandboxes asked for at once of one new image: one pull.
func TestImages_Docker_TwentyCreatesOnePull(t *testing.T) {
	d := requireDocker(t)
	host := testenv.Registry(t)
	ref := d.registryImage(host, testimages.User{}, "twenty", 512)
	g := d.startGateway(imagesPools)
	c, cx := g.client(), ctx(t)
	t0 := time.Now()
	const n = 20
	ids := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sb, err := c.CreateSandbox(cx, client.CreateSandboxRequest{Image: ref})
			if assert.NoError(t, err) {
				ids[i] = sb.ID
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, 1, d.pulls(ref, t0), "one pull for twenty creates")
	seen := map[string]bool{}
	for _, id := range ids {
		if id == "" {
			continue
		}
		res, err := c.Exec(cx, id, agentapi.ExecRequest{Command: "hostname"})
		require.NoError(t, err)
		seen[res.Stdout] = true
		_, err = c.DeleteSandbox(cx, id)
		require.NoError(t, err)
	}
	assert.Len(t, seen, n, "twenty sandboxes, twenty containers")
}

// Each way an image can fail has its own answer, naming the image and what
// the registry said, and leaves no container and no pool behind; the
// operator's registry credentials (QUARRY_DOCKER_CONFIG) let a private image
// through.
func TestImages_Docker_ImagesThatFail(t *testing.T) {
	d := requireDocker(t)
	host := testenv.Registry(t)
	authHost, user, password := testenv.RegistryAuth(t)
	private := d.registryImage(authHost, testimages.User{Name: user, Password: password}, "private", 16)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	down := l.Addr().String()
	require.NoError(t, l.Close())

	g := d.startGateway(imagesPools)
	cx := ctx(t)
	for _, tc := range []struct {
		name, image string
		status      int
		code        string
		says        []string
	}{
		{"missing", host + "/quarry-e2e-nope/never-pushed:1", 404, "image_not_found", []string{host + "/quarry-e2e-nope/never-pushed:1", "manifest unknown"}},
		{"not allowed", "quay.io/someone/image:1", 403, "image_not_allowed", []string{"quay.io/someone/image:1", "127.0.0.1:*/**"}},
		{"registry down", down + "/x/y:1", 503, "registry_unavailable", []string{down, "connection refused"}},
		{"registry refuses", private, 403, "image_denied", []string{private, authHost}},
		{"malformed", "Upper:1", 400, "bad_request", []string{"not an image reference"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, out := g.raw(cx, t, http.MethodPost, "/v1/sandboxes", g.key, fmt.Sprintf(`{"image": %q}`, tc.image))
			require.Equal(t, tc.status, status, out)
			assert.Contains(t, out, `"code":"`+tc.code+`"`)
			for _, s := range tc.says {
				assert.Contains(t, out, s)
			}
		})
	}
	status, out := g.raw(cx, t, http.MethodPost, "/v1/sandboxes", g.key, fmt.Sprintf(`{"image": %q, "memory": "1Gi"}`, host+"/x/y:1"))
	assert.Equal(t, 400, status, "more memory than the class's max_memory: %s", out)
	assert.Contains(t, out, "256 MiB")
	pools := 0
	images, err := g.client().Images(cx)
	require.NoError(t, err)
	for _, im := range images {
		if im.Pool != "" {
			pools++
		}
	}
	assert.Zero(t, pools, "no pool was made: %+v", images)
	assert.Empty(t, d.containers(""), "no container was left")

	// The operator's credentials, in a Docker config directory.
	cfgDir := t.TempDir()
	auth := base64.StdEncoding.EncodeToString([]byte(user + ":" + password))
	require.NoError(t, os.WriteFile(filepath.Join(cfgDir, "config.json"), []byte(fmt.Sprintf(`{"auths": {%q: {"auth": %q}}}`, authHost, auth)), 0o600))
	g2 := d.startGateway(imagesPools, withEnv("QUARRY_DOCKER_CONFIG="+cfgDir))
	c2 := g2.client()
	sb, err := c2.CreateSandbox(cx, client.CreateSandboxRequest{Image: private})
	require.NoError(t, err, "the private image with the operator's credentials")
	res, err := c2.Exec(cx, sb.ID, agentapi.ExecRequest{Command: "wc -c < /data"})
	require.NoError(t, err)
	assert.Equal(t, fmt.Sprintf("%d\n", 16<<10), res.Stdout)
}

// A prefetch starts the pulls at once and keeps the asked warm sandboxes;
// the CLI shows their progress until each is ready.
func TestImages_Docker_PrefetchAndTheCLI(t *testing.T) {
	d := requireDocker(t)
	host := testenv.Registry(t)
	a := d.registryImage(host, testimages.User{}, "next-a", 256)
	b := d.registryImage(host, testimages.User{}, "next-b", 256)
	g := d.startGateway(imagesPools)
	c, cx := g.client(), ctx(t)

	run := quarryCLI(t, g, nil, "image", "prefetch", "--warm", "1", a, b, "quay.io/not/allowed:1")
	assert.Equal(t, 1, run.code, "a refused image fails the command: %s", run.stderr)
	assert.Contains(t, string(run.stderr), "refused quay.io/not/allowed:1")
	for _, ref := range []string{a, b} {
		assert.Regexp(t, `(?m)^`+regexp.QuoteMeta(ref)+` +\[#{20}\] ready$`, string(run.stdout), "the progress of %s ends ready", ref)
	}
	images, err := c.Images(cx)
	require.NoError(t, err)
	warm := map[string]int{}
	for _, im := range images {
		warm[im.Image] = im.Warm
	}
	assert.Equal(t, 1, warm[a])
	assert.Equal(t, 1, warm[b])
	eventually(t, dockerWait, "each prefetched pool keeps one sandbox ready", func() error {
		if n := len(d.running("")); n != 2 {
			return fmt.Errorf("%d containers run", n)
		}
		return nil
	})
	t0 := time.Now()
	sb, err := c.CreateSandbox(cx, client.CreateSandboxRequest{Image: a})
	require.NoError(t, err)
	assert.Zero(t, d.pulls(a, t0), "no pull at the create: the prefetch made it")
	assert.Less(t, time.Since(t0), 10*time.Second, "a warm sandbox")
	_, err = c.DeleteSandbox(cx, sb.ID)
	require.NoError(t, err)

	run = quarryCLI(t, g, nil, "image", "ls")
	require.Zero(t, run.code, "%s", run.stderr)
	assert.Contains(t, string(run.stdout), a)
	assert.Contains(t, string(run.stdout), b)
}

// ROCK's SDK, unmodified, starts a sandbox of an image that no pool names.
func TestRock_Docker_SDKStartsAnyImage(t *testing.T) {
	py := testenv.RockPython(t)
	d := requireDocker(t)
	host := testenv.Registry(t)
	ref := d.registryImage(host, testimages.User{}, "rock", 32)
	g := d.startGateway(imagesPools)
	steps := runRockDriver(t, py, "image_driver.py", "ROCK_BASE_URL="+g.url(), "QUARRY_API_KEY="+g.key, "ROCK_IMAGE="+ref)
	run := step(t, steps, "run")
	assert.Equal(t, fmt.Sprintf("%d", 32<<10), strings.TrimSpace(run["output"].(string)))
	assert.EqualValues(t, 0, run["exit_code"])
	assert.Equal(t, true, step(t, steps, "stopped")["ok"])
}
