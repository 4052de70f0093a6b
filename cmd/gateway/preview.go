package main

import (
	"fmt"
	"log/slog"
	"path/filepath"

	"github.com/quarryhq/quarry/gateway"
	"github.com/quarryhq/quarry/internal/secretfile"
)

// previewSecretFile is where the generated preview secret is kept.
const previewSecretFile = "preview-secret"

// previewSecret returns QUARRY_PREVIEW_SECRET, or when it is unset the
// secret saved in dataDir/preview-secret (generated, mode 0600, on first
// use). Replicas that do not share that file must share
// QUARRY_PREVIEW_SECRET, or a preview URL works only on the replica that
// signed it: with a shared lease store (store) other than the embedded
// one, an unset secret is logged.
func previewSecret(set, dataDir, store string, log *slog.Logger) (string, error) {
	if set != "" {
		return set, nil
	}
	path := filepath.Join(dataDir, previewSecretFile)
	secret, _, err := secretfile.LoadOrCreate(path,
		func() (string, error) { return gateway.NewPreviewSecret(), nil },
		func(s string) error {
			if len(s) < gateway.MinPreviewSecretLen {
				return fmt.Errorf("shorter than %d characters", gateway.MinPreviewSecretLen)
			}
			return nil
		})
	if err != nil {
		return "", fmt.Errorf("preview secret file: %w (delete it or set QUARRY_PREVIEW_SECRET)", err)
	}
	if store != "embedded" {
		log.Warn("QUARRY_PREVIEW_SECRET is unset: preview URLs are signed with this replica's own secret and work only here; give every replica the same QUARRY_PREVIEW_SECRET",
			"file", path, "store", store)
	}
	return secret, nil
}
