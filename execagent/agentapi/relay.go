package agentapi

import "strings"

// RelayPathPrefix starts the paths of the model relay's sandbox routes,
// /v1/sandboxes/{id}/model/v1/..., which an agent with a relay socket
// forwards to the gateway (and the gateway's relay socket serves alone).
const RelayPathPrefix = "/v1/sandboxes/"

// relayPart follows the sandbox id in a relay path.
const relayPart = "/model/v1/"

// IsRelayPath reports whether p is a path of the model relay's sandbox
// routes: /v1/sandboxes/{id}/model/v1/ followed by the route.
func IsRelayPath(p string) bool {
	rest, ok := strings.CutPrefix(p, RelayPathPrefix)
	if !ok {
		return false
	}
	id, _, ok := strings.Cut(rest, "/")
	return ok && id != "" && len(rest) > len(id)+len(relayPart) && strings.HasPrefix(rest[len(id):], relayPart)
}
