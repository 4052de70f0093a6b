package gateway

import (
	"fmt"
	"html"
	"strings"

	"github.com/gofiber/fiber/v2"
)

// allowTable knows, for every path template the app serves, which methods
// serve it: the Allow header of a 405 (RFC 9110 §15.5.6). It is built once,
// from the registered routes, and only read after: safe for concurrent use.
// A lookup walks the request path's segments (a map read each), so it costs
// the same whatever the number of routes.
type allowTable struct {
	methods []string // the app's methods, in its order: bit i of a mask is methods[i]
	root    *allowNode
	allow   map[uint16]string // mask -> Allow value, for every mask a template has
}

// allowNode is one path segment of the templates.
type allowNode struct {
	lit   map[string]*allowNode // literal segments, lowercase
	param *allowNode            // a ":name" segment
	wild  *allowNode            // a final "*": any rest of the path, empty included
	mask  uint16                // methods of the template ending here
}

// newAllowTable builds the table of routes, whose methods are among methods
// (the app's RequestMethods, at most 16). It fails on a route it cannot
// model: a template with wildcards (but a final "/*"), optional parameters
// or a parameter that is not a whole segment. Paths match as fiber matches them by default
// (case-insensitive, trailing slashes ignored).
func newAllowTable(methods []string, routes []fiber.Route) (*allowTable, error) {
	if len(methods) > 16 {
		return nil, fmt.Errorf("allow table: %d request methods; at most 16", len(methods))
	}
	t := &allowTable{methods: methods, root: &allowNode{}, allow: make(map[uint16]string)}
	index := make(map[string]int, len(methods))
	for i, m := range methods {
		index[m] = i
	}
	var leaves []*allowNode
	for _, r := range routes {
		i, ok := index[r.Method]
		if !ok {
			return nil, fmt.Errorf("allow table: route %s %s: method not among the app's methods", r.Method, r.Path)
		}
		n := t.root
		segs := splitPath(r.Path)
		for j, seg := range segs {
			switch {
			case seg == "*" && j == len(segs)-1:
				if n.wild == nil {
					n.wild = &allowNode{}
				}
				n = n.wild
			case strings.HasPrefix(seg, ":") && len(seg) > 1 && !strings.ContainsAny(seg[1:], ":*+?.-"):
				if n.param == nil {
					n.param = &allowNode{}
				}
				n = n.param
			case seg == "" || strings.ContainsAny(seg, ":*+?"):
				return nil, fmt.Errorf("allow table: route %s %s: segment %q is not a literal or a whole :param", r.Method, r.Path, seg)
			default:
				seg = strings.ToLower(seg)
				if n.lit == nil {
					n.lit = make(map[string]*allowNode)
				}
				next := n.lit[seg]
				if next == nil {
					next = &allowNode{}
					n.lit[seg] = next
				}
				n = next
			}
		}
		if n.mask == 0 {
			leaves = append(leaves, n)
		}
		n.mask |= 1 << i
	}
	for _, n := range leaves {
		t.allow[n.mask] = t.join(n.mask)
	}
	return t, nil
}

// splitPath returns the segments of path after its leading '/', without
// trailing slashes ("/" has none).
func splitPath(path string) []string {
	path = strings.TrimRight(path, "/")
	if path == "" {
		return nil
	}
	return strings.Split(strings.TrimPrefix(path, "/"), "/")
}

// join lists the methods of mask as an Allow value, in the app's order.
func (t *allowTable) join(mask uint16) string {
	var b strings.Builder
	for i, m := range t.methods {
		if mask&(1<<i) == 0 {
			continue
		}
		if b.Len() > 0 {
			b.WriteString(", ")
		}
		b.WriteString(m)
	}
	return b.String()
}

// lookup returns the Allow value of path: the methods of every template it
// matches. ok is false when no template matches (404).
func (t *allowTable) lookup(path string) (allow string, ok bool) {
	mask := t.root.match(splitPath(path))
	if mask == 0 {
		return "", false
	}
	if s, ok := t.allow[mask]; ok {
		return s, true
	}
	return t.join(mask), true // a path two templates match, e.g. a literal and a :param
}

// match returns the methods of the templates below n that segs match.
func (n *allowNode) match(segs []string) uint16 {
	var mask uint16
	if n.wild != nil {
		mask = n.wild.mask
	}
	if len(segs) == 0 {
		return mask | n.mask
	}
	if next := n.lit[strings.ToLower(segs[0])]; next != nil {
		mask |= next.match(segs[1:])
	}
	if n.param != nil && segs[0] != "" {
		mask |= n.param.match(segs[1:])
	}
	return mask
}

// registerNotMatched adds, after every route, the handler of requests that
// no route matched. Call it once, after the last route is registered.
func (g *Gateway) registerNotMatched() error {
	t, err := newAllowTable(g.app.Config().RequestMethods, g.app.GetRoutes(true))
	if err != nil {
		return err
	}
	g.app.Use(func(c *fiber.Ctx) error { return notMatched(c, g, t) })
	return nil
}

// notMatched answers a request that no route of its method matched: 405
// with Allow listing the methods of its path when another method serves it,
// 404 otherwise. These are fiber's own answers, which fiber would find by
// scanning the routes of every method; the error body is the gateway's one
// shape (writeError). Outside /v1 the caller may be a client of another API
// (E2B's SDK, whose routes the gateway serves in part, or ROCK's): the body
// also has E2B's top-level code and message (writeForeignError), and a 404
// says where Quarry's API is and what of E2B's is served.
func notMatched(c *fiber.Ctx, g *Gateway, t *allowTable) error {
	allow, ok := t.lookup(c.Path())
	write := g.writeError
	if !underV1(c.Path()) {
		write = g.writeForeignError
	}
	if !ok {
		msg := "Cannot " + c.Method() + " " + html.EscapeString(string(c.Request().URI().PathOriginal()))
		if !underV1(c.Path()) {
			msg += ": " + notQuarrysAPI
		}
		write(c, fiber.NewError(fiber.StatusNotFound, msg))
		return nil
	}
	write(c, fiber.ErrMethodNotAllowed)
	c.Set(fiber.HeaderAllow, allow) // after the error, which resets the answer's headers
	return nil
}

// notQuarrysAPI ends the message of a 404 outside /v1.
const notQuarrysAPI = "this is a Quarry gateway, whose API is under /v1/ (POST /v1/sandboxes creates a sandbox; " +
	"every route: GET /openapi.json, or docs/API.md); of E2B's API it serves the sandbox routes its SDK calls, " +
	"with E2B_API_URL and E2B_SANDBOX_URL set to this address (docs/E2B.md), and not this one"

// underV1 reports whether path is /v1 or below it, in any case (as fiber
// routes it).
func underV1(path string) bool {
	return len(path) >= 3 && strings.EqualFold(path[:3], "/v1") && (len(path) == 3 || path[3] == '/')
}
