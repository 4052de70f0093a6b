package agentapi

import "github.com/quarryhq/quarry/api"

// RoutePort is the agent's reverse proxy into the sandbox: any method on
// /v1/ports/{port}/{path...} is relayed to http://127.0.0.1:{port}/{path...}
// (query string as sent; streamed bodies both ways, SSE, chunked, and
// WebSocket upgrades). The agent's Authorization and its Quarry headers are
// not forwarded. A port outside 1–65535 is 400 (CodeBadRequest); nothing
// listening on the port is 502 CodePortClosed, naming the port.
const RoutePort = "/v1/ports/{port}/{path...}"

// PortPathPrefix is the prefix of RoutePort's paths.
const PortPathPrefix = "/v1/ports/"

// CodePortClosed is the error code of a port proxy call whose target port
// had nothing listening (502).
const CodePortClosed = api.CodePortClosed

// MinPort and MaxPort bound the ports the proxy reaches.
const (
	MinPort = 1
	MaxPort = 65535
)

// HeaderPortProxied is set by the agent on every answer that came from the
// program behind the port (its value is the port), so that the gateway can
// tell the program's own 401 or 409 from the agent's.
const HeaderPortProxied = "X-Quarry-Port"

// RoutePortForward is the agent's TCP forward: GET upgrades to a WebSocket
// whose binary messages carry the bytes of one TCP connection to
// 127.0.0.1:{port} in the sandbox (ROCK's /portforward). The connection is
// made before the upgrade: nothing listening is 502 CodePortClosed.
const RoutePortForward = "/v1/portforward/{port}"

// PortForwardPathPrefix is the prefix of RoutePortForward's paths.
const PortForwardPathPrefix = "/v1/portforward/"

// MaxPortMessage bounds one WebSocket message the port routes read (the
// agent's TCP forward, the gateway's relay): larger is refused with close
// 1009.
const MaxPortMessage = 16 << 20
