package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/kelseyhightower/envconfig"

	"github.com/quarryhq/quarry/execagent"
	"github.com/quarryhq/quarry/execagent/agentapi"
)

// shutdownTimeout bounds the graceful part of a shutdown.
const shutdownTimeout = 10 * time.Second

// cmdConfig is what the binary reads besides execagent.Config.
type cmdConfig struct {
	Addr      string `default:"127.0.0.1:8000"`
	AddrFile  string `split_words:"true"`
	Token     string
	TokenFile string `split_words:"true"`
	// TokenKey (hex) and TokenNonce are the third way to get a token: the
	// agent derives it as agentapi.DeriveToken(key, nonce), as the provider
	// that launched it does (ECS: the key from a secret). Instead of
	// TokenNonce, TokenNonceFrom names where to read the nonce:
	// "ecs-task-arn" is the task's ARN from the ECS task metadata endpoint
	// (ECS_CONTAINER_METADATA_URI_V4), so the tasks of one RunTask call
	// share their definition and overrides yet each has its own token.
	TokenKey       string `split_words:"true"`
	TokenNonce     string `split_words:"true"`
	TokenNonceFrom string `split_words:"true"`
	// TokenFD is set only by the agent itself: after deriving its token it
	// re-executes with the key removed and the token on this pipe (hideKey).
	TokenFD  int    `split_words:"true"`
	LogLevel string `split_words:"true" default:"info"`
	// Procs is the agent's GOMAXPROCS. One is right for an agent: its work
	// is waiting on pipes and sockets, and with more, every wake-up of each
	// sandbox's agent pays for the Go scheduler spinning up idle threads
	// (measured: 30% less agent CPU per session run with 8 sandboxes busy).
	Procs int `default:"1"`
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	err := run(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "execagent:", err)
		os.Exit(1)
	}
}

// run starts the agent and serves until ctx is done.
func run(ctx context.Context) error {
	fs := flag.NewFlagSet("execagent", flag.ContinueOnError)
	version := fs.Bool("version", false, "print the version and exit")
	restoreSum := fs.String("restore", "", "restore the checkpoint archive read from stdin, whose SHA-256 this is, into the work dir (QUARRY_AGENT_WORKDIR, made when missing), print the result as JSON and exit; no server, no token")
	hold := fs.Bool("hold", false, "with -restore: after a restore that succeeded, keep running until stopped (SIGTERM, SIGINT), so that a volume mounted only while a container runs keeps what was restored")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return err
	}
	if *version {
		fmt.Println("execagent", agentapi.Version)
		return nil
	}
	if *restoreSum != "" {
		if err := restoreOnce(*restoreSum, os.Stdin, os.Stdout); err != nil || !*hold {
			return err
		}
		<-ctx.Done()
		return nil
	}
	var cc cmdConfig
	if err := envconfig.Process("QUARRY_AGENT", &cc); err != nil {
		return fmt.Errorf("read QUARRY_AGENT_* configuration: %w", err)
	}
	if cc.Procs < 1 {
		return fmt.Errorf("QUARRY_AGENT_PROCS: must be at least 1, got %d", cc.Procs)
	}
	runtime.GOMAXPROCS(cc.Procs)
	cfg := execagent.DefaultConfig()
	if err := envconfig.Process("QUARRY_AGENT", &cfg); err != nil {
		return fmt.Errorf("read QUARRY_AGENT_* configuration: %w", err)
	}
	token, err := loadToken(ctx, cc, os.Getenv(envMetadataURI), defaultMetadataClient())
	if err != nil {
		return err
	}
	if cc.TokenKey != "" {
		return hideKey(token) // the agent goes on in the new image, without the key
	}
	cfg.Token = token
	switch {
	case cfg.Workdir == "":
		if cfg.Workdir, err = os.Getwd(); err != nil {
			return fmt.Errorf("QUARRY_AGENT_WORKDIR: not set and the current directory is unknown: %w", err)
		}
	case filepath.IsAbs(cfg.Workdir):
		// Created when missing (e.g. under /tmp by an unprivileged user in
		// an image that has no directory for it); Validate rejects the rest.
		if err := os.MkdirAll(cfg.Workdir, 0o755); err != nil {
			return fmt.Errorf("QUARRY_AGENT_WORKDIR: create %s: %w", cfg.Workdir, err)
		}
	}
	cfg.Env = scrubEnv()
	log, err := newLogger(cc.LogLevel, os.Stderr)
	if err != nil {
		return err
	}
	srv, err := execagent.New(cfg, log)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cc.Addr)
	if err != nil {
		_ = srv.Close(context.Background())
		return fmt.Errorf("QUARRY_AGENT_ADDR: listen on %s: %w", cc.Addr, err)
	}
	bound := reachableAddr(ln.Addr())
	if cc.AddrFile != "" {
		if err := writeFileAtomic(cc.AddrFile, []byte(bound)); err != nil {
			_ = ln.Close()
			_ = srv.Close(context.Background())
			return fmt.Errorf("QUARRY_AGENT_ADDR_FILE: %w", err)
		}
	}
	log.Info("exec agent listening", "addr", bound, "version", agentapi.Version, "pid", os.Getpid())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, ln) }()
	var serveErr error
	select {
	case <-ctx.Done():
		log.Info("exec agent stopping", "reason", context.Cause(ctx))
	case <-srv.Orphaned():
		log.Warn("exec agent stopping", "reason", srv.OrphanReason())
	case serveErr = <-served:
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
	defer cancel()
	closeErr := srv.Close(sctx)
	if serveErr == nil {
		serveErr = <-served
	}
	return errors.Join(serveErr, closeErr)
}

// loadToken returns the token from QUARRY_AGENT_TOKEN, QUARRY_AGENT_TOKEN_FILE,
// or derived from QUARRY_AGENT_TOKEN_KEY and a nonce: QUARRY_AGENT_TOKEN_NONCE,
// or the one QUARRY_AGENT_TOKEN_NONCE_FROM names (ecs-task-arn: read with
// meta from metadataURI, the value of ECS_CONTAINER_METADATA_URI_V4).
// Exactly one of the three ways must be set, and one nonce with the key.
func loadToken(ctx context.Context, cc cmdConfig, metadataURI string, meta metadataClient) (string, error) {
	ways := 0
	derived := cc.TokenKey != "" || cc.TokenNonce != "" || cc.TokenNonceFrom != ""
	for _, set := range []bool{cc.Token != "", cc.TokenFile != "", derived, cc.TokenFD > 0} {
		if set {
			ways++
		}
	}
	switch {
	case ways > 1:
		return "", errors.New("two ways to get the token are both set (QUARRY_AGENT_TOKEN, QUARRY_AGENT_TOKEN_FILE, QUARRY_AGENT_TOKEN_KEY+_NONCE or _NONCE_FROM); set one")
	case cc.Token != "":
		return cc.Token, nil
	case cc.TokenFile != "":
		b, err := os.ReadFile(cc.TokenFile)
		if err != nil {
			return "", fmt.Errorf("QUARRY_AGENT_TOKEN_FILE: %w", err)
		}
		t := strings.TrimSpace(string(b))
		if t == "" {
			return "", fmt.Errorf("QUARRY_AGENT_TOKEN_FILE: %s is empty", cc.TokenFile)
		}
		return t, nil
	case cc.TokenFD > 0:
		return readTokenFD(cc.TokenFD)
	case derived:
		return deriveToken(ctx, cc, metadataURI, meta)
	}
	return "", errors.New("no token: set QUARRY_AGENT_TOKEN or QUARRY_AGENT_TOKEN_FILE (or QUARRY_AGENT_TOKEN_KEY and QUARRY_AGENT_TOKEN_NONCE or _NONCE_FROM); the agent refuses to start without one")
}

// deriveToken is loadToken's third way: the key and one nonce.
func deriveToken(ctx context.Context, cc cmdConfig, metadataURI string, meta metadataClient) (string, error) {
	switch {
	case cc.TokenNonce != "" && cc.TokenNonceFrom != "":
		return "", errors.New("QUARRY_AGENT_TOKEN_NONCE and QUARRY_AGENT_TOKEN_NONCE_FROM are both set; set one")
	case cc.TokenKey == "" || cc.TokenNonce == "" && cc.TokenNonceFrom == "":
		return "", errors.New("QUARRY_AGENT_TOKEN_KEY and QUARRY_AGENT_TOKEN_NONCE (or _NONCE_FROM): set both or neither")
	case cc.TokenNonceFrom != "" && cc.TokenNonceFrom != nonceFromTaskARN:
		return "", fmt.Errorf("QUARRY_AGENT_TOKEN_NONCE_FROM: want %q, got %q", nonceFromTaskARN, cc.TokenNonceFrom)
	}
	key, err := agentapi.ParseTokenKey(cc.TokenKey)
	if err != nil {
		return "", fmt.Errorf("QUARRY_AGENT_TOKEN_KEY: %w", err)
	}
	nonce := cc.TokenNonce
	if cc.TokenNonceFrom != "" {
		if metadataURI == "" {
			return "", fmt.Errorf("QUARRY_AGENT_TOKEN_NONCE_FROM=%s: %s is not set (ECS sets it in every task's containers)", nonceFromTaskARN, envMetadataURI)
		}
		if nonce, err = meta.taskARN(ctx, metadataURI); err != nil {
			return "", fmt.Errorf("QUARRY_AGENT_TOKEN_NONCE_FROM=%s: %w", nonceFromTaskARN, err)
		}
	}
	return agentapi.DeriveToken(key, nonce), nil
}

// scrubEnv removes every QUARRY_AGENT_* variable from the process environment
// and returns what is left, the base environment of the children.
func scrubEnv() []string {
	var keep []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, execagent.EnvPrefix) {
			_ = os.Unsetenv(k)
			continue
		}
		keep = append(keep, kv)
	}
	return keep
}

func newLogger(level string, w io.Writer) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("QUARRY_AGENT_LOG_LEVEL: %q is not debug, info, warn or error", level)
	}
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: l})), nil
}

// reachableAddr formats a bound address; an unspecified IP (0.0.0.0, ::)
// becomes 127.0.0.1, which reaches it from the same host.
func reachableAddr(a net.Addr) string {
	tcp, ok := a.(*net.TCPAddr)
	if !ok {
		return a.String()
	}
	ip := tcp.IP
	if ip == nil || ip.IsUnspecified() {
		ip = net.IPv4(127, 0, 0, 1)
	}
	return net.JoinHostPort(ip.String(), fmt.Sprint(tcp.Port))
}

// writeFileAtomic writes data to path through a temporary file and a rename,
// so a reader never sees a partial file.
func writeFileAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if _, err := tmp.Write(data); err != nil {
		_ = tmp.Close()
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// restoreOnce is the agent's one-shot restore (-restore): the archive read
// from in, whose SHA-256 is sum, restored into the work dir (made when
// missing, as the agent makes it at start) as a restore through the
// agent's API would, its result written to out as
// JSON. The Docker provider unpacks a copy-on-write layer with it, in a
// short-lived container of the pool's user.
func restoreOnce(sum string, in io.Reader, out io.Writer) error {
	if b, err := hex.DecodeString(sum); err != nil || len(b) != sha256.Size {
		return fmt.Errorf("-restore: want the archive's SHA-256 as 64 hex digits, got %q", sum)
	}
	cfg := execagent.DefaultConfig()
	if err := envconfig.Process("QUARRY_AGENT", &cfg); err != nil {
		return fmt.Errorf("read QUARRY_AGENT_* configuration: %w", err)
	}
	if !filepath.IsAbs(cfg.Workdir) {
		return fmt.Errorf("-restore: QUARRY_AGENT_WORKDIR must be an absolute path, got %q", cfg.Workdir)
	}
	if err := os.MkdirAll(cfg.Workdir, 0o755); err != nil {
		return fmt.Errorf("-restore: make the work dir: %w", err)
	}
	// The server answers no request: its token only passes its checks.
	var tok [16]byte
	if _, err := rand.Read(tok[:]); err != nil {
		return fmt.Errorf("-restore: %w", err)
	}
	cfg.Token = hex.EncodeToString(tok[:])
	srv, err := execagent.New(cfg, slog.New(slog.NewJSONHandler(os.Stderr, nil)))
	if err != nil {
		return err
	}
	res, err := srv.Restore(in, strings.ToLower(sum))
	cctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	if cerr := srv.Close(cctx); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("-restore: %w", err)
	}
	return json.NewEncoder(out).Encode(res)
}
