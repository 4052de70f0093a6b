// Package gateway is Quarry's REST API: a fiber v2 app that authenticates
// callers by API key, validates what the gateway owns (sandbox ids, the
// create body, list filters), maps every error to one JSON shape in one place
// (errors.go; the 404 of an unknown path outside /v1 also has the top-level
// code and message that E2B's SDK reads, allow.go), reads one lease per request and proxies sandbox calls (exec,
// sessions, processes, files) to the sandbox's exec agent with the agent's
// token and the lease generation, streaming bodies both ways. It also serves
// /healthz, /readyz, /metrics and the embedded OpenAPI document, and the
// model relay's routes (model.go, over a *modelservice.Service: OpenAI
// calls from sandboxes authenticated by their relay token, and the
// trainer's claims, answers and transcripts authenticated by API key),
// and the checkpoint routes (checkpoints.go, over the workflows of
// checkpoints/ckflow, to which ckadapters.go gives the gateway's lease and
// agent sides: archives stream from an agent into the store and back,
// never whole in memory; restore, from_checkpoint and fork). Its
// connections are parked between requests (internal/parkconn, wired in
// gateway.go).
//
// The gateway keeps no state that matters: leases live in the lease store
// behind the Manager interface; the only cache (HTTP clients per agent URL)
// is rebuilt on demand. The same *Gateway serves plain HTTP (Serve), HTTPS
// (ServeTLS) and, later, a Lambda adapter (App).
//
// Its answers on sandboxes, pools and the relay's trainer side are the wire
// types of package api, which the Go client (client) decodes.
//
// It depends on the warmpool, providers, agentapi, modelservice and
// checkpoints contracts, the wire types (api) and the envs service (envs.go: the env
// API's routes, with envs.Sandboxes implemented over the gateway's own
// lease checks) only. It must not import a concrete provider
// (providers/...), a concrete store (warmpool/boltstore,
// checkpoints/filestore, ...) or cmd/; its tests use the embedded stores.
package gateway
