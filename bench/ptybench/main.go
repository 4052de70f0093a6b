// Command ptybench measures a PTY keystroke's echo round trip through the
// gateway (bin/gateway, process provider, embedded store, loopback, real
// agents): one byte from the client over the WebSocket, the gateway's relay,
// the agent, the PTY, a program in the sandbox that echoes it (cat in raw
// mode, as a shell's line editor does), and back. It prints p50/p99 over
// -keys keystrokes, one at a time, after -warmup.
//
// `make bench` runs it (scripts/bench.sh) after building bin/.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/quarryhq/quarry/bench/internal/procgw"
	"github.com/quarryhq/quarry/client"
	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/internal/stats"
)

const benchKey = "ptybench-api-key-0123456789"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "ptybench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	bin := flag.String("bin", "bin", "directory with the gateway and execagent binaries")
	keys := flag.Int("keys", 2000, "keystrokes measured")
	warmup := flag.Int("warmup", 200, "keystrokes before measuring")
	out := flag.String("json", "", "write the result as JSON to this file")
	flag.Parse()
	if *keys < 1 || *warmup < 0 {
		return errors.New("-keys must be positive and -warmup not negative")
	}
	g, err := procgw.Start(ctx, procgw.Options{Bin: *bin, Key: benchKey,
		Pools: "pools:\n  - name: default\n    image: host\n    min_warm: 1\n    max_total: 4\n"})
	if err != nil {
		return err
	}
	defer g.Stop()
	if err := g.WaitReady(ctx, 1); err != nil {
		return err
	}
	cl := client.New(g.Base, benchKey, client.WithHTTPClient(&http.Client{Timeout: time.Minute}))
	sbx, err := cl.CreateSandbox(ctx, client.CreateSandboxRequest{})
	if err != nil {
		return fmt.Errorf("create sandbox: %w", err)
	}
	info, err := cl.CreatePTY(ctx, sbx.ID, agentapi.PTYCreateRequest{Command: []string{"sh", "-c", "stty raw -echo; echo ready; exec cat"}})
	if err != nil {
		return fmt.Errorf("create pty: %w", err)
	}
	term, err := cl.AttachPTY(ctx, sbx.ID, client.PTYOptions{PTY: info.ID})
	if err != nil {
		return fmt.Errorf("attach: %w", err)
	}
	defer term.Close()
	if err := readUntil(term, "ready\n"); err != nil {
		return err
	}
	lat := make([]time.Duration, 0, *keys)
	buf := make([]byte, 64)
	for i := range *warmup + *keys {
		key := []byte{'a' + byte(i%26)}
		start := time.Now()
		if _, err := term.Write(key); err != nil {
			return fmt.Errorf("write: %w", err)
		}
		n, err := term.Read(buf)
		if err != nil {
			return fmt.Errorf("read: %w", err)
		}
		if n != 1 || buf[0] != key[0] {
			return fmt.Errorf("keystroke %d: sent %q, got %q", i, key, buf[:n])
		}
		if i >= *warmup {
			lat = append(lat, time.Since(start))
		}
	}
	p50, p99 := stats.Percentile(lat, 50), stats.Percentile(lat, 99)
	fmt.Printf("pty keystroke echo through the gateway: keys=%d p50_us=%.0f p99_us=%.0f\n", len(lat),
		float64(p50.Microseconds()), float64(p99.Microseconds()))
	if *out != "" {
		b, _ := json.MarshalIndent(map[string]any{"name": "pty_keystroke_echo", "keys": len(lat),
			"p50_us": p50.Microseconds(), "p99_us": p99.Microseconds()}, "", "  ")
		if err := os.WriteFile(*out, b, 0o644); err != nil {
			return fmt.Errorf("write %s: %w", *out, err)
		}
	}
	return nil
}

// readUntil reads the terminal until its output ends with want.
func readUntil(term *client.PTYConn, want string) error {
	var got []byte
	buf := make([]byte, 4096)
	for len(got) < len(want) || string(got[len(got)-len(want):]) != want {
		n, err := term.Read(buf)
		if err != nil {
			return fmt.Errorf("wait for %q: %w (got %q)", want, err, got)
		}
		got = append(got, buf[:n]...)
	}
	return nil
}
