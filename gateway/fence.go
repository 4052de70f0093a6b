package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/valyala/fasthttp"

	"github.com/quarryhq/quarry/api"
	"github.com/quarryhq/quarry/errclass"
	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/warmpool"
)

// The fence: the one place that says whether a request may reach a sandbox.
// Every route that touches a sandbox's agent (the proxied calls, checkpoints,
// the env API, PTYs and the WebSocket relay, the port proxy and preview URLs,
// ROCK's routes) reads the lease here, and every agent failure is mapped here
// into how the lease ended or the agent's error. A lease may be used while it
// is active and unexpired, by its owner, at its generation: the agent refuses
// any other generation (409 stale_generation), which is how a call fenced by
// a lease that has since been released and re-leased never runs.

// activeLease reads the sandbox's lease for the caller of c and returns it
// if it may be used now; otherwise its error, classified for the sandbox
// (404 unknown or another owner's, 410 ended).
func (g *Gateway) activeLease(c *fiber.Ctx, id string) (warmpool.Lease, error) {
	lease, err := g.usableLease(c.UserContext(), id, ownerOf(c))
	if err != nil {
		return lease, errclass.Sandbox(id, err)
	}
	return lease, nil
}

// grantedLease is activeLease for a call to a sandbox's port or data plane
// whose credential kept a sandboxGrant (credentials.go): a token,
// signature or preview token holds only for the lease generation it was
// made for, and a preview token's refusals are its own 401s.
func (g *Gateway) grantedLease(c *fiber.Ctx, id string) (warmpool.Lease, error) {
	lease, err := g.activeLease(c, id)
	grant := sandboxGrantOf(c)
	switch {
	case grant == nil:
		return lease, err
	case err != nil && grant.preview != nil:
		return lease, errPreviewLease(err)
	case err != nil:
		return lease, err
	case grant.fenced && lease.Generation != grant.generation && grant.preview != nil:
		return lease, errPreview("it was issued for an earlier lease of this sandbox (generation %d, now %d)", grant.generation, lease.Generation)
	case grant.fenced && lease.Generation != grant.generation:
		return lease, errAccess(fmt.Sprintf("the access token was issued for an earlier lease of this sandbox (generation %d, now %d)", grant.generation, lease.Generation))
	}
	return lease, nil
}

// usableLease reads lease id of owner (bounded by ManagerTimeout) and
// returns it while it is active, unexpired and not paused (a paused one is
// 409 conflict). The error is the manager's
// (warmpool.ErrNotFound for an unknown lease or another owner's) or how the
// lease ended (*warmpool.LeaseEndedError), not yet classified.
func (g *Gateway) usableLease(ctx context.Context, id, owner string) (warmpool.Lease, error) {
	lease, ok := g.cachedLease(id, owner)
	if !ok {
		ctx, cancel := context.WithTimeout(ctx, g.cfg.ManagerTimeout)
		defer cancel()
		var err error
		if lease, err = g.mgr.Get(ctx, id, owner); err != nil {
			return lease, err
		}
	}
	if gone := g.leaseGone(lease); gone != nil {
		return lease, gone
	}
	if !lease.PausedAt.IsZero() {
		// Its agent is frozen: a call would wait for its deadline.
		return lease, errclass.New(http.StatusConflict, api.CodeConflict, fmt.Sprintf(
			"sandbox %s is paused (since %s): resume it before calling it (E2B's SDK: connect or resume)",
			id, lease.PausedAt.UTC().Format(time.RFC3339)))
	}
	return lease, nil
}

// leaseCache is what a Manager that keeps a lease cache offers
// (warmpool.Manager.Cached): a lease read without a store call.
type leaseCache interface {
	Cached(id, owner string) (warmpool.Lease, bool)
}

// cachedLease returns lease id of owner from the manager's lease cache,
// when it has one and the lease is there: no deadline to set up for a
// read that calls no store (a timer per request, 2% of the gateway's CPU
// under quarrybench's session runs).
func (g *Gateway) cachedLease(id, owner string) (warmpool.Lease, bool) {
	if c, ok := g.mgr.(leaseCache); ok {
		return c.Cached(id, owner)
	}
	return warmpool.Lease{}, false
}

// stillHeld reports whether lease id of owner is still usable at generation
// gen: the check a long-lived connection (a relayed WebSocket) repeats. A
// failed read keeps the connection (true): the next check decides.
func (g *Gateway) stillHeld(ctx context.Context, id, owner string, gen int64) bool {
	ctx, cancel := context.WithTimeout(ctx, g.cfg.ManagerTimeout)
	defer cancel()
	l, err := g.mgr.Get(ctx, id, owner)
	switch {
	case errors.Is(err, warmpool.ErrNotFound):
		return false
	case err != nil:
		g.log.Warn("lease check of a long-lived connection", "sandbox", id, "err", err)
		return true
	}
	return l.Generation == gen && g.leaseGone(l) == nil
}

// leaseGone returns why l can no longer be used (nil while it is active and
// unexpired) and drops the cached client of its agent when it cannot.
func (g *Gateway) leaseGone(l warmpool.Lease) *warmpool.LeaseEndedError {
	gone := l.Ended(g.clock.Now())
	if gone == nil {
		return nil
	}
	if l.AgentURL != "" {
		g.agents.evict(l.AgentURL)
	}
	return gone
}

// checkTask asks the manager whether the lease's task still lives; it
// returns why the lease is gone, or nil (alive, or the check failed). The
// check runs even when ctx's client has gone, bounded by ManagerTimeout.
func (g *Gateway) checkTask(ctx context.Context, lease warmpool.Lease) *warmpool.LeaseEndedError {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.cfg.ManagerTimeout)
	defer cancel()
	l, err := g.mgr.CheckTask(ctx, lease)
	if err != nil {
		g.log.Warn("check task after agent failure", "lease", lease.ID, "task", lease.TaskID, "err", err)
		return nil
	}
	return g.leaseGone(l)
}

// agentCallFailed turns a call to lease's agent that got no usable answer
// (err) into its error: when the agent may be down, the manager checks the
// task, and a dead task's lease answers how it ended
// (*warmpool.LeaseEndedError); otherwise an *agentapi.CallError.
func (g *Gateway) agentCallFailed(ctx context.Context, lease warmpool.Lease, err error) error {
	ce := agentCallError(err)
	if errclass.AgentMayBeDown(ce) {
		if gone := g.checkTask(ctx, lease); gone != nil {
			return gone
		}
	}
	return ce
}

// agentFailed turns a failed agent call of a request into its answer. The
// client's own body problems come first (413, 400); otherwise, when the
// agent may be down, the manager checks the task and a dead task's lease
// answers 410.
func (g *Gateway) agentFailed(c *fiber.Ctx, id string, lease warmpool.Lease, err error) error {
	if br, _ := c.Locals(bodyLocal).(*bodyReader); br != nil && br.err != nil {
		return br.err
	}
	return errclass.Sandbox(id, g.agentCallFailed(c.UserContext(), lease, err))
}

// agentRefusal maps an agent's refusal of the fence (an answer with status)
// to its error, or nil for an answer that passes through unchanged: a stale
// generation means the lease is gone (410; the agent's client is evicted), a
// refused token (401) is the gateway's problem (502), a sandbox at its pids
// limit (503 pids_limit) is answered with its kill-all route and
// Retry-After. A 403 (code forbidden) is the sandbox's own refusal and is
// not inspected. Only 401, 409 and 503 are read; a streamed body is read (at
// most maxAgentErrorBody) and kept in resp for the client.
func (g *Gateway) agentRefusal(resp *fasthttp.Response, lease warmpool.Lease) error {
	status := resp.StatusCode()
	if status != http.StatusConflict && status != http.StatusUnauthorized && status != http.StatusServiceUnavailable {
		return nil
	}
	var body []byte
	if s := resp.BodyStream(); s != nil {
		b, _ := io.ReadAll(io.LimitReader(s, maxAgentErrorBody))
		body = b
		resp.SetBody(b) // closes the stream; the answer passes on from memory
	} else {
		body = resp.Body()
	}
	var eb agentapi.ErrorBody
	_ = json.Unmarshal(body, &eb)
	return g.refusalOf(lease, &agentapi.Error{Status: status, Code: eb.Error.Code, Message: eb.Error.Message})
}

// refusalOf returns ae when it refuses the fence (see agentRefusal), else
// nil; a stale generation evicts the agent's client.
func (g *Gateway) refusalOf(lease warmpool.Lease, ae *agentapi.Error) error {
	switch {
	case ae.Status == http.StatusConflict && ae.Code == agentapi.CodeStaleGeneration:
		g.agents.evict(lease.AgentURL)
		return ae
	case ae.Status == http.StatusUnauthorized,
		ae.Status == http.StatusServiceUnavailable && ae.Code == agentapi.CodePidsLimit:
		return ae
	}
	return nil
}

// maxAgentErrorBody bounds how much of a streamed agent error answer is read
// to inspect it.
const maxAgentErrorBody = 64 << 10

// agentCallError is the *agentapi.CallError of a failed call on the
// gateway's fasthttp clients, with fasthttp's errors translated here, at the
// edge, to the contract's (agentapi.ErrCallLimit, agentapi.ErrAnswerTooLarge,
// os.ErrDeadlineExceeded): errclass knows no HTTP library.
func agentCallError(err error) *agentapi.CallError {
	switch {
	case errors.Is(err, fasthttp.ErrNoFreeConns):
		err = fmt.Errorf("%w: %w", agentapi.ErrCallLimit, err)
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		err = fmt.Errorf("%w: %w", agentapi.ErrAnswerTooLarge, err)
	case errors.Is(err, fasthttp.ErrTimeout), errors.Is(err, fasthttp.ErrDialTimeout):
		err = fmt.Errorf("%w: %w", os.ErrDeadlineExceeded, err)
	}
	return &agentapi.CallError{Err: err}
}
