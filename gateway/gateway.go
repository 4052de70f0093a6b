package gateway

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/quarryhq/quarry/checkpoints"
	"github.com/quarryhq/quarry/e2bcompat"
	"github.com/quarryhq/quarry/envs"
	"github.com/quarryhq/quarry/gateway/ui"
	"github.com/quarryhq/quarry/internal/clock"
	"github.com/quarryhq/quarry/internal/parkconn"
	"github.com/quarryhq/quarry/modelservice"
	"github.com/quarryhq/quarry/rockcompat"
	"github.com/quarryhq/quarry/warmpool"
)

// Manager is what the gateway needs of the warm pool; *warmpool.Manager
// implements it. Implementations must be safe for concurrent use.
type Manager interface {
	// Acquire leases a sandbox from req.Pool. replayed is true when
	// req.IdempotencyKey was used before by the same owner (the earlier
	// lease is returned). Bad input is a *badinput.Error; a full
	// pool is warmpool.ErrNoCapacity.
	Acquire(ctx context.Context, req warmpool.AcquireRequest) (lease warmpool.Lease, replayed bool, err error)
	// Get returns the lease in any state; warmpool.ErrNotFound when unknown
	// or owned by another owner.
	Get(ctx context.Context, id, owner string) (warmpool.Lease, error)
	// Heartbeat extends an active lease; warmpool.ErrLeaseEnded once ended.
	Heartbeat(ctx context.Context, id, owner string) (warmpool.Lease, error)
	// Release ends the lease and stops its task; an already ended lease is
	// returned with warmpool.ErrLeaseEnded.
	Release(ctx context.Context, id, owner string) (warmpool.Lease, error)
	// List returns the leases matching f.
	List(ctx context.Context, f warmpool.LeaseFilter) ([]warmpool.Lease, error)
	// Pools returns every pool's configuration and counts.
	Pools(ctx context.Context) ([]warmpool.PoolStatus, error)
	// CheckTask asks the provider about the lease's task after its agent
	// did not answer; the lease comes back lost when the task is dead.
	CheckTask(ctx context.Context, lease warmpool.Lease) (warmpool.Lease, error)
}

// Layers is an optional Manager capability: copy-on-write layers of
// checkpoints (warmpool.Manager.PrepareLayer, DropLayer). Without it every
// checkpoint is restored by copy.
type Layers interface {
	PrepareLayer(ctx context.Context, req warmpool.LayerRequest) error
	DropLayer(ctx context.Context, key string) error
}

// Readier is an optional Manager capability: Ready reports whether the lease
// store answers. Without it /readyz calls Pools.
type Readier interface {
	Ready(ctx context.Context) error
}

// Deps are the gateway's dependencies.
type Deps struct {
	// Manager serves leases (required).
	Manager Manager
	// Logger receives request failures (nil: discard).
	Logger *slog.Logger
	// Metrics is the registry the gateway registers its metrics on and that
	// /metrics serves; the manager registers its own on the same one (nil:
	// a new private registry).
	Metrics *prometheus.Registry
	// Clock decides whether a lease has expired (nil: clock.System).
	Clock clock.Clock
	// Model is the model relay (docs/MODELSERVICE.md); nil: its routes
	// answer 404.
	Model *modelservice.Service
	// Envs is the env registry of the env API (docs/ENVS.md); nil: its
	// routes answer 404.
	Envs *envs.Registry
	// Checkpoints is the checkpoint store (checkpoints.go, docs/API.md
	// "Checkpoints"); nil: the checkpoint routes answer 404.
	Checkpoints checkpoints.Store
	// CheckpointConfig holds the checkpoints' retention and size limit
	// (zero fields: the defaults).
	CheckpointConfig checkpoints.Config
	// RockImages maps ROCK image names to pools for ROCK's routes
	// (docs/ROCK.md); nil: images map to pools by name or image.
	RockImages map[string]string
}

// Gateway is the REST API. Build it with New; serve it with Serve or
// ServeTLS (or hand App to an adapter); stop it with Shutdown. Safe for
// concurrent use.
type Gateway struct {
	cfg    Config
	mgr    Manager
	model  *modelservice.Service
	envs   *envs.Service // nil without Deps.Envs
	log    *slog.Logger
	clock  clock.Clock
	keys   keyring
	agents *agentClients
	// agentHTTP is the net/http transport to agents of the typed clients
	// (agentcall.go sandboxAgent.client): checkpoint streams and ROCK's
	// routes.
	agentHTTP *http.Client
	metrics   *metrics
	app       *fiber.App
	routes    map[string]bool // registered route templates (metrics labels)
	conns     *parkconn.Set   // connections accepted by Serve and ServeTLS

	parksMu sync.Mutex
	parks   []*parkconn.Listener // the listeners of Serve, ServeTLS and ServeRelay

	// draining is closed when Shutdown starts: relay calls and trainer
	// long-polls waiting on the broker end with 503 (model.go).
	draining  chan struct{}
	drainOnce sync.Once

	ws   *wsSockets          // relayed WebSockets (wsrelay.go)
	rock *rockcompat.Service // ROCK's routes (rock.go)
	e2b  *e2bcompat.Service  // E2B's control plane (e2b.go)
	ck   *ckService          // checkpoints (checkpoints.go, ckadapters.go)
	ui   *console            // the web console's files (console.go)

	preview *tokenSigner // preview URLs of sandbox ports and E2B access tokens (preview.go)
}

// New validates cfg, applies its defaults and builds the gateway's app. It
// fails on a bad Config, a nil Manager, or metrics already registered on
// deps.Metrics.
func New(cfg Config, deps Deps) (*Gateway, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("gateway config: %w", err)
	}
	if deps.Manager == nil {
		return nil, errors.New("gateway: Deps.Manager is required")
	}
	cfg = cfg.WithDefaults()
	g := &Gateway{
		cfg:    cfg,
		mgr:    deps.Manager,
		model:  deps.Model,
		log:    deps.Logger,
		clock:  deps.Clock,
		keys:   newKeyring(cfg.APIKeys),
		routes: make(map[string]bool),
		conns:  parkconn.NewSet(),

		draining: make(chan struct{}),
		preview:  newTokenSigner(cfg.PreviewSecret),
	}
	if g.log == nil {
		g.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	g.agents = newAgentClients(cfg, g.log)
	g.agentHTTP = newAgentHTTP(cfg)
	if g.clock == nil {
		g.clock = clock.System{}
	}
	reg := deps.Metrics
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	m, err := newMetrics(reg, g.agents)
	if err != nil {
		return nil, err
	}
	g.metrics = m
	g.ws = newWSSockets(cfg)
	for _, c := range g.ws.collectors() {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register gateway metrics: %w", err)
		}
	}
	if err := deps.CheckpointConfig.Validate(); err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	if g.ck, err = newCkService(g, deps.Checkpoints, deps.CheckpointConfig); err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	if g.rock, err = g.newRock(deps.RockImages); err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	if g.e2b, err = g.newE2B(); err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	if g.envs, err = newEnvService(g, deps.Envs); err != nil {
		return nil, err
	}
	if g.ui, err = newConsole(ui.Files()); err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}

	g.app = fiber.New(fiber.Config{
		AppName:                      "quarry-gateway",
		DisableStartupMessage:        true,
		StreamRequestBody:            true,
		DisablePreParseMultipartForm: true,
		BodyLimit:                    int(cfg.MaxUploadBody),
		ReadTimeout:                  cfg.ReadTimeout,
		IdleTimeout:                  cfg.IdleTimeout,
		ReadBufferSize:               16 << 10,
		ErrorHandler:                 g.errorHandler,
	})
	srv := g.app.Server()
	srv.HeaderReceived = g.headerReceived
	srv.ConnState = parkconn.ConnState
	srv.CloseOnShutdown = true
	g.register()
	if err := g.registerNotMatched(); err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	return g, nil
}

// App returns the fiber app, for adapters (tests, Lambda) that serve it
// without a listener.
func (g *Gateway) App() *fiber.App { return g.app }

// Serve serves plain HTTP on ln until Shutdown. Every connection's reads and
// writes are bounded by the idle timeout; between requests it is parked
// (parkconn.Listener).
func (g *Gateway) Serve(ln net.Listener) error {
	if err := g.app.Listener(g.park(g.listener(ln))); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}

// ServeRelay serves the model relay's sandbox routes
// (/v1/sandboxes/{id}/model/v1/..., authenticated by relay tokens) on ln,
// a Unix socket that providers mount into sandboxes whose network does not
// reach the gateway (docker.Config.RelayDir); the sandboxes' agents forward
// their relay calls to it. Every other path answers 404 there. It returns
// when Shutdown stops the app.
func (g *Gateway) ServeRelay(ln net.Listener) error {
	if err := g.app.Listener(g.park(g.listener(relayListener{ln}))); err != nil {
		return fmt.Errorf("serve relay socket: %w", err)
	}
	return nil
}

// ServeTLS serves HTTPS on ln with the certificate and key in the given PEM
// files until Shutdown.
func (g *Gateway) ServeTLS(ln net.Listener, certFile, keyFile string) error {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return fmt.Errorf("load TLS certificate: %w", err)
	}
	tc := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if err := g.app.Listener(g.park(tls.NewListener(g.listener(ln), tc))); err != nil {
		return fmt.Errorf("serve TLS: %w", err)
	}
	return nil
}

// listener wraps ln so that every connection's waits are bounded and
// Shutdown can find connections that never sent a request.
func (g *Gateway) listener(ln net.Listener) net.Listener {
	return parkconn.NewIdleListener(ln, g.cfg.IdleTimeout, g.conns)
}

// park wraps ln in a parkconn.Listener over the app's server, which
// Shutdown waits for.
// connLinger is how long a client connection waits for its next request,
// after an answer, on the goroutine that served it before it parks
// (parkconn.Config.Linger). Requests sent back to back, as a trainer's
// steps are, then cost no park and no goroutine start each: 12-15% of the
// gateway's CPU per proxied session run in quarrybench (docs/BENCHMARKS.md).
// A connection keeps the server's buffers for at most this long after an
// answer.
const connLinger = 10 * time.Millisecond

func (g *Gateway) park(ln net.Listener) *parkconn.Listener {
	pl := parkconn.NewListener(ln, g.app.Server().ServeConn, parkconn.Config{
		WaitFirst: g.cfg.ReadTimeout, WaitNext: g.cfg.IdleTimeout, Retried: g.acceptRetried,
		Linger: connLinger,
	})
	g.parksMu.Lock()
	g.parks = append(g.parks, pl)
	g.parksMu.Unlock()
	return pl
}

// acceptRetried counts (and logs, at most once a minute) an accept that
// failed for want of file descriptors and is retried.
func (g *Gateway) acceptRetried(err error) {
	g.metrics.acceptRetries.Inc()
	if g.metrics.acceptLog.allow(time.Now()) {
		g.log.Warn("accept: out of file descriptors, retrying; raise the open files limit (RLIMIT_NOFILE, ulimit -n)", "err", err)
	}
}

// unservedAge is how old a connection that never sent a request must be for
// Shutdown to close it.
const unservedAge = 500 * time.Millisecond

// Shutdown stops accepting connections and waits, until ctx is done, for
// requests in flight to finish (streams included); connections that never
// sent a request, and those waiting for their next one, are closed. Relay calls waiting for a trainer and trainer
// long-polls end at once with 503 "the gateway is shutting down; retry"
// (their requests stay in the broker). Then it closes idle agent
// connections. It never touches leases or sandboxes.
func (g *Gateway) Shutdown(ctx context.Context) error {
	g.drainOnce.Do(func() { close(g.draining) })
	wsErr := g.ws.closeAll(ctx) // hijacked connections: the server does not track them
	done := make(chan error, 1)
	go func() { done <- g.app.ShutdownWithContext(ctx) }()
	tick := time.NewTicker(unservedAge / 5)
	defer tick.Stop()
	var err error
	for waiting := true; waiting; {
		select {
		case err = <-done:
			waiting = false
		case <-tick.C:
			g.conns.CloseUnserved(unservedAge)
		}
	}
	g.parksMu.Lock()
	parks := g.parks
	g.parksMu.Unlock()
	for _, pl := range parks {
		_ = pl.Close() // the server closed it already, unless it timed out
		if werr := pl.Wait(ctx); werr != nil && err == nil {
			err = werr
		}
	}
	g.agents.closeIdle()
	g.agentHTTP.CloseIdleConnections()
	if err == nil {
		err = wsErr
	}
	if err != nil {
		return fmt.Errorf("shut down gateway: %w", err)
	}
	return nil
}

// route is one route of the API: the lease routes and operations have a
// handler; sandbox calls are proxied to the agent by kind.
type route struct {
	method string
	path   string
	// cred is the credential its caller presents, checked before the
	// handler (credentials.go); every route names one.
	cred    credential
	handler fiber.Handler
	proxy   proxyKind
}

// routeTable lists every route. openapi.json documents exactly these
// (TestOpenAPI_MatchesRoutes).
func (g *Gateway) routeTable() []route {
	const sbx = "/v1/sandboxes/:id"
	return append([]route{
		{method: fiber.MethodGet, path: "/healthz", cred: credNone, handler: g.healthz},
		{method: fiber.MethodGet, path: "/readyz", cred: credNone, handler: g.readyz},
		{method: fiber.MethodGet, path: "/openapi.json", cred: credNone, handler: serveOpenAPI},
		{method: fiber.MethodGet, path: "/metrics", cred: credAPIKey, handler: g.metrics.handler},

		// The web console's static files (console.go, docs/CONSOLE.md): the
		// page sends the API key on every call it makes.
		{method: fiber.MethodGet, path: "/ui", cred: credNone, handler: g.serveConsole},
		{method: fiber.MethodGet, path: "/ui/:file", cred: credNone, handler: g.serveConsole},
		{method: fiber.MethodGet, path: "/ui/vendor/:pkg/:file", cred: credNone, handler: g.serveConsole},

		{method: fiber.MethodPost, path: "/v1/sandboxes", cred: credAPIKey, handler: g.createSandbox},
		{method: fiber.MethodGet, path: "/v1/sandboxes", cred: credAPIKey, handler: g.listSandboxes},
		{method: fiber.MethodGet, path: sbx, cred: credAPIKey, handler: g.getSandbox},
		{method: fiber.MethodDelete, path: sbx, cred: credAPIKey, handler: g.releaseSandbox},
		{method: fiber.MethodPost, path: sbx + "/heartbeat", cred: credAPIKey, handler: g.heartbeatSandbox},
		{method: fiber.MethodGet, path: "/v1/pools", cred: credAPIKey, handler: g.listPools},
		{method: fiber.MethodGet, path: "/v1/whoami", cred: credAPIKey, handler: g.whoami},

		// Images on demand (images.go).
		{method: fiber.MethodPost, path: "/v1/images/prefetch", cred: credAPIKey, handler: g.prefetchImages},
		{method: fiber.MethodGet, path: "/v1/images", cred: credAPIKey, handler: g.listImages},
		{method: fiber.MethodPost, path: "/v1/images/build", cred: credAPIKey, handler: g.buildImage},

		{method: fiber.MethodPost, path: sbx + "/exec", cred: credAPIKey, proxy: kindCommand},
		{method: fiber.MethodPost, path: sbx + "/sessions", cred: credAPIKey, proxy: kindJSON},
		{method: fiber.MethodGet, path: sbx + "/sessions", cred: credAPIKey, proxy: kindJSON},
		{method: fiber.MethodDelete, path: sbx + "/sessions/:sid", cred: credAPIKey, proxy: kindJSON},
		{method: fiber.MethodPost, path: sbx + "/sessions/:sid/run", cred: credAPIKey, proxy: kindCommand},
		{method: fiber.MethodPost, path: sbx + "/processes", cred: credAPIKey, proxy: kindJSON},
		{method: fiber.MethodGet, path: sbx + "/processes", cred: credAPIKey, proxy: kindJSON},
		{method: fiber.MethodGet, path: sbx + "/processes/:pid", cred: credAPIKey, proxy: kindJSON},
		{method: fiber.MethodDelete, path: sbx + "/processes/:pid", cred: credAPIKey, proxy: kindJSON},
		{method: fiber.MethodGet, path: sbx + "/processes/:pid/output", cred: credAPIKey, proxy: kindOutput},
		{method: fiber.MethodPost, path: sbx + "/processes/:pid/signal", cred: credAPIKey, proxy: kindJSON},
		{method: fiber.MethodPost, path: sbx + "/processes/:pid/stdin", cred: credAPIKey, proxy: kindUpload},
		{method: fiber.MethodPost, path: sbx + "/processes/:pid/call", cred: credAPIKey, proxy: kindCommand},
		{method: fiber.MethodGet, path: sbx + "/files", cred: credAPIKey, proxy: kindDownload},
		{method: fiber.MethodPut, path: sbx + "/files", cred: credAPIKey, proxy: kindUpload},
		{method: fiber.MethodDelete, path: sbx + "/files", cred: credAPIKey, proxy: kindJSON},
		{method: fiber.MethodGet, path: sbx + "/files/stat", cred: credAPIKey, proxy: kindJSON},
		{method: fiber.MethodGet, path: sbx + "/files/list", cred: credAPIKey, proxy: kindJSON},
		{method: fiber.MethodGet, path: sbx + "/files/archive", cred: credAPIKey, proxy: kindDownload},
		{method: fiber.MethodPut, path: sbx + "/files/archive", cred: credAPIKey, proxy: kindUpload},
		{method: fiber.MethodPost, path: sbx + "/kill-all", cred: credAPIKey, proxy: kindJSON},

		// Terminals (pty.go, wsrelay.go): the WebSocket, and the REST fallback.
		{method: fiber.MethodGet, path: sbx + "/pty", cred: credAPIKeyOrWS, handler: g.ptyWebSocket},
		{method: fiber.MethodPost, path: sbx + "/ptys", cred: credAPIKey, proxy: kindJSON},
		{method: fiber.MethodGet, path: sbx + "/ptys", cred: credAPIKey, proxy: kindJSON},
		{method: fiber.MethodGet, path: sbx + "/ptys/:pid", cred: credAPIKey, proxy: kindJSON},
		{method: fiber.MethodDelete, path: sbx + "/ptys/:pid", cred: credAPIKey, proxy: kindJSON},
		{method: fiber.MethodPost, path: sbx + "/ptys/:pid/resize", cred: credAPIKey, proxy: kindJSON},

		// Checkpoints (checkpoints.go).
		{method: fiber.MethodPost, path: sbx + "/checkpoints", cred: credAPIKey, handler: g.createCheckpoint},
		{method: fiber.MethodPost, path: sbx + "/restore", cred: credAPIKey, handler: g.restoreSandbox},
		{method: fiber.MethodPost, path: sbx + "/fork", cred: credAPIKey, handler: g.forkSandbox},
		{method: fiber.MethodGet, path: "/v1/checkpoints", cred: credAPIKey, handler: g.listCheckpoints},
		{method: fiber.MethodGet, path: "/v1/checkpoints/:id", cred: credAPIKey, handler: g.getCheckpoint},
		{method: fiber.MethodDelete, path: "/v1/checkpoints/:id", cred: credAPIKey, handler: g.deleteCheckpoint},

		// The model relay: the sandbox side authenticates with the lease's
		// relay token (model.go), the trainer side with an API key.
		{method: fiber.MethodPost, path: sbx + "/model/v1/chat/completions", cred: credRelayToken, handler: g.modelCall("chat/completions")},
		{method: fiber.MethodPost, path: sbx + "/model/v1/completions", cred: credRelayToken, handler: g.modelCall("completions")},
		{method: fiber.MethodGet, path: sbx + "/model/v1/models", cred: credRelayToken, handler: g.modelModels},
		{method: fiber.MethodGet, path: sbx + "/model/transcript", cred: credAPIKey, handler: g.modelTranscript},
		{method: fiber.MethodGet, path: "/v1/model/requests", cred: credAPIKey, handler: g.claimModelRequests},
		{method: fiber.MethodPost, path: "/v1/model/requests/:rid/response", cred: credAPIKey, handler: g.answerModelRequest},

		// The env API (envs.go, docs/ENVS.md).
		{method: fiber.MethodGet, path: "/v1/envs", cred: credAPIKey, handler: g.listEnvs},
		{method: fiber.MethodPost, path: "/v1/envs", cred: credAPIKey, handler: g.makeEnv},
		{method: fiber.MethodPost, path: sbx + "/env/reset", cred: credAPIKey, handler: g.resetEnv},
		{method: fiber.MethodPost, path: sbx + "/env/step", cred: credAPIKey, handler: g.stepEnv},
		{method: fiber.MethodPost, path: sbx + "/env/close", cred: credAPIKey, handler: g.closeEnv},
	}, g.portRoutes()...) // ports and preview URLs (ports.go)
}

func (g *Gateway) register() {
	g.app.Use(g.observe)
	g.app.Use(g.routeSandbox) // E2B's data plane, before any route (e2broute.go)
	for _, rt := range g.allRoutes() {
		if rt.handler == nil {
			rt.handler = g.proxyHandler(newProxyRoute(rt.path, rt.proxy))
		}
		g.add(rt)
	}
}

// allRoutes is every route the app registers: Quarry's, ROCK's and E2B's.
func (g *Gateway) allRoutes() []route {
	return append(append(g.routeTable(), g.rockRoutes()...), g.e2bRoutes()...)
}

// add registers rt behind its credential's check.
func (g *Gateway) add(rt route) {
	if check := g.admit(rt.cred); check != nil {
		g.app.Add(rt.method, rt.path, check, rt.handler)
	} else {
		g.app.Add(rt.method, rt.path, rt.handler)
	}
	g.routes[rt.path] = true
}

// observe wraps every request: it maps a handler's error to its answer,
// finishes the request body, and records the request's metrics (for
// streams, up to the start of the answer).
func (g *Gateway) observe(c *fiber.Ctx) error {
	start := time.Now()
	parkconn.RequestStarted(c.Context()) // served; its large bodies are dropped when it ends
	if err := g.onlyRelay(c); err != nil {
		g.writeError(c, err)
	} else if g.refuseDeclaredBody(c) {
		// answered: 413
	} else if err := c.Next(); err != nil {
		g.writeError(c, err)
	}
	finishBody(c)
	path := c.Route().Path
	if p, _ := c.Locals(metricsPathLocal).(string); p != "" {
		path = p
	} else if !g.routes[path] {
		path = "unmatched"
	}
	g.metrics.observe(path, c.Request().Header.Method(), c.Response().StatusCode(), time.Since(start))
	return nil
}

// metricsPathLocal is the fiber Locals key of the metrics label of a
// request that no route serves (E2B's data plane: e2broute.go).
const metricsPathLocal = "quarry.metricsPath"

// headerReceived picks, from a request's headers, how long its body may take
// and how much the server reads ahead: uploads get the upload limits. A
// declared Content-Length over the limit is refused before a byte of the
// body is read (refuseDeclaredBody).
func (g *Gateway) headerReceived(h *fasthttp.RequestHeader) fasthttp.RequestConfig {
	rc := fasthttp.RequestConfig{MaxRequestBodySize: int(g.cfg.MaxJSONBody)}
	if isUpload(h.Method(), h.RequestURI()) || isPortPath(h.RequestURI()) || isSandboxRouted(h) {
		rc = fasthttp.RequestConfig{ReadTimeout: g.cfg.UploadTimeout, MaxRequestBodySize: int(g.cfg.MaxUploadBody)}
	}
	markDeclaredBody(h, rc.MaxRequestBodySize)
	return rc
}

// isUpload reports whether method and uri address an upload route:
// PUT /v1/sandboxes/{id}/files[/archive] or POST .../processes/{pid}/stdin.
// It runs for every request, so it does not allocate.
func isUpload(method, uri []byte) bool {
	m := string(method)
	if m != fiber.MethodPut && m != fiber.MethodPost {
		return false
	}
	if i := bytes.IndexByte(uri, '?'); i >= 0 {
		uri = uri[:i]
	}
	if bytes.Equal(uri, rockUploadPath) {
		return m == fiber.MethodPost
	}
	rest, ok := bytes.CutPrefix(uri, []byte("/v1/sandboxes/"))
	i := bytes.IndexByte(rest, '/')
	if !ok || i <= 0 {
		return false
	}
	rest = rest[i:] // after the sandbox id
	if m == fiber.MethodPut {
		return string(rest) == "/files" || string(rest) == "/files/archive"
	}
	pid, ok := bytes.CutPrefix(rest, []byte("/processes/"))
	j := bytes.IndexByte(pid, '/')
	return ok && j > 0 && string(pid[j:]) == "/stdin"
}

// healthz answers 200 while the process serves requests.
func (g *Gateway) healthz(c *fiber.Ctx) error {
	return c.JSON(fiber.Map{"status": "ok"})
}

// readyz answers 200 when the lease store answers, 503 otherwise.
func (g *Gateway) readyz(c *fiber.Ctx) error {
	ctx, cancel := context.WithTimeout(c.UserContext(), g.cfg.ManagerTimeout)
	defer cancel()
	var err error
	if r, ok := g.mgr.(Readier); ok {
		err = r.Ready(ctx)
	} else {
		_, err = g.mgr.Pools(ctx)
	}
	if err != nil {
		return fmt.Errorf("check lease store: %w", errors.Join(warmpool.ErrUnavailable, err))
	}
	return c.JSON(fiber.Map{"status": "ok"})
}
