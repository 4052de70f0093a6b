// Package api holds the wire types of the gateway's own REST API
// (docs/API.md): sandboxes and pools, checkpoints (restore and fork), and
// the trainer side of the model
// relay. The gateway answers with them and the Go client (client), the
// test doubles (modelservice/modeltest) and the tests decode them, so the
// JSON of each route is declared once. The calls into a sandbox (exec,
// sessions, processes, files) use execagent/agentapi's types, which the
// gateway proxies unchanged.
//
// errors.go is the error vocabulary: ErrorBody, the one shape of every
// error answer, and the codes it carries, each named once in Codes(). The
// agent's codes (agentapi.Code*) and the env programs' (envs.Kind) are
// these constants; gateway/openapi.json, docs/API.md and the Python SDK are
// tested against Codes().
//
// Changing a type here changes the wire format: api_test.go pins the JSON
// of each type.
//
// It imports only the standard library; it must not import any other
// Quarry package.
package api
