package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/fasthttp/websocket"
	"github.com/gofiber/fiber/v2"
	"github.com/valyala/fasthttp"

	"github.com/quarryhq/quarry/envs"
	"github.com/quarryhq/quarry/errclass"
	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/warmpool"
)

// sandboxAgent is the one way the gateway calls a sandbox's agent: it knows
// the lease's agent address (its pooled clients), token and generation, and
// offers every form a route needs: a request on the pooled fasthttp clients
// (buffered or streamed, the proxied routes and the port proxy), a JSON call
// (the env API, PTY creation), a WebSocket dial (PTYs, ports, ROCK's port
// forward), a typed agentapi.Client over net/http (checkpoint streams, ROCK's
// routes), and the cancel of a call. Its failures are mapped by the fence
// (fence.go). A value is for one request; it is not safe for concurrent use
// only in that it must not be modified.
type sandboxAgent struct {
	g     *Gateway
	id    string // the sandbox id, for errors
	lease warmpool.Lease
	ac    *agentClient
}

// agentOf returns the agent of sandbox id's (fenced) lease. It fails, with
// the sandbox's classified error, when the lease's agent URL is not one the
// gateway can call.
func (g *Gateway) agentOf(id string, lease warmpool.Lease) (sandboxAgent, error) {
	ac, err := g.agents.get(lease.AgentURL)
	if err != nil {
		return sandboxAgent{}, errclass.Sandbox(id, err)
	}
	return sandboxAgent{g: g, id: id, lease: lease, ac: ac}, nil
}

// authorize sets the agent's token and the lease generation on an agent
// request: the one place the gateway writes them (the WebSocket dial copies
// them from here; the typed client of agentapi sets the same headers from
// the same values, client).
func (a *sandboxAgent) authorize(h *fasthttp.RequestHeader) {
	var arr [128]byte
	auth := append(arr[:0], "Bearer "...)
	auth = append(auth, a.lease.AgentToken...)
	h.SetBytesV(fiber.HeaderAuthorization, auth)
	h.SetBytesV(agentapi.HeaderGeneration, strconv.AppendInt(arr[:0], a.lease.Generation, 10))
}

// client returns a typed client of the agent over the gateway's net/http
// transport to agents, for calls whose bodies stream through io.Reader
// (checkpoints) and ROCK's routes.
func (a *sandboxAgent) client() *agentapi.Client {
	return a.g.agentClient(a.lease)
}

// agentClient is client for a lease without a fenced sandboxAgent (ROCK's
// routes fence the lease themselves).
func (g *Gateway) agentClient(lease warmpool.Lease) *agentapi.Client {
	return agentapi.New(lease.AgentURL, lease.AgentToken, g.agentHTTP).WithGeneration(lease.Generation)
}

// unary sends req on the agent's keep-alive client and buffers the answer
// into resp, bounded by timeout.
func (a *sandboxAgent) unary(req *fasthttp.Request, resp *fasthttp.Response, timeout time.Duration) error {
	a.authorize(&req.Header)
	return a.ac.unary.DoTimeout(req, resp, timeout)
}

// stream sends req on the agent's stream client: req's body may be a
// stream, and resp's body streams (set resp.StreamBody). The connection is
// not reused: the client may leave before the end of the answer.
func (a *sandboxAgent) stream(req *fasthttp.Request, resp *fasthttp.Response) error {
	a.authorize(&req.Header)
	req.SetConnectionClose()
	return a.ac.stream.Do(req, resp)
}

// url returns the agent URL of path (which starts with "/").
func (a *sandboxAgent) url(path string) string { return a.ac.base + path }

// failed maps a call that got no usable answer (fence.go agentCallFailed).
func (a *sandboxAgent) failed(ctx context.Context, err error) error {
	return a.g.agentCallFailed(ctx, a.lease, err)
}

var _ envs.Agent = (*sandboxAgent)(nil)

// StartProcess calls POST /v1/processes.
func (a *sandboxAgent) StartProcess(ctx context.Context, req agentapi.ProcessStartRequest) (agentapi.ProcessInfo, error) {
	var info agentapi.ProcessInfo
	err := a.call(ctx, agentapi.RouteProcesses, req, &info)
	return info, err
}

// CallProcess calls POST /v1/processes/{id}/call.
func (a *sandboxAgent) CallProcess(ctx context.Context, id string, req agentapi.ProcessCallRequest) (agentapi.ProcessCallResult, error) {
	var res agentapi.ProcessCallResult
	err := a.call(ctx, agentapi.RouteProcesses+"/"+id+"/call", req, &res)
	return res, err
}

// call POSTs in to path and decodes a 2xx answer into out. The agent's
// refusals are *agentapi.Error; a failed call is an *agentapi.CallError, or
// the lease's end when the manager finds the task dead. The call is bounded
// by ctx's deadline (RequestTimeout without one).
func (a *sandboxAgent) call(ctx context.Context, path string, in, out any) error {
	body, err := json.Marshal(in)
	if err != nil {
		return fmt.Errorf("encode agent request: %w", err)
	}
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(a.url(path))
	req.Header.SetMethod(fiber.MethodPost)
	req.Header.SetContentType(fiber.MIMEApplicationJSON)
	req.SetBodyRaw(body)
	a.authorize(&req.Header)
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(a.g.cfg.RequestTimeout)
	}
	if err := a.ac.unary.DoDeadline(req, resp, deadline); err != nil {
		return a.failed(ctx, err)
	}
	if status := resp.StatusCode(); status < 200 || status > 299 {
		var eb agentapi.ErrorBody
		_ = json.Unmarshal(resp.Body(), &eb)
		ae := &agentapi.Error{Status: status, Code: eb.Error.Code, Message: eb.Error.Message}
		a.g.refusalOf(a.lease, ae) // a stale generation evicts the client
		return ae
	}
	if err := json.Unmarshal(resp.Body(), out); err != nil {
		return fmt.Errorf("decode agent answer to %s: %w", path, err)
	}
	return nil
}

// cancelCallTimeout bounds the call that cancels an agent call.
const cancelCallTimeout = 5 * time.Second

// cancel sends DELETE /v1/calls/{callID}: the agent ends the call callID.
func (a *sandboxAgent) cancel(callID string) error {
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(a.url("/v1/calls/" + callID))
	req.Header.SetMethod(fiber.MethodDelete)
	if err := a.unary(req, resp, cancelCallTimeout); err != nil {
		return err
	}
	if s := resp.StatusCode(); s != fiber.StatusNoContent && s != fiber.StatusNotFound {
		return fmt.Errorf("agent answered %d: %s", s, resp.Body())
	}
	return nil
}

// dialWS opens a WebSocket to the agent's path (and query) with header's
// extra headers and protocols offered; each message is bounded by
// maxMessage. The dial and the handshake are bounded by
// QUARRY_AGENT_DIAL_TIMEOUT. A refusal is the agent's answer
// (*agentapi.Error; a stale generation evicts the agent's client), a failed
// call an *agentapi.CallError or how the lease ended when its task is dead;
// each is classified for the sandbox.
func (a *sandboxAgent) dialWS(ctx context.Context, path string, header http.Header, protocols []string, maxMessage int64) (*websocket.Conn, error) {
	g := a.g
	u := "ws" + strings.TrimPrefix(a.ac.base, "http") + path
	h := header.Clone()
	if h == nil {
		h = http.Header{}
	}
	var creds fasthttp.RequestHeader
	a.authorize(&creds)
	creds.VisitAll(func(k, v []byte) { h.Set(string(k), string(v)) })
	d := *g.ws.dialer
	d.Subprotocols = protocols
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.cfg.AgentDialTimeout)
	defer cancel()
	conn, resp, err := d.DialContext(ctx, u, h)
	if err == nil {
		conn.SetReadLimit(maxMessage)
		return conn, nil
	}
	if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
		var ae *agentapi.Error
		errors.As(agentapi.CheckResponse(resp), &ae)
		_ = resp.Body.Close()
		g.refusalOf(a.lease, ae) // a stale generation evicts the client
		if resp.StatusCode == http.StatusGone {
			if gone := g.checkTask(ctx, a.lease); gone != nil {
				return nil, errclass.Sandbox(a.id, gone)
			}
		}
		return nil, errclass.Sandbox(a.id, ae)
	}
	return nil, errclass.Sandbox(a.id, a.failed(ctx, err))
}
