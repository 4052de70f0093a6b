package docker

import (
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/docker/docker/api/types"
	"github.com/docker/docker/api/types/build"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/events"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/api/types/network"
	"github.com/docker/docker/api/types/volume"
	"github.com/docker/docker/client"
	"github.com/docker/docker/pkg/stdcopy"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sync/errgroup"

	"github.com/quarryhq/quarry/providers"
)

var (
	_ providers.Provider     = (*Provider)(nil)
	_ providers.Closer       = (*Provider)(nil)
	_ providers.SandboxRelay = (*Provider)(nil)
	_ providers.Watcher      = (*Provider)(nil)
)

const (
	// connectTimeout bounds the first contact with the engine in New.
	connectTimeout = 10 * time.Second
	// cleanupTimeout bounds the removal of a container whose launch failed;
	// it runs even when the caller's ctx is done.
	cleanupTimeout = 30 * time.Second
	// logTailLines and logTailBytes bound the log a launch error quotes.
	logTailLines = "20"
	logTailBytes = 2 << 10
	// reasonLogLines is how much of a stopped container's log Describe
	// reads for its Reason (providers.AgentLogTail): enough to see past a
	// Go crash's stack dump to what the runtime said before it.
	reasonLogLines = "400"
)

// shells are the paths of which an image must have one: the agent runs
// command strings and sessions with bash when present, else /bin/sh.
func shells() []string { return []string{"/bin/sh", "/bin/bash", "/usr/bin/bash"} }

// dockerAPI is the part of the Docker client the provider uses.
type dockerAPI interface {
	Ping(ctx context.Context) (types.Ping, error)
	ImageInspect(ctx context.Context, image string, opts ...client.ImageInspectOption) (image.InspectResponse, error)
	ContainerCreate(ctx context.Context, config *container.Config, hostConfig *container.HostConfig,
		networkingConfig *network.NetworkingConfig, platform *ocispec.Platform, name string) (container.CreateResponse, error)
	ContainerStatPath(ctx context.Context, id, path string) (container.PathStat, error)
	ContainerAttach(ctx context.Context, id string, options container.AttachOptions) (types.HijackedResponse, error)
	ContainerStart(ctx context.Context, id string, options container.StartOptions) error
	ContainerWait(ctx context.Context, id string, condition container.WaitCondition) (<-chan container.WaitResponse, <-chan error)
	ContainerInspect(ctx context.Context, id string) (container.InspectResponse, error)
	ContainerList(ctx context.Context, options container.ListOptions) ([]container.Summary, error)
	ContainerLogs(ctx context.Context, id string, options container.LogsOptions) (io.ReadCloser, error)
	ContainerRemove(ctx context.Context, id string, options container.RemoveOptions) error
	ContainerPause(ctx context.Context, id string) error
	ContainerUnpause(ctx context.Context, id string) error
	ImagePull(ctx context.Context, ref string, options image.PullOptions) (io.ReadCloser, error)
	ImageRemove(ctx context.Context, image string, options image.RemoveOptions) ([]image.DeleteResponse, error)
	ImageBuild(ctx context.Context, buildContext io.Reader, options build.ImageBuildOptions) (build.ImageBuildResponse, error)
	Events(ctx context.Context, options events.ListOptions) (<-chan events.Message, <-chan error)
	CopyToContainer(ctx context.Context, id, dstPath string, content io.Reader, options container.CopyToContainerOptions) error
	VolumeCreate(ctx context.Context, options volume.CreateOptions) (volume.Volume, error)
	VolumeInspect(ctx context.Context, id string) (volume.Volume, error)
	VolumeList(ctx context.Context, options volume.ListOptions) (volume.ListResponse, error)
	VolumeRemove(ctx context.Context, id string, force bool) error
	Close() error
}

// Provider runs sandbox tasks as Docker containers. It is safe for
// concurrent use, and several Providers (in one or several gateways) with the
// same GatewayID and token key share their containers: every method reads
// the state from the engine.
type Provider struct {
	cfg    Config
	api    dockerAPI
	key    tokenKey
	logger *slog.Logger
	img    *imageCache // images on demand (images.go)
	layers *layers     // copy-on-write layers (layers.go)
	once   sync.Once
	closed atomic.Bool
}

// SandboxRelayURL is where the sandboxes of spec reach the gateway's model
// relay: their agent's forwarder at 127.0.0.1 inside the container when
// they get the relay socket (Config.RelayDir, not on the host's network),
// else "" (the gateway's own address). An invalid spec gets "": its
// launches fail anyway.
func (p *Provider) SandboxRelayURL(spec providers.Spec) string {
	set, err := resolve(p.cfg, spec)
	if err != nil || !relaySocket(p.cfg, set) {
		return ""
	}
	return fmt.Sprintf("http://127.0.0.1:%d", agentPort)
}

// New returns a Provider for cfg after applying defaults and validating it.
// It checks that cfg.AgentBinary is a static executable, loads (or creates)
// the token key, and connects to the engine, negotiating the API version
// (an engine of API 1.24 or later, e.g. Docker 20.10, works); an engine that
// does not answer within 10 s is an error naming cfg.Host. Afterwards the
// client reconnects by itself: a restarted engine needs no new Provider.
// logger may be nil (logs are discarded).
func New(cfg Config, logger *slog.Logger) (*Provider, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := checkAgentBinary(cfg.AgentBinary); err != nil {
		return nil, fmt.Errorf("docker provider config: AgentBinary: %w", err)
	}
	key, err := loadOrCreateKey(cfg.TokenKeyFile)
	if err != nil {
		return nil, fmt.Errorf("docker provider config: TokenKeyFile: %w", err)
	}
	cli, err := client.NewClientWithOpts(client.WithHost(cfg.Host), client.WithAPIVersionNegotiation())
	if err != nil {
		return nil, fmt.Errorf("docker provider config: Host: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), connectTimeout)
	defer cancel()
	ping, err := cli.Ping(ctx)
	if err != nil {
		_ = cli.Close()
		return nil, fmt.Errorf("docker provider: no Docker engine answers at %s (Host): %w", cfg.Host, err)
	}
	cli.NegotiateAPIVersionPing(ping)
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	img, err := newImageCache(cfg, cli, logger)
	if err != nil {
		_ = cli.Close()
		return nil, err
	}
	logger.Info("connected to the Docker engine", "host", cfg.Host, "api_version", cli.ClientVersion())
	p := &Provider{cfg: cfg, api: cli, key: key, logger: logger, img: img, layers: newLayers()}
	if err := p.sweepLayers(ctx); err != nil {
		logger.Warn("copy-on-write layers of an earlier process are not swept; their checkpoints' deletion still removes them", "err", err)
	}
	return p, nil
}

// checkAgentBinary checks that path is an executable static ELF file: a
// dynamically linked agent would not start in an image without its libc.
func checkAgentBinary(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
		return fmt.Errorf("%s is not an executable file", path)
	}
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("%s is not an ELF executable: %w", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked; build the agent with CGO_ENABLED=0", path)
		}
	}
	return nil
}

// Close stops the pulls in flight (their callers get an error), writes the
// image ledger and releases the client's idle connections. Containers keep
// running (leases outlive a gateway process); a new Provider finds them.
// After Close, Launch fails; Describe, Stop and List still work.
// Idempotent.
func (p *Provider) Close(context.Context) error {
	var err error
	p.once.Do(func() {
		p.closed.Store(true)
		p.closeLayers()
		err = errors.Join(p.img.close(), p.api.Close())
	})
	if err != nil {
		return fmt.Errorf("close docker provider: %w", err)
	}
	return nil
}

// Launch creates and starts one container per name, at most
// Config.LaunchConcurrency at a time, and returns those that run, in the
// order of names, with their agent URL (a port published on 127.0.0.1, or
// the host port in host-network mode). It returns as soon as a container
// runs: the agent may need a moment more to answer /healthz.
//
// The image of a configured pool (spec.Class "") must be on the engine
// (such a launch never pulls) and is pinned: the image budget never
// removes it. The image of an on-demand pool (spec.Class set) is prepared
// first (PrepareImage: one inspection, or a pull shared with every caller
// of the image), its last use recorded, and its containers labelled
// providers.LabelClass; StartTimeout begins after the pull.
//
// A spec this provider cannot serve fails with a *providers.LaunchError
// wrapping providers.ErrInvalidSpec before any container is created: a bad
// option, reserved env names or labels, invalid or repeated names, a
// configured pool's image the engine does not have, an on-demand pool's
// image that cannot be pulled (the LaunchError wraps the
// *providers.ImageError, which says why). So does an image without a
// shell, found on each created container (which is removed).
// A name whose container exists already is returned when that container is
// this gateway's task of the same pool and runs (a retried launch);
// otherwise it fails. When some names fail, the others are returned with an
// error joining the failures; the failed containers are removed.
func (p *Provider) Launch(ctx context.Context, spec providers.Spec, names []string) ([]providers.Task, error) {
	if p.closed.Load() {
		return nil, errors.New("launch tasks: provider closed")
	}
	set, err := resolve(p.cfg, spec)
	if err != nil {
		return nil, err
	}
	if err := providers.CheckNames(spec, names, validateName); err != nil {
		return nil, err
	}
	if len(names) == 0 {
		return nil, nil
	}
	release, err := p.readyImage(ctx, spec)
	if err != nil {
		return nil, err
	}
	defer release()

	tasks := make([]*providers.Task, len(names))
	errs := make([]error, len(names))
	var g errgroup.Group
	g.SetLimit(p.cfg.LaunchConcurrency)
	for i, name := range names {
		g.Go(func() error {
			tasks[i], errs[i] = p.launchOne(ctx, spec, set, name)
			return nil
		})
	}
	_ = g.Wait() // launchOne reports through errs

	out := make([]providers.Task, 0, len(names))
	for i := range names {
		if errs[i] == nil {
			out = append(out, *tasks[i])
		}
	}
	if len(out) < len(names) {
		// errors.As still finds a LaunchError (an image without a shell) in the join.
		return out, fmt.Errorf("launch %d of %d tasks: %w", len(names)-len(out), len(names), errors.Join(errs...))
	}
	return out, nil
}

// readyImage makes sure the engine has spec's image before a launch: a
// configured pool's is pinned and inspected (checkImage), an on-demand
// pool's marked needed until release, prepared and its use recorded.
func (p *Provider) readyImage(ctx context.Context, spec providers.Spec) (release func(), err error) {
	ref, perr := parseRef(spec.Image)
	if spec.Class == "" {
		if perr == nil {
			p.img.pin(ref)
		}
		return func() {}, p.checkImage(ctx, spec)
	}
	if perr != nil {
		return nil, imageLaunchError(spec, perr)
	}
	release = p.img.use(ref)
	if _, err := p.img.prepare(ctx, spec); err != nil {
		release()
		return nil, imageLaunchError(spec, err)
	}
	p.img.ledger.touch(ref.name, time.Now())
	return release, nil
}

// imageLaunchError is the LaunchError of an image that could not be
// prepared (wrapping its *providers.ImageError), else err as it is.
func imageLaunchError(spec providers.Spec, err error) error {
	var ie *providers.ImageError
	if !errors.As(err, &ie) {
		return fmt.Errorf("launch tasks: %w", err)
	}
	return &providers.LaunchError{Pool: spec.Pool, Image: spec.Image, Reason: ie.Error(), Err: ie}
}

// checkImage fails with a LaunchError when the engine does not have the
// spec's image.
func (p *Provider) checkImage(ctx context.Context, spec providers.Spec) error {
	_, err := p.api.ImageInspect(ctx, spec.Image)
	switch {
	case err == nil:
		return nil
	case isNotFound(err):
		return providers.InvalidSpec(spec, fmt.Sprintf("image %q is not on the Docker engine: build, pull or load it first (the provider never pulls)", spec.Image))
	}
	return fmt.Errorf("launch tasks: inspect image %q: %w", spec.Image, err)
}

// launchOne creates, prepares and starts the container of one task. On
// failure it removes the container.
func (p *Provider) launchOne(ctx context.Context, spec providers.Spec, set settings, name string) (_ *providers.Task, err error) {
	start := time.Now()
	defer func() {
		var lerr *providers.LaunchError
		if err != nil && !errors.As(err, &lerr) {
			err = fmt.Errorf("launch task %q: %w", name, err)
		}
	}()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, p.cfg.StartTimeout)
	defer cancel()

	nonce, err := newNonce()
	if err != nil {
		return nil, err
	}
	plan := launchPlan{name: name, nonce: nonce, created: time.Now()}
	if set.hostNetwork() {
		if plan.hostPort, err = freePort(); err != nil {
			return nil, err
		}
	}
	if set.layer != "" {
		defer p.layers.hold(set.layer)()
		if plan.overlay, err = p.makeOverlay(ctx, set, name); err != nil {
			p.cleanTaskVolumes(ctx, name, set.layer)
			return nil, err
		}
	}
	cc, hc := buildContainer(p.cfg, spec, set, plan)
	// The engine completes a create whose client gave up on it, and a
	// container nobody knows the id of outlives its gateway (a test's, say).
	// So the create is never abandoned halfway: it gets its answer (within
	// StartTimeout) even when ctx ends, and the container of a launch ctx
	// ended is removed below like any failed launch's.
	cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), p.cfg.StartTimeout)
	created, err := p.api.ContainerCreate(cctx, cc, hc, nil, nil, name)
	ccancel()
	if err != nil {
		if isConflict(err) {
			return p.adopt(ctx, spec, name)
		}
		p.cleanTaskVolumes(ctx, name, set.layer)
		if isNotFound(err) || isInvalid(err) {
			return nil, providers.InvalidSpec(spec, "create container: "+err.Error())
		}
		return nil, fmt.Errorf("create container: %w", err)
	}
	id := created.ID
	defer func() {
		if err == nil {
			return
		}
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		if rerr := p.remove(cctx, id); rerr != nil {
			err = errors.Join(err, fmt.Errorf("clean up: %w", rerr))
		}
		p.cleanTaskVolumes(cctx, name, set.layer)
	}()
	if err := ctx.Err(); err != nil {
		return nil, err
	}

	if err := p.checkShell(ctx, spec, id); err != nil {
		return nil, err
	}
	if err := p.startWithToken(ctx, id, p.key.token(p.cfg.GatewayID, name, nonce)); err != nil {
		return nil, err
	}
	info, err := p.api.ContainerInspect(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("inspect started container: %w", err)
	}
	t := p.toTask(fromInspect(info))
	switch {
	case t.State == providers.TaskStopped:
		return nil, fmt.Errorf("the container stopped at start (%s); its log: %q", t.Reason, p.logTail(ctx, id))
	case t.AgentURL == "":
		return nil, errors.New("the engine reports no published port for the agent")
	}
	p.logger.Info("task launched", "task", name, "pool", spec.Pool, "container", shortID(id),
		"agent_url", t.AgentURL, "took", time.Since(start).Round(time.Millisecond))
	return &t, nil
}

// startWithToken attaches to the container's stdin, starts it and writes
// the agent's token there, then closes stdin (StdinOnce): the agent reads
// its token to EOF from stdin. The token is never in the container's
// environment, labels or files.
func (p *Provider) startWithToken(ctx context.Context, id, token string) error {
	hj, err := p.api.ContainerAttach(ctx, id, container.AttachOptions{Stream: true, Stdin: true})
	if err != nil {
		return fmt.Errorf("attach to the container's stdin: %w", err)
	}
	defer hj.Close()
	if err := p.api.ContainerStart(ctx, id, container.StartOptions{}); err != nil {
		return fmt.Errorf("start container: %w", err)
	}
	if d, ok := ctx.Deadline(); ok {
		_ = hj.Conn.SetWriteDeadline(d)
	}
	if _, err := io.WriteString(hj.Conn, token+"\n"); err != nil {
		return fmt.Errorf("send the agent its token: %w", err)
	}
	if err := hj.CloseWrite(); err != nil {
		return fmt.Errorf("send the agent its token: close stdin: %w", err)
	}
	return nil
}

// adopt returns the running container of a name that exists already, when
// it is this gateway's task of the same pool (a launch retried after an
// answer was lost).
func (p *Provider) adopt(ctx context.Context, spec providers.Spec, name string) (*providers.Task, error) {
	info, err := p.api.ContainerInspect(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("container name %q is in use: inspect it: %w", name, err)
	}
	v := fromInspect(info)
	t := p.toTask(v)
	if !p.ours(v.labels) || t.Pool != spec.Pool || t.Name != name || t.State != providers.TaskRunning || t.AgentURL == "" {
		return nil, fmt.Errorf("container name %q is in use by another container (%s)", name, shortID(info.ID))
	}
	p.logger.Info("task found running under its name; launch not repeated", "task", name, "container", shortID(info.ID))
	return &t, nil
}

// checkShell fails with a LaunchError naming the image when the created
// container has none of shells().
func (p *Provider) checkShell(ctx context.Context, spec providers.Spec, id string) error {
	for _, sh := range shells() {
		_, err := p.api.ContainerStatPath(ctx, id, sh)
		if err == nil {
			return nil
		}
		if !isNotFound(err) {
			return fmt.Errorf("look for a shell in the image: %w", err)
		}
	}
	return providers.InvalidSpec(spec, fmt.Sprintf("image %q has no shell: the exec agent runs commands with bash or /bin/sh, and the image has neither %s",
		spec.Image, strings.Join(shells(), ", ")))
}

// logTail returns the end of a container's log, bounded, or a note why it
// could not be read.
func (p *Provider) logTail(ctx context.Context, id string) string {
	log, err := p.logLines(ctx, id, logTailLines)
	if err != nil {
		return "unavailable: " + err.Error()
	}
	b := strings.TrimSpace(log)
	if len(b) > logTailBytes {
		b = b[len(b)-logTailBytes:]
	}
	return b
}

// logLines returns the last lines of a container's log (at most 64 KiB).
func (p *Provider) logLines(ctx context.Context, id, lines string) (string, error) {
	rc, err := p.api.ContainerLogs(ctx, id, container.LogsOptions{ShowStdout: true, ShowStderr: true, Tail: lines})
	if err != nil {
		return "", err
	}
	defer rc.Close()
	var buf bytes.Buffer
	_, _ = stdcopy.StdCopy(&buf, &buf, io.LimitReader(rc, 64<<10))
	return buf.String(), nil
}

// freePort returns a port on 127.0.0.1 that was free a moment ago, for an
// agent on the host's network. Another process may take it before the agent
// binds it: the agent then exits and the launch is retried by the pool.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pick a port for the agent: %w", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	if err := l.Close(); err != nil {
		return 0, fmt.Errorf("pick a port for the agent: %w", err)
	}
	return port, nil
}

// Describe returns one task per id, in order, from one container list of
// the engine (stopped containers are also inspected, for their exit code).
// Ids of no container of this gateway come back stopped with Reason "not
// found".
func (p *Provider) Describe(ctx context.Context, ids []string) ([]providers.Task, error) {
	out := make([]providers.Task, len(ids))
	f := p.filter("")
	n := 0
	for _, id := range ids {
		if isContainerID(id) {
			f.Add("id", id)
			n++
		}
	}
	byID := map[string]container.Summary{}
	if n > 0 {
		list, err := p.api.ContainerList(ctx, container.ListOptions{All: true, Filters: f})
		if err != nil {
			return nil, fmt.Errorf("describe tasks: %w", err)
		}
		for _, s := range list {
			byID[s.ID] = s
		}
	}
	for i, id := range ids {
		s, ok := byID[id]
		if !ok {
			out[i] = stoppedTask(id, reasonNotFound)
			continue
		}
		out[i] = p.toTask(fromSummary(s))
		if out[i].State != providers.TaskStopped {
			continue
		}
		if t, ok := p.stoppedDetail(ctx, id); ok {
			out[i] = t
		}
	}
	return out, nil
}

// stoppedDetail describes a stopped container as precisely as the engine
// can: from its inspection (exit code, OOM kill, limits) with the end of
// its log. ok is false when the engine could not be asked (the caller keeps
// what it has).
func (p *Provider) stoppedDetail(ctx context.Context, id string) (providers.Task, bool) {
	info, err := inspectSettled(ctx, p.api, id, time.Now)
	if err != nil {
		if isNotFound(err) {
			return stoppedTask(id, reasonNotFound), true
		}
		return providers.Task{}, false
	}
	t := p.toTask(fromInspect(info))
	log, _ := p.logLines(ctx, id, reasonLogLines) // unreadable: the reason without it
	t.Reason += providers.AgentLogTail(log)
	return t, true
}

// oomEventGrace is how long after a container's exit with code 137 the
// engine may still mark it OOM-killed: the kernel's OOM event reaches the
// engine on its own path and can come after the exit (under load, a task
// the OOM killer took was described as "SIGKILL, e.g. docker kill": make
// flake-hunt, 1 run in 20). oomEventPoll is how often it is asked again
// meanwhile.
const (
	oomEventGrace = 2 * time.Second
	oomEventPoll  = 50 * time.Millisecond
)

// inspector is the engine call inspectSettled makes.
type inspector interface {
	ContainerInspect(ctx context.Context, id string) (container.InspectResponse, error)
}

// inspectSettled inspects container id; a container that exited with 137
// less than oomEventGrace ago and is not (yet) marked OOM-killed is
// inspected again every oomEventPoll until it is, or until oomEventGrace
// after its exit, or until ctx ends (then the last inspection is
// returned).
func inspectSettled(ctx context.Context, api inspector, id string, now func() time.Time) (container.InspectResponse, error) {
	info, err := api.ContainerInspect(ctx, id)
	for err == nil && info.ContainerJSONBase != nil && info.State != nil && info.State.ExitCode == 137 && !info.State.OOMKilled {
		finished, perr := time.Parse(time.RFC3339Nano, info.State.FinishedAt)
		if perr != nil || now().Sub(finished) >= oomEventGrace {
			break
		}
		select {
		case <-ctx.Done():
			return info, nil
		case <-time.After(oomEventPoll):
		}
		next, nerr := api.ContainerInspect(ctx, id)
		if nerr != nil {
			return info, nil
		}
		info = next
	}
	return info, err
}

// List returns the containers of this gateway for pool ("" for every pool),
// stopped ones included, oldest first.
func (p *Provider) List(ctx context.Context, pool string) ([]providers.Task, error) {
	list, err := p.api.ContainerList(ctx, container.ListOptions{All: true, Filters: p.filter(pool)})
	if err != nil {
		return nil, fmt.Errorf("list tasks: %w", err)
	}
	out := make([]providers.Task, 0, len(list))
	for _, s := range list {
		out = append(out, p.toTask(fromSummary(s)))
	}
	sortTasks(out)
	return out, nil
}

// Stop removes the task's container (SIGKILL, then removal with its
// anonymous volumes): nothing of a sandbox is kept. It is idempotent: an
// unknown id, a removed container or one that is not this gateway's task
// returns nil and is left alone.
func (p *Provider) Stop(ctx context.Context, id string, reason string) error {
	info, err := p.api.ContainerInspect(ctx, id)
	switch {
	case isNotFound(err):
		return nil
	case err != nil:
		return fmt.Errorf("stop task %s: inspect: %w", id, err)
	case info.Config == nil || !p.ours(info.Config.Labels):
		p.logger.Debug("stop: not a container of this gateway; left alone", "id", id)
		return nil
	}
	if err := p.remove(ctx, info.ID); err != nil {
		return fmt.Errorf("stop task %s: %w", id, err)
	}
	if key := info.Config.Labels[labelLayer]; key != "" {
		if err := p.removeTaskVolumes(ctx, info.Config.Labels[providers.LabelTask], key); err != nil {
			return fmt.Errorf("stop task %s: %w", id, err)
		}
	}
	p.logger.Info("task stopped", "task", info.Config.Labels[providers.LabelTask], "container", shortID(info.ID), "reason", reason)
	return nil
}

// Pause implements providers.Pauser with the engine's cgroup freezer
// (`docker pause`): the container's processes keep their memory and use no
// CPU. Pausing a paused container is nil.
func (p *Provider) Pause(ctx context.Context, id string) error {
	return p.freeze(ctx, id, true)
}

// Resume implements providers.Pauser (`docker unpause`). Resuming a running
// container is nil.
func (p *Provider) Resume(ctx context.Context, id string) error {
	return p.freeze(ctx, id, false)
}

// freeze pauses (or unpauses) one of this gateway's containers, after
// checking that it is one and that it is not so already.
func (p *Provider) freeze(ctx context.Context, id string, pause bool) error {
	verb := map[bool]string{true: "pause", false: "resume"}[pause]
	info, err := p.api.ContainerInspect(ctx, id)
	switch {
	case isNotFound(err):
		return fmt.Errorf("%s task %s: %w", verb, id, providers.ErrNotFound)
	case err != nil:
		return fmt.Errorf("%s task %s: inspect: %w", verb, id, err)
	case info.Config == nil || !p.ours(info.Config.Labels):
		return fmt.Errorf("%s task %s: not a container of this gateway: %w", verb, id, providers.ErrNotFound)
	case info.State == nil || !info.State.Running:
		status := "unknown"
		if info.State != nil {
			status = string(info.State.Status)
		}
		return fmt.Errorf("%s task %s: the container is not running (%s)", verb, id, status)
	case info.State.Paused == pause:
		return nil
	}
	if pause {
		err = p.api.ContainerPause(ctx, info.ID)
	} else {
		err = p.api.ContainerUnpause(ctx, info.ID)
	}
	if err != nil {
		return fmt.Errorf("%s task %s: %w", verb, id, err)
	}
	p.logger.Info("task "+map[bool]string{true: "paused", false: "resumed"}[pause], "task", info.Config.Labels[providers.LabelTask], "container", shortID(info.ID))
	return nil
}

// remove force-removes a container; one already gone or being removed by
// another call counts as removed.
func (p *Provider) remove(ctx context.Context, id string) error {
	err := p.api.ContainerRemove(ctx, id, container.RemoveOptions{Force: true, RemoveVolumes: true})
	if err == nil || isNotFound(err) || isConflict(err) && strings.Contains(err.Error(), "already in progress") {
		return nil
	}
	return fmt.Errorf("remove container: %w", err)
}

// filter selects this gateway's containers (of pool, unless "").
func (p *Provider) filter(pool string) filters.Args {
	f := filters.NewArgs(
		filters.Arg("label", providers.LabelManaged+"=true"),
		filters.Arg("label", providers.LabelGateway+"="+p.cfg.GatewayID),
	)
	if pool != "" {
		f.Add("label", providers.LabelPool+"="+pool)
	}
	return f
}

// ours reports whether labels mark a container of this gateway.
func (p *Provider) ours(labels map[string]string) bool {
	return labels[providers.LabelManaged] == "true" && labels[providers.LabelGateway] == p.cfg.GatewayID
}

// isContainerID reports whether id has the shape of a full container id.
func isContainerID(id string) bool {
	if len(id) != 64 {
		return false
	}
	for _, c := range id {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

func shortID(id string) string { return id[:min(12, len(id))] }
