package ecssim

import (
	"fmt"
	"hash/fnv"
	"time"
)

// Image sizes and pulls (simulated). A task pulls the image of its task
// definition's sandbox container (the container named "sandbox", else the
// first one) after its placement: it runs after its drawn start time plus
// the pull, size / Config.PullRate. Every task pulls (Fargate caches no
// image between tasks). The init container's agent image is small and not
// counted.

// Bounds of DefaultImageSize.
const (
	minImageSize  = 64 << 20
	imageSizeSpan = 1984 << 20 // up to 2 GiB
)

// DefaultImageSize is the simulated size of an image the registry table
// (Config.Images) does not hold: a deterministic function of its
// reference, 64 MiB plus FNV-1a(image) mod 1,984 MiB (64 MiB to 2 GiB,
// spread evenly over images), so every run and every replica sees the same
// size for an image.
func DefaultImageSize(image string) int64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(image))
	return minImageSize + int64(h.Sum64()%imageSizeSpan)
}

// imageSize returns image's size in the simulated registry, false when it
// has none (StrictRegistry and not in the table).
func (c Config) imageSize(image string) (int64, bool) {
	if size, ok := c.Images[image]; ok {
		return size, true
	}
	if c.StrictRegistry {
		return 0, false
	}
	return DefaultImageSize(image), true
}

// pullTime returns the wall-clock time a pull of size bytes takes (0
// without a PullRate).
func (c Config) pullTime(size int64) time.Duration {
	if c.PullRate <= 0 {
		return 0
	}
	return c.wall(time.Duration(float64(size) / c.PullRate * float64(time.Second)))
}

// pullNotFound is the stopped reason of a task whose image the simulated
// registry does not hold: Fargate's words.
func pullNotFound(image string) string {
	return fmt.Sprintf("CannotPullContainerError: pull image manifest has been retried 5 time(s): failed to resolve ref %s: %s: not found", image, image)
}

// pullFailDelay is how long after its placement a task whose image does
// not exist stops (simulated: the pull's retries).
const pullFailDelay = 5 * time.Second
