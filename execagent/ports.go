package execagent

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

// portDialTimeout bounds the agent's connect to a port in the sandbox
// (loopback: it either answers at once or nothing listens).
const portDialTimeout = 5 * time.Second

// portIdleConns bounds the idle keep-alive connections kept per port.
const portIdleConns = 16

// portProxy relays RoutePort calls to 127.0.0.1:{port}. Its transport's idle
// connections are closed when the server's context ends (Close).
type portProxy struct {
	rp  *httputil.ReverseProxy
	log *slog.Logger
}

// newPortProxy builds the port proxy of s. Close (s.ctx) closes its idle
// connections.
func newPortProxy(s *Server) *portProxy {
	d := &net.Dialer{Timeout: portDialTimeout}
	tr := &http.Transport{
		DialContext:         d.DialContext,
		MaxIdleConnsPerHost: portIdleConns,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true, // bodies pass as the server sent them
	}
	context.AfterFunc(s.ctx, tr.CloseIdleConnections)
	p := &portProxy{log: s.log}
	p.rp = &httputil.ReverseProxy{
		Rewrite:       p.rewrite,
		Transport:     tr,
		FlushInterval: -1, // every write reaches the client at once: SSE, chunked
		ErrorHandler:  p.failed,
		ModifyResponse: func(r *http.Response) error {
			port, _ := r.Request.Context().Value(portKey{}).(int)
			r.Header.Set(agentapi.HeaderPortProxied, strconv.Itoa(port))
			return nil
		},
	}
	return p
}

// portKey is the context key of the target port of a proxied request.
type portKey struct{}

// handlePort answers RoutePort (any method).
func (s *Server) handlePort(p *portProxy) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		port, err := parsePort(r.PathValue("port"))
		if err != nil {
			return err
		}
		r = r.WithContext(context.WithValue(r.Context(), portKey{}, port))
		p.rp.ServeHTTP(w, r)
		return nil
	}
}

// parsePort parses a port number in 1–65535; anything else is a 400 naming
// the field.
func parsePort(v string) (int, error) {
	n, err := strconv.Atoi(v)
	if err != nil || n < agentapi.MinPort || n > agentapi.MaxPort || strings.TrimLeft(v, "0123456789") != "" {
		return 0, invalid("port", "must be a port number from %d to %d, got %q", agentapi.MinPort, agentapi.MaxPort, v)
	}
	return n, nil
}

// portStrippedHeaders are request headers meant for the agent, never for the
// program behind the port.
var portStrippedHeaders = [...]string{
	"Authorization", agentapi.HeaderGeneration, agentapi.HeaderCallID,
}

// rewrite points the outbound request at 127.0.0.1:{port}/{path...} with the
// query string as sent, and removes the agent's own headers. Host becomes
// the target's (servers such as Chromium's DevTools refuse other hosts).
func (p *portProxy) rewrite(pr *httputil.ProxyRequest) {
	port, _ := pr.In.Context().Value(portKey{}).(int)
	host := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	rest := targetPath(pr.In.URL.EscapedPath())
	pr.Out.URL = &url.URL{Scheme: "http", Host: host, RawQuery: pr.In.URL.RawQuery}
	if u, err := url.Parse(rest); err == nil && u.Path != "" {
		pr.Out.URL.Path, pr.Out.URL.RawPath = u.Path, u.RawPath
	} else {
		pr.Out.URL.Path = "/"
	}
	pr.Out.Host = ""
	for _, h := range portStrippedHeaders {
		pr.Out.Header.Del(h)
	}
}

// targetPath is the path behind /v1/ports/{port} of an escaped agent path:
// "/v1/ports/8000/a/b" → "/a/b", "/v1/ports/8000/" → "/".
func targetPath(escaped string) string {
	rest := strings.TrimPrefix(escaped, agentapi.PortPathPrefix)
	if i := strings.IndexByte(rest, '/'); i >= 0 {
		return rest[i:]
	}
	return "/"
}

// failed answers a proxied call that got no answer from the port: 502
// naming the port (nothing listening, or the program broke the connection).
// A client that left gets nothing.
func (p *portProxy) failed(w http.ResponseWriter, r *http.Request, err error) {
	if r.Context().Err() != nil {
		return
	}
	port, _ := r.Context().Value(portKey{}).(int)
	if errors.Is(err, syscall.ECONNREFUSED) {
		writeError(w, statusError(err, http.StatusBadGateway, agentapi.CodePortClosed,
			"nothing is listening on port %d in the sandbox", port))
		return
	}
	p.log.Warn("port proxy: no answer from the sandbox's port", "port", port, "err", err)
	writeError(w, statusError(err, http.StatusBadGateway, agentapi.CodePortClosed,
		"port %d in the sandbox gave no answer: %s", port, err.Error()))
}
