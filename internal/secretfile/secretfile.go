// Package secretfile keeps a generated secret (an API key, a signing key) in
// a file that is created once and read on every later start.
package secretfile

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// maxSize bounds what is read from a secret file.
const maxSize = 4 << 10

// LoadOrCreate returns the secret kept at path. When the file does not
// exist it calls generate, saves the result (file mode 0600; missing parent
// directories are created with mode 0700) and returns it. The file appears
// whole or not at all: the secret is written to a temporary file that is
// then hard-linked into place, so several processes starting at once agree
// on one secret and none of them reads a half-written file. check, when not
// nil, validates the (trimmed) content of an existing file; its error is
// returned wrapped with the path. created reports whether this call made
// the file.
func LoadOrCreate(path string, generate func() (string, error), check func(string) error) (secret string, created bool, err error) {
	secret, err = read(path, check)
	if !errors.Is(err, fs.ErrNotExist) {
		return secret, false, err
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", false, fmt.Errorf("create directory for %s: %w", path, err)
	}
	secret, err = generate()
	if err != nil {
		return "", false, err
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return "", false, fmt.Errorf("save %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	_, werr := tmp.WriteString(secret + "\n")
	if err := errors.Join(werr, tmp.Chmod(0o600), tmp.Sync(), tmp.Close()); err != nil {
		return "", false, fmt.Errorf("save %s: %w", path, err)
	}
	switch err := os.Link(tmp.Name(), path); {
	case errors.Is(err, fs.ErrExist): // another process won the race
		secret, err = read(path, check)
		return secret, false, err
	case err != nil:
		return "", false, fmt.Errorf("save %s: %w", path, err)
	}
	if d, err := os.Open(dir); err == nil { // make the new name durable
		_ = d.Sync()
		_ = d.Close()
	}
	return secret, true, nil
}

// read reads and checks an existing secret file. A missing file gives an
// error that wraps fs.ErrNotExist.
func read(path string, check func(string) error) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", err
		}
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxSize+1))
	if err != nil {
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	if len(b) > maxSize {
		return "", fmt.Errorf("%s: larger than %d bytes, not a secret file", path, maxSize)
	}
	s := strings.TrimSpace(string(b))
	if s == "" {
		return "", fmt.Errorf("%s is empty", path)
	}
	if check != nil {
		if err := check(s); err != nil {
			return "", fmt.Errorf("%s: %w", path, err)
		}
	}
	return s, nil
}
