package agentapi

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
)

// Derived agent tokens: a provider that cannot hand each agent a secret
// directly gives every agent the same secret key (from a secret store the
// backend injects, e.g. ECS task definition secrets) and a public random
// nonce of its own; the agent and the gateway both compute the token from
// the two, so the token itself never travels and is never stored.
const (
	// MinTokenKeyBytes is the shortest key ParseTokenKey accepts.
	MinTokenKeyBytes = 32
	// maxTokenKeyChars bounds the text ParseTokenKey reads.
	maxTokenKeyChars = 1024
	// tokenDomain separates these tokens from any other use of the key.
	tokenDomain = "quarry agent token v1"
)

// ParseTokenKey decodes a token key written as hex (surrounding white space
// ignored). It fails, without quoting the key, when the text is not hex or
// decodes to fewer than MinTokenKeyBytes bytes.
func ParseTokenKey(s string) ([]byte, error) {
	s = strings.TrimSpace(s)
	if len(s) > maxTokenKeyChars {
		return nil, fmt.Errorf("token key: longer than %d characters", maxTokenKeyChars)
	}
	key, err := hex.DecodeString(s)
	if err != nil || len(key) < MinTokenKeyBytes {
		return nil, fmt.Errorf("token key: want at least %d hex characters (%d random bytes)", 2*MinTokenKeyBytes, MinTokenKeyBytes)
	}
	return key, nil
}

// DeriveToken returns the agent token for nonce under key: the hex
// HMAC-SHA256 under key of "quarry agent token v1", NUL, nonce, NUL. It is
// the one derivation the agent (QUARRY_AGENT_TOKEN_KEY and
// QUARRY_AGENT_TOKEN_NONCE) and the providers that hand out nonces use.
// An empty nonce gives "" (no token). Safe for concurrent use.
func DeriveToken(key []byte, nonce string) string {
	if nonce == "" {
		return ""
	}
	m := hmac.New(sha256.New, key)
	for _, part := range []string{tokenDomain, nonce} {
		m.Write([]byte(part))
		m.Write([]byte{0})
	}
	return hex.EncodeToString(m.Sum(nil))
}
