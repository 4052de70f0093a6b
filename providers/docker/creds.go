package docker

import (
	"fmt"

	"github.com/docker/cli/cli/config"
	"github.com/docker/cli/cli/config/credentials"
	"github.com/docker/docker/api/types/registry"
)

// dockerHubHost is the registry host of reference.ParseNormalizedNamed's
// Docker Hub images, and dockerHubAuthKey the key Docker's config files
// keep its credentials under.
const (
	dockerHubHost    = "docker.io"
	dockerHubAuthKey = "https://index.docker.io/v1/"
)

// registryAuth returns the engine's X-Registry-Auth value for a pull from
// host with the credentials of the Docker config directory dir ("" when
// dir is "" or holds none for host): config.json's auths, or the
// credential helper credHelpers names for host, else credsStore's, run as
// docker-credential-<name> get. It reads the directory at each call, so
// credentials rotated on disk are used by the next pull. Unlike the
// Docker CLI it reads no environment (DOCKER_AUTH_CONFIG).
func registryAuth(dir, host string) (string, error) {
	if dir == "" {
		return "", nil
	}
	cf, err := config.Load(dir)
	if err != nil {
		return "", fmt.Errorf("read the Docker config in %s (DockerConfig): %w", dir, err)
	}
	key := host
	if host == dockerHubHost {
		key = dockerHubAuthKey
	}
	store := credentials.NewFileStore(cf)
	helper := cf.CredentialsStore
	if h, ok := cf.CredentialHelpers[key]; ok {
		helper = h
	}
	if helper != "" {
		store = credentials.NewNativeStore(cf, helper)
	}
	ac, err := store.Get(key)
	if err != nil {
		return "", fmt.Errorf("credentials of %s from the Docker config in %s (DockerConfig): %w", host, dir, err)
	}
	if ac.Username == "" && ac.Password == "" && ac.IdentityToken == "" && ac.RegistryToken == "" && ac.Auth == "" {
		return "", nil
	}
	return registry.EncodeAuthConfig(registry.AuthConfig{
		Username:      ac.Username,
		Password:      ac.Password,
		Auth:          ac.Auth,
		ServerAddress: ac.ServerAddress,
		IdentityToken: ac.IdentityToken,
		RegistryToken: ac.RegistryToken,
	})
}
