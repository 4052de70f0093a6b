package warmpool_test

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/providers"
	"github.com/quarryhq/quarry/warmpool"
	"github.com/quarryhq/quarry/warmpool/boltstore"
)

// relayProvider is a fake provider whose sandboxes reach the relay at a
// URL of their own (providers.SandboxRelay).
type relayProvider struct{ *fakeProvider }

func (relayProvider) SandboxRelayURL(spec providers.Spec) string {
	return "http://in-sandbox-of-" + spec.Pool
}

// Deps.LeaseEnv adds per-lease variables computed from the new lease's id
// and the pool's relay URL (its provider's, when it names one), over the
// request's own, and the agent's init receives them.
func TestManager_Acquire_LeaseEnvFromTheLeaseID(t *testing.T) {
	clock := newFakeClock()
	prov := relayProvider{newFakeProvider(clock)}
	agents := newFakeAgents(prov.fakeProvider)
	s, err := boltstore.Open(filepath.Join(t.TempDir(), "leases.db"), boltstore.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	m, err := warmpool.New(fastConfig(), warmpool.Deps{
		Store: s, Providers: map[string]providers.Provider{"fake": prov}, Pools: []warmpool.PoolConfig{testPool(1, 4)},
		Agents: agents, Clock: clock,
		LeaseEnv: func(id, relayURL string) map[string]string {
			return map[string]string{"RELAY": relayURL + "/for-" + id, "TASK": "overridden"}
		},
	})
	require.NoError(t, err)
	require.NoError(t, m.Start(t.Context()))
	t.Cleanup(func() { _ = m.Close(t.Context()) })

	l, _, err := m.Acquire(t.Context(), warmpool.AcquireRequest{Pool: "default", Owner: "alice", Env: map[string]string{"TASK": "1", "KEEP": "me"}})
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"RELAY": "http://in-sandbox-of-default/for-" + l.ID, "TASK": "overridden", "KEEP": "me"}, l.Env)

	agents.mu.Lock()
	defer agents.mu.Unlock()
	inits := agents.inits[l.AgentURL]
	require.NotEmpty(t, inits)
	assert.Equal(t, "http://in-sandbox-of-default/for-"+l.ID, inits[len(inits)-1].Env["RELAY"])
}
