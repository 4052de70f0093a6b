package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

func TestRun_DerivesTokenFromKeyAndNonce(t *testing.T) {
	keyHex := strings.Repeat("5a", 32)
	key, err := agentapi.ParseTokenKey(keyHex)
	require.NoError(t, err)
	p := startAgent(t, "QUARRY_AGENT_TOKEN_KEY="+keyHex, "QUARRY_AGENT_TOKEN_NONCE=nonce-1")
	ctx := context.Background()

	_, err = agentapi.New("http://"+p.addr, agentapi.DeriveToken(key, "nonce-2"), nil).Health(ctx)
	var ae *agentapi.Error
	require.ErrorAs(t, err, &ae, "a token of another nonce must be refused")
	assert.Equal(t, http.StatusUnauthorized, ae.Status)

	c := agentapi.New("http://"+p.addr, agentapi.DeriveToken(key, "nonce-1"), nil)
	_, err = c.Health(ctx)
	require.NoError(t, err)
	res, err := c.Exec(ctx, agentapi.ExecRequest{Command: "env"})
	require.NoError(t, err)
	assert.NotContains(t, res.Stdout, "QUARRY_AGENT_", "the key and nonce are scrubbed from children")
	assert.NotContains(t, res.Stdout, keyHex)

	// The agent re-executed itself without the key: its initial
	// environment (what /proc/<pid>/environ shows) no longer holds it.
	environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", p.cmd.Process.Pid))
	require.NoError(t, err)
	assert.NotContains(t, string(environ), keyHex)
	assert.NotContains(t, string(environ), "QUARRY_AGENT_TOKEN_KEY")
	assert.NotContains(t, string(environ), "nonce-1")
	m := regexp.MustCompile(`QUARRY_AGENT_TOKEN_FD=(\d+)`).FindStringSubmatch(string(environ))
	require.NotNil(t, m, "the re-executed agent got its token on a pipe")
	res, err = c.Exec(ctx, agentapi.ExecRequest{Command: "ls -l /proc/self/fd/"})
	require.NoError(t, err)
	assert.NotRegexp(t, " "+m[1]+" -> pipe:", res.Stdout, "the token pipe is closed, not inherited by commands")
}
