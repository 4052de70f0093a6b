package docker

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/providers"
)

// The engine's answers are Docker 20.10's (API 1.41, this machine's), as
// the Go client returned them for pulls from Debian's docker-registry 2.8
// on 127.0.0.1 (scripts/registry.sh): the registry tests below get them
// again from the real engine. "no such host" is the engine's answer for a
// registry whose name does not resolve; Docker Hub's refusal is the
// engine's wording of its "denied" answer.
func TestImageErrorOf_TheEnginesAnswers(t *testing.T) {
	tests := []struct {
		name   string
		image  string
		answer string
		kind   providers.ImageErrorKind // "" = not the image's
	}{
		{name: "missing tag", image: "127.0.0.1:5055/exp/bb:nope",
			answer: "Error response from daemon: manifest for 127.0.0.1:5055/exp/bb:nope not found: manifest unknown: manifest unknown", kind: providers.ImageNotFound},
		{name: "missing repository", image: "127.0.0.1:5055/exp/nothere:1",
			answer: "Error response from daemon: manifest for 127.0.0.1:5055/exp/nothere:1 not found: manifest unknown: manifest unknown", kind: providers.ImageNotFound},
		{name: "missing digest", image: "127.0.0.1:5055/exp/bb@sha256:0000000000000000000000000000000000000000000000000000000000000000",
			answer: "Error response from daemon: manifest for 127.0.0.1:5055/exp/bb@sha256:0000000000000000000000000000000000000000000000000000000000000000 not found: manifest unknown: manifest unknown", kind: providers.ImageNotFound},
		{name: "401 without credentials", image: "127.0.0.1:5056/exp/bb:1",
			answer: `Error response from daemon: Head "http://127.0.0.1:5056/v2/exp/bb/manifests/1": no basic auth credentials`, kind: providers.ImageDenied},
		{name: "401 with wrong credentials", image: "127.0.0.1:5056/exp/bb:1",
			answer: "Error response from daemon: unauthorized: authentication required", kind: providers.ImageDenied},
		{name: "docker hub's refusal", image: "quarry/private:1",
			answer: "Error response from daemon: pull access denied for quarry/private, repository does not exist or may require 'docker login': denied: requested access to the resource is denied", kind: providers.ImageDenied},
		{name: "connection refused", image: "127.0.0.1:5057/exp/bb:1",
			answer: `Error response from daemon: Get "http://127.0.0.1:5057/v2/": dial tcp 127.0.0.1:5057: connect: connection refused`, kind: providers.ImageUnreachable},
		{name: "no such host", image: "nosuchhost.invalid/x:1",
			answer: `Error response from daemon: Get "https://nosuchhost.invalid/v2/": dial tcp: lookup nosuchhost.invalid on 10.255.255.53:53: no such host`, kind: providers.ImageUnreachable},
		{name: "timeout", image: "r.example/x:1",
			answer: `Error response from daemon: Get "https://r.example/v2/": net/http: request canceled while waiting for connection (Client.Timeout exceeded while awaiting headers)`, kind: providers.ImageUnreachable},
		{name: "malformed reference", image: "x",
			answer: "Error response from daemon: invalid reference format: repository name must be lowercase", kind: providers.ImageInvalid},
		{name: "the engine itself", image: "x",
			answer: "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ref, err := parseRef(tt.image)
			require.NoError(t, err)
			got := imageErrorOf(tt.image, ref, tt.answer)
			if tt.kind == "" {
				assert.Nil(t, got)
				return
			}
			require.NotNil(t, got)
			assert.Equal(t, tt.kind, got.Kind)
			assert.Equal(t, tt.image, got.Image)
			assert.Equal(t, ref.registry, got.Registry)
			assert.NotContains(t, got.Answer, "Error response from daemon")
			assert.Contains(t, tt.answer, got.Answer, "the registry's answer as the engine gave it")
			assert.Contains(t, got.Error(), tt.image)
		})
	}
}

func TestParseRef_NormalizesOrRefuses(t *testing.T) {
	tests := []struct {
		image, name, registry string
	}{
		{image: "busybox", name: "docker.io/library/busybox:latest", registry: "docker.io"},
		{image: "python:3.11", name: "docker.io/library/python:3.11", registry: "docker.io"},
		{image: "127.0.0.1:5055/exp/bb:1", name: "127.0.0.1:5055/exp/bb:1", registry: "127.0.0.1:5055"},
		{image: "ghcr.io/o/r@sha256:" + fmt.Sprintf("%064d", 0), name: "ghcr.io/o/r@sha256:" + fmt.Sprintf("%064d", 0), registry: "ghcr.io"},
	}
	for _, tt := range tests {
		ref, err := parseRef(tt.image)
		require.NoError(t, err, tt.image)
		assert.Equal(t, imageRef{name: tt.name, registry: tt.registry}, ref)
	}
	for _, bad := range []string{"", "Bad/Name", "a//b", "x:"} {
		_, err := parseRef(bad)
		var ie *providers.ImageError
		require.ErrorAs(t, err, &ie, bad)
		assert.Equal(t, providers.ImageInvalid, ie.Kind)
		assert.ErrorIs(t, err, providers.ErrInvalidSpec)
	}
}

func TestPullError_DeadlineIsUnreachableCancelIsNot(t *testing.T) {
	ref, err := parseRef("127.0.0.1:5055/x:1")
	require.NoError(t, err)
	var ie *providers.ImageError
	require.ErrorAs(t, pullError("x", ref, fmt.Errorf("read: %w", context.DeadlineExceeded)), &ie)
	assert.Equal(t, providers.ImageUnreachable, ie.Kind)
	assert.Contains(t, ie.Answer, "PullTimeout")
	assert.ErrorIs(t, ie, providers.ErrThrottled)

	err = pullError("x", ref, context.Canceled)
	assert.False(t, errors.As(err, &ie), "a caller that went away is no fault of the image")
	assert.ErrorIs(t, err, context.Canceled)
}
