package warmpool

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"regexp"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/quarryhq/quarry/api"
	"github.com/quarryhq/quarry/internal/badinput"
	"github.com/quarryhq/quarry/providers"
)

// Defaults applied by ParsePools (and WithDefaults) to fields left empty.
const (
	DefaultCPU                       = 1.0
	DefaultMemory                MiB = 1024
	DefaultLeaseSeconds              = 1800
	DefaultMaxLeaseSeconds           = 86400
	DefaultStartupTimeoutSeconds     = 60
)

// Bounds checked by PoolConfig.Validate.
const (
	maxPoolsFileBytes       = 1 << 20
	maxPools                = 256
	maxPoolTotal            = 10000
	maxLeaseSecondsLimit    = 7 * 24 * 3600
	maxStartupSeconds       = 3600
	minCPU, maxCPU          = 0.25, 16.0
	minMemory, maxMemory    = 32, 1 << 20
	minDisk, maxDisk        = 1, 1 << 20
	maxMapEntries           = 64
	maxMapKeyLen            = 128
	maxMapValueLen          = 4096
	reservedLabelPrefix     = "quarry."
	poolNameDescription     = "must be 1-63 lowercase letters, digits or '-', starting and ending with a letter or digit"
	envKeyDescription       = "must be letters, digits and '_', not starting with a digit"
	labelKeyDescription     = "must be letters, digits, '.', '_', '-' or '/', starting with a letter or digit"
	providerNameDescription = "must be lowercase letters, digits or '-'"
)

var (
	poolNamePattern     = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
	providerNamePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)
	envKeyPattern       = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	labelKeyPattern     = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._/-]*$`)
)

// PoolConfig is one pool as written in the pools file (YAML or JSON, path in
// QUARRY_POOLS_FILE): {"pools": [PoolConfig, ...]}.
type PoolConfig struct {
	Name string `json:"name"`
	// Provider names the backend ("process", "docker", "ecs"); empty means
	// the gateway's default provider (QUARRY_PROVIDER).
	Provider string `json:"provider,omitempty"`
	Image    string `json:"image,omitempty"`
	// CPU in vCPUs; Memory in MiB (a number, or a string such as "512Mi", "2Gi").
	// Disk bounds the sandbox's work directory, spelled as Memory is; 0
	// (unset) leaves its size to the provider, and a provider that cannot
	// enforce a size refuses a pool that sets one (docs/API.md, "Pools").
	CPU      float64 `json:"cpu,omitempty"`
	Memory   MiB     `json:"memory,omitempty"`
	Disk     DiskMiB `json:"disk,omitempty"`
	MinWarm  int     `json:"min_warm"`
	MaxTotal int     `json:"max_total"`
	// DefaultLeaseSeconds applies when a create request names none;
	// MaxLeaseSeconds bounds what a request may ask for.
	DefaultLeaseSeconds int `json:"default_lease_seconds,omitempty"`
	MaxLeaseSeconds     int `json:"max_lease_seconds,omitempty"`
	// StartupTimeoutSeconds bounds a launch until the agent answers /healthz.
	StartupTimeoutSeconds int               `json:"startup_timeout_seconds,omitempty"`
	Env                   map[string]string `json:"env,omitempty"`
	Labels                map[string]string `json:"labels,omitempty"`
	// Options are the provider's settings, except those in a gateway
	// service's namespace ("model.*": the model relay's, see
	// docs/MODELSERVICE.md), which never reach the provider
	// (ProviderOptions).
	Options map[string]string `json:"options,omitempty"`
}

// ServiceOptionPrefix is the namespace of the pool options that a gateway
// service reads from the pools file (the model relay's "model.*"); the
// provider does not see them.
const ServiceOptionPrefix = "model."

// reservedOptionPrefix starts the options only the gateway sets
// (providers.OptionLayer); a pool's may not.
const reservedOptionPrefix = "quarry."

// ProviderOptions returns a copy of p.Options without the options of
// gateway services ("model.*"), or nil when none remain: what the pool's
// provider receives in providers.Spec.Options.
func (p PoolConfig) ProviderOptions() map[string]string {
	var out map[string]string
	for k, v := range p.Options {
		if strings.HasPrefix(k, ServiceOptionPrefix) {
			continue
		}
		if out == nil {
			out = make(map[string]string, len(p.Options))
		}
		out[k] = v
	}
	return out
}

// MiB is a memory size in mebibytes. In the pools file it is a number (MiB)
// or a string with a unit: "512Mi", "2Gi", "512m", "1g", "1024" (see
// UnmarshalJSON).
type MiB int

// DiskMiB is a disk size in mebibytes, spelled as MiB is (its parse errors
// name "disk").
type DiskMiB int

// SpecDigest is the digest of what a task of the pool is launched with:
// its provider, image, cpu, memory, disk, env and provider options (not
// its name, labels, lease bounds, warm counts or gateway service options,
// which a running task does not depend on). Tasks record it when they are
// reserved (TaskRecord.Spec), and a pool hands out only tasks of its own
// digest. Provider must be set (cmd/ defaults it before New).
func (p PoolConfig) SpecDigest() string {
	b, _ := json.Marshal(struct {
		Provider string            `json:"provider"`
		Image    string            `json:"image"`
		CPU      float64           `json:"cpu"`
		Memory   MiB               `json:"memory"`
		Disk     DiskMiB           `json:"disk"`
		Env      map[string]string `json:"env"`
		Options  map[string]string `json:"options"`
	}{p.Provider, p.Image, p.CPU, p.Memory, p.Disk, nilIfEmpty(p.Env), p.ProviderOptions()}) // map keys sorted: canonical
	sum := sha256.Sum256(b)
	return "v1:" + hex.EncodeToString(sum[:12])
}

// nilIfEmpty is m, or nil when it has no entries (an empty map and none
// digest the same).
func nilIfEmpty(m map[string]string) map[string]string {
	if len(m) == 0 {
		return nil
	}
	return m
}

// PoolsFile is the document of the pools file: {"pools": [...],
// "classes": [...]} (classes are optional).
type PoolsFile struct {
	Pools   []PoolConfig  `json:"pools"`
	Classes []ClassConfig `json:"classes,omitempty"`
}

// LoadPools reads the pools file at path (YAML or JSON, at most 1 MiB) and
// returns its pools as ParsePools does. Errors name the file.
func LoadPools(path string) ([]PoolConfig, error) {
	doc, err := LoadPoolsFile(path)
	return doc.Pools, err
}

// LoadPoolsFile reads the pools file at path as LoadPools does and returns
// its pools and classes (ParsePoolsFile).
func LoadPoolsFile(path string) (PoolsFile, error) {
	f, err := os.Open(path)
	if err != nil {
		return PoolsFile{}, fmt.Errorf("open pools file: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxPoolsFileBytes+1))
	if err != nil {
		return PoolsFile{}, fmt.Errorf("read pools file %s: %w", path, err)
	}
	if len(data) > maxPoolsFileBytes {
		return PoolsFile{}, fmt.Errorf("read pools file %s: larger than %d bytes", path, maxPoolsFileBytes)
	}
	doc, err := ParsePoolsFile(data)
	if err != nil {
		return PoolsFile{}, fmt.Errorf("pools file %s: %w", path, err)
	}
	return doc, nil
}

// ParsePools parses a pools document (YAML or JSON) strictly: an unknown or
// duplicate field is an error that names it. It applies the defaults
// (WithDefaults) and validates every pool (ValidatePools). Provider is left
// empty when the file leaves it empty: cmd/ fills in its default provider.
func ParsePools(data []byte) ([]PoolConfig, error) {
	doc, err := ParsePoolsFile(data)
	return doc.Pools, err
}

// ParsePoolsFile parses a pools document as ParsePools does, with its
// classes: each gets its defaults (ClassConfig.WithDefaults) and is
// validated (ValidateClasses). Provider is left empty where the file
// leaves it empty.
func ParsePoolsFile(data []byte) (PoolsFile, error) {
	if len(bytes.TrimSpace(data)) == 0 {
		return PoolsFile{}, badinput.New("pools", "the pools file is empty; it needs {\"pools\": [...]} with at least one pool")
	}
	var doc PoolsFile
	if err := yaml.UnmarshalStrict(data, &doc); err != nil {
		// The library wraps the decoder's error twice ("error unmarshaling
		// JSON: while decoding JSON: ..."); the innermost one says it all.
		for inner := errors.Unwrap(err); inner != nil; inner = errors.Unwrap(err) {
			err = inner
		}
		return PoolsFile{}, fmt.Errorf("parse pools: %w", err)
	}
	for i, p := range doc.Pools {
		doc.Pools[i] = p.WithDefaults()
	}
	for i, c := range doc.Classes {
		doc.Classes[i] = c.WithDefaults()
	}
	if err := errors.Join(ValidatePools(doc.Pools), ValidateClasses(doc.Classes, doc.Pools)); err != nil {
		return PoolsFile{}, err
	}
	return doc, nil
}

// WithDefaults returns a copy of p with empty fields set to their defaults:
// cpu 1, memory 1024 MiB, default lease 1800 s (at most the maximum),
// maximum lease 86400 s, startup timeout 60 s. MinWarm, MaxTotal, Name and
// Provider have no defaults.
func (p PoolConfig) WithDefaults() PoolConfig {
	if p.CPU == 0 {
		p.CPU = DefaultCPU
	}
	if p.Memory == 0 {
		p.Memory = DefaultMemory
	}
	if p.MaxLeaseSeconds == 0 {
		p.MaxLeaseSeconds = DefaultMaxLeaseSeconds
	}
	if p.DefaultLeaseSeconds == 0 {
		p.DefaultLeaseSeconds = min(DefaultLeaseSeconds, p.MaxLeaseSeconds)
	}
	if p.StartupTimeoutSeconds == 0 {
		p.StartupTimeoutSeconds = DefaultStartupTimeoutSeconds
	}
	return p
}

// ValidatePools validates every pool and checks that names are unique. The
// error joins one *badinput.Error per problem; fields are named like
// "pools[1].min_warm".
func ValidatePools(pools []PoolConfig) error {
	if len(pools) == 0 {
		return badinput.New("pools", "at least one pool is required")
	}
	if len(pools) > maxPools {
		return badinput.New("pools", "%d pools configured; at most %d are allowed", len(pools), maxPools)
	}
	var errs []error
	seen := make(map[string]int, len(pools))
	for i, p := range pools {
		prefix := fmt.Sprintf("pools[%d]", i)
		errs = append(errs, prefixErrors(prefix, p.Validate())...)
		if j, dup := seen[p.Name]; dup && p.Name != "" {
			errs = append(errs, badinput.New(prefix+".name", "%q is already the name of pools[%d]; pool names must be unique", p.Name, j))
			continue
		}
		seen[p.Name] = i
	}
	return errors.Join(errs...)
}

// Validate checks one pool (after defaults) and returns every problem
// joined, each a *badinput.Error naming the field ("min_warm").
func (p PoolConfig) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) { errs = append(errs, badinput.New(field, format, args...)) }
	if !poolNamePattern.MatchString(p.Name) {
		bad("name", "%q %s", p.Name, poolNameDescription)
	}
	if p.Provider != "" && !providerNamePattern.MatchString(p.Provider) {
		bad("provider", "%q %s (e.g. \"process\", \"docker\", \"ecs\")", p.Provider, providerNameDescription)
	}
	if len(p.Image) > 1024 {
		bad("image", "is %d characters long; at most 1024 are allowed", len(p.Image))
	}
	if math.IsNaN(p.CPU) || p.CPU < minCPU || p.CPU > maxCPU {
		bad("cpu", "is %g; it must be between %g and %g vCPUs", p.CPU, minCPU, maxCPU)
	}
	if p.Memory < minMemory || p.Memory > maxMemory {
		bad("memory", "is %d MiB; it must be between %d MiB and %d MiB", p.Memory, minMemory, maxMemory)
	}
	if p.Disk != 0 && (p.Disk < minDisk || p.Disk > maxDisk) {
		bad("disk", "is %d MiB; it must be between %d MiB and %d MiB, or unset (the provider's default)", p.Disk, minDisk, maxDisk)
	}
	if p.MaxTotal < 1 || p.MaxTotal > maxPoolTotal {
		bad("max_total", "is %d; it must be between 1 and %d", p.MaxTotal, maxPoolTotal)
	}
	if p.MinWarm < 0 {
		bad("min_warm", "is %d; it must not be negative", p.MinWarm)
	} else if p.MinWarm > p.MaxTotal && p.MaxTotal >= 1 {
		bad("min_warm", "is %d, above max_total %d; lower min_warm or raise max_total", p.MinWarm, p.MaxTotal)
	}
	if p.MaxLeaseSeconds < 1 || p.MaxLeaseSeconds > maxLeaseSecondsLimit {
		bad("max_lease_seconds", "is %d; it must be between 1 and %d (7 days)", p.MaxLeaseSeconds, maxLeaseSecondsLimit)
	}
	if p.DefaultLeaseSeconds < 1 || p.DefaultLeaseSeconds > p.MaxLeaseSeconds {
		bad("default_lease_seconds", "is %d; it must be between 1 and max_lease_seconds (%d)", p.DefaultLeaseSeconds, p.MaxLeaseSeconds)
	}
	if p.StartupTimeoutSeconds < 1 || p.StartupTimeoutSeconds > maxStartupSeconds {
		bad("startup_timeout_seconds", "is %d; it must be between 1 and %d", p.StartupTimeoutSeconds, maxStartupSeconds)
	}
	errs = append(errs, validateEnv("env", p.Env))
	errs = append(errs, validateLabels("labels", p.Labels, true))
	errs = append(errs, validateMap("options", p.Options, labelKeyPattern, labelKeyDescription))
	for k := range p.Options {
		if strings.HasPrefix(k, reservedOptionPrefix) {
			bad("options", "%q: options %s* are the gateway's own (a task started on a checkpoint's layer carries %s)", k, reservedOptionPrefix, providers.OptionLayer)
		}
	}
	return errors.Join(errs...)
}

// validateEnv checks environment variable names and sizes.
// ValidateEnv checks env vars of a lease or pool (field names them in the
// error): shell variable names, at most 64 entries, names at most 128 and
// values at most 4096 bytes, no NUL. Acquire applies it; callers that
// validate a request before it reaches the manager use it for the same
// answer.
func ValidateEnv(field string, env map[string]string) error {
	return validateEnv(field, env)
}

func validateEnv(field string, env map[string]string) error {
	return validateMap(field, env, envKeyPattern, envKeyDescription)
}

// validateLabels checks label keys and sizes; with reserved, keys starting
// with "quarry." are refused (Quarry's own labels use them).
func validateLabels(field string, labels map[string]string, reserved bool) error {
	if err := validateMap(field, labels, labelKeyPattern, labelKeyDescription); err != nil {
		return err
	}
	if reserved {
		for k := range labels {
			if strings.HasPrefix(k, reservedLabelPrefix) {
				return badinput.New(field, "key %q: the prefix %q is reserved for Quarry's own labels", k, reservedLabelPrefix)
			}
		}
	}
	return nil
}

// validateMap bounds a string map: entry count, key pattern and lengths,
// value lengths, and no NUL bytes in values.
func validateMap(field string, m map[string]string, keyPattern *regexp.Regexp, keyDescription string) error {
	if len(m) > maxMapEntries {
		return badinput.New(field, "has %d entries; at most %d are allowed", len(m), maxMapEntries)
	}
	for k, v := range m {
		if len(k) > maxMapKeyLen {
			return badinput.New(field, "key %.20q... is %d characters long; at most %d are allowed", k, len(k), maxMapKeyLen)
		}
		if !keyPattern.MatchString(k) {
			return badinput.New(field, "key %q %s", k, keyDescription)
		}
		if len(v) > maxMapValueLen {
			return badinput.New(field, "value of %q is %d bytes long; at most %d are allowed", k, len(v), maxMapValueLen)
		}
		if strings.IndexByte(v, 0) >= 0 {
			return badinput.New(field, "value of %q contains a NUL byte", k)
		}
	}
	return nil
}

// prefixErrors returns the errors joined in err, with prefix+"." added to
// the Field of each *badinput.Error.
func prefixErrors(prefix string, err error) []error {
	if err == nil {
		return nil
	}
	var list []error
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		list = j.Unwrap()
	} else {
		list = []error{err}
	}
	out := make([]error, 0, len(list))
	for _, e := range list {
		var ve *badinput.Error
		if errors.As(e, &ve) {
			out = append(out, &badinput.Error{Field: prefix + "." + ve.Field, Message: ve.Message})
			continue
		}
		out = append(out, fmt.Errorf("%s: %w", prefix, e))
	}
	return out
}

// UnmarshalJSON accepts a number of MiB (1024) or a string: a number with an
// optional unit, "512Mi", "2Gi", "1Ti", "512m", "1g", "512M", "2G", "512MiB",
// "2GiB" (all binary units), or "1024". Anything else is an error saying
// what is accepted.
func (m *MiB) UnmarshalJSON(data []byte) error {
	v, err := api.UnmarshalMiB("memory", data)
	if err != nil {
		return err
	}
	*m = MiB(v)
	return nil
}

// UnmarshalJSON accepts what MiB.UnmarshalJSON accepts; its errors name
// disk.
func (d *DiskMiB) UnmarshalJSON(data []byte) error {
	v, err := api.UnmarshalMiB("disk", data)
	if err != nil {
		return err
	}
	*d = DiskMiB(v)
	return nil
}
