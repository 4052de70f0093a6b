package execagent

import (
	"context"
	"net/http"
	"regexp"
	"sync"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

// callIDPattern is what agentapi.HeaderCallID accepts.
var callIDPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// callTable holds the cancel functions of the requests in flight that
// carry agentapi.HeaderCallID, so that DELETE /v1/calls/{id} can end one:
// its handler sees its context canceled, as when its client disconnects.
type callTable struct {
	mu sync.Mutex
	m  map[string]context.CancelFunc
}

// begin registers r's call id (when it has one) and returns r with a
// cancelable context and the function that unregisters it. A malformed id
// or one already in flight is refused.
func (t *callTable) begin(r *http.Request) (*http.Request, func(), error) {
	id := r.Header.Get(agentapi.HeaderCallID)
	if id == "" {
		return r, func() {}, nil
	}
	if !callIDPattern.MatchString(id) {
		return nil, nil, invalid(agentapi.HeaderCallID, "must be 1 to 64 letters, digits, '-' or '_'")
	}
	ctx, cancel := context.WithCancel(r.Context())
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, dup := t.m[id]; dup {
		cancel()
		return nil, nil, statusError(errConflict, http.StatusConflict, agentapi.CodeConflict, "call %q is already in flight", id)
	}
	if t.m == nil {
		t.m = map[string]context.CancelFunc{}
	}
	t.m[id] = cancel
	return r.WithContext(ctx), func() {
		t.mu.Lock()
		delete(t.m, id)
		t.mu.Unlock()
		cancel()
	}, nil
}

// cancel ends call id; false when no such call is in flight.
func (t *callTable) cancel(id string) bool {
	t.mu.Lock()
	cancel, ok := t.m[id]
	delete(t.m, id)
	t.mu.Unlock()
	if ok {
		cancel()
	}
	return ok
}

// handleCallCancel answers DELETE /v1/calls/{id}: 204 when the call was in
// flight (its handler answers its own client as for a disconnect), 404
// when it is not (finished already, or never seen).
func (s *Server) handleCallCancel(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	if !s.calls.cancel(id) {
		return statusError(errNotFound, http.StatusNotFound, agentapi.CodeNotFound, "no call %q in flight", id)
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
