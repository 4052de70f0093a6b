// Package errclass is where Quarry's errors are classified, once: Of maps
// an error — the contracts' sentinels and typed errors (warmpool,
// providers, modelservice, envs, agentapi, checkpoints), bad input
// (internal/badinput), and the few the HTTP layer makes itself — to a
// Class (code, HTTP status, retryable, message). Every API surface renders
// a Class and nothing else: Quarry's JSON errors and its env routes
// (gateway), ROCK's envelope and GEM routes (rockcompat), and later E2B's
// shapes. A handler never inspects an error to decide its answer.
//
// It imports the contract packages it classifies and must not import the
// surfaces (gateway, rockcompat) or any backend (providers/*,
// warmpool/boltstore, warmpool/dynamostore, modelservice/*broker,
// checkpoints/*store).
package errclass
