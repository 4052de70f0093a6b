package scalebench

import (
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/quarryhq/quarry/bench/ecssim"
)

// The images scenario's batch (issue 22): N sandboxes over M task images,
// SWE-style. Every size here is assumed, and every time simulated.
const (
	// imageRegistry holds the batch's images: a private ECR registry (or
	// a pull-through cache of one), as docs/DEPLOY.md sets one up.
	imageRegistry = "123456789012.dkr.ecr.us-east-1.amazonaws.com"
	// ImageBaseSize is the part every image of the batch shares (an OS, a
	// language toolchain and a repository's environment: SWE-bench's base
	// and env images), in compressed bytes; assumed. Fargate caches
	// nothing between tasks, so every task pulls it whole.
	ImageBaseSize = 1 << 30
	// ImageLayerMin and ImageLayerMax bound the per-task layer (the
	// repository at the task's commit and its dependencies), drawn from
	// the image's name; assumed from Epoch AI's SWE-bench registry, whose
	// instance layers are 40 MB to a few hundred MB once the repository's
	// history moved into the shared layers.
	ImageLayerMin = 40 << 20
	ImageLayerMax = 400 << 20
	// DefaultImagePullRate is how fast a Fargate task pulls (and unpacks)
	// its image, in compressed bytes per simulated second; assumed: a
	// user's report of a 2.7 GB image starting in 55 s on Fargate, of which
	// ~25–30 s is the start of a small image, gives ~50 MB/s. AWS publishes
	// no figure.
	DefaultImagePullRate = 50 << 20
	// DefaultImageSandboxes is N when the images scenario runs without
	// -sizes.
	DefaultImageSandboxes = 10000
	// imageClass is the pools file's one class.
	imageClass = "swe"
	// maxClassTotal is the most a class's max_total may be (a pool's
	// most): the images scenario's largest N.
	maxClassTotal = 10000
	// maxPrefetch is the most images one POST /v1/images/prefetch takes.
	maxPrefetch = 1000
	// imageSeed draws the batch's order: every run asks in the same order.
	imageSeed = 22
)

// imageSet is one batch: M images with their sizes, and which image each
// of the N sandboxes asks for.
type imageSet struct {
	names []string
	sizes map[string]int64 // the simulated registry (ecssim.Config.Images)
	// of[i] is sandbox i's image (an index into names): every image is
	// asked for N/M times or once more, in a shuffled order.
	of []int
}

// newImageSet builds the batch of n sandboxes over m images.
func newImageSet(n, m int) imageSet {
	s := imageSet{names: make([]string, m), sizes: make(map[string]int64, m), of: make([]int, n)}
	for j := range m {
		name := fmt.Sprintf("%s/sweb.eval.x86_64.task-%05d:latest", imageRegistry, j)
		s.names[j] = name
		s.sizes[name] = imageSize(name)
	}
	for i := range n {
		s.of[i] = i % m
	}
	rng := rand.New(rand.NewPCG(imageSeed, imageSeed))
	rng.Shuffle(n, func(a, b int) { s.of[a], s.of[b] = s.of[b], s.of[a] })
	return s
}

// imageSize is an image's size: the shared base and a per-task layer
// drawn uniformly from [ImageLayerMin, ImageLayerMax] by the FNV-1a hash
// of its name (assumed sizes).
func imageSize(name string) int64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(name))
	return ImageBaseSize + ImageLayerMin + int64(h.Sum64()%uint64(ImageLayerMax-ImageLayerMin+1))
}

// largest returns the largest image's size.
func (s imageSet) largest() int64 {
	var most int64
	for _, v := range s.sizes {
		most = max(most, v)
	}
	return most
}

// ImageFloor is the AWS floor of a batch (simulated seconds): what AWS's
// published rates allow at best, whatever the gateway does.
type ImageFloor struct {
	// Register is the last of M registrations: RegisterTaskDefinition's
	// bucket (burst 20, then 1/s) lets it happen at max(0, M − 20)/1 s.
	Register float64 `json:"register_seconds"`
	// Launch is the last of N task launches: Fargate's launch bucket
	// (burst 100, then 20 tasks/s; RunTask's 20 calls/s of 10 tasks allow
	// more) lets it happen at max(0, N − 100)/20 s.
	Launch float64 `json:"launch_seconds"`
	// Start is the slowest task's start after its launch: 90 s (the
	// longest drawn) plus the largest image's pull at the pull rate.
	Start float64 `json:"start_seconds"`
	// Batch is the floor of the whole batch however it is driven:
	// max(Register, Launch) + Start (the last image's tasks launch after
	// its registration, and the last launch after the launch bucket).
	Batch float64 `json:"batch_seconds"`
	// Creates is the floor of the creates alone once every image is
	// registered (Launch + Start); Prefetched the floor of a prefetch
	// then the creates (Register + Creates).
	Creates    float64 `json:"creates_seconds"`
	Prefetched float64 `json:"prefetch_then_creates_seconds"`
}

// imageFloor computes the floor of n sandboxes over m new images whose
// largest is largest bytes, pulled at pullRate bytes a second.
func imageFloor(n, m int, largest int64, pullRate float64) ImageFloor {
	f := ImageFloor{
		Register: math.Max(0, float64(m-ecssim.DefaultRegisterBurst)) / ecssim.DefaultRegisterRate,
		Launch:   math.Max(0, float64(n-ecssim.DefaultLaunchBurst)) / ecssim.DefaultLaunchRate,
		Start:    ecssim.DefaultStartMax.Seconds(),
	}
	if pullRate > 0 {
		f.Start += float64(largest) / pullRate
	}
	f.Start = round(f.Start)
	f.Batch = round(math.Max(f.Register, f.Launch) + f.Start)
	f.Creates = round(f.Launch + f.Start)
	f.Prefetched = round(f.Register + f.Creates)
	return f
}

// imagePools is the pools file of the images scenario: the class every
// image's on-demand pool is made of (max_total n, every image), and the
// one pool a pools file must have (min_warm 0: it launches nothing). Its
// seconds are simulated ones at the time scale.
func (c Config) imagePools(n int) string {
	ws := func(sec int) string { return strconv.Itoa(c.wallSeconds(sec)) }
	return `pools:
  - name: idle
    provider: ecs
    image: public.ecr.aws/docker/library/python:3.12-slim
    cpu: 0.25
    memory: 512Mi
    min_warm: 0
    max_total: 1
    startup_timeout_seconds: ` + ws(c.StartupSeconds) + `
classes:
  - name: ` + imageClass + `
    provider: ecs
    cpu: 0.25
    memory: 512Mi
    max_total: ` + strconv.Itoa(n) + `
    images: ["*"]
    warm_max: ` + strconv.Itoa(c.ImageWarmMax) + `
    warm_window_seconds: ` + ws(300) + `
    warm_lead_seconds: ` + ws(10) + `
    idle_seconds: ` + ws(c.ImageIdleSeconds) + `
    retention_seconds: ` + ws(7*24*3600) + `
    startup_timeout_seconds: ` + ws(c.StartupSeconds) + `
`
}

// imagesEnv is the images scenario's part of a replica's configuration at
// the time scale (docs/ARCHITECTURE.md, "One time scale"): the deadlines
// of a create and of an image's preparation, and the cadence at which
// acquires are counted into the pool records.
func (c Config) imagesEnv() []string {
	d := func(name string, v time.Duration) string { return name + "=" + c.wall(v).String() }
	return []string{
		d("QUARRY_CREATE_TIMEOUT", 5*time.Minute),
		d("QUARRY_IMAGE_PREPARE_TIMEOUT", 15*time.Minute),
		d("QUARRY_POOL_TOUCH_INTERVAL", 5*time.Second),
	}
}
