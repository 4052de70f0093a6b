// Package agentsim serves simulated exec agents — not the agent — for
// benchmarks only: the fleet simulation (bench/scalebench, issue 13) runs
// real gateways against thousands of sandboxes, and one real agent per
// sandbox would not fit on one machine. Every figure measured against it is
// a simulated one.
//
// A Farm serves many agents in one process, each on a loopback address of
// its own (one listener per address: every address of 127.0.0.0/8 is
// loopback), brought up with Up(addr, token) and taken down with Down(addr)
// (its listener and its connections closed, so the next call is refused, as
// a stopped task's address is). Each agent speaks the agent protocol
// (execagent/agentapi) for the calls a gateway makes of a sandbox:
//   - every route needs "Authorization: Bearer <token>" (401 unauthorized);
//   - GET /healthz: status ok, the protocol version, the lease and generation;
//   - POST /v1/init: the real agent's generation rules (a lower generation is
//     409 stale_generation, the same generation with another lease 409
//     conflict; equal with the same lease is an idempotent retry);
//   - every other route is fenced: a request whose X-Quarry-Generation is
//     below the agent's is 409 stale_generation;
//   - POST /v1/exec and the sessions (POST/GET /v1/sessions, DELETE
//     /v1/sessions/{id}, POST /v1/sessions/{id}/run): every command succeeds
//     at once with no output (exit code 0); a streaming exec is refused;
//   - DELETE /v1/calls/{id}: 404, as for a call no longer in flight (no call
//     is ever in flight: answers are immediate);
//   - anything else: 404 naming what the simulator does not simulate.
//
// Request bodies are decoded strictly, as the agent decodes them.
//
// A process may hold 20,000 open files on the benchmark machine, and each
// agent holds one listener plus its connections, so a fleet is spread over
// several processes: cmd/agentsim serves a Farm driven by lines on its
// stdin (Serve: "up ADDR TOKEN", "down ADDR", "stats", each answered with
// one line), and Procs starts K of them and routes each address to one.
// A process exits when its stdin closes, so none outlives its parent.
//
// It imports no other Quarry package but execagent/agentapi.
package agentsim
