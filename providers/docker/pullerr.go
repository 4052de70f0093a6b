package docker

import (
	"context"
	"errors"
	"strings"

	"github.com/distribution/reference"

	"github.com/quarryhq/quarry/providers"
)

// imageRef is an image reference as the provider keys it.
type imageRef struct {
	// name is the normalized reference, with a tag or digest:
	// "python:3.11" is "docker.io/library/python:3.11", "busybox" is
	// "docker.io/library/busybox:latest".
	name string
	// registry is the registry's host ("docker.io", "127.0.0.1:5000").
	registry string
}

// parseRef normalizes image, or returns the *providers.ImageError
// (invalid) of a malformed reference.
func parseRef(image string) (imageRef, error) {
	named, err := reference.ParseNormalizedNamed(strings.TrimSpace(image))
	if err != nil {
		return imageRef{}, &providers.ImageError{Image: image, Kind: providers.ImageInvalid, Answer: "not an image reference: " + err.Error()}
	}
	named = reference.TagNameOnly(named)
	return imageRef{name: named.String(), registry: reference.Domain(named)}, nil
}

// daemonPrefix starts the message of every error the engine answered.
const daemonPrefix = "Error response from daemon: "

// The engine's words, by what they mean. Docker 20.10 answered, for a
// registry on 127.0.0.1 (see pullerr_test.go for the whole messages):
//   - a tag, digest or repository the registry lacks: "manifest for … not
//     found: manifest unknown: manifest unknown" (HTTP 404);
//   - a registry that answers 401, without credentials: "Head \"…\": no
//     basic auth credentials"; with wrong ones: "unauthorized:
//     authentication required" (HTTP 500);
//   - nothing listening: "Get \"http://…/v2/\": dial tcp …: connect:
//     connection refused"; an unknown host: "… lookup … no such host"
//     (HTTP 500);
//   - a malformed reference: "invalid reference format: repository name
//     must be lowercase" (HTTP 400).
//
// Docker Hub answers a repository that does not exist or is private with
// "pull access denied for …, repository does not exist or may require
// 'docker login': denied: …": a refusal, as the registry gives it.
var (
	deniedWords = []string{
		"no basic auth credentials", "unauthorized", "authentication required",
		"denied", "forbidden", "insufficient_scope",
	}
	notFoundWords = []string{
		"manifest unknown", "name unknown", "blob unknown", "not found",
		"repository does not exist", "no such image",
	}
	unreachableWords = []string{
		"connection refused", "no such host", "timeout", "timed out", "i/o timeout",
		"network is unreachable", "no route to host", "connection reset",
		"server misbehaving", "tls handshake", "toomanyrequests", "service unavailable",
		"bad gateway", "gave http response to https client", "unexpected eof",
	}
	invalidWords = []string{
		"invalid reference format", "no matching manifest", "unsupported manifest",
		"not a valid", "invalid",
	}
)

// imageErrorOf translates the engine's answer to a pull of ref (an error
// of ImagePull, or the message of its stream's error) into a
// *providers.ImageError, or nil when the answer is not the image's or its
// registry's (the engine itself failed: the caller wraps it as is). The
// checks go from the most specific words to the least: a refusal before a
// missing manifest (Docker Hub's refusal says "does not exist" too),
// both before a connection's failure.
func imageErrorOf(image string, ref imageRef, answer string) *providers.ImageError {
	answer = strings.TrimSpace(strings.TrimPrefix(answer, daemonPrefix))
	lower := strings.ToLower(answer)
	var kind providers.ImageErrorKind
	switch {
	case containsAny(lower, deniedWords):
		kind = providers.ImageDenied
	case containsAny(lower, notFoundWords):
		kind = providers.ImageNotFound
	case containsAny(lower, unreachableWords):
		kind = providers.ImageUnreachable
	case containsAny(lower, invalidWords):
		kind = providers.ImageInvalid
	default:
		return nil
	}
	return &providers.ImageError{Image: image, Kind: kind, Registry: ref.registry, Answer: answer}
}

// pullError is the error of a pull of image that failed with err: an
// *ImageError where the engine's answer says what went wrong, an
// unreachable one when the pull's own deadline passed, else err wrapped.
func pullError(image string, ref imageRef, err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return &providers.ImageError{Image: image, Kind: providers.ImageUnreachable, Registry: ref.registry,
			Answer: "the pull did not finish within its time (PullTimeout)"}
	}
	if errors.Is(err, context.Canceled) {
		return err
	}
	if ie := imageErrorOf(image, ref, err.Error()); ie != nil {
		return ie
	}
	return err
}

func containsAny(s string, words []string) bool {
	for _, w := range words {
		if strings.Contains(s, w) {
			return true
		}
	}
	return false
}
