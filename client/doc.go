// Package client is the Go client of the Quarry gateway's REST API
// (docs/API.md): leasing sandboxes, running commands, sessions, background
// processes and PTYs in them, moving files, reaching their ports,
// checkpoints, and images of on-demand pools. The CLI (cmd/quarry), the
// end-to-end tests and the benchmarks use it.
//
// The exec, session, process and file calls use the wire types of
// execagent/agentapi, which the gateway proxies byte for byte. Non-2xx answers
// are returned as *Error; IsNotFound, IsGone and the other helpers test them
// through wrapping. Streaming answers (SSE events, file and archive bodies)
// are handed to the caller as they arrive, never buffered whole; every JSON
// answer and every event is bounded in size, and every call is bounded by its
// ctx.
//
// The sandbox and pool types are the gateway's wire types, declared in
// package api (which the gateway answers with) and named here as aliases.
//
// This package may import api and execagent/agentapi only; it must not
// import the gateway, warmpool, providers or any other server package.
package client
