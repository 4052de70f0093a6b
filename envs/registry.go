package envs

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/quarryhq/quarry/internal/badinput"
)

// Limits and defaults of the registry.
const (
	maxRegistryFileBytes = 1 << 20
	maxEnvs              = 1024
	maxArgs              = 256
	maxEnvVars           = 256
	maxDefaultsBytes     = 64 << 10
	// DefaultStepTimeout and DefaultResetTimeout apply when an env names none.
	DefaultStepTimeout  = 60 * time.Second
	DefaultResetTimeout = 120 * time.Second
	// MaxCallTimeout bounds an env's step and reset timeouts.
	MaxCallTimeout = time.Hour
)

var (
	envIDPattern   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._/-]{0,62}$`)
	envNamePattern = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

// Spec is one env of the registry.
type Spec struct {
	// ID names the env in Make (env_id): 1 to 63 letters, digits, '.', '_',
	// '/' or '-', starting with a letter or digit.
	ID string `json:"id"`
	// Pool is the warm pool its sandboxes are leased from; or, instead,
	// Image is the image they run (an on-demand pool of the gateway's
	// classes: docs/API.md, "Images on demand"). Exactly one is set.
	Pool  string `json:"pool,omitempty"`
	Image string `json:"image,omitempty"`
	// Command is the env program's argv, run inside the sandbox (argv[0] is
	// looked up in PATH when it has no '/').
	Command []string `json:"command"`
	// Env and Cwd are added to the program's environment and set its
	// working directory (relative to the agent's workdir).
	Env map[string]string `json:"env,omitempty"`
	Cwd string            `json:"cwd,omitempty"`
	// Defaults is a JSON object passed as reset options when a reset names
	// none.
	Defaults map[string]any `json:"defaults,omitempty"`
	// StepTimeoutMS and ResetTimeoutMS bound the program's reply to a step
	// and a reset (0: DefaultStepTimeout, DefaultResetTimeout; at most
	// MaxCallTimeout).
	StepTimeoutMS  int64 `json:"step_timeout_ms,omitempty"`
	ResetTimeoutMS int64 `json:"reset_timeout_ms,omitempty"`
	// LeaseSeconds is the lease of the sandboxes Make leases (0: the pool's
	// default).
	LeaseSeconds int `json:"lease_seconds,omitempty"`

	defaults json.RawMessage // Defaults, encoded once
}

// StepTimeout returns the bound of a step's reply.
func (s Spec) StepTimeout() time.Duration {
	return msOr(s.StepTimeoutMS, DefaultStepTimeout)
}

// ResetTimeout returns the bound of a reset's reply.
func (s Spec) ResetTimeout() time.Duration {
	return msOr(s.ResetTimeoutMS, DefaultResetTimeout)
}

func msOr(ms int64, def time.Duration) time.Duration {
	if ms <= 0 {
		return def
	}
	return time.Duration(ms) * time.Millisecond
}

// RegistryFile is the document of the registry file.
type RegistryFile struct {
	Envs []Spec `json:"envs"`
}

// Registry is the set of envs, read-only once built. Safe for concurrent use.
type Registry struct {
	byID  map[string]Spec
	order []string
}

// LoadRegistry reads the registry file at path (YAML or JSON, at most
// 1 MiB) and parses it as ParseRegistry does. Errors name the file.
func LoadRegistry(path string) (*Registry, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open envs file: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxRegistryFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read envs file %s: %w", path, err)
	}
	if len(data) > maxRegistryFileBytes {
		return nil, fmt.Errorf("read envs file %s: larger than %d bytes", path, maxRegistryFileBytes)
	}
	r, err := ParseRegistry(data)
	if err != nil {
		return nil, fmt.Errorf("envs file %s: %w", path, err)
	}
	return r, nil
}

// ParseRegistry parses a registry document (YAML or JSON) strictly: an
// unknown or duplicate field is an error that names it. Every env is
// validated (NewRegistry); errors are *badinput.Error naming the field as
// envs[i].field.
func ParseRegistry(data []byte) (*Registry, error) {
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, badinput.New("envs", "the envs file is empty; it needs {\"envs\": [...]} with at least one env")
	}
	var doc RegistryFile
	if err := yaml.UnmarshalStrict(data, &doc); err != nil {
		for inner := errors.Unwrap(err); inner != nil; inner = errors.Unwrap(err) {
			err = inner
		}
		return nil, fmt.Errorf("parse envs: %w", err)
	}
	return NewRegistry(doc.Envs)
}

// NewRegistry validates specs and returns their registry. It needs at least
// one env; ids must be unique.
func NewRegistry(specs []Spec) (*Registry, error) {
	if len(specs) == 0 {
		return nil, badinput.New("envs", "at least one env is required")
	}
	if len(specs) > maxEnvs {
		return nil, badinput.New("envs", "has %d envs; at most %d are allowed", len(specs), maxEnvs)
	}
	r := &Registry{byID: make(map[string]Spec, len(specs))}
	for i, s := range specs {
		field := fmt.Sprintf("envs[%d]", i)
		if err := s.validate(field); err != nil {
			return nil, err
		}
		if _, dup := r.byID[s.ID]; dup {
			return nil, badinput.New(field+".id", "duplicate env id %q", s.ID)
		}
		if s.Defaults != nil {
			b, err := json.Marshal(s.Defaults)
			if err != nil {
				return nil, badinput.New(field+".defaults", "cannot be encoded as JSON: %s", err.Error())
			}
			if len(b) > maxDefaultsBytes {
				return nil, badinput.New(field+".defaults", "is %d bytes as JSON; at most %d are allowed", len(b), maxDefaultsBytes)
			}
			s.defaults = b
		}
		s.Command = slices.Clone(s.Command)
		r.byID[s.ID] = s
		r.order = append(r.order, s.ID)
	}
	return r, nil
}

func (s Spec) validate(field string) error {
	switch {
	case !envIDPattern.MatchString(s.ID):
		return badinput.New(field+".id", "must be 1 to 63 letters, digits, '.', '_', '/' or '-', starting with a letter or digit, got %q", s.ID)
	case s.Pool == "" && s.Image == "":
		return badinput.New(field+".pool", "required: the pool the env's sandboxes are leased from (or image: the image they run)")
	case s.Pool != "" && s.Image != "":
		return badinput.New(field+".image", "name a pool or an image, not both")
	case len(s.Image) > 512:
		return badinput.New(field+".image", "is %d characters long; at most 512", len(s.Image))
	case len(s.Command) == 0 || s.Command[0] == "":
		return badinput.New(field+".command", "required: the env program's argv, e.g. [\"python3\", \"/opt/envs/game.py\"]")
	case len(s.Command) > maxArgs:
		return badinput.New(field+".command", "has %d arguments; at most %d are allowed", len(s.Command), maxArgs)
	case len(s.Env) > maxEnvVars:
		return badinput.New(field+".env", "has %d variables; at most %d are allowed", len(s.Env), maxEnvVars)
	case s.StepTimeoutMS < 0 || s.StepTimeoutMS > MaxCallTimeout.Milliseconds():
		return badinput.New(field+".step_timeout_ms", "must be between 0 (the default, %d) and %d", DefaultStepTimeout.Milliseconds(), MaxCallTimeout.Milliseconds())
	case s.ResetTimeoutMS < 0 || s.ResetTimeoutMS > MaxCallTimeout.Milliseconds():
		return badinput.New(field+".reset_timeout_ms", "must be between 0 (the default, %d) and %d", DefaultResetTimeout.Milliseconds(), MaxCallTimeout.Milliseconds())
	case s.LeaseSeconds < 0:
		return badinput.New(field+".lease_seconds", "must be 0 (the pool's default) or positive")
	case strings.ContainsRune(s.Cwd, 0):
		return badinput.New(field+".cwd", "contains a NUL byte")
	}
	for i, a := range s.Command {
		if strings.ContainsRune(a, 0) {
			return badinput.New(fmt.Sprintf("%s.command[%d]", field, i), "contains a NUL byte")
		}
	}
	for k, v := range s.Env {
		if !envNamePattern.MatchString(k) {
			return badinput.New(field+".env", "invalid variable name %q", k)
		}
		if strings.ContainsRune(v, 0) {
			return badinput.New(field+".env."+k, "contains a NUL byte")
		}
	}
	return nil
}

// Get returns the env with id; ok is false when there is none.
func (r *Registry) Get(id string) (Spec, bool) {
	s, ok := r.byID[id]
	return s, ok
}

// List returns every env in the order of the registry file.
func (r *Registry) List() []Spec {
	out := make([]Spec, 0, len(r.order))
	for _, id := range r.order {
		out = append(out, r.byID[id])
	}
	return out
}
