package ecs

import (
	"strings"

	"github.com/quarryhq/quarry/providers"
)

// ECS cannot check an image before a task starts: a missing or refused
// image shows only as the task's stopped reason (stop code
// TaskFailedToStart), "CannotPullContainerError: …" with the registry's or
// the network's answer, or "ResourceInitializationError: unable to pull
// secrets or registry auth: … unable to retrieve ecr registry auth: …"
// when the execution role could not get ECR's credentials. pullFailure
// reads those reasons as an *providers.ImageError, so a cold start of a
// missing image is a 4xx.

// Markers of a stopped reason that is an image pull's.
const (
	reasonCannotPull   = "CannotPullContainerError"
	reasonRegistryAuth = "ecr registry auth"
	reasonResourceInit = "ResourceInitializationError"
)

// pullKinds map what the registry or the network answered to a kind, in
// order: the first whose words appear (lower case) wins. Docker Hub answers
// "pull access denied ... repository does not exist or may require
// authorization" for a repository that does not exist: not_found (the
// answer, kept whole, names both).
var pullKinds = []struct {
	kind  providers.ImageErrorKind
	words []string
}{
	{providers.ImageUnreachable, []string{"toomanyrequests", "429 too many requests", "rate limit"}},
	{providers.ImageNotFound, []string{"not found", "does not exist", "manifest unknown", "name unknown", "no such image"}},
	{providers.ImageDenied, []string{"access denied", "accessdenied", "not authorized", "unauthorized", "forbidden", "denied"}},
	{providers.ImageInvalid, []string{"no matching manifest", "does not contain descriptor matching platform", "invalid reference format"}},
	{providers.ImageUnreachable, []string{"timeout", "timed out", "i/o timeout", "connection refused", "no such host", "request canceled",
		"context deadline exceeded", "tls handshake", "network is unreachable"}},
}

// pullFailure returns the ImageError of a task of spec that stopped for
// reasons (its stopped reason, its sandbox container's reason) when they
// say its image could not be pulled, else nil. A failure to pull the agent
// image (agentImage: the init container's) is the operator's, not the
// pool's image's: nil. A pull failure whose cause it cannot tell is
// unreachable (Fargate retries a pull before it gives up).
func pullFailure(spec providers.Spec, agentImage string, reasons ...string) *providers.ImageError {
	var text string
	for _, r := range reasons {
		if strings.Contains(r, reasonCannotPull) || strings.Contains(r, reasonResourceInit) && strings.Contains(r, reasonRegistryAuth) {
			text = r
			break
		}
	}
	if text == "" || agentImage != "" && strings.Contains(text, agentImage) && !strings.Contains(text, spec.Image) {
		return nil
	}
	kind := providers.ImageUnreachable
	lower := strings.ToLower(text)
kinds:
	for _, k := range pullKinds {
		for _, w := range k.words {
			if strings.Contains(lower, w) {
				kind = k.kind
				break kinds
			}
		}
	}
	return &providers.ImageError{Image: spec.Image, Kind: kind, Registry: registryOf(spec.Image), Answer: text}
}

// registryOf returns the host of an image reference's registry: its first
// element when that names a host (a '.' or ':' in it, or localhost), else
// Docker Hub.
func registryOf(image string) string {
	host, _, ok := strings.Cut(image, "/")
	if ok && (strings.ContainsAny(host, ".:") || host == "localhost") {
		return host
	}
	return "docker.io"
}
