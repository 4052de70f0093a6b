package modelservice

import (
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/quarryhq/quarry/internal/badinput"
	"github.com/quarryhq/quarry/internal/defaults"
	"github.com/quarryhq/quarry/warmpool"
)

// MaxTranscriptLimit bounds a transcript page's limit.
const MaxTranscriptLimit = 1000

// Defaults of Config's zero fields.
const (
	DefaultTimeout          = 600 * time.Second
	DefaultVisibility       = 60 * time.Second
	DefaultMaxWait          = 30 * time.Second
	DefaultMaxClaim         = 1000
	DefaultMaxClaimBytes    = 64 << 20
	DefaultMaxRecordedBody  = 8 << 20
	DefaultTranscriptBytes  = 64 << 20
	DefaultBrokerTimeout    = 10 * time.Second
	DefaultPurgeInterval    = time.Minute
	DefaultLeaseCheck       = 10 * time.Second
	DefaultModelName        = "policy"
	maxTimeout              = 24 * time.Hour
	defaultTranscriptLimit  = 100
	disconnectedReason      = "the agent disconnected"
	upstreamFailedReason    = "the upstream failed"
	sandboxRelayPathPattern = "/v1/sandboxes/%s/model/v1"
)

// Pool options read by the Service (in a pool's "options" map in the pools
// file).
const (
	// OptionTimeout: seconds an agent's call waits for its answer (1-86400;
	// default Config.Timeout).
	OptionTimeout = "model.timeout_seconds"
	// OptionUpstreamURL: an OpenAI-compatible base URL (http or https,
	// e.g. "http://10.0.0.5:8000/v1"); calls are forwarded there instead of
	// being queued for a trainer (passthrough).
	OptionUpstreamURL = "model.upstream_url"
	// OptionUpstreamKey: the bearer token sent to the upstream (the
	// sandbox's relay token never is).
	OptionUpstreamKey = "model.upstream_key"
	// OptionModelName: the model GET /models lists in trainer mode
	// (default "policy").
	OptionModelName = "model.name"
	// LabelUpstreamURL is the lease label that picks a passthrough upstream
	// for one sandbox; it must be one of Config.AllowedUpstreams (or the
	// pool's own upstream).
	LabelUpstreamURL = "model.upstream_url"
)

// Config tunes the Service. cmd/gateway fills it from QUARRY_RELAY_*
// variables (the envconfig tags); zero fields take the defaults.
type Config struct {
	// SandboxURL is the gateway's base URL as sandboxes reach it
	// (QUARRY_SANDBOX_GATEWAY_URL, required): OPENAI_BASE_URL is
	// SandboxURL + "/v1/sandboxes/{id}/model/v1", unless the sandbox's
	// provider names a relay URL of its own (LeaseEnv).
	SandboxURL string `envconfig:"QUARRY_SANDBOX_GATEWAY_URL"`
	// SandboxURLFixed makes every lease use SandboxURL, even where the
	// provider names a relay URL of its own: cmd/gateway sets it when
	// QUARRY_SANDBOX_GATEWAY_URL is set explicitly.
	SandboxURLFixed bool `ignored:"true"`
	// Timeout is how long an agent's call waits for its answer unless its
	// pool sets model.timeout_seconds (default 600 s).
	Timeout time.Duration `envconfig:"QUARRY_RELAY_TIMEOUT"`
	// Visibility is how long a claimed request stays hidden from other
	// claims; unanswered by then, it is offered again (default 60 s).
	Visibility time.Duration `envconfig:"QUARRY_RELAY_VISIBILITY_TIMEOUT"`
	// MaxWait bounds a claim's wait_ms (default 30 s; keep it below the
	// gateway's idle timeout).
	MaxWait time.Duration `envconfig:"QUARRY_RELAY_MAX_WAIT"`
	// MaxClaim bounds a claim's max (default 1000); MaxClaimBytes the body
	// bytes of one claimed batch (default 64 MiB).
	MaxClaim      int   `envconfig:"QUARRY_RELAY_MAX_CLAIM"`
	MaxClaimBytes int64 `envconfig:"QUARRY_RELAY_MAX_CLAIM_BYTES"`
	// MaxRecordedBody bounds the part of a passthrough answer kept in the
	// transcript (default 8 MiB); the agent receives all of it.
	MaxRecordedBody int64 `envconfig:"QUARRY_RELAY_MAX_RECORDED_BODY"`
	// TranscriptBytes bounds the body bytes of one transcript page
	// (default 64 MiB).
	TranscriptBytes int64 `envconfig:"QUARRY_RELAY_TRANSCRIPT_BYTES"`
	// BrokerTimeout bounds each broker call other than the waits (default
	// 10 s).
	BrokerTimeout time.Duration `envconfig:"QUARRY_RELAY_BROKER_TIMEOUT"`
	// PurgeInterval is how often exchanges past their retention are purged
	// from brokers that need it (default 1 min).
	PurgeInterval time.Duration `envconfig:"QUARRY_RELAY_PURGE_INTERVAL"`
	// LeaseCheck is how often a call waiting for a trainer re-reads its
	// lease: a call whose lease has ended (released, expired, lost) is
	// cancelled, so trainers stop being offered it (default 10 s).
	LeaseCheck time.Duration `envconfig:"QUARRY_RELAY_LEASE_CHECK"`
	// AllowedUpstreams are the upstream URLs a lease may pick with the
	// label model.upstream_url (QUARRY_RELAY_ALLOWED_UPSTREAMS, comma
	// separated; default none).
	AllowedUpstreams []string `envconfig:"QUARRY_RELAY_ALLOWED_UPSTREAMS"`
}

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	defaults.Set(&c.Timeout, DefaultTimeout)
	defaults.Set(&c.Visibility, DefaultVisibility)
	defaults.Set(&c.MaxWait, DefaultMaxWait)
	defaults.Set(&c.BrokerTimeout, DefaultBrokerTimeout)
	defaults.Set(&c.PurgeInterval, DefaultPurgeInterval)
	defaults.Set(&c.LeaseCheck, DefaultLeaseCheck)
	if c.MaxClaim == 0 {
		c.MaxClaim = DefaultMaxClaim
	}
	if c.MaxClaimBytes == 0 {
		c.MaxClaimBytes = DefaultMaxClaimBytes
	}
	if c.MaxRecordedBody == 0 {
		c.MaxRecordedBody = DefaultMaxRecordedBody
	}
	if c.TranscriptBytes == 0 {
		c.TranscriptBytes = DefaultTranscriptBytes
	}
	c.SandboxURL = strings.TrimRight(c.SandboxURL, "/")
	return c
}

// Validate checks c after defaults; errors name the QUARRY_ variable.
func (c Config) Validate() error {
	var errs []error
	if err := checkURL(c.SandboxURL); err != nil {
		errs = append(errs, fmt.Errorf("QUARRY_SANDBOX_GATEWAY_URL: %w", err))
	}
	positive := func(name string, d time.Duration) {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("QUARRY_%s: %s is not a positive duration", name, d))
		}
	}
	positive("RELAY_TIMEOUT", c.Timeout)
	positive("RELAY_VISIBILITY_TIMEOUT", c.Visibility)
	positive("RELAY_MAX_WAIT", c.MaxWait)
	positive("RELAY_BROKER_TIMEOUT", c.BrokerTimeout)
	positive("RELAY_PURGE_INTERVAL", c.PurgeInterval)
	positive("RELAY_LEASE_CHECK", c.LeaseCheck)
	if c.Timeout > maxTimeout {
		errs = append(errs, fmt.Errorf("QUARRY_RELAY_TIMEOUT: %s is above %s", c.Timeout, maxTimeout))
	}
	if c.MaxClaim < 1 || c.MaxClaim > 10000 {
		errs = append(errs, fmt.Errorf("QUARRY_RELAY_MAX_CLAIM: %d; between 1 and 10000", c.MaxClaim))
	}
	for _, s := range []struct {
		name string
		v    int64
	}{{"RELAY_MAX_CLAIM_BYTES", c.MaxClaimBytes}, {"RELAY_MAX_RECORDED_BODY", c.MaxRecordedBody}, {"RELAY_TRANSCRIPT_BYTES", c.TranscriptBytes}} {
		if s.v < 1 {
			errs = append(errs, fmt.Errorf("QUARRY_%s: %d; at least 1", s.name, s.v))
		}
	}
	for _, u := range c.AllowedUpstreams {
		if err := checkURL(u); err != nil {
			errs = append(errs, fmt.Errorf("QUARRY_RELAY_ALLOWED_UPSTREAMS: %q: %w", u, err))
		}
	}
	return errors.Join(errs...)
}

// checkURL accepts absolute http and https URLs without a query.
func checkURL(s string) error {
	u, err := url.Parse(s)
	switch {
	case s == "":
		return errors.New("is required (an http or https URL)")
	case err != nil:
		return fmt.Errorf("not a URL: %w", err)
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Errorf("%q: want an http or https URL", s)
	case u.Host == "":
		return fmt.Errorf("%q: the URL names no host", s)
	case u.RawQuery != "" || u.Fragment != "":
		return fmt.Errorf("%q: the URL must have no query or fragment", s)
	}
	return nil
}

// poolSettings are a pool's relay options, parsed once.
type poolSettings struct {
	timeout     time.Duration
	upstream    string
	upstreamKey string
	model       string
}

// parsePoolOptions reads the model.* options of each pool. Errors are
// *badinput.Error naming "pools[i].options.<key>".
func parsePoolOptions(pools []warmpool.PoolConfig, def time.Duration) (map[string]poolSettings, error) {
	out := make(map[string]poolSettings, len(pools))
	var errs []error
	for i, p := range pools {
		field := func(key string) string { return fmt.Sprintf("pools[%d].options.%s", i, key) }
		ps := poolSettings{timeout: def, model: DefaultModelName}
		if v, ok := p.Options[OptionTimeout]; ok {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > int(maxTimeout/time.Second) {
				errs = append(errs, badinput.New(field(OptionTimeout), "%q: want whole seconds between 1 and %d", v, int(maxTimeout/time.Second)))
			}
			ps.timeout = time.Duration(n) * time.Second
		}
		if v, ok := p.Options[OptionUpstreamURL]; ok {
			if err := checkURL(v); err != nil {
				errs = append(errs, badinput.New(field(OptionUpstreamURL), "%s", err.Error()))
			}
			ps.upstream = strings.TrimRight(v, "/")
		}
		ps.upstreamKey = p.Options[OptionUpstreamKey]
		if v := p.Options[OptionModelName]; v != "" {
			ps.model = v
		}
		out[p.Name] = ps
	}
	return out, errors.Join(errs...)
}
