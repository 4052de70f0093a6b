package e2bcompat

import (
	"bytes"

	"github.com/quarryhq/quarry/internal/badinput"
)

// EnvdPort is the sandbox port of envd, the agent in every E2B sandbox: a
// request routed to it goes to the lease's exec agent, unchanged.
const EnvdPort = 49983

// EnvdVersion is the envd version every sandbox reports (Sandbox.envdVersion):
// the SDK turns features on and off by it (e2b/envd/versions.py). It is the
// one place the version is stated, and it must equal the envd protocol the
// exec agent serves (execagent, envd's data plane).
const EnvdVersion = "0.6.4"

// The headers of E2B's protocol.
const (
	// HeaderSandboxID and HeaderSandboxPort route a data-plane request (the
	// SDK sends both on every envd call).
	HeaderSandboxID   = "E2b-Sandbox-Id"
	HeaderSandboxPort = "E2b-Sandbox-Port"
	// HeaderAccessToken carries a sandbox's envdAccessToken on the data
	// plane.
	HeaderAccessToken = "X-Access-Token"
	// HeaderAPIKey carries the API key on the control plane.
	HeaderAPIKey = "X-API-KEY"
	// HeaderNextToken carries the cursor of a list's next page.
	HeaderNextToken = "X-Next-Token"
)

// maxLabel is the longest DNS label (RFC 1035), and so the longest
// "{port}-{id}" a Host routes by.
const maxLabel = 63

// maxID bounds a sandbox id named in a header.
const maxID = 128

// Target is the sandbox and port a data-plane request is for.
type Target struct {
	ID   string
	Port int
	// ByHost: routed by the Host's first label, not by the headers.
	ByHost bool
}

// RouteOf returns the sandbox a request is for, from its E2b-Sandbox-Id
// and E2b-Sandbox-Port headers (id, port) and its Host. On any host the
// headers win: a request with either is routed (ok), and a missing or bad
// one is a *badinput.Error. Without them, a Host whose first label is
// "{port}-{id}" — split at the first '-', the port all digits from 1 to
// 65535, the label at most 63 characters — is routed; any other Host is not
// (ok false, nil error). It allocates only for a routed request, so it may
// run on every request.
func RouteOf(host, id, port []byte) (t Target, ok bool, err error) {
	if len(id) > 0 || len(port) > 0 {
		t, err = headerTarget(id, port)
		return t, true, err
	}
	label := host
	if i := bytes.IndexByte(label, '.'); i >= 0 {
		label = label[:i]
	}
	if i := bytes.IndexByte(label, ':'); i >= 0 {
		label = label[:i] // a bare host with a port: "8000-sbx-1:8080"
	}
	if len(label) > maxLabel {
		return Target{}, false, nil
	}
	p, rest, found := bytes.Cut(label, []byte("-"))
	n, pok := parsePort(p)
	if !found || !pok || !validID(rest) {
		return Target{}, false, nil
	}
	return Target{ID: string(rest), Port: n, ByHost: true}, true, nil
}

// headerTarget reads the routing headers of a header-routed request.
func headerTarget(id, port []byte) (Target, error) {
	if len(id) == 0 {
		return Target{}, badinput.New(HeaderSandboxID, "is required with %s: name the sandbox", HeaderSandboxPort)
	}
	if !validID(id) {
		return Target{}, badinput.New(HeaderSandboxID, "must be 1 to %d letters, digits, '.', '_' or '-', not starting with '.'", maxID)
	}
	n, ok := parsePort(port)
	if !ok {
		return Target{}, badinput.New(HeaderSandboxPort, "must be a port number from 1 to 65535 (%d for envd), got %q", EnvdPort, port)
	}
	return Target{ID: string(id), Port: n}, nil
}

// parsePort parses 1 to 5 ASCII digits naming a port from 1 to 65535.
func parsePort(b []byte) (int, bool) {
	if len(b) == 0 || len(b) > 5 {
		return 0, false
	}
	n := 0
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, n >= 1 && n <= 65535
}

// validID reports whether b is a sandbox id the gateway may look up: 1 to
// 128 letters, digits, '.', '_' or '-', not starting with '.'.
func validID(b []byte) bool {
	if len(b) == 0 || len(b) > maxID || b[0] == '.' {
		return false
	}
	for _, c := range b {
		if !badinput.Alnum(c) && c != '.' && c != '_' && c != '-' {
			return false
		}
	}
	return true
}
