package gateway

import (
	"net/http"

	"github.com/gofiber/fiber/v2"
	"github.com/valyala/fasthttp"

	"github.com/quarryhq/quarry/api"
	"github.com/quarryhq/quarry/e2bcompat"
	"github.com/quarryhq/quarry/errclass"
	"github.com/quarryhq/quarry/internal/badinput"
)

// E2B's data plane (docs/ARCHITECTURE.md, "E2B's routes"): a request for a
// sandbox — by the E2b-Sandbox-Id and E2b-Sandbox-Port headers on any host,
// or by a Host whose first label is "{port}-{id}" — is routed here before
// the route table, and never served as a Quarry route. Port 49983 (envd) is
// forwarded to the lease's agent unchanged; any other port goes to the port
// proxy.

// e2bTargetLocal is the fiber Locals key of a routed request's
// *e2bcompat.Target.
const e2bTargetLocal = "quarry.e2bTarget"

// headerEnvdUser carries, to the agent, the user E2B's SDK names with
// Authorization: Basic base64("user:").
const headerEnvdUser = "X-Quarry-Envd-User"

// Metrics labels of routed requests.
const (
	metricsEnvd = "e2b:envd"
	metricsPort = "e2b:port"
)

// e2bDropHeaders are the data plane's headers that are Quarry's or E2B's
// own, never forwarded: the access token, the user header that only the
// gateway sets, and the routing headers.
var e2bDropHeaders = []string{e2bcompat.HeaderAccessToken, headerEnvdUser, e2bcompat.HeaderSandboxID, e2bcompat.HeaderSandboxPort}

// sandboxRoute of a request: its target, whether it is routed, and the
// error of routing headers that are bad. It allocates only for a routed
// request.
func sandboxRoute(h *fasthttp.RequestHeader) (e2bcompat.Target, bool, error) {
	return e2bcompat.RouteOf(h.Host(), h.Peek(e2bcompat.HeaderSandboxID), h.Peek(e2bcompat.HeaderSandboxPort))
}

// routeSandbox is the middleware, before the route table, that serves a
// request routed to a sandbox: its credential (credE2BEnvd for envd's port,
// credE2BPort for any other) is checked, the lease fenced, and the call
// forwarded. Its refusals are E2B's data-plane errors (writeProxyError).
// Any other request goes on to the routes.
func (g *Gateway) routeSandbox(c *fiber.Ctx) error {
	t, ok, err := sandboxRoute(&c.Request().Header)
	if !ok {
		return c.Next()
	}
	cred, label, serve := credE2BPort, metricsPort, g.serveE2BPort
	if t.Port == e2bcompat.EnvdPort {
		cred, label, serve = credE2BEnvd, metricsEnvd, g.forwardEnvd
	}
	c.Locals(metricsPathLocal, label)
	c.Locals(e2bTargetLocal, &t)
	if err == nil {
		err = g.admitSandbox(c, cred, t)
	}
	if err == nil {
		err = serve(c, t)
	}
	if err != nil {
		g.writeProxyError(c, err)
	}
	return nil
}

// forwardEnvd forwards a call to envd's port to the lease's agent: method,
// path, query and body unchanged, both ways streamed, with the agent's
// token and the lease generation (sandboxAgent), without the client's
// Authorization and X-Access-Token; the user of Authorization: Basic
// base64("user:") goes as X-Quarry-Envd-User. The agent's own API, under
// /v1/ (which envd has not), is refused: it is the gateway's to call.
func (g *Gateway) forwardEnvd(c *fiber.Ctx, t e2bcompat.Target) error {
	if underV1(c.Path()) {
		return errclass.New(http.StatusForbidden, api.CodeForbidden,
			"the agent's own API (/v1/...) is not served on envd's port: use Quarry's API under /v1/sandboxes/"+t.ID)
	}
	lease, err := g.grantedLease(c, t.ID)
	if err != nil {
		return err
	}
	uri := c.Request().URI()
	agentURI := string(uri.PathOriginal()) // as sent, escapes kept; never an absolute-form URI's scheme and host
	if q := uri.QueryString(); len(q) > 0 {
		agentURI += "?" + string(q)
	}
	pc := portCall{id: t.ID, port: t.Port, lease: lease, dropHeaders: e2bDropHeaders, agentURI: agentURI}
	if user, ok := basicUser(c.Request().Header.Peek(fiber.HeaderAuthorization)); ok {
		pc.addHeaders = []string{headerEnvdUser, user}
	}
	return g.relayPort(c, pc)
}

// serveE2BPort relays a call to any other port of the sandbox through the
// port proxy, as /v1/sandboxes/{id}/ports/{port}/... does. A preview token
// sent in the query of a host-routed call is kept in a cookie for the
// host's every path.
func (g *Gateway) serveE2BPort(c *fiber.Ctx, t e2bcompat.Target) error {
	lease, err := g.grantedLease(c, t.ID)
	if err != nil {
		return err
	}
	if t.ByHost {
		setPreviewCookie(c, "/")
	}
	return g.relayPort(c, portCall{id: t.ID, port: t.Port, lease: lease,
		rest: string(c.Request().URI().PathOriginal()), dropHeaders: e2bDropHeaders})
}

// basicUser returns the user of an Authorization: Basic header, as E2B's
// SDK names the user of an envd call (base64("user:")): a printable name,
// or ok false.
func basicUser(v []byte) (string, bool) {
	user, _, ok := basicCredentials(v)
	if !ok || len(user) == 0 || !badinput.Printable(string(user)) {
		return "", false
	}
	return string(user), true
}

// isSandboxRouted reports whether a request is for a sandbox's data plane,
// whose bodies take the upload limits (headerReceived).
func isSandboxRouted(h *fasthttp.RequestHeader) bool {
	_, ok, _ := sandboxRoute(h)
	return ok
}
