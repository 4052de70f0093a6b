// Command portbench measures the port proxy (docs/API.md "Ports and preview
// URLs") on loopback with a real gateway (bin/gateway, process provider,
// embedded store) and a real agent: a program in the sandbox (this binary,
// run with -serve) answers HTTP and echoes WebSocket messages, and each
// measurement is taken directly against it and through
// /v1/sandboxes/{id}/ports/{port}/ (the gateway and the agent's reverse
// proxy), interleaved:
//
//  1. HTTP: sequential GETs of a 1 KiB body, keep-alive on both paths;
//     p50/p99 of each and the proxied/direct ratio;
//  2. WebSocket round trips: one message, its echo, then the next; p50/p99;
//  3. WebSocket streaming: -ws-window messages in flight on one socket;
//     messages per second each way.
//
// `make bench` runs it after building bin/ (scripts/bench.sh). The
// gateway's data directory is a temporary directory removed at the end,
// and the sandbox is released.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/fasthttp/websocket"

	"github.com/quarryhq/quarry/bench/internal/dockergw"
	"github.com/quarryhq/quarry/client"
	"github.com/quarryhq/quarry/execagent/agentapi"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "portbench:", err)
		os.Exit(1)
	}
}

type options struct {
	bin        string
	jsonOut    string
	requests   int
	wsRounds   int
	wsMessages int
	wsWindow   int
	serve      int
}

// body is what the program answers to GET /: 1 KiB.
var body = []byte(strings.Repeat("q", 1024))

func run(ctx context.Context) error {
	var o options
	flag.StringVar(&o.bin, "bin", "bin", "directory with the gateway and execagent binaries")
	flag.StringVar(&o.jsonOut, "json", "", "also write the results as JSON to this file")
	flag.IntVar(&o.requests, "requests", 2000, "HTTP requests per path")
	flag.IntVar(&o.wsRounds, "ws-rounds", 2000, "WebSocket round trips per path")
	flag.IntVar(&o.wsMessages, "ws-messages", 20000, "WebSocket messages streamed per path")
	flag.IntVar(&o.wsWindow, "ws-window", 64, "WebSocket messages in flight while streaming")
	flag.IntVar(&o.serve, "serve", 0, "internal: serve the benchmark's program on this port (run in the sandbox)")
	flag.Parse()
	if o.serve > 0 {
		return serve(o.serve)
	}
	bin, err := filepath.Abs(o.bin)
	if err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "portbench-")
	if err != nil {
		return err
	}
	key := "portbench-" + dockergw.RandomHex(12)
	g, err := dockergw.Start(dockergw.Options{Bin: bin, Dir: dir, Key: key, GatewayID: "portbench-" + dockergw.RandomHex(4),
		Pools: "pools:\n  - name: default\n    image: host\n    min_warm: 0\n    max_total: 2\n",
		Env:   []string{"QUARRY_PROVIDER=process"}})
	if err != nil {
		return err
	}
	defer g.Stop()
	if err := g.WaitPool(ctx, "default", time.Minute, func(client.Pool) bool { return true }); err != nil {
		return fmt.Errorf("%w\n%s", err, g.LogTail())
	}
	sbx, err := g.C.CreateSandbox(ctx, client.CreateSandboxRequest{Pool: "default"})
	if err != nil {
		return fmt.Errorf("create sandbox: %w\n%s", err, g.LogTail())
	}
	defer func() { _, _ = g.C.DeleteSandbox(context.WithoutCancel(ctx), sbx.ID) }()
	port, err := freePort()
	if err != nil {
		return err
	}
	if _, err := g.C.StartProcess(ctx, sbx.ID, agentapi.ProcessStartRequest{Argv: []string{self, "-serve", strconv.Itoa(port)}}); err != nil {
		return fmt.Errorf("start the program: %w", err)
	}
	direct := "http://127.0.0.1:" + strconv.Itoa(port)
	proxied, err := g.C.PortURL(sbx.ID, port, "")
	if err != nil {
		return err
	}
	proxied = strings.TrimSuffix(proxied, "/")
	dc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}, Timeout: time.Minute}
	pc := client.New(strings.SplitN(proxied, "/v1/", 2)[0], key, client.WithHTTPClient(dc)).PortClient()
	if err := waitUp(ctx, pc, proxied+"/"); err != nil {
		return err
	}

	res := map[string]any{"started": time.Now().UTC().Format(time.RFC3339)}
	dHTTP, pHTTP, err := httpLatency(ctx, dc, pc, direct+"/", proxied+"/", o.requests)
	if err != nil {
		return err
	}
	fmt.Printf("HTTP GET 1 KiB  direct  %s\n", line(dHTTP))
	fmt.Printf("HTTP GET 1 KiB  proxied %s\n", line(pHTTP))
	rHTTP := ratio(pHTTP, dHTTP)
	fmt.Printf("HTTP proxied/direct: p50 x%.2f, p99 x%.2f\n", rHTTP[0], rHTTP[1])
	res["http_direct_ms"], res["http_proxied_ms"], res["http_ratio_p50_p99"] = dockergw.Summary(dHTTP), dockergw.Summary(pHTTP), rHTTP

	hdr := http.Header{"Authorization": {"Bearer " + key}}
	wsDirect, wsProxied := "ws"+strings.TrimPrefix(direct, "http")+"/ws", "ws"+strings.TrimPrefix(proxied, "http")+"/ws"
	dRT, err := wsRoundTrips(wsDirect, nil, o.wsRounds)
	if err != nil {
		return fmt.Errorf("websocket direct: %w", err)
	}
	pRT, err := wsRoundTrips(wsProxied, hdr, o.wsRounds)
	if err != nil {
		return fmt.Errorf("websocket proxied: %w", err)
	}
	fmt.Printf("WS round trip 64 B  direct  %s\n", line(dRT))
	fmt.Printf("WS round trip 64 B  proxied %s\n", line(pRT))
	res["ws_rt_direct_ms"], res["ws_rt_proxied_ms"] = dockergw.Summary(dRT), dockergw.Summary(pRT)

	dRate, err := wsStream(wsDirect, nil, o.wsMessages, o.wsWindow)
	if err != nil {
		return fmt.Errorf("websocket direct: %w", err)
	}
	pRate, err := wsStream(wsProxied, hdr, o.wsMessages, o.wsWindow)
	if err != nil {
		return fmt.Errorf("websocket proxied: %w", err)
	}
	fmt.Printf("WS streamed 64 B messages (window %d): direct %.0f msg/s, proxied %.0f msg/s (x%.2f)\n", o.wsWindow, dRate, pRate, pRate/dRate)
	res["ws_msgs_per_s_direct"], res["ws_msgs_per_s_proxied"] = dRate, pRate
	if o.jsonOut != "" {
		b, _ := json.MarshalIndent(res, "", "  ")
		return os.WriteFile(o.jsonOut, b, 0o644)
	}
	return nil
}

// httpLatency times n GETs of each URL, interleaved.
func httpLatency(ctx context.Context, dc, pc *http.Client, direct, proxied string, n int) (d, p []time.Duration, err error) {
	get := func(c *http.Client, u string) (time.Duration, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		t0 := time.Now()
		resp, err := c.Do(req)
		if err != nil {
			return 0, err
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK || len(b) != len(body) {
			return 0, fmt.Errorf("GET %s: %d, %d bytes, %v", u, resp.StatusCode, len(b), err)
		}
		return time.Since(t0), nil
	}
	for range n {
		a, err := get(dc, direct)
		if err != nil {
			return nil, nil, err
		}
		b, err := get(pc, proxied)
		if err != nil {
			return nil, nil, err
		}
		d, p = append(d, a), append(p, b)
	}
	return d, p, nil
}

// wsRoundTrips times n sequential echoes of a 64-byte message.
func wsRoundTrips(u string, h http.Header, n int) ([]time.Duration, error) {
	c, _, err := websocket.DefaultDialer.Dial(u, h)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	msg := []byte(strings.Repeat("m", 64))
	out := make([]time.Duration, 0, n)
	for range n {
		t0 := time.Now()
		if err := c.WriteMessage(websocket.BinaryMessage, msg); err != nil {
			return nil, err
		}
		if _, _, err := c.ReadMessage(); err != nil {
			return nil, err
		}
		out = append(out, time.Since(t0))
	}
	return out, nil
}

// wsStream sends n 64-byte messages with at most window unanswered and
// returns the echoed messages per second.
func wsStream(u string, h http.Header, n, window int) (float64, error) {
	c, _, err := websocket.DefaultDialer.Dial(u, h)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	msg := []byte(strings.Repeat("s", 64))
	credits := make(chan struct{}, window)
	for range window {
		credits <- struct{}{}
	}
	errc := make(chan error, 1)
	t0 := time.Now()
	go func() {
		for range n {
			<-credits
			if err := c.WriteMessage(websocket.BinaryMessage, msg); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	for range n {
		if _, _, err := c.ReadMessage(); err != nil {
			return 0, err
		}
		credits <- struct{}{}
	}
	if err := <-errc; err != nil {
		return 0, err
	}
	return float64(n) / time.Since(t0).Seconds(), nil
}

// line is dockergw.Summary as one printed line, in microseconds (Line
// rounds to 100 µs, coarse for loopback).
func line(ds []time.Duration) string {
	m := dockergw.Summary(ds)
	return fmt.Sprintf("n=%d p50 %.0f µs p99 %.0f µs (min %.0f, max %.0f)", len(ds), 1000*m["p50"], 1000*m["p99"], 1000*m["min"], 1000*m["max"])
}

func ratio(p, d []time.Duration) [2]float64 {
	sp, sd := dockergw.Summary(p), dockergw.Summary(d)
	return [2]float64{sp["p50"] / sd["p50"], sp["p99"] / sd["p99"]}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// waitUp polls u through the proxy until the program answers.
func waitUp(ctx context.Context, c *http.Client, u string) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		resp, err := c.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = errors.New(resp.Status)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the program does not answer through the proxy: %w", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// serve is the program in the sandbox: GET / answers body, /ws echoes
// every message.
func serve(port int) error {
	// echo.v1 is selected when offered (tests/ports_test.go runs this
	// program as its WebSocket echo).
	up := websocket.Upgrader{ReadBufferSize: 4 << 10, WriteBufferSize: 4 << 10, Subprotocols: []string{"echo.v1"}}
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write(body) })
	mux.HandleFunc("/ws", func(w http.ResponseWriter, r *http.Request) {
		c, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer c.Close()
		for {
			mt, m, err := c.ReadMessage()
			if err != nil {
				return
			}
			if c.WriteMessage(mt, m) != nil {
				return
			}
		}
	})
	srv := &http.Server{Addr: "127.0.0.1:" + strconv.Itoa(port), Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	return srv.ListenAndServe()
}
