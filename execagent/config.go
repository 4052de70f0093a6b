package execagent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/quarryhq/quarry/internal/defaults"
)

// EnvPrefix is the prefix of the agent's own configuration variables. Every
// variable with this prefix is removed from the environment of every child
// the agent starts, so the token never reaches sandbox commands.
const EnvPrefix = "QUARRY_AGENT_"

// Config configures a Server. cmd/execagent fills it from QUARRY_AGENT_*
// variables with envconfig (split_words: MaxTimeout is
// QUARRY_AGENT_MAX_TIMEOUT); tests build it directly. Zero values take the
// defaults of DefaultConfig.
type Config struct {
	// Token is the bearer token every request must carry. Required.
	Token string `ignored:"true"`
	// Workdir is the directory relative paths resolve against and the default
	// cwd of commands. Required; must be an existing directory.
	Workdir string
	// Env is the base environment of every child ("KEY=value"), usually the
	// agent's own environment. Entries whose key starts with EnvPrefix are
	// dropped.
	Env []string `ignored:"true"`
	// Shell is the path of the shell for command strings and sessions: bash
	// (sessions use interactive bash) or a POSIX sh (sessions source a command
	// file). Empty means /bin/bash (or /usr/bin/bash) when present, else /bin/sh.
	Shell string
	// StateDir is the agent's private directory (the command files of
	// sessions). Empty means a new directory in /dev/shm (or, when that is
	// not writable, in the system's temporary directory), removed by Close.
	StateDir string `split_words:"true"`

	// MaxJSONBody bounds every JSON request body (default 8 MiB).
	MaxJSONBody int64 `split_words:"true"`
	// MaxUploadBytes bounds a file write, an archive upload (compressed and
	// extracted), and a process stdin write (default 1 GiB).
	MaxUploadBytes int64 `split_words:"true"`
	// MaxReadBytes bounds one file read, one archive download and the
	// files of one checkpoint (default 1 GiB).
	MaxReadBytes int64 `split_words:"true"`
	// MaxListEntries bounds a directory listing (default 100000).
	MaxListEntries int `split_words:"true"`
	// MaxCheckpointEntries bounds the entries of one checkpoint (default
	// 1000000): the agent holds about 100 bytes and the path of each
	// entry from its walk until it is sent.
	MaxCheckpointEntries int `split_words:"true"`
	// DefaultTimeout applies to exec and session runs that name none (300 s);
	// MaxTimeout bounds what a request may ask for (24 h).
	DefaultTimeout time.Duration `split_words:"true"`
	MaxTimeout     time.Duration `split_words:"true"`
	// DefaultOutputBytes is the output cap per stream when a request names
	// none (1 MiB); MaxOutputBytes bounds what a request may ask for (64 MiB).
	DefaultOutputBytes int64 `split_words:"true"`
	MaxOutputBytes     int64 `split_words:"true"`
	// ProcessOutputBytes is the size of each background process's output ring (4 MiB).
	ProcessOutputBytes int64 `split_words:"true"`
	// MaxSessions and MaxProcesses bound the live sessions (64) and the
	// tracked background processes, running or exited (256).
	MaxSessions  int `split_words:"true"`
	MaxProcesses int `split_words:"true"`
	// PTYReplay is the size of each PTY's replay ring: the recent output a
	// client that attaches gets first (256 KiB).
	PTYReplay int64 `envconfig:"PTY_REPLAY"`
	// MaxPTYs bounds the running PTYs (32); past it a create is 409. Exited
	// ones are kept (their exit code) until deleted or until room is needed.
	MaxPTYs int `envconfig:"MAX_PTYS"`
	// KeepAlive is the interval of ": keep-alive" comments on quiet event
	// streams (15 s).
	KeepAlive time.Duration `split_words:"true"`
	// InterruptGrace is how long a session gets to come back after SIGINT on
	// a run's timeout before the agent escalates, and then kills it (5 s).
	InterruptGrace time.Duration `split_words:"true"`
	// DrainTimeout is how long output is still read after a command's main
	// process exited, while a leftover child keeps its pipes open (2 s).
	DrainTimeout time.Duration `split_words:"true"`
	// StdinTimeout bounds one write to a process's stdin (60 s).
	StdinTimeout time.Duration `split_words:"true"`
	// ReapInterval is the period of the full zombie sweep that backs up
	// SIGCHLD (1 s).
	ReapInterval time.Duration `split_words:"true"`
	// OwnerDir, when set, is a directory whose existence means that
	// something owns the agent (the process provider's task directory):
	// when it is gone, the agent is orphaned (Server.Orphaned) and its
	// binary exits, killing what it started. It must exist at start.
	OwnerDir string `split_words:"true"`
	// OwnerCheckInterval is how often the agent checks whether it is
	// orphaned (5 s): OwnerDir, and IdleExit.
	OwnerCheckInterval time.Duration `split_words:"true"`
	// IdleExit: an agent that holds no lease (never initialized, or its
	// lease was fenced) and got no authenticated call for this long is
	// orphaned (1 h). A leased agent never is: leases outlive gateway
	// restarts. A warm pool's gateway checks the health of its ready
	// agents far more often (QUARRY_HEALTH_CHECK_INTERVAL, 30 s).
	IdleExit time.Duration `split_words:"true"`
	// NoSubreaper leaves the process's child-subreaper attribute alone (tests
	// of code that embeds the agent). The reaper still reaps untracked
	// zombie children.
	NoSubreaper bool `ignored:"true"`
	// RelaySocket is the path of the gateway's model relay socket, a Unix
	// socket the provider mounted into the sandbox. When set, the agent
	// forwards the relay's sandbox routes (/v1/sandboxes/{id}/model/v1/...)
	// to it without its own authentication: the gateway checks their relay
	// token (relay.go).
	RelaySocket string `split_words:"true"`
}

// DefaultConfig returns the defaults; Token, Workdir and Env are left empty.
func DefaultConfig() Config {
	return Config{
		MaxJSONBody:          8 << 20,
		MaxUploadBytes:       1 << 30,
		MaxReadBytes:         1 << 30,
		MaxListEntries:       100000,
		MaxCheckpointEntries: 1000000,
		DefaultTimeout:       300 * time.Second,
		MaxTimeout:           24 * time.Hour,
		DefaultOutputBytes:   1 << 20,
		MaxOutputBytes:       64 << 20,
		ProcessOutputBytes:   4 << 20,
		MaxSessions:          64,
		MaxProcesses:         256,
		PTYReplay:            256 << 10,
		MaxPTYs:              32,
		KeepAlive:            15 * time.Second,
		InterruptGrace:       5 * time.Second,
		DrainTimeout:         2 * time.Second,
		StdinTimeout:         60 * time.Second,
		ReapInterval:         time.Second,
		OwnerCheckInterval:   5 * time.Second,
		IdleExit:             time.Hour,
	}
}

// WithDefaults returns c with every zero field set from DefaultConfig.
func (c Config) WithDefaults() Config {
	d := DefaultConfig()
	defaults.Set(&c.MaxJSONBody, d.MaxJSONBody)
	defaults.Set(&c.MaxUploadBytes, d.MaxUploadBytes)
	defaults.Set(&c.MaxReadBytes, d.MaxReadBytes)
	defaults.Set(&c.MaxListEntries, d.MaxListEntries)
	defaults.Set(&c.MaxCheckpointEntries, d.MaxCheckpointEntries)
	defaults.Set(&c.DefaultTimeout, d.DefaultTimeout)
	defaults.Set(&c.MaxTimeout, d.MaxTimeout)
	defaults.Set(&c.DefaultOutputBytes, d.DefaultOutputBytes)
	defaults.Set(&c.MaxOutputBytes, d.MaxOutputBytes)
	defaults.Set(&c.ProcessOutputBytes, d.ProcessOutputBytes)
	defaults.Set(&c.MaxSessions, d.MaxSessions)
	defaults.Set(&c.MaxProcesses, d.MaxProcesses)
	defaults.Set(&c.PTYReplay, d.PTYReplay)
	defaults.Set(&c.MaxPTYs, d.MaxPTYs)
	defaults.Set(&c.KeepAlive, d.KeepAlive)
	defaults.Set(&c.InterruptGrace, d.InterruptGrace)
	defaults.Set(&c.DrainTimeout, d.DrainTimeout)
	defaults.Set(&c.StdinTimeout, d.StdinTimeout)
	defaults.Set(&c.ReapInterval, d.ReapInterval)
	defaults.Set(&c.OwnerCheckInterval, d.OwnerCheckInterval)
	defaults.Set(&c.IdleExit, d.IdleExit)
	return c
}

// Validate reports the first invalid setting, naming its variable.
func (c Config) Validate() error {
	if c.Token == "" {
		return errors.New("QUARRY_AGENT_TOKEN (or QUARRY_AGENT_TOKEN_FILE): required; the agent refuses to start without a token")
	}
	if strings.ContainsAny(c.Token, " \t\r\n") {
		return errors.New("QUARRY_AGENT_TOKEN: must not contain white space")
	}
	if c.Workdir == "" {
		return errors.New("QUARRY_AGENT_WORKDIR: required")
	}
	if !filepath.IsAbs(c.Workdir) {
		return fmt.Errorf("QUARRY_AGENT_WORKDIR: %q is not an absolute path", c.Workdir)
	}
	if fi, err := os.Stat(c.Workdir); err != nil || !fi.IsDir() {
		return fmt.Errorf("QUARRY_AGENT_WORKDIR: %q is not a directory", c.Workdir)
	}
	if c.OwnerDir != "" {
		if !filepath.IsAbs(c.OwnerDir) {
			return fmt.Errorf("QUARRY_AGENT_OWNER_DIR: %q is not an absolute path", c.OwnerDir)
		}
		if fi, err := os.Stat(c.OwnerDir); err != nil || !fi.IsDir() {
			return fmt.Errorf("QUARRY_AGENT_OWNER_DIR: %q is not a directory", c.OwnerDir)
		}
	}
	if c.Shell != "" {
		if fi, err := os.Stat(c.Shell); err != nil || fi.IsDir() {
			return fmt.Errorf("QUARRY_AGENT_SHELL: %q is not an executable file", c.Shell)
		}
	}
	positive := []struct {
		name string
		v    int64
	}{
		{"QUARRY_AGENT_MAX_JSON_BODY", c.MaxJSONBody},
		{"QUARRY_AGENT_MAX_UPLOAD_BYTES", c.MaxUploadBytes},
		{"QUARRY_AGENT_MAX_READ_BYTES", c.MaxReadBytes},
		{"QUARRY_AGENT_MAX_LIST_ENTRIES", int64(c.MaxListEntries)},
		{"QUARRY_AGENT_MAX_CHECKPOINT_ENTRIES", int64(c.MaxCheckpointEntries)},
		{"QUARRY_AGENT_DEFAULT_TIMEOUT", int64(c.DefaultTimeout)},
		{"QUARRY_AGENT_MAX_TIMEOUT", int64(c.MaxTimeout)},
		{"QUARRY_AGENT_DEFAULT_OUTPUT_BYTES", c.DefaultOutputBytes},
		{"QUARRY_AGENT_MAX_OUTPUT_BYTES", c.MaxOutputBytes},
		{"QUARRY_AGENT_PROCESS_OUTPUT_BYTES", c.ProcessOutputBytes},
		{"QUARRY_AGENT_MAX_SESSIONS", int64(c.MaxSessions)},
		{"QUARRY_AGENT_MAX_PROCESSES", int64(c.MaxProcesses)},
		{"QUARRY_AGENT_PTY_REPLAY", c.PTYReplay},
		{"QUARRY_AGENT_MAX_PTYS", int64(c.MaxPTYs)},
		{"QUARRY_AGENT_KEEP_ALIVE", int64(c.KeepAlive)},
		{"QUARRY_AGENT_INTERRUPT_GRACE", int64(c.InterruptGrace)},
		{"QUARRY_AGENT_DRAIN_TIMEOUT", int64(c.DrainTimeout)},
		{"QUARRY_AGENT_STDIN_TIMEOUT", int64(c.StdinTimeout)},
		{"QUARRY_AGENT_REAP_INTERVAL", int64(c.ReapInterval)},
		{"QUARRY_AGENT_OWNER_CHECK_INTERVAL", int64(c.OwnerCheckInterval)},
		{"QUARRY_AGENT_IDLE_EXIT", int64(c.IdleExit)},
	}
	for _, p := range positive {
		if p.v <= 0 {
			return fmt.Errorf("%s: must be positive", p.name)
		}
	}
	if c.DefaultTimeout > c.MaxTimeout {
		return fmt.Errorf("QUARRY_AGENT_DEFAULT_TIMEOUT: %s is above QUARRY_AGENT_MAX_TIMEOUT %s", c.DefaultTimeout, c.MaxTimeout)
	}
	if c.DefaultOutputBytes > c.MaxOutputBytes {
		return fmt.Errorf("QUARRY_AGENT_DEFAULT_OUTPUT_BYTES: %d is above QUARRY_AGENT_MAX_OUTPUT_BYTES %d", c.DefaultOutputBytes, c.MaxOutputBytes)
	}
	return nil
}

// childEnv returns base without the agent's own variables (EnvPrefix).
func childEnv(base []string) []string {
	out := make([]string, 0, len(base))
	for _, kv := range base {
		if strings.HasPrefix(kv, EnvPrefix) {
			continue
		}
		out = append(out, kv)
	}
	return out
}
