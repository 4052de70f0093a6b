package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/api"
	"github.com/quarryhq/quarry/internal/badinput"
	"github.com/quarryhq/quarry/internal/syncbuf"
	"github.com/quarryhq/quarry/providers"
	"github.com/quarryhq/quarry/warmpool"
)

// imageManager is a fakeManager with images on demand (ImageManager):
// each method's function field decides its answer.
type imageManager struct {
	*fakeManager
	ImagePoolFn func(ctx context.Context, req warmpool.ImageRequest) (string, error)
	PrefetchFn  func(ctx context.Context, req warmpool.PrefetchRequest) ([]warmpool.PrefetchResult, error)
	BuildFn     func(ctx context.Context, req warmpool.BuildRequest, log io.Writer) (providers.ImageInfo, error)

	mu       sync.Mutex
	requests []warmpool.ImageRequest
}

var _ ImageManager = (*imageManager)(nil)

func (m *imageManager) ImagePool(ctx context.Context, req warmpool.ImageRequest) (string, error) {
	m.mu.Lock()
	m.requests = append(m.requests, req)
	m.mu.Unlock()
	return m.ImagePoolFn(ctx, req)
}

func (m *imageManager) Prefetch(ctx context.Context, req warmpool.PrefetchRequest) ([]warmpool.PrefetchResult, error) {
	return m.PrefetchFn(ctx, req)
}

func (m *imageManager) Images(_ context.Context, cursor string, limit int) (warmpool.ImagePage, error) {
	return warmpool.ImagePage{Images: []warmpool.ImageStatus{{Image: "docker.io/library/python:3.11", Class: "default", Pool: "i-a",
		PoolState: warmpool.PoolActive, State: providers.ImagePulling, BytesDone: 5, BytesTotal: 10}}, Next: fmt.Sprintf("%s+%d", cursor, limit)}, nil
}

func (m *imageManager) ImagesOf(_ context.Context, pools, _ []string) (warmpool.ImagePage, error) {
	var out warmpool.ImagePage
	for _, p := range pools {
		out.Images = append(out.Images, warmpool.ImageStatus{Pool: p, Image: "of-" + p, State: providers.ImageReady})
	}
	return out, nil
}

func (m *imageManager) Classes(context.Context) ([]warmpool.ClassStatus, error) {
	return []warmpool.ClassStatus{{ClassConfig: warmpool.ClassConfig{Name: "default", Provider: "docker", MaxTotal: 8}.WithDefaults(), Tasks: 2}}, nil
}

func (m *imageManager) Pool(_ context.Context, name string) (warmpool.PoolConfig, error) {
	return warmpool.PoolConfig{Name: name, Image: "docker.io/library/python:3.11"}, nil
}

func (m *imageManager) BuildImage(ctx context.Context, req warmpool.BuildRequest, log io.Writer) (providers.ImageInfo, error) {
	return m.BuildFn(ctx, req, log)
}

func TestCreateSandbox_ImageGoesToItsOnDemandPool(t *testing.T) {
	mgr := &imageManager{fakeManager: newFakeManager("http://127.0.0.1:1")}
	mgr.ImagePoolFn = func(_ context.Context, req warmpool.ImageRequest) (string, error) {
		switch req.Image {
		case "quay.io/x:1":
			return "", &warmpool.ImageNotAllowedError{Image: "quay.io/x:1", Refused: "no class serves it"}
		case "127.0.0.1:5000/missing:1":
			return "", fmt.Errorf("prepare: %w", &providers.ImageError{Image: req.Image, Kind: providers.ImageNotFound, Registry: "127.0.0.1:5000", Answer: "manifest unknown"})
		case "127.0.0.1:5001/down:1":
			return "", &providers.ImageError{Image: req.Image, Kind: providers.ImageUnreachable, Registry: "127.0.0.1:5001", Answer: "connection refused"}
		}
		return "i-python", nil
	}
	gw := startGateway(t, mgr, nil)

	resp, b := callJSON(t, http.MethodPost, gw.URL+"/v1/sandboxes", testKey, map[string]any{"image": "python:3.11", "cpu": 2, "memory": "2Gi", "class": "default"})
	require.Equal(t, http.StatusCreated, resp.StatusCode, "%s", b)
	assert.Equal(t, "i-python", decode[api.Sandbox](t, b).Pool)
	require.Len(t, mgr.requests, 1)
	assert.Equal(t, warmpool.ImageRequest{Image: "python:3.11", Class: "default", CPU: 2, Memory: 2048, Owner: OwnerOf(testKey)}, mgr.requests[0])

	for _, tc := range []struct {
		name   string
		body   map[string]any
		status int
		code   string
		msg    string
	}{
		{"not allowed", map[string]any{"image": "quay.io/x:1"}, 403, "image_not_allowed", "no class serves it"},
		{"missing", map[string]any{"image": "127.0.0.1:5000/missing:1"}, 404, "image_not_found", "manifest unknown"},
		{"registry down", map[string]any{"image": "127.0.0.1:5001/down:1"}, 503, "registry_unavailable", "connection refused"},
		{"pool and image", map[string]any{"image": "python:3.11", "pool": "default"}, 400, "bad_request", "not both"},
		{"sizes without an image", map[string]any{"cpu": 2}, 400, "bad_request", "name the image too"},
		{"a bad size", map[string]any{"image": "python:3.11", "memory": "2Xi"}, 400, "bad_request", "memory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, b := callJSON(t, http.MethodPost, gw.URL+"/v1/sandboxes", testKey, tc.body)
			require.Equal(t, tc.status, resp.StatusCode, "%s", b)
			e := decodeError(t, b)
			assert.Equal(t, tc.code, e.Code)
			assert.Contains(t, e.Message, tc.msg)
		})
	}
}

func TestCreateSandbox_ImageWithoutImageManagerIs400(t *testing.T) {
	gw := startGateway(t, newFakeManager("http://127.0.0.1:1"), nil)
	resp, b := callJSON(t, http.MethodPost, gw.URL+"/v1/sandboxes", testKey, map[string]any{"image": "python:3.11"})
	require.Equal(t, http.StatusBadRequest, resp.StatusCode, "%s", b)
	assert.Contains(t, decodeError(t, b).Message, "serves no image on demand")
	resp, b = call(t, http.MethodGet, gw.URL+"/v1/images", testKey, nil)
	assert.Equal(t, http.StatusNotFound, resp.StatusCode, "%s", b)
}

func TestImages_PrefetchListAndPools(t *testing.T) {
	mgr := &imageManager{fakeManager: newFakeManager("http://127.0.0.1:1")}
	var got warmpool.PrefetchRequest
	mgr.PrefetchFn = func(_ context.Context, req warmpool.PrefetchRequest) ([]warmpool.PrefetchResult, error) {
		got = req
		if len(req.Images) == 0 {
			return nil, badinput.New("images", "is required")
		}
		return []warmpool.PrefetchResult{
			{Image: "a:1", Pool: "i-a", State: warmpool.PrefetchQueued},
			{Image: "quay.io/b:1", State: warmpool.PrefetchRefused, Err: &warmpool.ImageNotAllowedError{Image: "quay.io/b:1", Refused: "no"}},
		}, nil
	}
	gw := startGateway(t, mgr, nil)
	resp, b := callJSON(t, http.MethodPost, gw.URL+"/v1/images/prefetch", testKey, map[string]any{"images": []string{"a:1", "quay.io/b:1"}, "warm": 2, "memory": "1Gi"})
	require.Equal(t, http.StatusAccepted, resp.StatusCode, "%s", b)
	assert.Equal(t, warmpool.PrefetchRequest{Images: []string{"a:1", "quay.io/b:1"}, Warm: 2, Memory: 1024, Owner: OwnerOf(testKey)}, got)
	pr := decode[api.PrefetchResponse](t, b)
	require.Len(t, pr.Images, 2)
	assert.Equal(t, api.PrefetchedImage{Image: "a:1", Pool: "i-a", State: "queued"}, pr.Images[0])
	require.NotNil(t, pr.Images[1].Error)
	assert.Equal(t, api.ForkError{Status: 403, Code: "image_not_allowed", Message: `image "quay.io/b:1" is not allowed: no`}, *pr.Images[1].Error)

	resp, b = callJSON(t, http.MethodPost, gw.URL+"/v1/images/prefetch", testKey, map[string]any{})
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "%s", b)

	resp, b = call(t, http.MethodGet, gw.URL+"/v1/images?cursor=i-0&limit=5", testKey, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
	list := decode[api.ImageList](t, b)
	assert.Equal(t, "i-0+5", list.Next)
	require.Len(t, list.Images, 1)
	assert.Equal(t, api.Image{Image: "docker.io/library/python:3.11", Class: "default", Pool: "i-a", PoolState: "active", State: "pulling", BytesDone: 5, BytesTotal: 10}, list.Images[0])
	resp, b = call(t, http.MethodGet, gw.URL+"/v1/images?limit=0", testKey, nil)
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "%s", b)
	resp, b = call(t, http.MethodGet, gw.URL+"/v1/images?pool=i-a&pool=i-b", testKey, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
	list = decode[api.ImageList](t, b)
	require.Len(t, list.Images, 2)
	assert.Equal(t, "of-i-b", list.Images[1].Image)
	resp, b = call(t, http.MethodGet, gw.URL+"/v1/images?pool=i-a&cursor=x", testKey, nil)
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "%s", b)

	resp, b = call(t, http.MethodGet, gw.URL+"/v1/pools", testKey, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
	pl := decode[api.PoolList](t, b)
	require.Len(t, pl.Classes, 1)
	assert.Equal(t, "default", pl.Classes[0].Name)
	assert.Equal(t, 2, pl.Classes[0].Tasks)

	resp, b = call(t, http.MethodGet, gw.URL+"/v1/whoami", testKey, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
	assert.Equal(t, OwnerOf(testKey), decode[map[string]string](t, b)["owner"])
}

func TestImages_BuildIsOffUnlessTheKeyIsNamed(t *testing.T) {
	mgr := &imageManager{fakeManager: newFakeManager("http://127.0.0.1:1")}
	mgr.BuildFn = func(_ context.Context, req warmpool.BuildRequest, log io.Writer) (providers.ImageInfo, error) {
		ctx, err := io.ReadAll(req.Context)
		if err != nil {
			return providers.ImageInfo{}, err
		}
		fmt.Fprintf(log, "Step 1/1 : context of %d bytes\nhalf a line", len(ctx))
		fmt.Fprintf(log, " ended\n")
		if req.Name == "bad" {
			return providers.ImageInfo{}, &providers.BuildError{Tag: "quarry-build/x/bad", Message: "step 1: exit code 1"}
		}
		return providers.ImageInfo{Image: "quarry-build/" + req.Owner[:12] + "/" + req.Name, Digest: "sha256:b"}, nil
	}
	off := startGateway(t, mgr, nil)
	resp, b := call(t, http.MethodPost, off.URL+"/v1/images/build?name=t", testKey, strings.NewReader("tar"))
	require.Equal(t, http.StatusForbidden, resp.StatusCode, "%s", b)
	assert.Contains(t, decodeError(t, b).Message, "QUARRY_IMAGE_BUILD_KEYS")
	assert.Contains(t, decodeError(t, b).Message, OwnerOf(testKey), "the message names the key's owner id")

	on := startGateway(t, mgr, func(c *Config) { c.ImageBuildKeys = []string{OwnerOf(testKey)} })
	resp, b = call(t, http.MethodPost, on.URL+"/v1/images/build?name=t:1", testKey, bytes.NewReader(make([]byte, 3000)))
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
	assert.Equal(t, "application/x-ndjson", resp.Header.Get("Content-Type"))
	events := buildEvents(t, b)
	require.Len(t, events, 3)
	assert.Equal(t, "Step 1/1 : context of 3000 bytes", events[0].Log)
	assert.Equal(t, "half a line ended", events[1].Log)
	assert.Equal(t, "quarry-build/"+OwnerOf(testKey)[:12]+"/t:1", events[2].Image)

	resp, b = call(t, http.MethodPost, on.URL+"/v1/images/build?name=bad", testKey, strings.NewReader("tar"))
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
	events = buildEvents(t, b)
	last := events[len(events)-1]
	require.NotNil(t, last.Error)
	assert.Equal(t, api.ForkError{Status: 422, Code: "build_failed", Message: "build quarry-build/x/bad: step 1: exit code 1"}, *last.Error)

	for _, q := range []string{"", "?name=t&dockerfile=/etc/passwd", "?name=t&dockerfile=../x"} {
		resp, b = call(t, http.MethodPost, on.URL+"/v1/images/build"+q, testKey, strings.NewReader("tar"))
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "%s: %s", q, b)
	}
}

func buildEvents(t *testing.T, b []byte) []api.BuildEvent {
	t.Helper()
	var out []api.BuildEvent
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		var ev api.BuildEvent
		require.NoError(t, json.Unmarshal(sc.Bytes(), &ev), "%s", sc.Text())
		out = append(out, ev)
	}
	require.NoError(t, sc.Err())
	return out
}

// A build that prints nothing for a while still sends a line every
// keep-alive interval: an empty event, which clients skip.
func TestBuildLog_KeepAliveWhileSilent(t *testing.T) {
	var buf syncbuf.Buffer
	w := bufio.NewWriter(&buf)
	lw := &buildLog{w: w, cancel: func() {}}
	stop := lw.keepAlive(30 * time.Millisecond)
	require.Eventually(t, func() bool { return strings.Count(buf.String(), "{}\n") >= 2 }, 10*time.Second, 5*time.Millisecond)
	fmt.Fprintf(lw, "Step 1/1 : RUN sleep\n")
	stop()
	lw.event(api.BuildEvent{Image: "x"})
	events := buildEvents(t, []byte(buf.String()))
	var logs []string
	for _, ev := range events {
		if ev.Log != "" {
			logs = append(logs, ev.Log)
		}
	}
	assert.Equal(t, []string{"Step 1/1 : RUN sleep"}, logs)
	assert.Equal(t, "x", events[len(events)-1].Image)
}
