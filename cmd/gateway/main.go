package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/kelseyhightower/envconfig"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/quarryhq/quarry/gateway"
	"github.com/quarryhq/quarry/internal/secretfile"
	"github.com/quarryhq/quarry/providers"
	"github.com/quarryhq/quarry/providers/process"
	"github.com/quarryhq/quarry/warmpool"
	"github.com/quarryhq/quarry/warmpool/boltstore"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := run(ctx, os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "gateway:", err)
		os.Exit(1)
	}
}

// Config is the gateway binary's configuration, read by envconfig with the
// QUARRY_ prefix (docs/CONFIG.md lists every variable). The embedded configs
// carry their own variables.
type Config struct {
	Addr        string `envconfig:"QUARRY_ADDR" default:"127.0.0.1:8080"`
	DataDir     string `envconfig:"QUARRY_DATA_DIR" default:".quarry"`
	PoolsFile   string `envconfig:"QUARRY_POOLS_FILE"`
	Pools       string `envconfig:"QUARRY_POOLS"`       // the pools document itself (Lambda has no file); exclusive with PoolsFile
	RockImages  string `envconfig:"QUARRY_ROCK_IMAGES"` // image=pool pairs for ROCK's routes (docs/ROCK.md)
	Provider    string `envconfig:"QUARRY_PROVIDER" default:"process"`
	Store       string `envconfig:"QUARRY_STORE" default:"embedded"`
	AgentBinary string `envconfig:"QUARRY_AGENT_BINARY"`
	LogLevel    string `envconfig:"QUARRY_LOG_LEVEL" default:"info"`
	TLSCertFile string `envconfig:"QUARRY_TLS_CERT_FILE"`
	TLSKeyFile  string `envconfig:"QUARRY_TLS_KEY_FILE"`
	// ShutdownTimeout bounds finishing in-flight requests on SIGINT/SIGTERM.
	ShutdownTimeout time.Duration `envconfig:"QUARRY_SHUTDOWN_TIMEOUT" default:"30s"`
	// StartTimeout bounds the start of the manager (the store must answer).
	StartTimeout time.Duration `envconfig:"QUARRY_START_TIMEOUT" default:"30s"`

	GatewayConfig
	ManagerConfig
	DynamoConfig
	CheckpointConfig
}

// The embedded configurations, named so that their fields stay flat for
// envconfig (QUARRY_API_KEYS, QUARRY_RECONCILE_INTERVAL, ...).
type (
	GatewayConfig = gateway.Config
	ManagerConfig = warmpool.Config
)

// storeDeps are what a lease store opener may use besides the config.
type storeDeps struct {
	log     *slog.Logger
	metrics prometheus.Registerer
}

// storeOpener opens one kind of lease store.
type storeOpener func(ctx context.Context, cfg Config, deps storeDeps) (warmpool.Store, error)

// storeOpeners returns the lease stores by QUARRY_STORE name.
func storeOpeners() map[string]storeOpener {
	return map[string]storeOpener{
		"embedded": openEmbeddedStore,
		"dynamodb": openDynamoStore,
	}
}

// providerMaker builds one kind of provider.
type providerMaker func(cfg Config, log *slog.Logger) (providers.Provider, error)

// providerMakers returns the providers by name (QUARRY_PROVIDER and the
// pools' provider). A gateway built with the tag benchfarm also has the
// benchmarks' farm provider (farm.go).
func providerMakers() map[string]providerMaker {
	m := map[string]providerMaker{
		"process": newProcessProvider,
		"docker":  makeDockerProvider,
		"ecs":     makeECSProvider,
	}
	addBenchProviders(m)
	return m
}

// knownProviders lists the provider names for error messages.
func knownProviders() string {
	return strings.Join(slices.Sorted(maps.Keys(providerMakers())), ", ")
}

// Validate checks the values envconfig could parse and names the variable of
// the first bad one.
func (c Config) Validate() error {
	if _, _, err := net.SplitHostPort(c.Addr); err != nil {
		return fmt.Errorf("QUARRY_ADDR: want host:port, got %q", c.Addr)
	}
	if c.DataDir == "" {
		return errors.New("QUARRY_DATA_DIR: must not be empty")
	}
	if _, ok := storeOpeners()[c.Store]; !ok {
		return fmt.Errorf("QUARRY_STORE: unknown store %q (known: embedded, dynamodb)", c.Store)
	}
	if c.Store == "dynamodb" {
		if err := c.validateDynamo(); err != nil {
			return err
		}
	}
	if _, ok := providerMakers()[c.Provider]; !ok {
		return fmt.Errorf("QUARRY_PROVIDER: unknown provider %q (known: %s)", c.Provider, knownProviders())
	}
	if _, err := parseLevel(c.LogLevel); err != nil {
		return err
	}
	if (c.TLSCertFile == "") != (c.TLSKeyFile == "") {
		return errors.New("QUARRY_TLS_CERT_FILE and QUARRY_TLS_KEY_FILE: set both or neither")
	}
	if c.ShutdownTimeout <= 0 {
		return fmt.Errorf("QUARRY_SHUTDOWN_TIMEOUT: must be positive, got %s", c.ShutdownTimeout)
	}
	if c.StartTimeout <= 0 {
		return fmt.Errorf("QUARRY_START_TIMEOUT: must be positive, got %s", c.StartTimeout)
	}
	if err := c.CheckpointConfig.Validate(); err != nil {
		return err
	}
	return c.ManagerConfig.WithDefaults().Validate()
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return l, fmt.Errorf("QUARRY_LOG_LEVEL: want debug, info, warn or error, got %q", s)
	}
	return l, nil
}

// run starts the gateway and serves until ctx is done, then shuts down:
// in-flight requests finish (bounded), the manager and the store close. The
// sandboxes keep running: leases outlive the process. It writes one line to
// out once serving: the URL and where the API key is. Inside AWS Lambda
// (AWS_LAMBDA_RUNTIME_API is set) it serves Lambda invocations instead
// (lambda.go).
func run(ctx context.Context, out io.Writer) error {
	if err := loadSecrets(ctx); err != nil {
		return err
	}
	cfg, log, err := loadConfig()
	if err != nil {
		return err
	}
	applyMemoryLimit(log)
	if inLambda(os.Getenv) {
		return runLambda(ctx, cfg, log)
	}
	st, err := build(ctx, cfg, log, providerMakers(), true)
	if err != nil {
		return err
	}
	defer st.close(ctx)
	return serve(ctx, st, out, log)
}

// loadConfig reads and validates the QUARRY_* configuration and builds the
// logger it asks for.
func loadConfig() (Config, *slog.Logger, error) {
	var cfg Config
	if err := envconfig.Process("", &cfg); err != nil {
		return cfg, nil, fmt.Errorf("read QUARRY_* configuration: %w", err)
	}
	cfg.ManagerConfig = cfg.ManagerConfig.WithDefaults() // once: the default replica id is random
	if err := cfg.Validate(); err != nil {
		return cfg, nil, err
	}
	level, _ := parseLevel(cfg.LogLevel)
	return cfg, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})), nil
}

// stack is the gateway with everything it runs on, built by build; close
// tears it down in reverse order.
type stack struct {
	cfg       Config
	gw        *gateway.Gateway
	mgr       *warmpool.Manager
	keySource string       // where the API key comes from, for the start-up line
	ln        net.Listener // QUARRY_ADDR (with background)
	relayLn   net.Listener // the relay socket, when a provider mounts its directory (with background)
	purge     *purger      // deletes expired checkpoints (started with background)
	log       *slog.Logger
	closers   []func(ctx context.Context) // run in reverse order by close
}

// close stops what build started, last first, each step bounded by
// QUARRY_SHUTDOWN_TIMEOUT. It never stops sandboxes.
func (s *stack) close(ctx context.Context) {
	for i := len(s.closers) - 1; i >= 0; i-- {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.ShutdownTimeout)
		s.closers[i](cctx)
		cancel()
	}
}

// build opens the lease store, the providers (made by makers), the model
// relay and the manager, and builds the gateway on them. With background
// (a long-lived server), it listens on QUARRY_ADDR and, when a provider
// mounts it into sandboxes, on the relay socket, and only then starts the
// manager's loops: their first launches mount the socket's directory.
// Without, nothing runs between calls and the background work is
// Manager.RunOnce's (Lambda). On error, what was opened is closed again.
func build(ctx context.Context, cfg Config, log *slog.Logger, makers map[string]providerMaker, background bool) (_ *stack, err error) {
	st := &stack{cfg: cfg, log: log}
	defer func() {
		if err != nil {
			st.close(ctx)
		}
	}()
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("QUARRY_DATA_DIR: create %s: %w", cfg.DataDir, err)
	}
	st.keySource = "QUARRY_API_KEYS"
	if len(cfg.APIKeys) == 0 {
		key, path, err := loadOrCreateKey(cfg.DataDir)
		if err != nil {
			return nil, err
		}
		cfg.APIKeys, st.keySource = []string{key}, path
		log.Info("no QUARRY_API_KEYS: using the generated key", "file", path)
	}
	if cfg.PreviewSecret, err = previewSecret(cfg.PreviewSecret, cfg.DataDir, cfg.Store, log); err != nil { // preview.go
		return nil, err
	}
	doc, err := loadPoolsFile(cfg)
	if err != nil {
		return nil, err
	}
	pools := doc.Pools
	envReg, err := loadEnvs(pools)
	if err != nil {
		return nil, err
	}
	rockImages, err := parseRockImages(cfg.RockImages, pools)
	if err != nil {
		return nil, err
	}
	if cfg.DefaultPool == "" && !hasPool(pools, "default") {
		cfg.DefaultPool = pools[0].Name
	}
	if err := cfg.GatewayConfig.Validate(); err != nil { // now with its keys
		return nil, err
	}
	cfg.MaxAgentClients = maxAgentClients(cfg.MaxAgentClients, pools)
	st.cfg = cfg

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	openCtx, cancel := context.WithTimeout(ctx, cfg.StartTimeout)
	store, err := storeOpeners()[cfg.Store](openCtx, cfg, storeDeps{log: log, metrics: reg})
	cancel()
	if err != nil {
		return nil, err
	}
	st.closers = append(st.closers, func(context.Context) {
		if err := store.Close(); err != nil {
			log.Error("close lease store", "err", err)
		}
	})
	provs, err := makeProviders(cfg, providerNames(doc), makers, log)
	if err != nil {
		return nil, err
	}
	st.closers = append(st.closers, func(context.Context) { closeProviders(provs, log) })
	if err := registerProviderMetrics(reg, provs); err != nil {
		return nil, err
	}
	if background {
		// Before the manager exists: its closer runs before theirs, so
		// the socket's directory outlives every launch.
		if err := st.listen(provs); err != nil {
			return nil, err
		}
	}

	agentHTTP := &http.Client{
		Timeout:   30 * time.Second,
		Transport: managerAgentTransport(),
	}
	relay, closeRelay, err := newModelRelay(ctx, cfg.DataDir, cfg.Addr, pools, store, log)
	if err != nil {
		return nil, err
	}
	st.closers = append(st.closers, func(ctx context.Context) {
		if err := closeRelay(ctx); err != nil {
			log.Error("close model relay", "err", err)
		}
	})
	mgr, err := warmpool.New(cfg.ManagerConfig.WithDefaults(), warmpool.Deps{
		Store: store, Providers: provs, Pools: pools, Classes: doc.Classes, Agents: warmpool.NewHTTPAgents(agentHTTP),
		Logger: log, Metrics: reg, LeaseEnv: relay.LeaseEnv, ExtraProvider: extraProvider(cfg, makers, log),
	})
	if err != nil {
		return nil, fmt.Errorf("create manager: %w", err)
	}
	st.mgr = mgr
	st.closers = append(st.closers, func(ctx context.Context) {
		if err := mgr.Close(ctx); err != nil {
			log.Error("close manager", "err", err)
		}
	})
	if background {
		startCtx, cancel := context.WithTimeout(ctx, cfg.StartTimeout)
		err = mgr.Start(startCtx)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("start manager: %w", err)
		}
	}

	openCtx, cancel = context.WithTimeout(ctx, cfg.StartTimeout)
	ckStore, err := openCheckpointStore(openCtx, cfg, log)
	cancel()
	if err != nil {
		return nil, err
	}
	st.closers = append(st.closers, func(context.Context) {
		if err := ckStore.Close(); err != nil {
			log.Error("close checkpoint store", "err", err)
		}
	})
	if st.purge, err = newPurger(ckStore, cfg.CheckpointConfig, log, reg); err != nil {
		return nil, err
	}
	if background { // Lambda runs a pass per scheduled invocation instead (lambda.go)
		st.purge.Start(ctx)
		st.closers = append(st.closers, st.purge.Close)
	}

	st.gw, err = gateway.New(cfg.GatewayConfig, gateway.Deps{Manager: mgr, Logger: log, Metrics: reg, Model: relay, Envs: envReg, RockImages: rockImages,
		Checkpoints: ckStore, CheckpointConfig: cfg.CheckpointConfig.Config})
	if err != nil {
		return nil, err
	}
	return st, nil
}

// listen listens on QUARRY_ADDR and, when one of provs mounts it into its
// sandboxes (providers.SandboxRelay), on the relay socket; st.close closes
// both and removes the socket.
func (st *stack) listen(provs map[string]providers.Provider) error {
	ln, err := net.Listen("tcp", st.cfg.Addr)
	if err != nil {
		return fmt.Errorf("QUARRY_ADDR: listen on %s: %w", st.cfg.Addr, err)
	}
	st.ln = ln
	st.closers = append(st.closers, func(context.Context) { _ = ln.Close() }) // closed by Shutdown already, unless serve never ran
	for _, prov := range provs {
		if _, ok := prov.(providers.SandboxRelay); !ok {
			continue
		}
		// After QUARRY_ADDR: a second gateway on a busy address must not
		// take the first one's socket.
		dir, err := relayDir(st.cfg.DataDir)
		if err != nil {
			return err
		}
		rln, err := listenRelay(dir)
		if err != nil {
			return err
		}
		st.relayLn = rln
		// A later gateway makes it again; containers see it through their
		// mount of the directory.
		st.closers = append(st.closers, func(context.Context) {
			_ = rln.Close()
			removeRelaySocket(dir, st.log)
		})
		return nil
	}
	return nil
}

// serve serves on the listeners build opened until ctx is done, then shuts
// the gateway down.
func serve(ctx context.Context, st *stack, out io.Writer, log *slog.Logger) error {
	cfg, gw, ln, rln := st.cfg, st.gw, st.ln, st.relayLn
	scheme := "http"
	errc := make(chan error, 2)
	servers := 1
	if cfg.TLSCertFile != "" {
		scheme = "https"
		go func() { errc <- gw.ServeTLS(ln, cfg.TLSCertFile, cfg.TLSKeyFile) }()
	} else {
		go func() { errc <- gw.Serve(ln) }()
	}
	if rln != nil {
		servers++
		go func() { errc <- gw.ServeRelay(rln) }()
		log.Info("model relay socket for sandboxes", "path", rln.Addr().String())
	}
	fmt.Fprintf(out, "quarry gateway serving on %s://%s (API key: %s)\n", scheme, ln.Addr(), st.keySource)

	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	log.Info("shutting down: finishing requests in flight", "timeout", cfg.ShutdownTimeout)
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.ShutdownTimeout)
	defer cancel()
	err := gw.Shutdown(sctx)
	for range servers {
		err = errors.Join(err, <-errc)
	}
	return err
}

// loadOrCreateKey returns the API key saved in dir/api-key, generating and
// saving one (mode 0600) on first use.
func loadOrCreateKey(dir string) (key, path string, err error) {
	path = filepath.Join(dir, "api-key")
	key, _, err = secretfile.LoadOrCreate(path, func() (string, error) {
		raw := make([]byte, 24)
		if _, err := rand.Read(raw); err != nil {
			return "", fmt.Errorf("generate API key: %w", err)
		}
		return "qk_" + hex.EncodeToString(raw), nil
	}, nil)
	if err != nil {
		return "", path, fmt.Errorf("API key file: %w (delete it or set QUARRY_API_KEYS)", err)
	}
	return key, path, nil
}

// defaultPools is what a gateway serves when neither QUARRY_POOLS nor
// QUARRY_POOLS_FILE is set: a pool "default" and a class "default" (every
// image, on QUARRY_PROVIDER: the process provider answers an image with a
// 400 naming the providers that run images).
func defaultPools() warmpool.PoolsFile {
	return warmpool.PoolsFile{
		Pools:   []warmpool.PoolConfig{warmpool.PoolConfig{Name: "default", Image: "host", MinWarm: 2, MaxTotal: 16}.WithDefaults()},
		Classes: []warmpool.ClassConfig{warmpool.ClassConfig{Name: "default", MaxTotal: 16}.WithDefaults()},
	}
}

// loadPools is loadPoolsFile's pools.
func loadPools(cfg Config) ([]warmpool.PoolConfig, error) {
	doc, err := loadPoolsFile(cfg)
	return doc.Pools, err
}

// loadPoolsFile reads QUARRY_POOLS or QUARRY_POOLS_FILE (or uses the
// built-in defaultPools) and gives pools and classes that name no provider
// QUARRY_PROVIDER.
func loadPoolsFile(cfg Config) (warmpool.PoolsFile, error) {
	doc := defaultPools()
	source := "QUARRY_POOLS_FILE"
	if cfg.Pools != "" {
		source = "QUARRY_POOLS"
	}
	var err error
	switch {
	case cfg.PoolsFile != "" && cfg.Pools != "":
		return doc, errors.New("QUARRY_POOLS and QUARRY_POOLS_FILE: set one, not both")
	case cfg.Pools != "":
		if doc, err = warmpool.ParsePoolsFile([]byte(cfg.Pools)); err != nil {
			return doc, fmt.Errorf("QUARRY_POOLS: %w", err)
		}
	case cfg.PoolsFile != "":
		if doc, err = warmpool.LoadPoolsFile(cfg.PoolsFile); err != nil {
			return doc, fmt.Errorf("QUARRY_POOLS_FILE: %w", err)
		}
	}
	for i := range doc.Pools {
		if doc.Pools[i].Provider == "" {
			doc.Pools[i].Provider = cfg.Provider
		}
		if _, ok := providerMakers()[doc.Pools[i].Provider]; !ok {
			return doc, fmt.Errorf("%s: pool %q: unknown provider %q (known: %s)", source, doc.Pools[i].Name, doc.Pools[i].Provider, knownProviders())
		}
	}
	for i := range doc.Classes {
		if doc.Classes[i].Provider == "" {
			doc.Classes[i].Provider = cfg.Provider
		}
		if _, ok := providerMakers()[doc.Classes[i].Provider]; !ok {
			return doc, fmt.Errorf("%s: class %q: unknown provider %q (known: %s)", source, doc.Classes[i].Name, doc.Classes[i].Provider, knownProviders())
		}
	}
	if err := errors.Join(warmpool.ValidatePools(doc.Pools), warmpool.ValidateClasses(doc.Classes, doc.Pools)); err != nil {
		return doc, fmt.Errorf("%s: %w", source, err)
	}
	return doc, nil
}

// providerNames are the providers the pools and classes of doc use, in
// order of first use.
func providerNames(doc warmpool.PoolsFile) []string {
	var names []string
	for _, p := range doc.Pools {
		if !slices.Contains(names, p.Provider) {
			names = append(names, p.Provider)
		}
	}
	for _, c := range doc.Classes {
		if !slices.Contains(names, c.Provider) {
			names = append(names, c.Provider)
		}
	}
	return names
}

func hasPool(pools []warmpool.PoolConfig, name string) bool {
	for _, p := range pools {
		if p.Name == name {
			return true
		}
	}
	return false
}

// makeProviders builds the providers the pools use with makers (by name:
// providerMakers).
func makeProviders(cfg Config, names []string, makers map[string]providerMaker, log *slog.Logger) (map[string]providers.Provider, error) {
	out := make(map[string]providers.Provider)
	for _, name := range names {
		prov, err := makers[name](cfg, log.With("provider", name))
		if err != nil {
			closeProviders(out, log)
			return nil, err
		}
		out[name] = prov
	}
	return out, nil
}

// extraProvider is the manager's Deps.ExtraProvider: on the embedded store
// (one machine, whose data dir made every task in it), a provider that no
// pool uses any more is built when a task it made is to be stopped (a pool
// moved from the process provider to Docker in the same data dir). On a
// shared store a task may have been made on another machine, which this
// one's process provider or engine cannot see: such tasks are reported
// instead (nil).
func extraProvider(cfg Config, makers map[string]providerMaker, log *slog.Logger) func(name string) (providers.Provider, error) {
	if cfg.Store != "embedded" {
		return nil
	}
	return func(name string) (providers.Provider, error) {
		maker, ok := makers[name]
		if !ok {
			return nil, fmt.Errorf("unknown provider %q (known: %s)", name, knownProviders())
		}
		return maker(cfg, log.With("provider", name))
	}
}

// registerProviderMetrics registers the collectors of the providers that
// have some (the ECS provider's launch queue, starting tasks, refusals,
// events).
func registerProviderMetrics(reg prometheus.Registerer, provs map[string]providers.Provider) error {
	for name, p := range provs {
		m, ok := p.(interface{ Collectors() []prometheus.Collector })
		if !ok {
			continue
		}
		for _, c := range m.Collectors() {
			if err := reg.Register(c); err != nil {
				return fmt.Errorf("register the %s provider's metrics: %w", name, err)
			}
		}
	}
	return nil
}

// closeProviders releases the providers' resources; it never stops tasks.
func closeProviders(provs map[string]providers.Provider, log *slog.Logger) {
	for name, p := range provs {
		c, ok := p.(providers.Closer)
		if !ok {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := c.Close(ctx); err != nil {
			log.Error("close provider", "provider", name, "err", err)
		}
		cancel()
	}
}

func openEmbeddedStore(_ context.Context, cfg Config, _ storeDeps) (warmpool.Store, error) {
	path := filepath.Join(cfg.DataDir, "quarry.db")
	s, err := boltstore.Open(path, boltstore.Options{})
	if err != nil {
		return nil, fmt.Errorf("open embedded lease store %s: %w", path, err)
	}
	return s, nil
}

func newProcessProvider(cfg Config, log *slog.Logger) (providers.Provider, error) {
	bin, err := agentBinary(cfg.AgentBinary)
	if err != nil {
		return nil, err
	}
	p, err := process.New(process.Config{
		AgentBinary: bin,
		Dir:         filepath.Join(cfg.DataDir, "process"),
		GatewayID:   cfg.ManagerConfig.WithDefaults().GatewayID,
	}, log)
	if err != nil {
		return nil, fmt.Errorf("create process provider: %w", err)
	}
	return p, nil
}

// agentBinary finds the exec agent: QUARRY_AGENT_BINARY, else execagent next
// to this executable, else in PATH.
func agentBinary(configured string) (string, error) {
	if configured != "" {
		return configured, nil
	}
	if self, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(self), "execagent")
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
			return p, nil
		}
	}
	p, err := exec.LookPath("execagent")
	if err != nil {
		return "", errors.New("QUARRY_AGENT_BINARY: not set, and no execagent next to the gateway or in PATH (make build puts one in bin/)")
	}
	return p, nil
}

// managerAgentTransport is the transport of the manager's agent calls
// (health checks, inits, fences): it keeps at most 2 idle connections per
// agent and 256 in all, each for 10 s. An idle connection costs two
// goroutines and 8 KiB of buffers, and a file: kept per agent for 90 s (as
// before), 10,000 ready tasks, each checked every 30 s, held 10,000.
func managerAgentTransport() *http.Transport {
	return &http.Transport{MaxIdleConnsPerHost: 2, MaxIdleConns: 256, IdleConnTimeout: 10 * time.Second}
}

// maxAgentClients is the gateway's agent-client bound: QUARRY_MAX_AGENT_CLIENTS
// when set, else the default or, when larger, the pools' total max_total
// (every task that can exist), so that the bound drops no live sandbox's
// client.
func maxAgentClients(set int, pools []warmpool.PoolConfig) int {
	if set != 0 {
		return set
	}
	total := 0
	for _, p := range pools {
		total += p.MaxTotal
	}
	return max(gateway.DefaultMaxAgentClients, total)
}
