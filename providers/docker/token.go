package docker

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

const (
	// keyBytes is the size of the token key (hex encoded in its file).
	keyBytes = agentapi.MinTokenKeyBytes
	// nonceBytes is the size of a container's nonce (hex encoded in its label).
	nonceBytes = 16
	// maxKeyFile bounds what is read from the key file.
	maxKeyFile = 4 << 10
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
	key, err := agentapi.ParseTokenKey(string(b))
	if err != nil {
		return nil, fmt.Errorf("%s: %w; delete the file to generate a new key (running sandboxes then lose their tokens)", path, err)
	}
	return key, nil
}
