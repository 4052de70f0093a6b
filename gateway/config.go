package gateway

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/internal/badinput"
	"github.com/quarryhq/quarry/internal/defaults"
	"github.com/quarryhq/quarry/rockcompat"
)

// Config is the gateway's configuration. cmd/gateway fills it with envconfig
// (prefix QUARRY_, the names in the envconfig tags); a zero value means the
// default stated on each field. Validate reports the first bad value by its
// environment variable.
type Config struct {
	// APIKeys are the accepted bearer keys (QUARRY_API_KEYS, comma
	// separated). At least one is required. A lease's owner is a hash of the
	// key that created it, so rotating a key hides the sandboxes it created.
	APIKeys []string `envconfig:"QUARRY_API_KEYS"`
	// DefaultPool is the pool of a create request that names none (default "default").
	DefaultPool string `envconfig:"QUARRY_DEFAULT_POOL"`

	// MaxJSONBody bounds JSON request bodies in bytes (default 8 MiB).
	MaxJSONBody int64 `envconfig:"QUARRY_MAX_JSON_BODY"`
	// MaxUploadBody bounds raw uploads in bytes: files, archives and process
	// stdin (default 1 GiB).
	MaxUploadBody int64 `envconfig:"QUARRY_MAX_UPLOAD_BODY"`
	// MaxAgentResponse bounds an agent answer that the gateway buffers (every
	// answer except streams and downloads) in bytes (default 256 MiB: an
	// exec may return 64 MiB of stdout and of stderr, JSON-escaped).
	MaxAgentResponse int64 `envconfig:"QUARRY_MAX_AGENT_RESPONSE"`

	// RequestTimeout bounds an agent call that carries no timeout of its own
	// (default 30s).
	RequestTimeout time.Duration `envconfig:"QUARRY_REQUEST_TIMEOUT"`
	// CommandTimeout is the run time assumed for an exec or session run
	// without timeout_ms: the agent's default (default 5m).
	CommandTimeout time.Duration `envconfig:"QUARRY_COMMAND_TIMEOUT"`
	// TimeoutMargin is added to a command's timeout_ms to bound the whole
	// agent call (default 10s).
	TimeoutMargin time.Duration `envconfig:"QUARRY_TIMEOUT_MARGIN"`
	// MaxCommandTimeout caps the bound of one exec or session run call
	// (default 24h10s: the agent's maximum timeout plus the margin).
	MaxCommandTimeout time.Duration `envconfig:"QUARRY_MAX_COMMAND_TIMEOUT"`
	// ManagerTimeout bounds each manager call other than a create: lease
	// reads, heartbeats, releases, lists, pools, task checks (default 10s).
	ManagerTimeout time.Duration `envconfig:"QUARRY_MANAGER_TIMEOUT"`
	// CreateTimeout bounds a create, including a cold start (default 5m; keep
	// it above the manager's QUARRY_ACQUIRE_TIMEOUT).
	CreateTimeout time.Duration `envconfig:"QUARRY_CREATE_TIMEOUT"`
	// ImageBuildKeys are the API keys that may build images
	// (POST /v1/images/build): their owner ids (GET /v1/whoami), or "*"
	// for every key. Empty (the default): builds are off, since a build
	// runs the Dockerfile's commands on the engine's host.
	ImageBuildKeys []string `envconfig:"QUARRY_IMAGE_BUILD_KEYS"`
	// ImageBuildTimeout bounds one image build (default 30m).
	ImageBuildTimeout time.Duration `envconfig:"QUARRY_IMAGE_BUILD_TIMEOUT"`
	// ReadTimeout bounds reading one request's headers and JSON body
	// (default 60s).
	ReadTimeout time.Duration `envconfig:"QUARRY_READ_TIMEOUT"`
	// UploadTimeout bounds reading one upload body (default 1h).
	UploadTimeout time.Duration `envconfig:"QUARRY_UPLOAD_TIMEOUT"`
	// IdleTimeout closes a client connection or an agent stream on which
	// nothing was sent or received for that long (default 2m). Agents send
	// keep-alives on quiet streams well within it.
	IdleTimeout time.Duration `envconfig:"QUARRY_IDLE_TIMEOUT"`
	// AgentDialTimeout bounds connecting to an agent (default 5s).
	AgentDialTimeout time.Duration `envconfig:"QUARRY_AGENT_DIAL_TIMEOUT"`
	// MaxConnsPerAgent bounds the connections to one agent (default 256); a
	// call waits up to AgentDialTimeout for a free one.
	MaxConnsPerAgent int `envconfig:"QUARRY_MAX_CONNS_PER_AGENT"`
	// MaxAgentClients bounds the cached per-agent HTTP clients, about 1 KiB
	// each (default 16384; cmd/gateway defaults it to the pools' total
	// max_total when that is larger). Past it the least recently used are
	// dropped (and rebuilt when used again).
	MaxAgentClients int `envconfig:"QUARRY_MAX_AGENT_CLIENTS"`
	// RetryAfter is the Retry-After of 503 answers (default 2s).
	RetryAfter time.Duration `envconfig:"QUARRY_RETRY_AFTER"`
	// CheckpointCompression is the level agents compress checkpoints at:
	// "none" (the default: a plain tar, the speed of a copy),
	// "fast" (Huffman only: archives about 0.6 of none's, restores about
	// twice as slow) or "small" (deflate's fastest level).
	CheckpointCompression string `envconfig:"QUARRY_CHECKPOINT_COMPRESSION"`
	// CheckpointCowMinBytes: forks of a checkpoint of at least this many
	// bytes, and sandboxes created from one, start on a copy-on-write
	// layer where the pool's provider can (Docker), instead of a restore
	// into each (default 32 MiB, from `make bench`'s ckbench: below it a
	// restore into a warm sandbox is faster than a cold start; negative:
	// never).
	CheckpointCowMinBytes int64 `envconfig:"QUARRY_CHECKPOINT_COW_MIN_BYTES"`

	// PreviewConfig: signed preview URLs of sandbox ports (preview.go).
	PreviewConfig

	// MaxWebSockets bounds the WebSockets (PTY and port routes) one gateway
	// relays at once (default 10000); past it a new one is 503.
	MaxWebSockets int `envconfig:"QUARRY_MAX_WEBSOCKETS"`
	// WSLeaseCheck is how often an open WebSocket reads its lease; a
	// released or expired lease closes it with 4410 lease_gone (default 10s).
	WSLeaseCheck time.Duration `envconfig:"QUARRY_WS_LEASE_CHECK"`
	// WSPingInterval is how often the relay pings both ends of a WebSocket;
	// an end silent for two intervals is closed (default 30s).
	WSPingInterval time.Duration `envconfig:"QUARRY_WS_PING_INTERVAL"`
	// RockPollHold is how long ROCK's SDK's "kill -0 PID" check of a nohup
	// job is held until the job ends (default 8s; "off": answered at once;
	// docs/ROCK.md).
	RockPollHold rockcompat.PollHoldSetting `envconfig:"QUARRY_ROCK_POLL_HOLD"`
	// E2BDomain is the domain E2B's SDK is told its sandboxes are under
	// (Sandbox.domain): without E2B_SANDBOX_URL it reaches envd at
	// https://49983-{id}.{E2BDomain} and a port at {port}-{id}.{E2BDomain},
	// which needs wildcard DNS and TLS to the gateway. It may end in
	// ":port" when the gateway is not on 443 (sbx.example.com:8443). Empty
	// (the default): null, and the SDK uses its E2B_DOMAIN (docs/E2B.md).
	E2BDomain string `envconfig:"QUARRY_E2B_DOMAIN"`
	// RockNohupExit is what reading a finished nohup job's output answers
	// ROCK's SDK: "rock" (default), success as ROCK answers, or "real", the
	// job's exit code (docs/ROCK.md).
	RockNohupExit string `envconfig:"QUARRY_ROCK_NOHUP_EXIT"`
}

// Defaults of Config's zero fields.
const (
	DefaultMaxJSONBody           = 8 << 20
	DefaultMaxUploadBody         = 1 << 30
	DefaultMaxAgentResponse      = 256 << 20
	DefaultRequestTimeout        = 30 * time.Second
	DefaultCommandTimeout        = 5 * time.Minute
	DefaultTimeoutMargin         = 10 * time.Second
	DefaultMaxCommandTimeout     = 24*time.Hour + DefaultTimeoutMargin
	DefaultManagerTimeout        = 10 * time.Second
	DefaultCreateTimeout         = 5 * time.Minute
	DefaultImageBuildTimeout     = 30 * time.Minute
	DefaultReadTimeout           = 60 * time.Second
	DefaultUploadTimeout         = time.Hour
	DefaultIdleTimeout           = 2 * time.Minute
	DefaultAgentDialTimeout      = 5 * time.Second
	DefaultMaxConnsPerAgent      = 256
	DefaultMaxAgentClients       = 16384
	DefaultRetryAfter            = 2 * time.Second
	DefaultMaxWebSockets         = 10000
	DefaultWSLeaseCheck          = 10 * time.Second
	DefaultWSPingInterval        = 30 * time.Second
	DefaultCheckpointCowMinBytes = 32 << 20
)

// maxAPIKeyLen bounds one API key; longer Authorization values are refused
// before hashing. minAPIKeyLen refuses keys short enough to guess.
const (
	maxAPIKeyLen = 256
	minAPIKeyLen = 16
)

// Validate checks c (before defaults are applied: zero means default) and
// returns an error naming the environment variable of the first bad value.
func (c Config) Validate() error {
	if len(c.APIKeys) == 0 {
		return errors.New("QUARRY_API_KEYS: at least one API key is required")
	}
	for i, k := range c.APIKeys {
		if err := checkAPIKey(k); err != nil {
			return fmt.Errorf("QUARRY_API_KEYS: key %d: %w", i+1, err)
		}
	}
	if c.DefaultPool != "" {
		if err := checkName(c.DefaultPool); err != nil {
			return fmt.Errorf("QUARRY_DEFAULT_POOL: %w", err)
		}
	}
	switch c.CheckpointCompression {
	case "", agentapi.CompressionFast, agentapi.CompressionNone, agentapi.CompressionSmall:
	default:
		return fmt.Errorf("QUARRY_CHECKPOINT_COMPRESSION: want %s, %s or %s, got %q",
			agentapi.CompressionFast, agentapi.CompressionNone, agentapi.CompressionSmall, c.CheckpointCompression)
	}
	sizes := []struct {
		name string
		v    int64
	}{
		{"QUARRY_MAX_JSON_BODY", c.MaxJSONBody},
		{"QUARRY_MAX_UPLOAD_BODY", c.MaxUploadBody},
		{"QUARRY_MAX_AGENT_RESPONSE", c.MaxAgentResponse},
		{"QUARRY_MAX_CONNS_PER_AGENT", int64(c.MaxConnsPerAgent)},
		{"QUARRY_MAX_AGENT_CLIENTS", int64(c.MaxAgentClients)},
		{"QUARRY_MAX_WEBSOCKETS", int64(c.MaxWebSockets)},
	}
	for _, s := range sizes {
		if s.v < 0 {
			return fmt.Errorf("%s: must not be negative, got %d", s.name, s.v)
		}
	}
	durations := []struct {
		name string
		v    time.Duration
	}{
		{"QUARRY_REQUEST_TIMEOUT", c.RequestTimeout},
		{"QUARRY_COMMAND_TIMEOUT", c.CommandTimeout},
		{"QUARRY_TIMEOUT_MARGIN", c.TimeoutMargin},
		{"QUARRY_MAX_COMMAND_TIMEOUT", c.MaxCommandTimeout},
		{"QUARRY_MANAGER_TIMEOUT", c.ManagerTimeout},
		{"QUARRY_CREATE_TIMEOUT", c.CreateTimeout},
		{"QUARRY_IMAGE_BUILD_TIMEOUT", c.ImageBuildTimeout},
		{"QUARRY_READ_TIMEOUT", c.ReadTimeout},
		{"QUARRY_UPLOAD_TIMEOUT", c.UploadTimeout},
		{"QUARRY_IDLE_TIMEOUT", c.IdleTimeout},
		{"QUARRY_AGENT_DIAL_TIMEOUT", c.AgentDialTimeout},
		{"QUARRY_RETRY_AFTER", c.RetryAfter},
		{"QUARRY_WS_LEASE_CHECK", c.WSLeaseCheck},
		{"QUARRY_WS_PING_INTERVAL", c.WSPingInterval},
	}
	for _, d := range durations {
		if d.v < 0 {
			return fmt.Errorf("%s: must not be negative, got %s", d.name, d.v)
		}
	}
	if err := checkDomain(c.E2BDomain); err != nil {
		return fmt.Errorf("QUARRY_E2B_DOMAIN: %w", err)
	}
	if c.MaxJSONBody > 0 && c.MaxUploadBody > 0 && c.MaxUploadBody < c.MaxJSONBody {
		return fmt.Errorf("QUARRY_MAX_UPLOAD_BODY: must be at least QUARRY_MAX_JSON_BODY (%d), got %d", c.MaxJSONBody, c.MaxUploadBody)
	}
	return c.PreviewConfig.validate()
}

// checkAPIKey accepts printable ASCII without spaces or commas, 1..256 bytes.
func checkAPIKey(k string) error {
	if k == "" {
		return errors.New("must not be empty")
	}
	if len(k) > maxAPIKeyLen {
		return fmt.Errorf("must be at most %d bytes", maxAPIKeyLen)
	}
	if len(k) < minAPIKeyLen {
		return fmt.Errorf("must be at least %d characters (a short key can be guessed; e.g. openssl rand -hex 24)", minAPIKeyLen)
	}
	if strings.IndexFunc(k, func(r rune) bool { return r <= ' ' || r > '~' || r == ',' }) >= 0 {
		return errors.New("must be printable ASCII without spaces or commas")
	}
	return nil
}

// checkDomain accepts "" or a DNS name without a scheme, port or path:
// labels of letters, digits and '-' joined by '.'.
func checkDomain(d string) error {
	if d == "" {
		return nil
	}
	if host, port, ok := strings.Cut(d, ":"); ok {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 || port[0] == '0' {
			return fmt.Errorf("want a domain and, optionally, :port (sandboxes.example.com:8443), got %q", d)
		}
		d = host
	}
	if len(d) > 253 {
		return errors.New("at most 253 characters")
	}
	for _, label := range strings.Split(d, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' ||
			strings.IndexFunc(label, func(r rune) bool { return !(r == '-' || r < 128 && badinput.Alnum(byte(r))) }) >= 0 {
			return fmt.Errorf("want a domain such as sandboxes.example.com, optionally with :port (no scheme or path), got %q", d)
		}
	}
	return nil
}

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.DefaultPool == "" {
		c.DefaultPool = "default"
	}
	defaults.Set(&c.MaxJSONBody, DefaultMaxJSONBody)
	defaults.Set(&c.MaxUploadBody, DefaultMaxUploadBody)
	defaults.Set(&c.MaxAgentResponse, DefaultMaxAgentResponse)
	defaults.Set(&c.RequestTimeout, DefaultRequestTimeout)
	defaults.Set(&c.CommandTimeout, DefaultCommandTimeout)
	defaults.Set(&c.TimeoutMargin, DefaultTimeoutMargin)
	defaults.Set(&c.MaxCommandTimeout, DefaultMaxCommandTimeout)
	defaults.Set(&c.ManagerTimeout, DefaultManagerTimeout)
	defaults.Set(&c.CreateTimeout, DefaultCreateTimeout)
	defaults.Set(&c.ImageBuildTimeout, DefaultImageBuildTimeout)
	defaults.Set(&c.ReadTimeout, DefaultReadTimeout)
	defaults.Set(&c.UploadTimeout, DefaultUploadTimeout)
	defaults.Set(&c.IdleTimeout, DefaultIdleTimeout)
	defaults.Set(&c.AgentDialTimeout, DefaultAgentDialTimeout)
	defaults.Set(&c.RetryAfter, DefaultRetryAfter)
	defaults.Set(&c.CheckpointCompression, agentapi.CompressionNone)
	if c.CheckpointCowMinBytes == 0 {
		c.CheckpointCowMinBytes = DefaultCheckpointCowMinBytes
	}
	defaults.Set(&c.WSLeaseCheck, DefaultWSLeaseCheck)
	defaults.Set(&c.WSPingInterval, DefaultWSPingInterval)
	defaults.Set(&c.MaxWebSockets, DefaultMaxWebSockets)
	if c.MaxConnsPerAgent == 0 {
		c.MaxConnsPerAgent = DefaultMaxConnsPerAgent
	}
	if c.MaxAgentClients == 0 {
		c.MaxAgentClients = DefaultMaxAgentClients
	}
	c.PreviewConfig = c.PreviewConfig.withDefaults()
	return c
}
