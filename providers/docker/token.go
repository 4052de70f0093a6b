package docker

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

const (
	// keyBytes is the size of the token key (hex encoded in its file).
	keyBytes = 32
	// nonceBytes is the size of a container's nonce (hex encoded in its label).
	nonceBytes = 16
	// tokenDomain separates these tokens from any other use of the key.
	tokenDomain = "quarry docker agent token v1"
	// maxKeyFile bounds what is read from the key file.
	maxKeyFile = 4 << 10
)

// tokenKey derives agent tokens. A token is HMAC-SHA256 of the gateway id,
// the task name and the container's nonce under the key: the engine keeps
// the inputs (labels), the key file keeps the secret, and nothing needs to
// be remembered per task.
type tokenKey []byte

// token returns the agent token of a container, or "" without a nonce.
func (k tokenKey) token(gatewayID, name, nonce string) string {
	if nonce == "" {
		return ""
	}
	m := hmac.New(sha256.New, k)
	for _, part := range []string{tokenDomain, gatewayID, name, nonce} {
		m.Write([]byte(part))
		m.Write([]byte{0})
	}
	return hex.EncodeToString(m.Sum(nil))
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
// directory 0700) when the file does not exist. Two gateways creating it at
// once agree: the file is created exclusively and the loser reads it.
func loadOrCreateKey(path string) (tokenKey, error) {
	key, err := readKey(path)
	if !errors.Is(err, fs.ErrNotExist) {
		return key, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("create token key directory: %w", err)
	}
	raw := make([]byte, keyBytes)
	if _, err := rand.Read(raw); err != nil {
		return nil, fmt.Errorf("generate token key: %w", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return readKey(path)
	}
	if err != nil {
		return nil, fmt.Errorf("create token key: %w", err)
	}
	_, werr := f.WriteString(hex.EncodeToString(raw) + "\n")
	if err := errors.Join(werr, f.Sync(), f.Close()); err != nil {
		return nil, fmt.Errorf("write token key %s: %w", path, err)
	}
	return raw, nil
}

// readKey reads and checks an existing key file.
func readKey(path string) (tokenKey, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open token key: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxKeyFile))
	if err != nil {
		return nil, fmt.Errorf("read token key %s: %w", path, err)
	}
	key, err := hex.DecodeString(strings.TrimSpace(string(b)))
	if err != nil || len(key) < keyBytes {
		return nil, fmt.Errorf("token key %s: want at least %d hex characters; delete the file to generate a new key (running sandboxes then lose their tokens)", path, 2*keyBytes)
	}
	return key, nil
}
