package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/valyala/bytebufferpool"

	"github.com/quarryhq/quarry/api"
	"github.com/quarryhq/quarry/errclass"
	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/internal/badinput"
	"github.com/quarryhq/quarry/modelservice"
	"github.com/quarryhq/quarry/warmpool"
)

// Model relay routes (docs/MODELSERVICE.md). The sandbox side authenticates
// with the lease's relay token, the trainer side with an API key.

// headerRequestID carries the relay's request id on answers to agents.
const headerRequestID = "X-Quarry-Request-Id"

// disconnectPoll is how often a waiting relay call checks whether its agent
// is still connected.
const disconnectPoll = 250 * time.Millisecond

// errRelayOff answers the relay routes of a gateway built without a model
// relay.
var errRelayOff = errclass.New(http.StatusNotFound, agentapi.CodeNotFound,
	"the model relay is not configured on this gateway")

// errAgentLeft is the cause of a relay call's context when its agent
// disconnected.
var errAgentLeft = errors.New("the agent disconnected")

// relayLease authenticates a sandbox-side relay call by its relay token and
// returns its active lease (credRelayToken's check).
func (g *Gateway) relayLease(c *fiber.Ctx) (warmpool.Lease, error) {
	if g.model == nil {
		return warmpool.Lease{}, errRelayOff
	}
	id, err := pathID(c, "id")
	if err != nil {
		return warmpool.Lease{}, err
	}
	token, err := relayToken(c)
	if err != nil {
		return warmpool.Lease{}, err
	}
	ctx, cancel := context.WithTimeout(c.UserContext(), g.cfg.ManagerTimeout)
	defer cancel()
	lease, err := g.model.Lease(ctx, id, token)
	if err != nil {
		return lease, errclass.Sandbox(id, err)
	}
	if gone := g.leaseGone(lease); gone != nil {
		return lease, errclass.Sandbox(id, gone)
	}
	return lease, nil
}

// modelCall handles POST /v1/sandboxes/{id}/model/v1/{route}: the agent's
// OpenAI call, queued for the trainer (or forwarded to the upstream) and
// answered when the answer arrives.
func (g *Gateway) modelCall(route string) fiber.Handler {
	return func(c *fiber.Ctx) error {
		lease := relayLeaseOf(c)
		bb, err := readBody(c, g.cfg.MaxJSONBody)
		if err != nil {
			return err
		}
		body := slices.Clone(bb.B)
		bytebufferpool.Put(bb)
		upstream, key, err := g.model.Upstream(lease)
		if err != nil {
			return errclass.Sandbox(lease.ID, err)
		}
		if upstream != "" {
			ctx, stop := g.watchAgent(c, false)
			defer stop()
			return g.forwardModel(c, ctx, lease, fiber.MethodPost, route, body, upstream, key)
		}
		ctx, stop := g.watchAgent(c, true)
		defer stop()
		resp, rid, err := g.model.Relay(ctx, lease, route, body)
		if err != nil {
			if context.Cause(ctx) == errAgentLeft {
				return agentLeft(c)
			}
			return errclass.Sandbox(lease.ID, err)
		}
		c.Set(headerRequestID, rid)
		c.Set(fiber.HeaderContentType, resp.ContentType)
		if resp.ContentType == modelservice.ContentTypeSSE {
			c.Set(fiber.HeaderCacheControl, "no-cache")
		}
		c.Status(resp.Status)
		c.Response().SetBodyRaw(resp.Body)
		return nil
	}
}

// agentLeft ends a relay call whose agent went away: nobody reads the
// answer, and the connection is closed.
func agentLeft(c *fiber.Ctx) error {
	c.Status(499)
	c.Response().SetConnectionClose()
	return nil
}

// modelModels handles GET /v1/sandboxes/{id}/model/v1/models.
func (g *Gateway) modelModels(c *fiber.Ctx) error {
	lease := relayLeaseOf(c)
	upstream, key, err := g.model.Upstream(lease)
	if err != nil {
		return errclass.Sandbox(lease.ID, err)
	}
	if upstream != "" {
		ctx, stop := g.watchAgent(c, false)
		defer stop()
		return g.forwardModel(c, ctx, lease, fiber.MethodGet, "models", nil, upstream, key)
	}
	c.Set(fiber.HeaderContentType, fiber.MIMEApplicationJSON)
	return c.Send(g.model.Models(lease))
}

// forwardModel streams an upstream's answer to the agent as it arrives,
// flushing every read, and records the exchange when the stream ends.
func (g *Gateway) forwardModel(c *fiber.Ctx, ctx context.Context, lease warmpool.Lease, method, route string, body []byte, upstream, key string) error {
	fw, err := g.model.Forward(ctx, lease, method, route, body, upstream, key)
	if err != nil {
		if context.Cause(ctx) == errAgentLeft {
			return agentLeft(c)
		}
		return errclass.Sandbox(lease.ID, err)
	}
	c.Status(fw.Status)
	if fw.ContentType != "" {
		c.Set(fiber.HeaderContentType, fw.ContentType)
	}
	c.Set(headerRequestID, fw.ID())
	c.Response().ImmediateHeaderFlush = true
	c.Context().SetBodyStreamWriter(func(w *bufio.Writer) {
		buf := make([]byte, 32<<10)
		var werr error
		for {
			n, rerr := fw.Read(buf)
			if n > 0 {
				if _, werr = w.Write(buf[:n]); werr == nil {
					werr = w.Flush()
				}
				if werr != nil {
					break
				}
			}
			if rerr != nil {
				break
			}
		}
		fw.Finish(werr)
	})
	return nil
}

// watchAgent returns a context that ends (with cause errAgentLeft) when
// the client of c closes its connection or, with drain, (with cause
// modelservice.ErrShuttingDown) when Shutdown starts; and a stop function
// that ends the watch and waits for it.
func (g *Gateway) watchAgent(c *fiber.Ctx, drain bool) (context.Context, func()) {
	var draining <-chan struct{} // nil: never
	if drain {
		draining = g.draining
	}
	ctx, cancel := context.WithCancelCause(c.UserContext())
	conn := c.Context().Conn()
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(disconnectPoll)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-draining:
				cancel(modelservice.ErrShuttingDown)
				return
			case <-t.C:
				if peerClosed(conn) {
					cancel(errAgentLeft)
					return
				}
			}
		}
	}()
	return ctx, func() {
		close(done)
		wg.Wait()
		cancel(nil)
	}
}

// modelRequest describes r as trainers see it.
func modelRequest(r modelservice.Request) api.ModelRequest {
	labels := r.Labels
	if labels == nil {
		labels = map[string]string{}
	}
	return api.ModelRequest{ID: r.ID, SandboxID: r.LeaseID, Pool: r.Pool, Labels: labels, Route: r.Route,
		Stream: r.Stream, Attempt: r.Attempt, ReceivedAt: r.ReceivedAt, Deadline: r.Deadline}
}

// appendClaimed writes r as an api.ClaimedRequest, its "body" spliced in
// verbatim.
func appendClaimed(out *bytebufferpool.ByteBuffer, r modelservice.Request) error {
	return appendWithBody(out, api.ClaimedRequest{ModelRequest: modelRequest(r)}, "body", r.Body)
}

// claimModelRequests handles GET /v1/model/requests?wait_ms=&max=&pool=&label=k=v.
func (g *Gateway) claimModelRequests(c *fiber.Ctx) error {
	if g.model == nil {
		return errRelayOff
	}
	args := c.Context().QueryArgs()
	cfg := g.model.Config()
	maxN, err := queryInt(args, "max", 1, 1, int64(cfg.MaxClaim))
	if err != nil {
		return err
	}
	wait, err := queryInt(args, "wait_ms", 0, 0, cfg.MaxWait.Milliseconds())
	if err != nil {
		return err
	}
	p := modelservice.ClaimParams{Max: int(maxN), Wait: time.Duration(wait) * time.Millisecond}
	if s := string(args.Peek("pool")); s != "" {
		if err := checkName(s); err != nil {
			return badinput.New("pool", "%s", err.Error())
		}
		p.Pool = s
	}
	labels, err := labelFilter(args.PeekMulti("label"))
	if err != nil {
		return err
	}
	p.Labels = labels
	ctx, stop := g.watchAgent(c, true)
	defer stop()
	reqs, err := g.model.Claim(ctx, ownerOf(c), p)
	if err != nil {
		return err
	}
	// api.ClaimedRequests, written by hand to splice in the bodies.
	out := bytebufferpool.Get()
	defer bytebufferpool.Put(out)
	out.WriteString(`{"requests":[`)
	for i, r := range reqs {
		if i > 0 {
			out.WriteByte(',')
		}
		if err := appendClaimed(out, r); err != nil {
			return err
		}
	}
	out.WriteString("]}")
	c.Set(fiber.HeaderContentType, fiber.MIMEApplicationJSON)
	return sendCopy(c, out.B)
}

// appendWithBody writes meta as a JSON object with one more member, key,
// whose value is body verbatim when it is JSON (else a JSON string).
func appendWithBody(out *bytebufferpool.ByteBuffer, meta any, key string, body []byte) error {
	b, err := json.Marshal(meta)
	if err != nil {
		return err
	}
	out.Write(b[:len(b)-1])
	if len(b) > 2 {
		out.WriteByte(',')
	}
	kb, _ := json.Marshal(key)
	out.Write(kb)
	out.WriteByte(':')
	if len(bytes.TrimSpace(body)) > 0 && json.Valid(body) {
		out.Write(body)
	} else {
		sb, _ := json.Marshal(string(body))
		out.Write(sb)
	}
	out.WriteByte('}')
	return nil
}

// answerModelRequest handles POST /v1/model/requests/{rid}/response?status=.
func (g *Gateway) answerModelRequest(c *fiber.Ctx) error {
	if g.model == nil {
		return errRelayOff
	}
	rid, err := pathID(c, "rid")
	if err != nil {
		return err
	}
	status := http.StatusOK
	if s := c.Context().QueryArgs().Peek("status"); len(s) > 0 {
		if status, err = strconv.Atoi(string(s)); err != nil {
			return badinput.New("status", "must be an HTTP status, got %q", s)
		}
	}
	ct := string(c.Request().Header.ContentType())
	if i := bytes.IndexByte([]byte(ct), ';'); i >= 0 {
		ct = ct[:i]
	}
	ct = string(bytes.TrimSpace([]byte(ct)))
	if ct == "" || ct == fiber.MIMEApplicationForm {
		// As every JSON route: no type, or curl -d's default, is JSON.
		ct = modelservice.ContentTypeJSON
	}
	bb, err := readBody(c, g.cfg.MaxJSONBody)
	if err != nil {
		return err
	}
	body := slices.Clone(bb.B)
	bytebufferpool.Put(bb)
	ctx, cancel := context.WithTimeout(c.UserContext(), g.cfg.ManagerTimeout)
	defer cancel()
	if err := g.model.Respond(ctx, ownerOf(c), rid, status, ct, body); err != nil {
		return err
	}
	return c.JSON(fiber.Map{"id": rid, "state": modelservice.StateAnswered})
}

// modelTranscript handles GET /v1/sandboxes/{id}/model/transcript?after=&limit=.
func (g *Gateway) modelTranscript(c *fiber.Ctx) error {
	if g.model == nil {
		return errRelayOff
	}
	id, err := pathID(c, "id")
	if err != nil {
		return err
	}
	args := c.Context().QueryArgs()
	limit, err := queryInt(args, "limit", 0, 1, modelservice.MaxTranscriptLimit)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(c.UserContext(), g.cfg.ManagerTimeout)
	defer cancel()
	owner := ownerOf(c)
	if _, err := g.mgr.Get(ctx, id, owner); err != nil {
		return errclass.Sandbox(id, err)
	}
	page, more, err := g.model.Transcript(ctx, id, owner, string(args.Peek("after")), int(limit))
	if err != nil {
		return err
	}
	// api.Transcript, written by hand to splice in the bodies.
	out := bytebufferpool.Get()
	defer bytebufferpool.Put(out)
	out.WriteString(`{"sandbox_id":`)
	idJSON, _ := json.Marshal(id)
	out.Write(idJSON)
	out.WriteString(`,"exchanges":[`)
	for i, ex := range page {
		if i > 0 {
			out.WriteByte(',')
		}
		if err := appendExchange(out, ex); err != nil {
			return err
		}
	}
	out.WriteString("]")
	if more && len(page) > 0 {
		out.WriteString(`,"next_after":`)
		nb, _ := json.Marshal(page[len(page)-1].ID)
		out.Write(nb)
	}
	out.WriteString("}")
	c.Set(fiber.HeaderContentType, fiber.MIMEApplicationJSON)
	return sendCopy(c, out.B)
}

// appendExchange writes one transcript entry, an api.Exchange whose
// "request" and "response.body" are spliced in verbatim.
func appendExchange(out *bytebufferpool.ByteBuffer, ex modelservice.Exchange) error {
	w := api.Exchange{ModelRequest: modelRequest(ex.Request), State: string(ex.State), Reason: ex.Reason,
		Upstream: ex.Upstream, ClaimedAt: ex.ClaimedAt, EndedAt: ex.EndedAt, Truncated: ex.Truncated}
	if !ex.EndedAt.IsZero() {
		ms := ex.EndedAt.Sub(ex.ReceivedAt).Milliseconds()
		w.LatencyMS = &ms
	}
	var tail bytebufferpool.ByteBuffer
	if ex.Response != nil {
		r := ex.Response
		tail.WriteString(`,"response":`)
		if err := appendWithBody(&tail, api.ExchangeResponse{Status: r.Status, ContentType: r.ContentType, AnsweredAt: r.AnsweredAt}, "body", r.Body); err != nil {
			return err
		}
	}
	var head bytebufferpool.ByteBuffer
	if err := appendWithBody(&head, w, "request", ex.Body); err != nil {
		return err
	}
	out.Write(head.B[:len(head.B)-1])
	out.Write(tail.B)
	out.WriteByte('}')
	return nil
}

// sendCopy answers with a copy of b. fiber's Send keeps b itself, and the
// server writes it only after the handler returned — after a deferred
// bytebufferpool.Put has handed b to another request.
func sendCopy(c *fiber.Ctx, b []byte) error {
	c.Response().SetBody(b)
	return nil
}
