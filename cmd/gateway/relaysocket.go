package main

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"syscall"

	"github.com/quarryhq/quarry/providers"
)

// maxSocketPath keeps the relay socket's path within the kernel's limit
// for a Unix socket address (108 bytes with the terminating NUL).
const maxSocketPath = 100

// relayDir is the directory of the gateway's model relay socket:
// $QUARRY_DATA_DIR/relay, or, when that path is too long for a socket
// address, a directory of this data dir's own under the system's temporary
// directory. Docker sandboxes get it mounted (docker.Config.RelayDir).
func relayDir(dataDir string) (string, error) {
	abs, err := filepath.Abs(dataDir)
	if err != nil {
		return "", fmt.Errorf("QUARRY_DATA_DIR: %w", err)
	}
	dir := filepath.Join(abs, "relay")
	if len(dir)+1+len(providers.RelaySocketName) <= maxSocketPath {
		return dir, nil
	}
	sum := sha256.Sum256([]byte(abs))
	return filepath.Join(os.TempDir(), "quarry-relay-"+hex.EncodeToString(sum[:6])), nil
}

// removeRelaySocket removes the relay socket, and dir when that leaves it
// empty.
func removeRelaySocket(dir string, log *slog.Logger) {
	if err := os.Remove(filepath.Join(dir, providers.RelaySocketName)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		log.Warn("remove the relay socket", "err", err)
	}
	_ = os.Remove(dir) // fails, harmlessly, when something else is in it
}

// listenRelay creates dir (0755, owned by this process's user) and listens
// on the relay socket in it, replacing a socket left by an earlier gateway.
// The socket is open to every user (0666): the sandboxes' agents run as the
// pool's user, and what it serves is authenticated by relay tokens.
func listenRelay(dir string) (net.Listener, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("relay socket: create %s: %w", dir, err)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return nil, fmt.Errorf("relay socket: %w", err)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !fi.IsDir() || (ok && int(st.Uid) != os.Geteuid()) {
		return nil, fmt.Errorf("relay socket: %s is not a directory of this gateway's user", dir)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, fmt.Errorf("relay socket: %w", err)
	}
	path := filepath.Join(dir, providers.RelaySocketName)
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&fs.ModeSocket == 0 {
			return nil, fmt.Errorf("relay socket: %s exists and is not a socket", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("relay socket: remove the old %s: %w", path, err)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("relay socket: %w", err)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("relay socket: listen on %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o666); err != nil {
		_ = ln.Close()
		return nil, fmt.Errorf("relay socket: %w", err)
	}
	return ln, nil
}
