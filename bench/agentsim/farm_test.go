package agentsim

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

// freeAddr returns a loopback address (a random one of 127.200.0.0/13)
// with a port free on it a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	ip := fmt.Sprintf("127.%d.%d.%d", 200+rand.IntN(8), rand.IntN(256), 1+rand.IntN(250))
	ln, err := net.Listen("tcp", ip+":0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

func newFarm(t *testing.T) *Farm {
	t.Helper()
	f := NewFarm(Config{})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		assert.NoError(t, f.Close(ctx))
	})
	return f
}

func client(addr, token string) *agentapi.Client {
	return agentapi.New("http://"+addr, token, &http.Client{Timeout: 10 * time.Second})
}

// code returns the agent error code of err ("" when it is not one).
func code(err error) string {
	var ae *agentapi.Error
	if errors.As(err, &ae) {
		return ae.Code
	}
	return ""
}

func TestFarm_Health_NeedsTheToken(t *testing.T) {
	f := newFarm(t)
	addr := freeAddr(t)
	require.NoError(t, f.Up(addr, "tok-1"))

	h, err := client(addr, "tok-1").Health(context.Background())
	require.NoError(t, err)
	assert.Equal(t, "ok", h.Status)
	assert.Equal(t, agentapi.Version, h.Version)
	assert.Zero(t, h.Generation)

	_, err = client(addr, "tok-2").Health(context.Background())
	assert.Equal(t, agentapi.CodeUnauthorized, code(err))
	_, err = client(addr, "").Health(context.Background())
	assert.Equal(t, agentapi.CodeUnauthorized, code(err))
	assert.Equal(t, int64(2), f.Stats().Unauthorized)
}

func TestFarm_Init_FollowsTheAgentsGenerationRules(t *testing.T) {
	f := newFarm(t)
	addr := freeAddr(t)
	require.NoError(t, f.Up(addr, "tok"))
	c := client(addr, "tok")
	ctx := context.Background()

	h, err := c.Init(ctx, agentapi.InitRequest{LeaseID: "lease-a", Generation: 1})
	require.NoError(t, err)
	assert.Equal(t, "lease-a", h.LeaseID)
	assert.Equal(t, int64(1), h.Generation)

	_, err = c.Init(ctx, agentapi.InitRequest{LeaseID: "lease-a", Generation: 1})
	assert.NoError(t, err, "the same lease and generation again is a retry")
	_, err = c.Init(ctx, agentapi.InitRequest{LeaseID: "lease-b", Generation: 1})
	assert.Equal(t, agentapi.CodeConflict, code(err))
	_, err = c.Init(ctx, agentapi.InitRequest{LeaseID: "lease-b", Generation: 0})
	assert.Equal(t, agentapi.CodeStaleGeneration, code(err))

	h, err = c.Init(ctx, agentapi.InitRequest{LeaseID: "lease-a", Generation: 2}) // a fence
	require.NoError(t, err)
	assert.Equal(t, int64(2), h.Generation)
	h, err = c.Health(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(2), h.Generation)

	err = c.Do(ctx, http.MethodPost, agentapi.RouteInit, map[string]any{"lease_id": "x", "generation": 3, "bogus": 1}, nil)
	assert.Equal(t, agentapi.CodeBadRequest, code(err), "unknown fields are refused")
}

func TestFarm_Calls_AreFencedByTheGeneration(t *testing.T) {
	f := newFarm(t)
	addr := freeAddr(t)
	require.NoError(t, f.Up(addr, "tok"))
	ctx := context.Background()
	_, err := client(addr, "tok").Init(ctx, agentapi.InitRequest{LeaseID: "l", Generation: 2})
	require.NoError(t, err)

	_, err = client(addr, "tok").WithGeneration(1).Exec(ctx, agentapi.ExecRequest{Command: "true"})
	assert.Equal(t, agentapi.CodeStaleGeneration, code(err))
	_, err = client(addr, "tok").Exec(ctx, agentapi.ExecRequest{Command: "true"})
	assert.Equal(t, agentapi.CodeStaleGeneration, code(err), "no header is generation 0")

	res, err := client(addr, "tok").WithGeneration(2).Exec(ctx, agentapi.ExecRequest{Command: "true"})
	require.NoError(t, err)
	assert.Equal(t, 0, res.ExitCode)
	_, err = client(addr, "tok").WithGeneration(2).Exec(ctx, agentapi.ExecRequest{})
	assert.Equal(t, agentapi.CodeBadRequest, code(err))
	st := f.Stats()
	assert.Equal(t, int64(2), st.Stale)
	assert.Equal(t, int64(1), st.Execs, "only answered execs count")
}

func TestFarm_Sessions(t *testing.T) {
	f := newFarm(t)
	addr := freeAddr(t)
	require.NoError(t, f.Up(addr, "tok"))
	c := client(addr, "tok")
	ctx := context.Background()

	s, err := c.CreateSession(ctx, agentapi.SessionCreateRequest{})
	require.NoError(t, err)
	assert.NotEmpty(t, s.ID)
	res, err := c.RunSession(ctx, s.ID, agentapi.SessionRunRequest{Command: "echo hi"})
	require.NoError(t, err)
	assert.Equal(t, 0, res.ExitCode)
	list, err := c.ListSessions(ctx)
	require.NoError(t, err)
	require.Len(t, list, 1)
	assert.Equal(t, s.ID, list[0].ID)
	require.NoError(t, c.CloseSession(ctx, s.ID))
	_, err = c.RunSession(ctx, s.ID, agentapi.SessionRunRequest{Command: "true"})
	assert.Equal(t, agentapi.CodeNotFound, code(err))
	assert.Equal(t, int64(1), f.Stats().SessionRuns)
}

func TestFarm_UnsimulatedRoutes_AreNotFound(t *testing.T) {
	f := newFarm(t)
	addr := freeAddr(t)
	require.NoError(t, f.Up(addr, "tok"))
	ctx := context.Background()
	_, err := client(addr, "tok").ListProcesses(ctx)
	assert.Equal(t, agentapi.CodeNotFound, code(err))
	assert.Contains(t, err.Error(), "does not simulate")
	err = client(addr, "tok").CancelCall(ctx, "call-1")
	assert.Equal(t, agentapi.CodeNotFound, code(err))
}

func TestFarm_Down_RefusesConnections(t *testing.T) {
	f := newFarm(t)
	addr := freeAddr(t)
	require.NoError(t, f.Up(addr, "tok"))
	hc := &http.Client{Timeout: 5 * time.Second}
	c := agentapi.New("http://"+addr, "tok", hc)
	ctx := context.Background()
	_, err := c.Health(ctx) // leaves an idle keep-alive connection
	require.NoError(t, err)
	assert.Equal(t, int64(1), f.Stats().Up)

	require.NoError(t, f.Down(addr))
	_, err = c.Health(ctx)
	require.Error(t, err, "a call after Down fails, on the idle connection and on a new one")
	_, err = net.DialTimeout("tcp", addr, time.Second)
	assert.True(t, errors.Is(err, syscall.ECONNREFUSED), "dial after Down: %v", err)
	assert.Error(t, f.Down(addr), "not up any more")

	require.NoError(t, f.Up(addr, "tok-2"), "the address can serve another agent")
	_, err = client(addr, "tok-2").Health(ctx)
	require.NoError(t, err)
	st := f.Stats()
	assert.Equal(t, int64(2), st.Ups)
	assert.Equal(t, int64(1), st.Downs)
	assert.Equal(t, int64(1), st.MaxUp)
}

func TestFarm_Up_RefusesBadAddresses(t *testing.T) {
	f := newFarm(t)
	addr := freeAddr(t)
	require.NoError(t, f.Up(addr, "tok"))
	err := f.Up(addr, "tok")
	assert.ErrorContains(t, err, "already up")
	assert.ErrorContains(t, f.Up("10.1.2.3:8000", "tok"), "not a loopback address")
	assert.ErrorContains(t, f.Up("localhost", "tok"), "missing port")
	assert.ErrorContains(t, f.Up(freeAddr(t), ""), "empty token")
	assert.Equal(t, int64(4), f.Stats().UpErrors)
}

func TestFarm_Close_TakesEveryAgentDown(t *testing.T) {
	f := NewFarm(Config{})
	addrs := []string{freeAddr(t), freeAddr(t), freeAddr(t)}
	for _, a := range addrs {
		require.NoError(t, f.Up(a, "tok"))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, f.Close(ctx))
	require.NoError(t, f.Close(ctx), "idempotent")
	for _, a := range addrs {
		_, err := net.DialTimeout("tcp", a, time.Second)
		assert.Error(t, err)
	}
	assert.ErrorContains(t, f.Up(addrs[0], "tok"), "closed")
}

func TestServe_LineProtocol(t *testing.T) {
	f := newFarm(t)
	addr := freeAddr(t)
	in := strings.NewReader("up " + addr + " tok\nup " + addr + " tok\nstats\nbogus\ndown " + addr + "\n")
	var out strings.Builder
	require.NoError(t, Serve(context.Background(), in, &out, f))
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	require.Len(t, lines, 5)
	assert.Equal(t, "ok", lines[0])
	assert.True(t, strings.HasPrefix(lines[1], "err ") && strings.Contains(lines[1], "already up"), lines[1])
	assert.True(t, strings.HasPrefix(lines[2], `stats {"simulated":true,"up":1,`), lines[2])
	assert.True(t, strings.HasPrefix(lines[3], "err unknown command"), lines[3])
	assert.Equal(t, "ok", lines[4])
}
