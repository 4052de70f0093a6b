// Package modelservice is the model relay: it lets a program inside a
// sandbox call an LLM through an OpenAI-compatible API while the trainer
// answers those calls with the policy being trained (or an upstream
// OpenAI-compatible server answers them, in passthrough), and records every
// exchange in the lease's transcript.
//
// broker.go is the Broker contract: the queue between the replica that
// holds an agent's call and the replica that serves the trainer, with its
// sentinel errors. Backends live in subpackages (membroker: in memory, the
// single-node default; dynamobroker: DynamoDB, for replicas);
// brokertest is the conformance suite both pass. service.go is the
// Service the gateway calls: lease env (OPENAI_BASE_URL, OPENAI_API_KEY),
// relay tokens (token.go: HMAC of the lease id with a secret shared by the
// replicas), Relay (queue and wait), Claim, Respond, Transcript; sse.go
// turns a whole completion into OpenAI stream chunks; passthrough.go
// forwards calls to an upstream and records them.
//
// It depends on the warmpool contract (leases, pool configuration) and
// internal helpers only. It must not import the gateway, a concrete broker,
// store or provider, or cmd/.
package modelservice
