package execagent

import (
	"context"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"time"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

// The model relay's forwarder. A sandbox whose network cannot reach the
// gateway (a Docker container on a bridge: its 127.0.0.1 is its own) gets
// the gateway's relay as a Unix socket mounted by its provider
// (Config.RelaySocket). The agent then serves the relay's sandbox routes,
// /v1/sandboxes/{id}/model/v1/..., on its own address, which every program
// in the sandbox reaches at 127.0.0.1, and forwards them to that socket
// unchanged: the relay token they carry is checked by the gateway, not
// here, and the gateway's socket serves nothing but those routes. No path
// from the sandbox to the gateway's network is needed.

// newRelayForwarder returns the handler that forwards relay calls to the
// gateway's Unix socket at path. Streams (server-sent events) pass as they
// arrive; a caller that goes away cancels the forwarded call, which the
// gateway takes as the agent leaving.
func newRelayForwarder(path string) http.Handler {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		},
		MaxIdleConnsPerHost:   16,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: 0, // a relay call waits for the trainer (the gateway bounds it)
	}
	target := &url.URL{Scheme: "http", Host: "quarry-relay"}
	return &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(target)
			r.Out.Host = target.Host
		},
		Transport:     tr,
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if r.Context().Err() != nil {
				return // the caller left
			}
			writeError(w, statusError(err, http.StatusBadGateway, agentapi.CodeAgentUnreachable,
				"the gateway's model relay is unreachable from the sandbox's agent: %s", err.Error()))
		},
	}
}
