package gateway

import (
	"net/http"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/warmpool"
)

// cachingManager is a fakeManager with a lease cache, as warmpool.Manager
// has one (Cached).
type cachingManager struct {
	*fakeManager
	cmu    sync.Mutex
	cached map[string]warmpool.Lease
}

func (m *cachingManager) Cached(id, owner string) (warmpool.Lease, bool) {
	m.cmu.Lock()
	defer m.cmu.Unlock()
	l, ok := m.cached[id]
	return l, ok && l.Owner == owner
}

// The fence answers a cached lease from the manager's cache, with no Get
// (no store call, no deadline to set up), and a lease the cache does not
// hold through Get; a cached lease that has ended is refused as ended.
func TestFence_ReadsACachedLeaseWithoutGet(t *testing.T) {
	agent := startAgent(t)
	fm := newFakeManager(agent.URL)
	l := fm.addLease("sbx-1", testKey, agent.URL, 1)
	fm.addLease("sbx-2", testKey, agent.URL, 1)
	m := &cachingManager{fakeManager: fm, cached: map[string]warmpool.Lease{l.ID: l}}
	gw := startGateway(t, m, nil)
	exec := func(id string) (*http.Response, []byte) {
		return callJSON(t, http.MethodPost, gw.URL+"/v1/sandboxes/"+id+"/exec", testKey, agentapi.ExecRequest{Command: "true"})
	}

	resp, body := exec("sbx-1")
	require.Equal(t, http.StatusOK, resp.StatusCode, "body %s", body)
	assert.Empty(t, fm.Calls("Get"), "a cached lease needs no Get")

	resp, body = exec("sbx-2")
	require.Equal(t, http.StatusOK, resp.StatusCode, "body %s", body)
	assert.Equal(t, []string{"Get:sbx-2"}, fm.Calls("Get"), "one the cache does not hold is read with Get")

	resp, _ = callJSON(t, http.MethodPost, gw.URL+"/v1/sandboxes/sbx-1/exec", otherKey, agentapi.ExecRequest{Command: "true"})
	assert.Equal(t, http.StatusNotFound, resp.StatusCode, "another key's lease, cached or not")

	ended := l
	ended.State = warmpool.LeaseReleased
	m.cmu.Lock()
	m.cached[l.ID] = ended
	m.cmu.Unlock()
	resp, body = exec("sbx-1")
	assert.Equal(t, http.StatusGone, resp.StatusCode, "body %s", body)
}
