//go:build integration

package tests

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/remote"
	"github.com/fasthttp/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/client"
	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/internal/testenv"
	"github.com/quarryhq/quarry/rockcompat"
)

// freePort is a TCP port nothing listens on now (the process provider's
// sandboxes share the host's network).
func freePort(t *testing.T) int {
	t.Helper()
	_, p, err := net.SplitHostPort(freeAddr(t))
	require.NoError(t, err)
	n, err := strconv.Atoi(p)
	require.NoError(t, err)
	return n
}

// startPortProgram uploads a program into the sandbox and starts it there
// with PORT set, then waits until the port answers through the proxy.
func startPortProgram(t *testing.T, c *client.Client, id, local, remote string, argv func(remote string) []string, port int) {
	t.Helper()
	f, err := os.Open(local)
	require.NoError(t, err)
	defer f.Close()
	_, err = c.WriteFile(ctx(t), id, remote, 0o755, f)
	require.NoError(t, err)
	_, err = c.StartProcess(ctx(t), id, agentapi.ProcessStartRequest{Argv: argv(remote), Env: map[string]string{"PORT": strconv.Itoa(port)}})
	require.NoError(t, err)
	u, err := c.PortURL(id, port, "/")
	require.NoError(t, err)
	eventually(t, 30*time.Second, "the program listens on its port", func() error {
		resp, err := c.PortClient().Get(u)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusBadGateway {
			return fmt.Errorf("still 502")
		}
		return nil
	})
}

// TestPorts_E2E: a Python http.server and a Go WebSocket echo inside a
// sandbox of the real gateway (process provider), reached through the port
// proxy, with the API key and with preview URLs.
// portSandbox starts a gateway, leases a sandbox and runs the Python
// program (testdata/portserver.py) in it on a free port.
func portSandbox(t *testing.T) (*gatewayProc, *client.Client, client.Sandbox, int) {
	t.Helper()
	g := startGateway(t, defaultPools)
	g.waitReady("default", 1)
	c := g.client()
	sbx, err := c.CreateSandbox(ctx(t), client.CreateSandboxRequest{Pool: "default"})
	require.NoError(t, err)
	httpPort := freePort(t)
	startPortProgram(t, c, sbx.ID, "testdata/portserver.py", "portserver.py",
		func(r string) []string { return []string{"python3", r} }, httpPort)
	return g, c, sbx, httpPort
}

// buildEcho builds bench/portbench, whose -serve program answers GET / and
// echoes WebSocket messages on /ws (a static binary: it runs in any image).
func buildEcho(t *testing.T) string {
	t.Helper()
	echo := filepath.Join(t.TempDir(), "portbench")
	build := exec.Command("go", "build", "-o", echo, "./bench/portbench")
	build.Dir = ".."
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := build.CombinedOutput()
	require.NoError(t, err, string(out))
	return echo
}

func echoArgv(port int) func(string) []string {
	return func(r string) []string { return []string{"./" + r, "-serve", strconv.Itoa(port)} }
}

func TestPorts_E2E(t *testing.T) {
	g, c, sbx, httpPort := portSandbox(t)
	wsPort := freePort(t)
	startPortProgram(t, c, sbx.ID, buildEcho(t), "portbench", echoArgv(wsPort), wsPort)

	pc := c.PortClient()
	portURL := func(port int, path string) string {
		u, err := c.PortURL(sbx.ID, port, path)
		require.NoError(t, err)
		return u
	}

	t.Run("GET", func(t *testing.T) {
		resp, err := pc.Get(portURL(httpPort, "/hello"))
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		assert.Equal(t, http.StatusOK, resp.StatusCode)
		assert.Equal(t, "hello from the sandbox, auth=", string(b), "the API key does not reach the program")
	})
	t.Run("POST body echo", func(t *testing.T) {
		body := bytes.Repeat([]byte("0123456789"), 300_000) // 3 MB, over the JSON body limit's typical size
		resp, err := pc.Post(portURL(httpPort, "/echo"), "application/octet-stream", bytes.NewReader(body))
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		assert.Equal(t, http.StatusCreated, resp.StatusCode)
		assert.Equal(t, "application/octet-stream", resp.Header.Get("Content-Type"))
		assert.True(t, bytes.Equal(append([]byte("echo:"), body...), b), "the body comes back whole (%d bytes)", len(b))
	})
	t.Run("the program's 404 passes through", func(t *testing.T) {
		resp, err := pc.Get(portURL(httpPort, "/missing"))
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		assert.Equal(t, http.StatusNotFound, resp.StatusCode)
		assert.Equal(t, "no such page: /missing", string(b))
	})
	t.Run("SSE flows before the program finishes", func(t *testing.T) {
		gate := "gate-" + strconv.FormatInt(time.Now().UnixNano(), 36)
		resp, err := pc.Get(portURL(httpPort, "/events?gate="+gate))
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		assert.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
		br := bufio.NewReader(resp.Body)
		line, err := br.ReadString('\n')
		require.NoError(t, err)
		// The program holds its second event until the gate file exists:
		// the first one arrived while the answer was still open.
		assert.Equal(t, "data: first\n", line)
		_, err = c.WriteFile(ctx(t), sbx.ID, gate, 0o644, strings.NewReader("open"))
		require.NoError(t, err)
		rest, err := io.ReadAll(br)
		require.NoError(t, err)
		assert.Equal(t, "\ndata: second\n\n", string(rest))
	})
	t.Run("WebSocket echo", func(t *testing.T) {
		d := websocket.Dialer{Subprotocols: []string{"echo.v1"}, HandshakeTimeout: 30 * time.Second}
		ws, resp, err := d.Dial("ws"+strings.TrimPrefix(portURL(wsPort, "/ws"), "http"), http.Header{"Authorization": {"Bearer " + g.key}})
		require.NoError(t, err)
		defer ws.Close()
		assert.Equal(t, "echo.v1", resp.Header.Get("Sec-WebSocket-Protocol"))
		for i := range 100 {
			msg := fmt.Sprintf("message %d", i)
			require.NoError(t, ws.WriteMessage(websocket.TextMessage, []byte(msg)))
			_, got, err := ws.ReadMessage()
			require.NoError(t, err)
			assert.Equal(t, msg, string(got))
		}
	})
	t.Run("nothing listening is 502 naming the port", func(t *testing.T) {
		closed := freePort(t)
		resp, err := pc.Get(portURL(closed, "/"))
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		assert.Equal(t, http.StatusBadGateway, resp.StatusCode)
		assert.Contains(t, string(b), fmt.Sprintf("nothing is listening on port %d in the sandbox", closed))
	})
	t.Run("bad port is 400", func(t *testing.T) {
		for _, p := range []string{"0", "65536", "http"} {
			status, body := g.raw(ctx(t), t, http.MethodGet, "/v1/sandboxes/"+sbx.ID+"/ports/"+p+"/", g.key, "")
			assert.Equal(t, http.StatusBadRequest, status, p)
			assert.Contains(t, body, "port", p)
		}
	})
	t.Run("ROCK proxy and portforward", func(t *testing.T) {
		req, err := http.NewRequest(http.MethodGet, g.url()+rockcompat.Prefix+"/sandboxes/"+sbx.ID+"/proxy/hello", nil)
		require.NoError(t, err)
		req.Header.Set("X-ROCK-Target-Port", strconv.Itoa(httpPort))
		req.Header.Set("XRL-Authorization", "Bearer "+g.key)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		assert.Equal(t, http.StatusOK, resp.StatusCode, string(b))
		assert.Equal(t, "hello from the sandbox, auth=", string(b))

		// /portforward: raw TCP to the http.server.
		ws, _, err := websocket.DefaultDialer.Dial(fmt.Sprintf("ws%s%s/sandboxes/%s/portforward?port=%d",
			strings.TrimPrefix(g.url(), "http"), rockcompat.Prefix, sbx.ID, httpPort), http.Header{"X-Key": {g.key}})
		require.NoError(t, err)
		defer ws.Close()
		require.NoError(t, ws.WriteMessage(websocket.BinaryMessage, []byte("GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")))
		var got []byte
		for !bytes.Contains(got, []byte("auth=")) {
			_, m, err := ws.ReadMessage()
			require.NoError(t, err, "got so far: %q", got)
			got = append(got, m...)
		}
		assert.True(t, bytes.HasPrefix(got, []byte("HTTP/1.1 200")), "%q", got)
	})

	t.Run("preview URL", func(t *testing.T) {
		pv, err := c.PreviewURL(ctx(t), sbx.ID, httpPort, 10*time.Minute)
		require.NoError(t, err)
		assert.WithinDuration(t, time.Now().Add(10*time.Minute), pv.ExpiresAt, 5*time.Second)
		jar, err := cookiejar.New(nil)
		require.NoError(t, err)
		browser := &http.Client{Jar: jar}
		resp, err := browser.Get(strings.Replace(pv.URL, "/?", "/hello?", 1))
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		assert.Equal(t, http.StatusOK, resp.StatusCode, "a preview URL works without the API key: %s", b)
		// Its cookie serves the page's relative requests.
		resp, err = browser.Get(portURL(httpPort, "/missing"))
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusNotFound, resp.StatusCode, "the cookie authenticates: the program's own 404")

		wsPv, err := c.PreviewURL(ctx(t), sbx.ID, wsPort, 0)
		require.NoError(t, err)
		ws, _, err := websocket.DefaultDialer.Dial("ws"+strings.TrimPrefix(strings.Replace(wsPv.URL, "/?", "/ws?", 1), "http"), nil)
		require.NoError(t, err, "a preview URL opens a WebSocket")
		require.NoError(t, ws.WriteMessage(websocket.TextMessage, []byte("via preview")))
		_, got, err := ws.ReadMessage()
		require.NoError(t, err)
		assert.Equal(t, "via preview", string(got))
		ws.Close()

		// The CLI prints one.
		cmd := exec.Command(bins.quarry, "sandbox", "url", "--ttl", "1s", sbx.ID, strconv.Itoa(httpPort))
		cmd.Env = append(os.Environ(), "QUARRY_URL="+g.url(), "QUARRY_API_KEY="+g.key)
		out, err := cmd.Output()
		require.NoError(t, err)
		short := strings.TrimSpace(string(out))
		require.True(t, strings.HasPrefix(short, g.url()+"/v1/sandboxes/"+sbx.ID+"/ports/"), short)
		time.Sleep(2 * time.Second)
		resp, err = http.Get(short)
		require.NoError(t, err)
		b, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		assert.Equal(t, http.StatusUnauthorized, resp.StatusCode, "expired: %s", b)
		assert.Contains(t, string(b), "expired")

		// Released: the URL ends with the lease.
		_, err = c.DeleteSandbox(ctx(t), sbx.ID)
		require.NoError(t, err)
		resp, err = http.Get(pv.URL)
		require.NoError(t, err)
		b, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		assert.Equal(t, http.StatusUnauthorized, resp.StatusCode, "after release: %s", b)
		var e struct {
			Error struct{ Code, Message string }
		}
		require.NoError(t, json.Unmarshal(b, &e))
		assert.Contains(t, e.Error.Message, "has ended")
	})
}

// TestPorts_ChromiumOverCDP: a headless Chromium runs as a sandbox process
// and is driven over CDP through a preview URL (no API key): /json/version
// through the proxy, then chromedp on the proxied browser WebSocket loads a
// page served inside the sandbox and reads it.
func TestPorts_ChromiumOverCDP(t *testing.T) {
	chromium := testenv.Chromium(t)
	_, c, sbx, httpPort := portSandbox(t)
	cdpPort := freePort(t)
	_, err := c.StartProcess(ctx(t), sbx.ID, agentapi.ProcessStartRequest{Argv: []string{chromium,
		"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
		"--remote-debugging-address=127.0.0.1", "--remote-debugging-port=" + strconv.Itoa(cdpPort),
		"--user-data-dir=chromium-profile", "about:blank"}})
	require.NoError(t, err)

	pv, err := c.PreviewURL(ctx(t), sbx.ID, cdpPort, 10*time.Minute)
	require.NoError(t, err)
	base, query, ok := strings.Cut(pv.URL, "?")
	require.True(t, ok, pv.URL)
	var version struct {
		Browser string `json:"Browser"`
		WS      string `json:"webSocketDebuggerUrl"`
	}
	eventually(t, 60*time.Second, "Chromium's DevTools answers through the preview URL", func() error {
		resp, err := http.Get(base + "json/version?" + query)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%d: %s", resp.StatusCode, b)
		}
		return json.Unmarshal(b, &version)
	})
	assert.Contains(t, version.Browser, "Chrome")
	// The answer names the sandbox's own address; the client connects to
	// the same path through the proxy.
	wsPath := version.WS[strings.Index(version.WS, "/devtools/"):]
	cdpURL := "ws" + strings.TrimPrefix(strings.TrimSuffix(base, "/"), "http") + wsPath + "?" + query

	actx, cancelA := remote.NewAllocator(ctx(t), cdpURL, remote.NoModifyURL)
	defer cancelA()
	tctx, cancelT := chromedp.NewContext(actx)
	defer cancelT()
	_, err = chromedp.Run(tctx, chromedp.Navigate(fmt.Sprintf("http://127.0.0.1:%d/hello", httpPort)))
	require.NoError(t, err)
	text, err := chromedp.Run(tctx, chromedp.Text("body"))
	require.NoError(t, err)
	assert.Equal(t, "hello from the sandbox, auth=", strings.TrimSpace(text), "the page, loaded by Chromium inside the sandbox, read over CDP")
}

// TestPorts_Docker: the same route into a Docker sandbox, whose ports are
// not published: the program listens on the container's own loopback and
// only its agent reaches it. HTTP, a WebSocket and a preview URL.
func TestPorts_Docker(t *testing.T) {
	d := requireDocker(t)
	g := d.startGateway(dockerTwoPools)
	g.waitReady("plain", 1)
	c := g.client()
	sbx, err := c.CreateSandbox(ctx(t), client.CreateSandboxRequest{Pool: "plain"})
	require.NoError(t, err)
	const port = 8123 // inside the container (the agent itself listens on 8000 there)
	startPortProgram(t, c, sbx.ID, buildEcho(t), "portbench", echoArgv(port), port)

	u, err := c.PortURL(sbx.ID, port, "/")
	require.NoError(t, err)
	resp, err := c.PortClient().Get(u)
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Len(t, b, 1024, "the program's 1 KiB answer from inside the container")
	direct, err := http.Get("http://127.0.0.1:8123/")
	if err == nil {
		direct.Body.Close()
		assert.NotEqual(t, http.StatusOK, direct.StatusCode, "the container's port is not published")
	}

	pv, err := c.PreviewURL(ctx(t), sbx.ID, port, time.Minute)
	require.NoError(t, err)
	ws, _, err := websocket.DefaultDialer.Dial("ws"+strings.TrimPrefix(strings.Replace(pv.URL, "/?", "/ws?", 1), "http"), nil)
	require.NoError(t, err)
	defer ws.Close()
	require.NoError(t, ws.WriteMessage(websocket.TextMessage, []byte("into docker")))
	_, got, err := ws.ReadMessage()
	require.NoError(t, err)
	assert.Equal(t, "into docker", string(got))
}
