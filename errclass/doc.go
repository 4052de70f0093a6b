// Package errclass is where Quarry's errors are classified, once: Of maps
// an error — the contracts' sentinels and typed errors (warmpool,
// providers, modelservice, envs, agentapi, checkpoints), bad input
// (internal/badinput), and the few the HTTP layer makes itself — to a
// Class (code, HTTP status, retryable, message). The codes are api's
// (api.Codes()). Every API surface renders a Class and nothing else:
// Quarry's JSON errors and its env routes (gateway), ROCK's envelope and
// GEM routes (rockcompat), and E2B's error bodies (e2bcompat). A handler never
// inspects an error to decide its answer.
//
// It stands between the contracts and the surfaces: it imports api and
// the contract packages it classifies (which is why it is not under
// internal/, whose packages import no domain package), and the surfaces
// import it. It must not import the surfaces (gateway, rockcompat), any
// backend (providers/*, warmpool/boltstore, warmpool/dynamostore,
// modelservice/*broker, checkpoints/*store) or an HTTP framework: a
// surface translates its framework's errors before it classifies them
// (gateway/errors.go turns fiber's into a StatusError). One exception is
// left: agentcall.go still knows fasthttp's errors inside an
// agentapi.CallError (it says why).
//
// Files: errclass.go holds Of, Class and the errors this package owns;
// agentcall.go the calls to an agent that got no answer; deprecated.go
// the old names of api's codes.
package errclass
