// Package gateway is Quarry's HTTP API: one fiber v2 app that serves
// Quarry's REST API (/v1), ROCK's routes (rockcompat), E2B's control and
// data planes (e2bcompat) and the web console,
// plain (Serve), over TLS (ServeTLS), on the relay's Unix socket
// (ServeRelay), or without a listener (App: cmd/gateway's Lambda adapter).
//
// Its rooms, each the one place for what it holds:
//
//   - gateway.go: the route table (every route with its credential and
//     handler or proxy kind), New, Serve and Shutdown, and the request
//     wrapper (observe: errors, body limits, metrics).
//   - credentials.go: who may call a route. Each route names a credential
//     (API key; API key or WebSocket subprotocol; relay token; preview
//     token or API key; ROCK's headers; E2B's X-API-KEY, access token or
//     signed file URL), checked by one middleware before the handler, with
//     one bearer parser and one Basic parser.
//   - fence.go: whether a request may reach a sandbox: the lease read
//     (active, unexpired, the caller's), the generation a long-lived
//     connection keeps, and how an agent's failure or refusal maps to the
//     lease's end or the agent's error.
//   - agentcall.go, agents.go: the one way to call a sandbox's agent
//     (sandboxAgent: token and generation set in one place; request,
//     stream, JSON, WebSocket and typed-client forms) over a bounded cache
//     of pooled clients per agent URL.
//   - proxy.go, stream.go, body.go, leave.go: the proxied sandbox routes
//     (exec, sessions, processes, files, PTYs' REST side), streamed bodies
//     with their bounds, and cancelling an agent call whose client left.
//   - sandboxes.go, images.go: leases (create, list, get, heartbeat,
//     release), pools and images on demand.
//   - wsrelay.go, pty.go, ports.go, portsws.go, preview.go: relayed
//     WebSockets (terminals, ports), the port proxy and signed preview URLs
//     (preview.go's signer signs every token the gateway makes).
//   - e2broute.go, e2btoken.go: E2B's data plane, routed before the route
//     table by E2B's headers or a "{port}-{id}" Host (envd's port forwarded
//     to the agent unchanged, any other to the port proxy), and the
//     lease-scoped envdAccessToken and signed file URLs that admit it.
//   - model.go, relaysocket.go: the model relay's routes over a
//     *modelservice.Service (sandbox side by relay token, trainer side by
//     API key) and the relay socket.
//   - checkpoints.go, ckadapters.go: the checkpoint routes over the
//     workflows of checkpoints/ckflow, and the lease and agent sides the
//     gateway gives them; envs.go: the env API over envs.Service; rock.go,
//     rockports.go: ROCK's routes (rockcompat) and ports; e2b.go: E2B's
//     control plane (e2bcompat).
//   - errors.go, allow.go: every error rendered in one JSON shape from its
//     classification; 404 and 405 for unknown routes.
//   - console.go, openapi.go, metrics.go, config.go: the console's files,
//     the OpenAPI document, Prometheus metrics, Config.
//
// Connection parking and idle deadlines are internal/parkconn's; the
// gateway wires them (Serve, observe, Shutdown).
//
// The gateway keeps no state that matters: leases live in the lease store
// behind the Manager interface, and the only cache (HTTP clients per agent
// URL) is rebuilt on demand; any number of replicas serve the same API.
//
// It depends on the contracts (warmpool, providers, agentapi, modelservice,
// checkpoints, envs), the wire types (api), rockcompat and e2bcompat. It must not
// import a concrete provider (providers/...), a concrete store
// (warmpool/boltstore, checkpoints/filestore, ...) or cmd/; its tests use
// the embedded stores.
package gateway
