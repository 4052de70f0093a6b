package docker

import (
	"context"
	"testing"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/network"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// abandoningCreate is the engine as a client whose ctx ends mid-create
// sees it: the engine creates the container, but the client gave up and
// answers ctx's error without the id. cancel ends the launch's ctx while
// the create is under way.
type abandoningCreate struct {
	dockerAPI
	cancel context.CancelFunc
}

func (a abandoningCreate) ContainerCreate(ctx context.Context, config *container.Config, hostConfig *container.HostConfig,
	networkingConfig *network.NetworkingConfig, platform *ocispec.Platform, name string,
) (container.CreateResponse, error) {
	created, err := a.dockerAPI.ContainerCreate(context.WithoutCancel(ctx), config, hostConfig, networkingConfig, platform, name)
	a.cancel()
	if ctx.Err() != nil {
		return container.CreateResponse{}, ctx.Err()
	}
	return created, err
}

// A launch whose ctx ends while its container is being created (a gateway
// shutting down mid-refill) leaves no container behind: the engine finishes
// the create either way, and a container whose id its launch never learnt
// is stopped by no one once its gateway is gone for good.
func TestProvider_Launch_CanceledDuringCreateLeavesNoContainer(t *testing.T) {
	e, p := dockerProvider(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p.api = abandoningCreate{dockerAPI: p.api, cancel: cancel}

	tasks, err := p.Launch(ctx, spec("abandoned", imageBusybox), []string{"abandoned-" + randomHex(t, 4)})
	assert.Empty(t, tasks)
	require.ErrorIs(t, err, context.Canceled)
	assert.Empty(t, e.containers(t), "the container its launch gave up on is left behind")
}
