package agentsim

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// childEnv makes the test binary act as an agentsim process (TestMain).
const childEnv = "AGENTSIM_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		os.Exit(runChild())
	}
	os.Exit(m.Run())
}

// runChild is cmd/agentsim's loop, in the test binary.
func runChild() int {
	f := NewFarm(Config{})
	if _, err := os.Stdout.WriteString("ready\n"); err != nil {
		return 1
	}
	err := Serve(context.Background(), os.Stdin, os.Stdout, f)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if cerr := f.Close(ctx); err == nil {
		err = cerr
	}
	if err != nil {
		return 1
	}
	return 0
}

func TestProcs_RouteAddressesToProcesses(t *testing.T) {
	ctx := context.Background()
	p, err := StartProcs(ctx, ProcsConfig{Command: []string{os.Args[0]}, Procs: 3, Env: []string{childEnv + "=1"}})
	require.NoError(t, err)
	closed := false
	t.Cleanup(func() {
		if !closed {
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			_ = p.Close(cctx)
		}
	})
	require.Len(t, p.PIDs(), 3)

	var addrs []string
	for range 12 {
		a := freeAddr(t)
		require.NoError(t, p.Up(a, "tok-"+a[len(a)-4:]))
		addrs = append(addrs, a)
	}
	for _, a := range addrs {
		h, err := client(a, "tok-"+a[len(a)-4:]).Health(ctx)
		require.NoError(t, err, a)
		assert.Equal(t, "ok", h.Status)
	}
	assert.ErrorContains(t, p.Up(addrs[0], "tok"), "already up", "errors come back from the child")
	assert.Error(t, p.Up("bad addr", "tok"))
	require.NoError(t, p.Down(addrs[0]))
	_, err = client(addrs[0], "tok").Health(ctx)
	assert.Error(t, err)

	st, err := p.Stats()
	require.NoError(t, err)
	assert.Equal(t, int64(11), st.Up)
	assert.Equal(t, int64(12), st.Ups)
	assert.Equal(t, int64(12), st.Healths)

	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, p.Close(cctx), "the processes exit cleanly when their stdin closes")
	closed = true
	for _, a := range addrs[1:] {
		_, err := client(a, "tok").Health(ctx)
		assert.Error(t, err, "the agents went with their process")
	}
}

func TestStartProcs_RefusesABadCommand(t *testing.T) {
	_, err := StartProcs(context.Background(), ProcsConfig{Command: []string{"/nonexistent/agentsim"}, Procs: 1})
	assert.ErrorContains(t, err, "start agentsim process 0")
	_, err = StartProcs(context.Background(), ProcsConfig{Command: []string{"true"}, Procs: 1})
	assert.ErrorContains(t, err, "agentsim process 0")
}
