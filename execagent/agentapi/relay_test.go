package agentapi

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestIsRelayPath(t *testing.T) {
	for p, want := range map[string]bool{
		"/v1/sandboxes/sbx-1/model/v1/chat/completions": true,
		"/v1/sandboxes/sbx-1/model/v1/models":           true,
		"/v1/sandboxes/sbx-1/model/v1/":                 false,
		"/v1/sandboxes/sbx-1/model/transcript":          false,
		"/v1/sandboxes/sbx-1/exec":                      false,
		"/v1/sandboxes//model/v1/models":                false,
		"/v1/sandboxes/model/v1/models":                 false,
		"/v1/exec":                                      false,
		"/v1/sandboxes/sbx-1/model/v1x/models":          false,
	} {
		assert.Equal(t, want, IsRelayPath(p), p)
	}
}
