package gateway

import (
	"bytes"
	"net/http"
	"strconv"
	"time"

	"github.com/fasthttp/websocket"
	"github.com/gofiber/fiber/v2"
	"github.com/valyala/fasthttp"

	"github.com/quarryhq/quarry/errclass"
	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/internal/badinput"
	"github.com/quarryhq/quarry/warmpool"
)

// portMethods are the methods the port routes serve.
var portMethods = [...]string{
	fiber.MethodGet, fiber.MethodHead, fiber.MethodPost, fiber.MethodPut, fiber.MethodPatch, fiber.MethodDelete, fiber.MethodOptions,
}

// portRoutes lists the port routes: the proxy under every method, and the
// preview URL.
func (g *Gateway) portRoutes() []route {
	const path = "/v1/sandboxes/:id/ports/:port/*"
	// The preview route comes first: POST to a program's own path /url is
	// not reachable through the proxy (docs/API.md).
	rts := []route{{method: fiber.MethodPost, path: "/v1/sandboxes/:id/ports/:port/url", cred: credAPIKey, handler: g.createPreviewURL}}
	for _, m := range portMethods {
		rts = append(rts, route{method: m, path: path, cred: credPreviewOrKey, handler: g.proxyPort})
	}
	return rts
}

// portParam parses a port number in 1–65535 (400 naming the field
// otherwise).
func portParam(v string) (int, error) {
	n, err := strconv.Atoi(v)
	if err != nil || n < agentapi.MinPort || n > agentapi.MaxPort || v[0] == '+' || v[0] == '-' {
		return 0, badinput.New("port", "must be a port number from %d to %d, got %q", agentapi.MinPort, agentapi.MaxPort, v)
	}
	return n, nil
}

// portPathParams returns the sandbox id and the port of a port route.
func portPathParams(c *fiber.Ctx) (string, int, error) {
	id, err := pathID(c, "id")
	if err != nil {
		return "", 0, err
	}
	port, err := portParam(c.Params("port"))
	return id, port, err
}

// isPortPath reports whether an escaped path is under a port route, whose
// bodies take the upload limits (headerReceived). It does not allocate.
func isPortPath(uri []byte) bool {
	if i := bytes.IndexByte(uri, '?'); i >= 0 {
		uri = uri[:i]
	}
	rest, ok := bytes.CutPrefix(uri, []byte("/v1/sandboxes/"))
	if !ok {
		return isRockPortPath(uri)
	}
	i := bytes.IndexByte(rest, '/')
	return i > 0 && bytes.HasPrefix(rest[i:], []byte("/ports/"))
}

// proxyPort handles /v1/sandboxes/{id}/ports/{port}/{path...} (every method):
// the caller was admitted by a preview token or the API key
// (credPreviewOrKey), the lease is read (active, the caller's, and for a
// token the generation it was issued for), and the call is relayed to the
// agent's port proxy.
func (g *Gateway) proxyPort(c *fiber.Ctx) error {
	id, port, err := portPathParams(c)
	if err != nil {
		return err
	}
	lease, err := g.grantedLease(c, id)
	if err != nil {
		return err
	}
	setPreviewCookie(c, portPath(id, port))
	return g.relayPort(c, portCall{id: id, port: port, lease: lease, rest: "/" + c.Params("*")})
}

// setPreviewCookie sets, when the call's preview token came in the query,
// the HttpOnly cookie that carries it to the next calls under path.
func setPreviewCookie(c *fiber.Ctx, path string) {
	sg := sandboxGrantOf(c)
	if sg == nil || sg.preview == nil || !sg.preview.fromQuery {
		return
	}
	ck := fasthttp.AcquireCookie()
	defer fasthttp.ReleaseCookie(ck)
	ck.SetKey(previewParam)
	ck.SetValue(sg.preview.token)
	ck.SetPath(path)
	ck.SetHTTPOnly(true)
	ck.SetSameSite(fasthttp.CookieSameSiteStrictMode)
	ck.SetSecure(c.Protocol() == "https")
	ck.SetExpire(time.Unix(sg.preview.claims.Expires, 0))
	c.Response().Header.SetCookie(ck)
}

// portCall is one call to a sandbox port: where it goes and what of the
// client's request is Quarry's (not forwarded).
type portCall struct {
	id    string
	port  int
	lease warmpool.Lease
	rest  string // the escaped path behind the port, starting with "/"
	// dropHeaders and dropQuery name more of the client's headers and
	// query parameters that are not forwarded (ROCK's port selectors and
	// keys).
	dropHeaders []string
	dropQuery   []string
	// agentURI, when set, is the agent's own path and query the call goes
	// to, unchanged (E2B's envd routes, e2broute.go), instead of the
	// port's; its answer is the agent's.
	agentURI string
	// addHeaders are more headers (name, value pairs) for the agent.
	addHeaders []string
}

// hopHeaders are the hop-by-hop headers (RFC 9110 7.6.1) and the ones the
// gateway sets itself; none is forwarded.
var hopHeaders = []string{
	"Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authenticate", "Proxy-Authorization",
	"Te", "Trailer", "Transfer-Encoding", "Upgrade", "Host", "Content-Length", "Cookie",
	// The agent's token takes its place, so no program sees the caller's.
	fiber.HeaderAuthorization,
	agentapi.HeaderGeneration, agentapi.HeaderCallID,
}

// relayPort relays a fenced port call to the lease's agent: a WebSocket
// upgrade goes to relayPortWS; any other request streams its body (bounded
// by MaxUploadBody) and its answer (SSE and chunked bodies flow as they
// come).
func (g *Gateway) relayPort(c *fiber.Ctx, pc portCall) error {
	if pc.agentURI == "" && websocket.FastHTTPIsWebSocketUpgrade(c.Context()) {
		return g.relayPortWS(c, pc)
	}
	agent, err := g.agentOf(pc.id, pc.lease)
	if err != nil {
		return err
	}
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	uri := pc.agentURI
	if uri == "" {
		uri = agentPortURI(pc, c.Request().URI().QueryString())
	}
	req.SetRequestURI(agent.url(uri))
	req.Header.SetMethodBytes(c.Request().Header.Method())
	copyPortHeaders(&c.Request().Header, &req.Header, pc)
	for i := 0; i+1 < len(pc.addHeaders); i += 2 {
		req.Header.Set(pc.addHeaders[i], pc.addHeaders[i+1])
	}
	if cl := c.Request().Header.ContentLength(); cl > 0 || cl == -1 {
		br, err := openBody(c, g.cfg.MaxUploadBody)
		if err != nil {
			return err
		}
		req.SetBodyStream(br, cl)
	}
	up := fasthttp.AcquireResponse()
	up.StreamBody = true
	if err := agent.stream(req, up); err != nil {
		fasthttp.ReleaseResponse(up)
		return g.agentFailed(c, pc.id, pc.lease, err)
	}
	if len(up.Header.Peek(agentapi.HeaderPortProxied)) == 0 {
		// The agent's own answer (refused token, stale generation, bad
		// port, nothing listening), not the program's.
		if s := up.StatusCode(); s == http.StatusConflict || s == http.StatusUnauthorized {
			if err := g.agentRefusal(up, pc.lease); err != nil {
				fasthttp.ReleaseResponse(up)
				return errclass.Sandbox(pc.id, err)
			}
		}
	}
	resp := c.Response()
	// Keep the preview cookie set above: CopyTo replaces the headers.
	var cookie []byte
	if v := resp.Header.Peek(fiber.HeaderSetCookie); len(v) > 0 {
		cookie = append(cookie, v...)
	}
	up.Header.CopyTo(&resp.Header)
	resp.Header.Del(agentapi.HeaderPortProxied)
	resp.Header.ResetConnectionClose()
	if cookie != nil {
		resp.Header.Add(fiber.HeaderSetCookie, string(cookie))
	}
	if st := up.StatusCode(); st == http.StatusNoContent || st == http.StatusNotModified || st < 200 {
		// An answer without a body: none is written, not even a chunked
		// end, which the client would read as the start of the next answer.
		_ = up.CloseBodyStream()
		fasthttp.ReleaseResponse(up)
		return nil
	}
	size := up.Header.ContentLength()
	if size < 0 {
		size = -1
	}
	body := &upstreamBody{up: up}
	if s := up.BodyStream(); s != nil {
		body.src = s
	} else {
		body.src = bytes.NewReader(up.Body())
	}
	resp.SetBodyStream(body, size)
	resp.ImmediateHeaderFlush = true
	return nil
}

// agentPortURI is the agent's path and query of a port call: the query as
// sent but for Quarry's preview token and pc.dropQuery.
func agentPortURI(pc portCall, query []byte) string {
	b := make([]byte, 0, 64+len(pc.rest)+len(query))
	b = append(b, agentapi.PortPathPrefix...)
	b = strconv.AppendInt(b, int64(pc.port), 10)
	b = append(b, pc.rest...)
	first := true
	for len(query) > 0 {
		var kv []byte
		kv, query, _ = bytes.Cut(query, []byte("&"))
		k, _, _ := bytes.Cut(kv, []byte("="))
		if len(kv) == 0 || string(k) == previewParam || containsFold(pc.dropQuery, k) {
			continue
		}
		if first {
			b = append(b, '?')
			first = false
		} else {
			b = append(b, '&')
		}
		b = append(b, kv...)
	}
	return string(b)
}

// copyPortHeaders copies the client's headers to the agent's request, but
// for the hop-by-hop ones (and those the Connection header names), Quarry's
// own (Authorization, the preview cookie) and pc.dropHeaders.
func copyPortHeaders(from *fasthttp.RequestHeader, to *fasthttp.RequestHeader, pc portCall) {
	var conn [][]byte // header names listed in Connection
	for _, v := range bytes.Split(from.Peek(fiber.HeaderConnection), []byte(",")) {
		if v = bytes.TrimSpace(v); len(v) > 0 {
			conn = append(conn, v)
		}
	}
	from.VisitAll(func(k, v []byte) {
		switch {
		case containsFold(hopHeaders, k), containsFold(pc.dropHeaders, k):
		default:
			for _, c := range conn {
				if bytes.EqualFold(c, k) {
					return
				}
			}
			to.AddBytesKV(k, v)
		}
	})
	// Cookies but Quarry's.
	from.VisitAllCookie(func(k, v []byte) {
		if string(k) != previewParam {
			to.SetCookieBytesKV(k, v)
		}
	})
}

// containsFold reports whether names holds k, ignoring case.
func containsFold(names []string, k []byte) bool {
	for _, n := range names {
		if len(n) == len(k) && bytes.EqualFold([]byte(n), k) {
			return true
		}
	}
	return false
}
