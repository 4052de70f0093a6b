package warmpool

import (
	"crypto/sha256"
	"encoding/base32"
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"

	"github.com/distribution/reference"

	"github.com/quarryhq/quarry/internal/badinput"
)

// Defaults of a class (ClassConfig.WithDefaults).
const (
	DefaultWarmMax           = 2
	DefaultWarmWindowSeconds = 300
	DefaultWarmLeadSeconds   = 10
	DefaultIdleSeconds       = 600
	DefaultRetentionSeconds  = 7 * 24 * 3600
	DefaultPrefetchHold      = 1800
	// OnDemandPrefix starts the name of every on-demand pool
	// (OnDemandPoolName); no configured pool may use it.
	OnDemandPrefix = "i-"
)

// Bounds checked by ClassConfig.Validate.
const (
	maxClasses       = 64
	maxImagePatterns = 64
	maxImageRefLen   = 512
	maxWarm          = 100
	maxRetention     = 365 * 24 * 3600
)

// ClassConfig is one pool class of the pools file ({"classes": [...]}):
// what an on-demand pool of an image that a request names is made of. It
// carries what a pool carries but the image and the warm counts, the most
// a request may ask for, which images it serves, its warm policy and how
// its pools end.
type ClassConfig struct {
	Name string `json:"name"`
	// Provider names the backend; empty means the gateway's default.
	Provider string `json:"provider,omitempty"`
	// CPU, Memory and Disk are what a request that names none gets;
	// MaxCPU, MaxMemory and MaxDisk the most it may ask for (default: the
	// defaults, so a request may only ask for less).
	CPU       float64 `json:"cpu,omitempty"`
	Memory    MiB     `json:"memory,omitempty"`
	Disk      DiskMiB `json:"disk,omitempty"`
	MaxCPU    float64 `json:"max_cpu,omitempty"`
	MaxMemory MiB     `json:"max_memory,omitempty"`
	MaxDisk   DiskMiB `json:"max_disk,omitempty"`
	// MaxTotal bounds the tasks of all the class's on-demand pools
	// together, MaxPerImage those of each one (default MaxTotal).
	MaxTotal    int `json:"max_total"`
	MaxPerImage int `json:"max_per_image,omitempty"`
	// Lease bounds and the startup timeout, as for a pool.
	DefaultLeaseSeconds   int               `json:"default_lease_seconds,omitempty"`
	MaxLeaseSeconds       int               `json:"max_lease_seconds,omitempty"`
	StartupTimeoutSeconds int               `json:"startup_timeout_seconds,omitempty"`
	Env                   map[string]string `json:"env,omitempty"`
	Labels                map[string]string `json:"labels,omitempty"`
	Options               map[string]string `json:"options,omitempty"`
	// Images are the patterns of the images the class serves (ImagePattern);
	// default ["*"], every image.
	Images []string `json:"images,omitempty"`
	// The warm policy: a pool with acquires in the last WarmWindowSeconds
	// keeps clamp(ceil(rate × WarmLeadSeconds), 1, WarmMax) tasks ready,
	// rate being its acquires per second over the window; none otherwise.
	// WarmMax nil is DefaultWarmMax; 0 keeps no pool warm.
	WarmMax           *int `json:"warm_max,omitempty"`
	WarmWindowSeconds int  `json:"warm_window_seconds,omitempty"`
	WarmLeadSeconds   int  `json:"warm_lead_seconds,omitempty"`
	// IdleSeconds: a pool with no acquire that long and no task leased
	// ends (its ready tasks stop); RetentionSeconds after it ended its
	// record goes, with what the provider made for its image.
	IdleSeconds      int `json:"idle_seconds,omitempty"`
	RetentionSeconds int `json:"retention_seconds,omitempty"`
	// PrefetchHoldSeconds: a prefetched pool keeps its prefetch's warm
	// sandboxes, and does not end for idleness, for that long after the
	// prefetch (a batch announced ahead of time may take a while to come:
	// 2,000 new images take ECS 33 minutes to register).
	PrefetchHoldSeconds int `json:"prefetch_hold_seconds,omitempty"`
}

// WithDefaults returns a copy of c with its empty fields set to their
// defaults (those of a pool for resources, lease bounds and startup).
func (c ClassConfig) WithDefaults() ClassConfig {
	pc := PoolConfig{CPU: c.CPU, Memory: c.Memory, DefaultLeaseSeconds: c.DefaultLeaseSeconds,
		MaxLeaseSeconds: c.MaxLeaseSeconds, StartupTimeoutSeconds: c.StartupTimeoutSeconds}.WithDefaults()
	c.CPU, c.Memory, c.DefaultLeaseSeconds, c.MaxLeaseSeconds, c.StartupTimeoutSeconds =
		pc.CPU, pc.Memory, pc.DefaultLeaseSeconds, pc.MaxLeaseSeconds, pc.StartupTimeoutSeconds
	if c.MaxCPU == 0 {
		c.MaxCPU = c.CPU
	}
	if c.MaxMemory == 0 {
		c.MaxMemory = c.Memory
	}
	if c.MaxDisk == 0 {
		c.MaxDisk = c.Disk
	}
	if c.MaxPerImage == 0 {
		c.MaxPerImage = c.MaxTotal
	}
	if len(c.Images) == 0 {
		c.Images = []string{"*"}
	}
	if c.WarmMax == nil {
		n := DefaultWarmMax
		c.WarmMax = &n
	}
	if c.WarmWindowSeconds == 0 {
		c.WarmWindowSeconds = DefaultWarmWindowSeconds
	}
	if c.WarmLeadSeconds == 0 {
		c.WarmLeadSeconds = DefaultWarmLeadSeconds
	}
	if c.IdleSeconds == 0 {
		c.IdleSeconds = DefaultIdleSeconds
	}
	if c.RetentionSeconds == 0 {
		c.RetentionSeconds = DefaultRetentionSeconds
	}
	if c.PrefetchHoldSeconds == 0 {
		c.PrefetchHoldSeconds = DefaultPrefetchHold
	}
	return c
}

// Validate checks one class (after defaults) and returns every problem
// joined, each a *badinput.Error naming the field.
func (c ClassConfig) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) { errs = append(errs, badinput.New(field, format, args...)) }
	if !poolNamePattern.MatchString(c.Name) {
		bad("name", "%q %s", c.Name, poolNameDescription)
	}
	// The class is a pool that has every image and every size it allows:
	// its defaults and its maxima are checked as a pool's are.
	for _, pc := range []struct {
		what string
		cfg  PoolConfig
	}{{"", c.pool("x", "", c.CPU, c.Memory, c.Disk)}, {"max_", c.pool("x", "", c.MaxCPU, c.MaxMemory, c.MaxDisk)}} {
		for _, e := range prefixErrors("", pc.cfg.Validate()) {
			var ve *badinput.Error
			if errors.As(e, &ve) {
				ve.Field = strings.TrimPrefix(ve.Field, ".")
				switch ve.Field {
				case "cpu", "memory", "disk":
					ve.Field = pc.what + ve.Field
				case "max_total":
					ve.Field = "max_per_image"
				case "name", "min_warm":
					continue
				}
				if pc.what != "" && ve.Field[:4] != "max_" {
					continue // the rest was said once
				}
			}
			errs = append(errs, e)
		}
	}
	switch {
	case c.MaxCPU < c.CPU:
		bad("max_cpu", "is %g, below cpu %g", c.MaxCPU, c.CPU)
	case c.MaxMemory < c.Memory:
		bad("max_memory", "is %d MiB, below memory %d MiB", c.MaxMemory, c.Memory)
	case c.MaxDisk < c.Disk:
		bad("max_disk", "is %d MiB, below disk %d MiB", c.MaxDisk, c.Disk)
	}
	if c.MaxTotal < 1 || c.MaxTotal > maxPoolTotal {
		bad("max_total", "is %d; it must be between 1 and %d", c.MaxTotal, maxPoolTotal)
	} else if c.MaxPerImage > c.MaxTotal {
		bad("max_per_image", "is %d, above max_total %d", c.MaxPerImage, c.MaxTotal)
	}
	if len(c.Images) > maxImagePatterns {
		bad("images", "has %d patterns; at most %d are allowed", len(c.Images), maxImagePatterns)
	}
	for i, s := range c.Images {
		if _, err := ParseImagePattern(s); err != nil {
			bad(fmt.Sprintf("images[%d]", i), "%s", err.Error())
		}
	}
	if c.WarmMax != nil && (*c.WarmMax < 0 || *c.WarmMax > maxWarm) {
		bad("warm_max", "is %d; it must be between 0 and %d", *c.WarmMax, maxWarm)
	} else if c.WarmMax != nil && *c.WarmMax > c.MaxPerImage && c.MaxPerImage > 0 {
		bad("warm_max", "is %d, above max_per_image %d", *c.WarmMax, c.MaxPerImage)
	}
	for _, f := range []struct {
		name     string
		v, lo, h int
	}{
		{"warm_window_seconds", c.WarmWindowSeconds, 1, 24 * 3600},
		{"warm_lead_seconds", c.WarmLeadSeconds, 1, 3600},
		{"idle_seconds", c.IdleSeconds, 1, maxRetention},
		{"retention_seconds", c.RetentionSeconds, 1, maxRetention},
		{"prefetch_hold_seconds", c.PrefetchHoldSeconds, 1, 7 * 24 * 3600},
	} {
		if f.v < f.lo || f.v > f.h {
			bad(f.name, "is %d; it must be between %d and %d", f.v, f.lo, f.h)
		}
	}
	return errors.Join(errs...)
}

// pool is the configuration of the class's on-demand pool name of image
// with those resources.
func (c ClassConfig) pool(name, image string, cpu float64, memory MiB, disk DiskMiB) PoolConfig {
	return PoolConfig{
		Name: name, Provider: c.Provider, Image: image, CPU: cpu, Memory: memory, Disk: disk,
		MinWarm: 0, MaxTotal: c.MaxPerImage, DefaultLeaseSeconds: c.DefaultLeaseSeconds, MaxLeaseSeconds: c.MaxLeaseSeconds,
		StartupTimeoutSeconds: c.StartupTimeoutSeconds, Env: c.Env, Labels: c.Labels, Options: c.Options,
	}
}

// ValidateClasses validates every class and checks that names are unique
// and differ from the pools'. Fields are named like "classes[1].max_total".
func ValidateClasses(classes []ClassConfig, pools []PoolConfig) error {
	if len(classes) > maxClasses {
		return badinput.New("classes", "%d classes configured; at most %d are allowed", len(classes), maxClasses)
	}
	var errs []error
	seen := map[string]int{}
	for i, c := range classes {
		prefix := fmt.Sprintf("classes[%d]", i)
		errs = append(errs, prefixErrors(prefix, c.Validate())...)
		if j, dup := seen[c.Name]; dup && c.Name != "" {
			errs = append(errs, badinput.New(prefix+".name", "%q is already the name of classes[%d]; class names must be unique", c.Name, j))
		}
		seen[c.Name] = i
	}
	for i, p := range pools {
		if strings.HasPrefix(p.Name, OnDemandPrefix) {
			errs = append(errs, badinput.New(fmt.Sprintf("pools[%d].name", i), "%q: names starting with %q are the on-demand pools'", p.Name, OnDemandPrefix))
		}
	}
	return errors.Join(errs...)
}

// ImageRef is a normalized image reference: "docker.io/library/python:3.11",
// "127.0.0.1:5000/swe/task-1@sha256:…" (a reference with a digest keeps
// only the digest).
type ImageRef struct {
	// Repo is the repository with its registry host
	// ("docker.io/library/python"); Tag is its tag or digest ("3.11",
	// "sha256:…").
	Repo, Tag string
	digest    bool
}

// String is the whole reference, as the providers get it.
func (r ImageRef) String() string {
	if r.digest {
		return r.Repo + "@" + r.Tag
	}
	return r.Repo + ":" + r.Tag
}

// Registry is the reference's registry host ("docker.io").
func (r ImageRef) Registry() string { h, _, _ := strings.Cut(r.Repo, "/"); return h }

// ParseImageRef normalizes an image reference as the Docker engine does:
// a registry host is added when the first element names none
// ("docker.io"), "library/" to official images, and ":latest" when there
// is neither tag nor digest. A malformed reference is a *badinput.Error
// naming field image.
func ParseImageRef(s string) (ImageRef, error) {
	if s == "" || len(s) > maxImageRefLen {
		return ImageRef{}, badinput.New("image", "must be 1 to %d characters, an image reference such as \"python:3.11\" or \"127.0.0.1:5000/team/task:1\"", maxImageRefLen)
	}
	named, err := reference.ParseDockerRef(s)
	if err != nil {
		return ImageRef{}, badinput.New("image", "%q is not an image reference (%s); use NAME[:TAG] or NAME@sha256:DIGEST", s, err.Error())
	}
	ref := ImageRef{Repo: named.Name()}
	switch r := named.(type) {
	case reference.Canonical:
		ref.Tag, ref.digest = r.Digest().String(), true
	case reference.Tagged:
		ref.Tag = r.Tag()
	}
	return ref, nil
}

// ImagePattern selects image references (ClassConfig.Images,
// QUARRY_IMAGE_ALLOW). "*" alone matches every image. Otherwise a pattern
// is a reference whose elements may hold globs — "*" matches within one
// "/"-separated element, "**" across elements — normalized as references
// are ("python:*" is "docker.io/library/python:*"); a pattern without a tag
// or digest matches every tag and digest of the repositories it names.
type ImagePattern struct {
	raw       string
	any       bool
	repo, tag *regexp.Regexp // tag nil: every tag
}

// ParseImagePattern parses a pattern (ImagePattern).
func ParseImagePattern(s string) (ImagePattern, error) {
	p := ImagePattern{raw: s}
	s = strings.TrimSpace(s)
	switch {
	case s == "*" || s == "**":
		p.any = true
		return p, nil
	case s == "" || len(s) > maxImageRefLen:
		return p, fmt.Errorf("%q: a pattern is 1 to %d characters", s, maxImageRefLen)
	case strings.ContainsAny(s, " \t\n?[]\\"):
		return p, fmt.Errorf("%q: patterns use only * and ** as wildcards", s)
	}
	repo, tag := s, ""
	last := strings.LastIndex(repo, "/")
	if i := strings.IndexAny(repo[last+1:], ":@"); i >= 0 {
		repo, tag = s[:last+1+i], s[last+2+i:]
		if tag == "" {
			return p, fmt.Errorf("%q: an empty tag", s)
		}
	}
	first, rest, hasSlash := strings.Cut(repo, "/")
	switch {
	case !hasSlash:
		repo = "docker.io/library/" + repo
	case !strings.ContainsAny(first, ".:") && first != "localhost" && first != "*" && first != "**":
		repo = "docker.io/" + repo
	default:
		_ = rest
	}
	p.repo = globRegexp(repo)
	if tag != "" {
		p.tag = globRegexp(tag)
	}
	return p, nil
}

// globRegexp compiles a glob: "**" any run of characters, "*" any run
// without "/".
func globRegexp(glob string) *regexp.Regexp {
	var b strings.Builder
	b.WriteString("^")
	for i := 0; i < len(glob); i++ {
		switch {
		case strings.HasPrefix(glob[i:], "**"):
			b.WriteString(".*")
			i++
		case glob[i] == '*':
			b.WriteString("[^/]*")
		default:
			b.WriteString(regexp.QuoteMeta(glob[i : i+1]))
		}
	}
	b.WriteString("$")
	return regexp.MustCompile(b.String())
}

// Match reports whether the pattern selects ref.
func (p ImagePattern) Match(ref ImageRef) bool {
	if p.any {
		return true
	}
	return p.repo != nil && p.repo.MatchString(ref.Repo) && (p.tag == nil || p.tag.MatchString(ref.Tag))
}

// String is the pattern as written.
func (p ImagePattern) String() string { return p.raw }

// OnDemandPoolName is the name of class's on-demand pool of image with
// those resources: OnDemandPrefix and 24 base32 characters of their
// SHA-256, the same on every replica.
func OnDemandPoolName(class string, image ImageRef, cpu float64, memory MiB, disk DiskMiB) string {
	h := sha256.New()
	for _, part := range []string{class, image.String(), strconv.FormatFloat(cpu, 'g', -1, 64),
		strconv.Itoa(int(memory)), strconv.Itoa(int(disk))} {
		h.Write([]byte(part))
		h.Write([]byte{0})
	}
	sum := h.Sum(nil)
	enc := base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(sum[:15])
	return OnDemandPrefix + strings.ToLower(enc)
}

// warmTarget is the warm policy of a class: how many ready tasks a pool
// keeps when it had acquires at rate per second (over the window), and a
// last acquire within the window (recent).
func (c ClassConfig) warmTarget(rate float64, recent bool) int {
	if !recent || c.WarmMax == nil || *c.WarmMax == 0 {
		return 0
	}
	n := int(math.Ceil(rate * float64(c.WarmLeadSeconds)))
	return min(max(n, 1), *c.WarmMax)
}
