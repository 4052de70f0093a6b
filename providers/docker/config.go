package docker

import (
	"errors"
	"fmt"
	"path"
	"strconv"
	"strings"
	"time"

	units "github.com/docker/go-units"

	"github.com/quarryhq/quarry/internal/defaults"
)

// Defaults applied by Config.WithDefaults.
const (
	DefaultHost      = "unix:///var/run/docker.sock"
	DefaultGatewayID = "local"
	DefaultUser      = "65534:65534"
	DefaultWorkdir   = "/home/sandbox"
	DefaultNetwork   = NetworkBridge
	DefaultPidsLimit = 1024
	// defaultWorkdirSizeMB sizes the work directory of a container without
	// a memory limit when Config.WorkdirSizeMB is 0.
	defaultWorkdirSizeMB     = 1024
	DefaultStartTimeout      = 60 * time.Second
	DefaultLayerTimeout      = 5 * time.Minute
	DefaultLayerIdle         = 10 * time.Minute
	DefaultLayerMedium       = LayerMemory
	DefaultLaunchConcurrency = 4
	DefaultPullConcurrency   = 4
	DefaultPullTimeout       = 10 * time.Minute
)

// Network modes with a meaning of their own; any other value names a Docker
// network the containers join (with the agent's port published as on the
// bridge).
const (
	// NetworkBridge is Docker's default bridge network; the agent's port is
	// published on 127.0.0.1 only.
	NetworkBridge = "bridge"
	// NetworkHost shares the host's network namespace: the agent listens on
	// 127.0.0.1 at a port the provider picks, and the sandbox sees every
	// host interface. Less isolated; use it when a sandbox needs the host's
	// network.
	NetworkHost = "host"
)

// Bounds checked by Validate and by the pool options.
const (
	minPidsLimit         = 16
	maxPidsLimit         = 1 << 22
	maxWorkdirSizeMB     = 1 << 20
	maxLaunchConcurrency = 64
	maxPullConcurrency   = 64
	maxID                = 1<<31 - 1
)

// Config configures the Docker provider. The zero value of every field but
// AgentBinary and TokenKeyFile is replaced by its default (WithDefaults).
// Pools can override User, Workdir, Network and PidsLimit with options (see
// the package README section in providers/README.md). cmd/gateway fills it
// with envconfig: the tags name each field's QUARRY_DOCKER_* variable (in
// full, so that no unprefixed USER or HOST is read); the ignored fields come
// from the gateway's own configuration.
type Config struct {
	// Host is the Docker engine's endpoint, as DOCKER_HOST spells it
	// ("unix:///var/run/docker.sock", "tcp://127.0.0.1:2375"). The engine
	// must run on the gateway's host: the agent binary is bind-mounted from
	// its file system.
	Host string `envconfig:"QUARRY_DOCKER_HOST"`
	// AgentBinary is the absolute path of the static exec agent
	// (CGO_ENABLED=0) on the engine's host; it is bind-mounted read-only
	// into every container. Required.
	AgentBinary string `ignored:"true"`
	// TokenKeyFile holds the secret (64 hex characters) that agent tokens
	// are derived from. New creates it (mode 0600, its directory 0700) when
	// missing. Gateways that share containers must share the key. Required.
	TokenKeyFile string `envconfig:"QUARRY_DOCKER_TOKEN_KEY_FILE"`
	// RelayDir is the directory on the engine's host that holds the
	// gateway's model relay socket (providers.RelaySocketName). When set,
	// containers that do not share the host's network get it mounted
	// read-only, and their agent forwards the relay's sandbox routes to it,
	// so that a sandbox reaches the relay at its own 127.0.0.1
	// (SandboxRelayURL) with no network path to the gateway. Empty: no
	// relay socket.
	RelayDir string `ignored:"true"`
	// GatewayID is attached to every container as providers.LabelGateway;
	// List, Describe and Stop only see containers that carry it.
	GatewayID string `ignored:"true"`
	// User is the numeric "uid" or "uid:gid" commands run as (default
	// 65534:65534, nobody). "0" runs them as root (still without
	// privileges beyond the capability set the provider keeps).
	User string `envconfig:"QUARRY_DOCKER_USER"`
	// Workdir is the sandbox's working directory and HOME: a tmpfs owned by
	// User, so that any image gets a writable home for its unprivileged user.
	Workdir string `envconfig:"QUARRY_DOCKER_WORKDIR"`
	// WorkdirSizeMB bounds the work directory's tmpfs, in MiB, for pools
	// that set no disk. Its pages count against the container's memory
	// limit, which is raised by as much (memory + disk); 0 sizes it as the
	// pool's memory (1024 MiB for a pool without a memory limit).
	WorkdirSizeMB int64 `envconfig:"QUARRY_DOCKER_WORKDIR_SIZE_MB"`
	// Network is "bridge" (default), "host", or the name of an existing
	// Docker network.
	Network string `envconfig:"QUARRY_DOCKER_NETWORK"`
	// PidsLimit bounds the processes of one container (default 1024).
	PidsLimit int64 `envconfig:"QUARRY_DOCKER_PIDS_LIMIT"`
	// StartTimeout bounds the launch of one container, from create until it
	// runs with a known agent port.
	StartTimeout time.Duration `envconfig:"QUARRY_DOCKER_START_TIMEOUT"`
	// LaunchConcurrency bounds how many containers one Launch call creates
	// and starts at once (1..64).
	LaunchConcurrency int `envconfig:"QUARRY_DOCKER_LAUNCH_CONCURRENCY"`
	// DockerConfig is a Docker config directory whose config.json gives
	// the credentials of pulls (auths, credHelpers, credsStore: a helper
	// runs as docker-credential-<name> get), read at each pull; "" pulls
	// without credentials. Requests never carry credentials.
	DockerConfig string `envconfig:"QUARRY_DOCKER_CONFIG"`
	// PullConcurrency bounds the pulls under way at once (1..64); more
	// wait for a slot.
	PullConcurrency int `envconfig:"QUARRY_DOCKER_PULL_CONCURRENCY"`
	// PullTimeout bounds one pull from when it has a slot, whoever waits.
	PullTimeout time.Duration `envconfig:"QUARRY_DOCKER_PULL_TIMEOUT"`
	// ImageBudget bounds the bytes of the images this provider pulled for
	// on-demand pools (as the engine sizes them); after a pull past it the
	// least recently used unused ones are removed. 0: no budget.
	ImageBudget Bytes `envconfig:"QUARRY_DOCKER_IMAGE_BUDGET"`
	// LedgerFile is where the provider records the images it pulled for
	// on-demand pools and their last use (JSON, written atomically); ""
	// keeps the record in memory (a restarted provider forgets it and so
	// never removes those images).
	LedgerFile string `ignored:"true"`
	// LayerTimeout bounds the unpack of one copy-on-write layer
	// (providers.Layers), whoever waits for it.
	LayerTimeout time.Duration `envconfig:"QUARRY_DOCKER_LAYER_TIMEOUT"`
	// LayerIdle is how long a layer no task uses is kept for the next
	// sandbox started from its checkpoint, unless the checkpoint is
	// deleted first (DropLayer); a timer removes it then.
	LayerIdle time.Duration `envconfig:"QUARRY_DOCKER_LAYER_IDLE"`
	// LayerMedium is where layers are unpacked: LayerMemory (a tmpfs
	// volume, held mounted by the container that unpacked it for the
	// layer's life; the default) or LayerDisk (a volume on the engine's
	// disk).
	LayerMedium string `envconfig:"QUARRY_DOCKER_LAYER_MEDIUM"`
}

// Layer media (Config.LayerMedium).
const (
	LayerMemory = "memory"
	LayerDisk   = "disk"
)

// Bytes is a size in bytes that envconfig reads as a number of bytes or
// with a binary unit: "1073741824", "20Gi", "20GiB", "512Mi", "20G" (all
// 1024-based).
type Bytes int64

// Decode implements envconfig.Decoder.
func (b *Bytes) Decode(s string) error {
	in := s
	if strings.HasSuffix(in, "i") || strings.HasSuffix(in, "I") {
		in += "B" // go-units spells "Gi" "GiB"
	}
	n, err := units.RAMInBytes(in)
	if err != nil || n < 0 {
		return fmt.Errorf("want bytes or a size such as \"20Gi\", got %q", s)
	}
	*b = Bytes(n)
	return nil
}

// WithDefaults returns c with every unset field set to its default.
func (c Config) WithDefaults() Config {
	defaults.Set(&c.Host, DefaultHost)
	defaults.Set(&c.GatewayID, DefaultGatewayID)
	defaults.Set(&c.User, DefaultUser)
	defaults.Set(&c.Workdir, DefaultWorkdir)
	defaults.Set(&c.Network, DefaultNetwork)
	if c.PidsLimit == 0 {
		c.PidsLimit = DefaultPidsLimit
	}
	if c.StartTimeout == 0 {
		c.StartTimeout = DefaultStartTimeout
	}
	if c.LaunchConcurrency == 0 {
		c.LaunchConcurrency = DefaultLaunchConcurrency
	}
	if c.PullConcurrency == 0 {
		c.PullConcurrency = DefaultPullConcurrency
	}
	if c.PullTimeout == 0 {
		c.PullTimeout = DefaultPullTimeout
	}
	if c.LayerTimeout == 0 {
		c.LayerTimeout = DefaultLayerTimeout
	}
	if c.LayerIdle == 0 {
		c.LayerIdle = DefaultLayerIdle
	}
	if c.LayerMedium == "" {
		c.LayerMedium = DefaultLayerMedium
	}
	return c
}

// Validate reports every invalid field of c (after defaults), each error
// naming its field. It touches neither the file system nor the engine (New
// does).
func (c Config) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", field, fmt.Sprintf(format, args...)))
	}
	if !strings.Contains(c.Host, "://") {
		bad("Host", "want an endpoint such as %q, got %q", DefaultHost, c.Host)
	}
	switch {
	case c.AgentBinary == "":
		bad("AgentBinary", "must be set")
	case !path.IsAbs(c.AgentBinary):
		bad("AgentBinary", "must be an absolute path (the engine bind-mounts it), got %q", c.AgentBinary)
	case c.RelayDir != "" && !path.IsAbs(c.RelayDir):
		bad("RelayDir", "must be an absolute path (the engine bind-mounts it), got %q", c.RelayDir)
	}
	if c.TokenKeyFile == "" {
		bad("TokenKeyFile", "must be set")
	}
	if c.GatewayID == "" {
		bad("GatewayID", "must be set")
	}
	if _, _, err := parseUser(c.User); err != nil {
		bad("User", "%v", err)
	}
	if err := checkWorkdir(c.Workdir); err != nil {
		bad("Workdir", "%v", err)
	}
	if c.WorkdirSizeMB != 0 {
		if err := checkWorkdirSize(c.WorkdirSizeMB); err != nil {
			bad("WorkdirSizeMB", "%v", err)
		}
	}
	if err := checkNetwork(c.Network); err != nil {
		bad("Network", "%v", err)
	}
	if err := checkPidsLimit(c.PidsLimit); err != nil {
		bad("PidsLimit", "%v", err)
	}
	if c.StartTimeout <= 0 {
		bad("StartTimeout", "must be positive, got %s", c.StartTimeout)
	}
	if c.LaunchConcurrency < 1 || c.LaunchConcurrency > maxLaunchConcurrency {
		bad("LaunchConcurrency", "must be between 1 and %d, got %d", maxLaunchConcurrency, c.LaunchConcurrency)
	}
	if c.PullConcurrency < 1 || c.PullConcurrency > maxPullConcurrency {
		bad("PullConcurrency", "must be between 1 and %d, got %d", maxPullConcurrency, c.PullConcurrency)
	}
	if c.PullTimeout <= 0 {
		bad("PullTimeout", "must be positive, got %s", c.PullTimeout)
	}
	if c.LayerTimeout <= 0 {
		bad("LayerTimeout", "must be positive, got %s", c.LayerTimeout)
	}
	if c.LayerIdle < 0 {
		bad("LayerIdle", "must not be negative, got %s", c.LayerIdle)
	}
	if c.LayerMedium != LayerMemory && c.LayerMedium != LayerDisk {
		bad("LayerMedium", "must be %q or %q, got %q", LayerMemory, LayerDisk, c.LayerMedium)
	}
	if c.ImageBudget < 0 {
		bad("ImageBudget", "must not be negative, got %d", c.ImageBudget)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("docker provider config: %w", err)
	}
	return nil
}

// parseUser parses a numeric "uid" or "uid:gid" (gid defaults to uid).
// Names are refused: the work directory is mounted owned by the user before
// the image's /etc/passwd could say who a name is.
func parseUser(s string) (uid, gid int, err error) {
	u, g, hasGID := strings.Cut(s, ":")
	uid, err = parseID(u)
	if err != nil {
		return 0, 0, fmt.Errorf("want a numeric uid or uid:gid, got %q", s)
	}
	gid = uid
	if hasGID {
		if gid, err = parseID(g); err != nil {
			return 0, 0, fmt.Errorf("want a numeric uid or uid:gid, got %q", s)
		}
	}
	return uid, gid, nil
}

func parseID(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || n > maxID || strconv.Itoa(n) != s {
		return 0, errors.New("not an id")
	}
	return n, nil
}

// reservedDirs are where a work directory may not be: the provider's own
// directory and the kernel's file systems.
func reservedDirs() []string { return []string{agentDir, "/proc", "/sys", "/dev"} }

func checkWorkdir(dir string) error {
	switch {
	case !path.IsAbs(dir):
		return fmt.Errorf("must be an absolute path, got %q", dir)
	case path.Clean(dir) != dir:
		return fmt.Errorf("must be a clean path (%q), got %q", path.Clean(dir), dir)
	case dir == "/":
		return errors.New("must not be /")
	}
	for _, r := range reservedDirs() {
		if dir == r || strings.HasPrefix(dir, r+"/") {
			return fmt.Errorf("must not be in %s, got %q", r, dir)
		}
	}
	return nil
}

func checkWorkdirSize(mb int64) error {
	if mb < 1 || mb > maxWorkdirSizeMB {
		return fmt.Errorf("must be between 1 and %d MiB, got %d", maxWorkdirSizeMB, mb)
	}
	return nil
}

func checkNetwork(n string) error {
	switch {
	case n == "":
		return errors.New("must be set (\"bridge\", \"host\" or a network name)")
	case n == "none":
		return errors.New("\"none\" leaves the agent unreachable")
	case strings.HasPrefix(n, "container:"):
		return errors.New("sharing another container's network is not supported")
	}
	return nil
}

func checkPidsLimit(n int64) error {
	if n < minPidsLimit || n > maxPidsLimit {
		return fmt.Errorf("must be between %d and %d, got %d", minPidsLimit, maxPidsLimit, n)
	}
	return nil
}
