package docker

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"

	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/internal/secretfile"
)

const (
	// keyBytes is the size of the token key (hex encoded in its file).
	keyBytes = agentapi.MinTokenKeyBytes
	// nonceBytes is the size of a container's nonce (hex encoded in its label).
	nonceBytes = 16
)

// tokenKey derives agent tokens: agentapi.DeriveToken under the key of the
// gateway id, the task name and the container's nonce, so a token is bound
// to the container it was made for. The engine keeps the inputs (labels),
// the key file keeps the secret, and nothing needs to be remembered per task.
type tokenKey []byte

// token returns the agent token of a container, or "" without a nonce.
func (k tokenKey) token(gatewayID, name, nonce string) string {
	if nonce == "" {
		return ""
	}
	return agentapi.DeriveToken(k, gatewayID+"\x00"+name+"\x00"+nonce)
}

// newNonce returns a random nonce for one container.
func newNonce() (string, error) {
	b := make([]byte, nonceBytes)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("generate token nonce: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// loadOrCreateKey reads the key from path, or creates it (mode 0600, the
// directory 0700) when the file does not exist. Gateways creating it at once
// agree on one key (see secretfile.LoadOrCreate).
func loadOrCreateKey(path string) (tokenKey, error) {
	check := func(s string) error {
		if _, err := agentapi.ParseTokenKey(s); err != nil {
			return fmt.Errorf("%w; delete the file to generate a new key (running sandboxes then lose their tokens)", err)
		}
		return nil
	}
	s, _, err := secretfile.LoadOrCreate(path, func() (string, error) {
		raw := make([]byte, keyBytes)
		if _, err := rand.Read(raw); err != nil {
			return "", fmt.Errorf("generate token key: %w", err)
		}
		return hex.EncodeToString(raw), nil
	}, check)
	if err != nil {
		return nil, fmt.Errorf("token key: %w", err)
	}
	return agentapi.ParseTokenKey(s)
}
