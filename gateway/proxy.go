package gateway

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/gofiber/fiber/v2"
	"github.com/valyala/bytebufferpool"
	"github.com/valyala/fasthttp"

	"github.com/quarryhq/quarry/errclass"
	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/internal/badinput"
)

// proxyKind says how a sandbox call travels to the agent and back.
type proxyKind uint8

const (
	// kindJSON: a JSON body (bounded by MaxJSONBody, buffered), a buffered
	// answer, bounded by RequestTimeout.
	kindJSON proxyKind = iota + 1
	// kindCommand: like kindJSON but bounded by the body's timeout_ms plus a
	// margin; with Accept: text/event-stream the answer is streamed.
	kindCommand
	// kindOutput: a buffered page, or a stream with Accept:
	// text/event-stream or follow=true.
	kindOutput
	// kindDownload: the answer is streamed (files, archives).
	kindDownload
	// kindUpload: the request body is streamed (bounded by MaxUploadBody).
	kindUpload
)

// proxyRoute is a sandbox route's agent side: its kind and the agent path
// template, e.g. ["/v1/sessions/", ":sid", "/run"].
type proxyRoute struct {
	kind  proxyKind
	parts []string
}

// newProxyRoute derives the agent path from a gateway route template:
// "/v1/sandboxes/:id/sessions/:sid/run" → "/v1/sessions/{sid}/run".
func newProxyRoute(gatewayPath string, kind proxyKind) *proxyRoute {
	rest := strings.TrimPrefix(gatewayPath, "/v1/sandboxes/:id")
	rt := &proxyRoute{kind: kind}
	lit := "/v1"
	for _, seg := range strings.Split(strings.TrimPrefix(rest, "/"), "/") {
		if strings.HasPrefix(seg, ":") {
			rt.parts = append(rt.parts, lit+"/", seg)
			lit = ""
			continue
		}
		lit += "/" + seg
	}
	if lit != "" {
		rt.parts = append(rt.parts, lit)
	}
	return rt
}

func (g *Gateway) proxyHandler(rt *proxyRoute) fiber.Handler {
	return func(c *fiber.Ctx) error { return g.forward(c, rt) }
}

// forward proxies one sandbox call: one lease read (active, unexpired,
// owned by the caller), then the call to the agent with its token and the
// lease generation. Agent answers pass through unchanged, except a stale
// generation (410) and a refused token (401 → 502); an agent's 410 names
// the lease's end when the manager knows it. A streamed event stream that
// breaks ends with an error event (passStream). A failed call asks the
// manager to check the task: a dead task's lease answers 410.
func (g *Gateway) forward(c *fiber.Ctx, rt *proxyRoute) error {
	id, err := pathID(c, "id")
	if err != nil {
		return err
	}
	lease, err := g.activeLease(c, id)
	if err != nil {
		return err
	}
	agent, err := g.agentOf(id, lease)
	if err != nil {
		return err
	}
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	if err := buildAgentRequest(c, rt, agent.ac.base, req); err != nil {
		return err
	}

	stream := false
	command := false // a command call or a followed output: cancelled when the client leaves
	timeout := g.cfg.RequestTimeout
	switch rt.kind {
	case kindUpload:
		br, err := openBody(c, g.cfg.MaxUploadBody)
		if err != nil {
			return err
		}
		size := c.Request().Header.ContentLength()
		if size < 0 {
			size = -1
		}
		req.SetBodyStream(br, size)
		stream = true
	case kindDownload:
		stream = true
	default:
		if c.Request().Header.ContentLength() != 0 {
			bb, err := readBody(c, g.cfg.MaxJSONBody)
			if err != nil {
				return err
			}
			defer bytebufferpool.Put(bb)
			// Malformed JSON gets the one message of every route, not the
			// agent's own.
			if err := badinput.CheckJSON(bb.B); err != nil {
				return err
			}
			req.SetBodyRaw(bb.B)
		}
		sse := bytes.Contains(c.Request().Header.Peek(fiber.HeaderAccept), []byte("text/event-stream"))
		switch {
		case rt.kind == kindCommand && sse:
			stream, command = true, true
		case rt.kind == kindCommand:
			timeout = g.commandTimeout(req.Body())
			command = true
		case rt.kind == kindOutput:
			// As the agent decides: follow (any strconv.ParseBool form)
			// overrides Accept; a malformed one is the agent's 400.
			stream = sse
			if v := c.Context().QueryArgs().Peek("follow"); len(v) > 0 {
				if b, err := strconv.ParseBool(string(v)); err == nil {
					stream = b
				}
			}
			command = stream
		}
	}
	var leave *leaveWatch // nil: the client's leaving is noticed by a failed write or read
	if command {
		callID := newCallID()
		req.Header.Set(agentapi.HeaderCallID, callID)
		leave = g.cancelIfClientLeaves(c, &agent, callID)
	}

	resp := c.Response()
	if stream {
		// A stream's connection is not reused (stream): the client may leave
		// before the end, and what is left unread must not reach the next call.
		up := fasthttp.AcquireResponse()
		up.StreamBody = true
		if err := agent.stream(req, up); err != nil {
			leave.stop()
			fasthttp.ReleaseResponse(up)
			return g.agentFailed(c, id, lease, err)
		}
		// The watch goes on while the answer streams: the body stops it.
		g.passStream(context.WithoutCancel(c.UserContext()), id, lease, up, resp, leave)
	} else {
		err := agent.unary(req, resp, timeout)
		leave.stop()
		if err != nil {
			return g.agentFailed(c, id, lease, err)
		}
	}
	// The agent's Connection: close concerns the gateway's connection to it,
	// not the client's.
	resp.Header.ResetConnectionClose()
	if err := g.agentRefusal(resp, lease); err != nil {
		return errclass.Sandbox(id, err)
	}
	if resp.StatusCode() == http.StatusGone {
		// The agent ended the call because it is shutting down: say how
		// the lease ended when the manager knows.
		if gone := g.checkTask(c.UserContext(), lease); gone != nil {
			return errclass.Sandbox(id, gone)
		}
	}
	if stream {
		resp.ImmediateHeaderFlush = true
	}
	return nil
}

// buildAgentRequest fills req with the agent URL of the call (path from the
// route, query string as sent) and the client's Content-Type and Accept; the
// agent's credentials are the sandboxAgent's to set.
func buildAgentRequest(c *fiber.Ctx, rt *proxyRoute, base string, req *fasthttp.Request) error {
	var arr [256]byte
	uri := append(arr[:0], base...)
	for _, p := range rt.parts {
		if !strings.HasPrefix(p, ":") {
			uri = append(uri, p...)
			continue
		}
		name := p[1:]
		v := c.Params(name)
		if err := checkID(v); err != nil {
			return badinput.New(name, "%s", err.Error())
		}
		uri = append(uri, v...)
	}
	if q := c.Request().URI().QueryString(); len(q) > 0 {
		uri = append(uri, '?')
		uri = append(uri, q...)
	}
	req.SetRequestURIBytes(uri)
	req.Header.SetMethodBytes(c.Request().Header.Method())

	if ct := c.Request().Header.ContentType(); len(ct) > 0 {
		req.Header.SetContentTypeBytes(ct)
	}
	if a := c.Request().Header.Peek(fiber.HeaderAccept); len(a) > 0 {
		req.Header.SetBytesV(fiber.HeaderAccept, a)
	}
	return nil
}

// commandTimeout bounds an exec or session run call: the body's timeout_ms
// (or CommandTimeout) plus TimeoutMargin, at most MaxCommandTimeout. A body
// the agent will refuse gets the default; the agent names the bad field.
func (g *Gateway) commandTimeout(body []byte) time.Duration {
	var t struct {
		TimeoutMS int64 `json:"timeout_ms"`
	}
	d := g.cfg.CommandTimeout
	if mayNameTimeout(body) && json.Unmarshal(body, &t) == nil && t.TimeoutMS > 0 {
		if t.TimeoutMS >= g.cfg.MaxCommandTimeout.Milliseconds() {
			return g.cfg.MaxCommandTimeout
		}
		d = time.Duration(t.TimeoutMS) * time.Millisecond
	}
	return min(d+g.cfg.TimeoutMargin, g.cfg.MaxCommandTimeout)
}

// mayNameTimeout reports whether body may hold timeout_ms as the agent's
// decoder reads it: the key in any case (Go's decoder matches names
// case-insensitively, folding some non-ASCII letters too), or spelled with
// \u escapes. A body that cannot is not decoded: a whole decode of every
// run's body was 2% of the gateway's CPU under quarrybench's session runs.
func mayNameTimeout(body []byte) bool {
	const key = "timeout_ms"
	for i, b := range body {
		switch {
		case b == '\\' || b >= utf8.RuneSelf:
			return true
		case b|0x20 == 't' && len(body)-i >= len(key) && asciiEqualFold(body[i:i+len(key)], key):
			return true
		}
	}
	return false
}

// asciiEqualFold reports whether b is s, ASCII letters in either case.
func asciiEqualFold(b []byte, s string) bool {
	for i := range b {
		if b[i]|0x20 != s[i]|0x20 {
			return false
		}
	}
	return true
}

// Call ids (agentapi.HeaderCallID): a random prefix per process (96 bits:
// no two gateways share one) and a counter, so that no two calls of any
// gateway share an id; cheaper than 12 random bytes per call.
var (
	callIDPrefix = func() string {
		var b [12]byte
		_, _ = rand.Read(b[:])
		return hex.EncodeToString(b[:]) + "-"
	}()
	callIDCount atomic.Uint64
)

// newCallID returns an agentapi.HeaderCallID value no other call of any
// gateway has.
func newCallID() string {
	return callIDPrefix + strconv.FormatUint(callIDCount.Add(1), 36)
}
