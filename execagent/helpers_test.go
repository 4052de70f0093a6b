package execagent

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

const (
	testToken = "test-token-0123456789"
	// waitLong is the generous deadline of every polling wait in the tests:
	// the CI machine is a busy 2-core box.
	waitLong = 30 * time.Second
)

// testAgent is a running agent on 127.0.0.1 with a client for it.
type testAgent struct {
	srv    *Server
	client *agentapi.Client
	url    string
	cfg    Config
}

// newTestAgent starts an agent with a fresh workdir; mutate (may be nil)
// adjusts the config first. The agent is closed when the test ends.
func newTestAgent(t testing.TB, mutate func(*Config)) *testAgent {
	t.Helper()
	cfg := Config{
		Token:   testToken,
		Workdir: t.TempDir(),
		Env:     []string{"PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "HOME=/root", "LANG=C.UTF-8"},
	}
	if mutate != nil {
		mutate(&cfg)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	srv, err := New(cfg, log)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(context.Background(), ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitLong)
		defer cancel()
		require.NoError(t, srv.Close(ctx))
		if err := <-served; !errors.Is(err, errClosed) { // errClosed: closed before it served (a test that made no call)
			require.NoError(t, err)
		}
		_ = ln.Close()
	})
	url := "http://" + ln.Addr().String()
	return &testAgent{
		srv:    srv,
		client: agentapi.New(url, testToken, &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}),
		url:    url,
		cfg:    srv.cfg,
	}
}

// eventually polls cond every few milliseconds until it holds or waitLong
// passes.
func eventually(t testing.TB, cond func() bool, msg string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(waitLong)
	for !cond() {
		if time.Now().After(deadline) {
			require.Failf(t, "condition not met in time", msg, args...)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// processGone reports whether pid no longer exists (not even as a zombie).
func processGone(pid int) bool {
	_, err := os.Stat("/proc/" + strconv.Itoa(pid))
	return errors.Is(err, os.ErrNotExist)
}

// processState returns the state letter of pid ("R", "S", "Z", ...) or ""
// when it is gone.
func processState(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ""
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return ""
	}
	return s[i+2 : i+3]
}

// processDead reports whether pid is gone or a zombie (killed, awaiting its reaper).
func processDead(pid int) bool {
	st := processState(pid)
	return st == "" || st == "Z"
}

// apiError returns err as *agentapi.Error (failing the test otherwise).
func apiError(t testing.TB, err error) *agentapi.Error {
	t.Helper()
	var ae *agentapi.Error
	require.ErrorAs(t, err, &ae)
	return ae
}
