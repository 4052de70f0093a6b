package process

import (
	"errors"
	"fmt"
	"time"
)

// Defaults applied by Config.WithDefaults.
const (
	DefaultGatewayID         = "local"
	DefaultStartTimeout      = 30 * time.Second
	DefaultStopGrace         = 5 * time.Second
	DefaultLaunchConcurrency = 4
	DefaultPath              = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	DefaultLang              = "C.UTF-8"
)

// maxLaunchConcurrency bounds how many agents one Launch call starts at once.
const maxLaunchConcurrency = 64

// Config configures the process provider. The zero value of every field but
// AgentBinary and Dir is replaced by its default (see WithDefaults).
type Config struct {
	// AgentBinary is the exec agent executable (a path, or a name looked up
	// in PATH by New). Required.
	AgentBinary string
	// Dir holds one directory per task, Dir/<task-name>/. Required; created
	// (mode 0700) by New if missing. Two gateways on one host share tasks
	// only if they share Dir.
	Dir string
	// GatewayID is attached to every task as providers.LabelGateway.
	GatewayID string
	// StartTimeout bounds a launch until the agent has written its address.
	StartTimeout time.Duration
	// StopGrace is how long Stop waits after SIGTERM before it kills the
	// task's whole session with SIGKILL.
	StopGrace time.Duration
	// LaunchConcurrency bounds how many agents one Launch call starts at once
	// (1..64).
	LaunchConcurrency int
	// Path and Lang are the PATH and LANG of every agent (and so of every
	// sandbox command) unless the spec's Env sets them.
	Path string
	Lang string
}

// WithDefaults returns c with every unset field set to its default.
func (c Config) WithDefaults() Config {
	if c.GatewayID == "" {
		c.GatewayID = DefaultGatewayID
	}
	if c.StartTimeout == 0 {
		c.StartTimeout = DefaultStartTimeout
	}
	if c.StopGrace == 0 {
		c.StopGrace = DefaultStopGrace
	}
	if c.LaunchConcurrency == 0 {
		c.LaunchConcurrency = DefaultLaunchConcurrency
	}
	if c.Path == "" {
		c.Path = DefaultPath
	}
	if c.Lang == "" {
		c.Lang = DefaultLang
	}
	return c
}

// Validate reports every invalid field of c (after defaults), each error
// naming its field. It does not touch the file system.
func (c Config) Validate() error {
	var errs []error
	if c.AgentBinary == "" {
		errs = append(errs, errors.New("AgentBinary: must be set"))
	}
	if c.Dir == "" {
		errs = append(errs, errors.New("Dir: must be set"))
	}
	if c.GatewayID == "" {
		errs = append(errs, errors.New("GatewayID: must be set"))
	}
	if c.StartTimeout <= 0 {
		errs = append(errs, fmt.Errorf("StartTimeout: must be positive, got %s", c.StartTimeout))
	}
	if c.StopGrace <= 0 {
		errs = append(errs, fmt.Errorf("StopGrace: must be positive, got %s", c.StopGrace))
	}
	if c.LaunchConcurrency < 1 || c.LaunchConcurrency > maxLaunchConcurrency {
		errs = append(errs, fmt.Errorf("LaunchConcurrency: must be between 1 and %d, got %d", maxLaunchConcurrency, c.LaunchConcurrency))
	}
	if c.Path == "" {
		errs = append(errs, errors.New("Path: must be set"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("process provider config: %w", err)
	}
	return nil
}
