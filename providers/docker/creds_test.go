package docker

import (
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/docker/docker/api/types/registry"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRegistryAuth_FromTheDockerConfig(t *testing.T) {
	dir := t.TempDir()
	bin := t.TempDir()
	// A credential helper as Docker runs it: `docker-credential-<name> get`,
	// the server on stdin, the credentials on stdout.
	helper := "#!/bin/sh\n[ \"$1\" = get ] || exit 1\nread server\nprintf '{\"ServerURL\":\"%s\",\"Username\":\"helped\",\"Secret\":\"s3\"}' \"$server\"\n"
	require.NoError(t, os.WriteFile(filepath.Join(bin, "docker-credential-fake"), []byte(helper), 0o755))
	t.Setenv("PATH", bin+":"+os.Getenv("PATH"))
	auth := base64.StdEncoding.EncodeToString([]byte("user:pass"))
	cfg := `{"auths": {"127.0.0.1:5056": {"auth": "` + auth + `"}, "https://index.docker.io/v1/": {"auth": "` + auth + `"}},
		"credHelpers": {"helped.example": "fake"}}`
	require.NoError(t, os.WriteFile(filepath.Join(dir, "config.json"), []byte(cfg), 0o600))

	decode := func(t *testing.T, header string) registry.AuthConfig {
		t.Helper()
		b, err := base64.URLEncoding.DecodeString(header)
		require.NoError(t, err)
		var ac registry.AuthConfig
		require.NoError(t, json.Unmarshal(b, &ac))
		return ac
	}
	tests := []struct {
		name, host, user, password string
	}{
		{name: "auths", host: "127.0.0.1:5056", user: "user", password: "pass"},
		{name: "docker hub's key", host: "docker.io", user: "user", password: "pass"},
		{name: "credential helper", host: "helped.example", user: "helped", password: "s3"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, err := registryAuth(dir, tt.host)
			require.NoError(t, err)
			ac := decode(t, h)
			assert.Equal(t, tt.user, ac.Username)
			assert.Equal(t, tt.password, ac.Password)
		})
	}
	h, err := registryAuth(dir, "other.example")
	require.NoError(t, err)
	assert.Empty(t, h, "no credentials for a registry the config does not name")
	h, err = registryAuth("", "127.0.0.1:5056")
	require.NoError(t, err)
	assert.Empty(t, h, "no config: no credentials")

	require.NoError(t, os.WriteFile(filepath.Join(dir, "config.json"), []byte("{"), 0o600))
	_, err = registryAuth(dir, "127.0.0.1:5056")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "DockerConfig")
}
