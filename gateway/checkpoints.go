package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/gofiber/fiber/v2"
	"golang.org/x/sync/errgroup"

	"github.com/quarryhq/quarry/api"
	"github.com/quarryhq/quarry/checkpoints"
	"github.com/quarryhq/quarry/errclass"
	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/internal/badinput"
	"github.com/quarryhq/quarry/warmpool"
)

// Checkpoints (docs/API.md, "Checkpoints"; docs/ARCHITECTURE.md, "Request
// paths"). A checkpoint is taken by the sandbox's agent (GET
// /v1/checkpoint, a tar+gzip stream) and copied into the store as it
// arrives (Store.Put reads the agent's answer body); a restore copies the
// store's reader (Store.Open) into the agent's PUT /v1/checkpoint as its
// request body. Neither is ever held whole in the gateway: what it
// buffers is the HTTP client's and the store's copy buffers.

// MaxForks is the most sandboxes one fork makes.
const MaxForks = 100

// errCheckpointsOff: the gateway has no checkpoint store (Deps.Checkpoints);
// its checkpoint routes answer 404.
var errCheckpointsOff = errclass.New(http.StatusNotFound, agentapi.CodeNotFound,
	"checkpoints are off on this gateway (it has no checkpoint store)")

// checkpointFields, restoreFields and forkFields are the JSON fields of
// api.CreateCheckpointRequest, api.RestoreRequest and api.ForkRequest.
var (
	checkpointFields = []string{"paths", "exclude", "labels"}
	restoreFields    = []string{"checkpoint"}
	forkFields       = []string{"count", "lease_seconds", "paths", "exclude", "labels", "keep_checkpoint"}
)

// ckService is the gateway's checkpoint side: the store, its limits, the
// HTTP client that streams archives to and from agents, and the images of
// the pools.
type ckService struct {
	store checkpoints.Store // nil: checkpoints are off
	cfg   checkpoints.Config
	http  *http.Client

	mu     sync.Mutex
	images map[string]string // pool → image, read from Manager.Pools
	read   time.Time         // when images was read
}

// imagesRefresh is how often, at most, the pool images are read again when
// a pool is not among them (pools are configured at start-up).
const imagesRefresh = 30 * time.Second

func newCkService(cfg Config, store checkpoints.Store, ckCfg checkpoints.Config) *ckService {
	dialer := &net.Dialer{Timeout: cfg.AgentDialTimeout}
	return &ckService{
		store: store,
		cfg:   ckCfg.WithDefaults(),
		http: &http.Client{Transport: &http.Transport{
			DialContext:         dialer.DialContext,
			MaxIdleConnsPerHost: 2,
			IdleConnTimeout:     cfg.IdleTimeout,
			// The agent walks the tree before its answer's headers.
			ResponseHeaderTimeout: cfg.UploadTimeout,
			DisableCompression:    true,
			// Archives stream through: larger buffers mean fewer writes
			// and reads (the default is 4 KiB); 128 KiB per connection, so
			// a fork of 100 holds 12.5 MiB of them while it restores.
			WriteBufferSize: 64 << 10,
			ReadBufferSize:  64 << 10,
		}},
	}
}

// on returns the store, or errCheckpointsOff.
func (s *ckService) on() (checkpoints.Store, error) {
	if s.store == nil {
		return nil, errCheckpointsOff
	}
	return s.store, nil
}

// poolImage returns pool's image. Images are read from Manager.Pools once,
// and again (at most every imagesRefresh) when a pool is missing, so that a
// request does not list every pool's tasks; a read holds the others
// waiting (bounded by ManagerTimeout). An unknown pool is bad input.
func (g *Gateway) poolImage(ctx context.Context, pool string) (string, error) {
	if im := g.images(); im != nil && strings.HasPrefix(pool, warmpool.OnDemandPrefix) {
		ctx, cancel := context.WithTimeout(ctx, g.cfg.ManagerTimeout)
		defer cancel()
		pc, err := im.Pool(ctx, pool)
		if err != nil {
			return "", badinput.New("pool", "unknown pool %q", pool)
		}
		return pc.Image, nil // an on-demand pool's image never changes
	}
	s := g.ck
	s.mu.Lock()
	defer s.mu.Unlock()
	if img, ok := s.images[pool]; ok {
		return img, nil
	}
	if s.images == nil || time.Since(s.read) >= imagesRefresh {
		ctx, cancel := context.WithTimeout(ctx, g.cfg.ManagerTimeout)
		defer cancel()
		ps, err := g.mgr.Pools(ctx)
		if err != nil {
			return "", err
		}
		s.images, s.read = make(map[string]string, len(ps)), time.Now()
		for _, p := range ps {
			s.images[p.Name] = p.Image
		}
	}
	img, ok := s.images[pool]
	if !ok {
		return "", badinput.New("pool", "unknown pool %q", pool)
	}
	return img, nil
}

// ckAgent returns a client of lease's agent for the streaming checkpoint
// routes.
func (g *Gateway) ckAgent(lease warmpool.Lease) *agentapi.Client {
	return g.agentClient(lease)
}

// toCheckpoint converts a stored checkpoint for a client.
func toCheckpoint(c checkpoints.Checkpoint) api.Checkpoint {
	return api.Checkpoint{
		ID: c.ID, Pool: c.Pool, Image: c.Image, Sandbox: c.Sandbox, Paths: c.Paths, Exclude: c.Exclude, Labels: c.Labels,
		Format: c.Format, SizeBytes: c.SizeBytes, Files: c.Files, SHA256: c.SHA256, CreatedAt: c.CreatedAt, ExpiresAt: c.ExpiresAt,
	}
}

// ckTimeout bounds taking or restoring one checkpoint: the upload timeout,
// as the other calls that stream a body.
func (g *Gateway) ckTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, g.cfg.UploadTimeout)
}

// checkArchiveRequest checks what a client sends for a checkpoint before the
// agent is called: the contract's limits (checkpoints.CheckPut) on
// excludes and labels, and the count of paths (the agent checks each path
// and resolves the relative ones).
func checkArchiveRequest(paths, exclude []string, labels map[string]string) error {
	probe := make([]string, max(1, len(paths)))
	for i := range probe {
		probe[i] = "/" // the shape of each path is the agent's to check
	}
	now := time.Now()
	_, err := checkpoints.CheckPut(checkpoints.Checkpoint{
		ID: checkpoints.NewID(), Owner: "o", Format: agentapi.FormatTarGzip, Paths: probe, Exclude: exclude, Labels: labels,
		CreatedAt: now, ExpiresAt: now.Add(time.Hour),
	}, 1)
	return err
}

// archiveLease checks a request that takes a checkpoint (checkArchiveRequest)
// and returns the sandbox's lease when checkpoints are on and the lease is
// active.
func (g *Gateway) archiveLease(c *fiber.Ctx, id string, req api.CreateCheckpointRequest) (warmpool.Lease, error) {
	if err := checkArchiveRequest(req.Paths, req.Exclude, req.Labels); err != nil {
		return warmpool.Lease{}, err
	}
	if _, err := g.ck.on(); err != nil {
		return warmpool.Lease{}, err
	}
	return g.activeLease(c, id)
}

// createCheckpoint handles POST /v1/sandboxes/{id}/checkpoints: 201 with
// the checkpoint.
func (g *Gateway) createCheckpoint(c *fiber.Ctx) error {
	var req api.CreateCheckpointRequest
	id, err := g.sandboxBody(c, &req, checkpointFields)
	if err != nil {
		return err
	}
	lease, err := g.archiveLease(c, id, req)
	if err != nil {
		return err
	}
	ck, err := g.takeCheckpoint(c.UserContext(), lease, req)
	if err != nil {
		return errclass.Sandbox(id, err)
	}
	return c.Status(http.StatusCreated).JSON(toCheckpoint(ck))
}

// takeCheckpoint has lease's agent archive req's paths and streams the
// archive into the store, as the lease owner's checkpoint.
func (g *Gateway) takeCheckpoint(ctx context.Context, lease warmpool.Lease, req api.CreateCheckpointRequest) (checkpoints.Checkpoint, error) {
	store, err := g.ck.on()
	if err != nil {
		return checkpoints.Checkpoint{}, err
	}
	image, err := g.poolImage(ctx, lease.Pool)
	if err != nil {
		return checkpoints.Checkpoint{}, err
	}
	ctx, cancel := g.ckTimeout(ctx)
	defer cancel()
	start := time.Now()
	body, info, err := g.ckAgent(lease).CheckpointLevel(ctx, req.Paths, req.Exclude, g.cfg.CheckpointCompression)
	if err != nil {
		return checkpoints.Checkpoint{}, g.ckAgentFailed(ctx, lease, err)
	}
	defer body.Close()
	meta := g.ck.cfg.Stamp(checkpoints.Checkpoint{
		ID: checkpoints.NewID(), Owner: lease.Owner, Pool: lease.Pool, Image: image, Sandbox: lease.ID,
		Paths: info.Roots, Exclude: req.Exclude, Labels: req.Labels, Format: info.Format, Files: info.Files,
	}, g.clock.Now())
	src := &trackedReader{r: body}
	ck, err := store.Put(ctx, meta, src, g.ck.cfg.MaxBytes)
	if err != nil {
		g.metrics.checkpointFailed("create")
		if be := (*checkpoints.BudgetError)(nil); errors.As(err, &be) {
			g.metrics.checkpointRefused(be.Variable())
		}
		if src.err != nil && !errors.Is(err, checkpoints.ErrTooLarge) {
			// The agent's stream broke: that is the failure, not the store.
			return checkpoints.Checkpoint{}, g.ckAgentFailed(ctx, lease, src.err)
		}
		return checkpoints.Checkpoint{}, fmt.Errorf("store checkpoint of sandbox %s: %w", lease.ID, err)
	}
	g.metrics.checkpointTaken(ck.SizeBytes, time.Since(start))
	return ck, nil
}

// ckAgentFailed turns a failed checkpoint or restore call into its error:
// the agent's answers pass as they are; a call without an answer is
// checked as the proxy checks it (the task may be dead).
func (g *Gateway) ckAgentFailed(ctx context.Context, lease warmpool.Lease, err error) error {
	var ae *agentapi.Error
	if errors.As(err, &ae) {
		if ae.Code == agentapi.CodeStaleGeneration {
			g.agents.evict(lease.AgentURL)
		}
		return err
	}
	var ce *agentapi.CallError
	if errors.As(err, &ce) {
		err = ce.Err
	}
	return g.agentCallFailed(ctx, lease, err)
}

// trackedReader remembers the error its reader returned (io.EOF aside), so
// that a caller can tell a broken source from its sink's failure. With
// endOnError, it returns io.EOF in that error's place (and from then on).
type trackedReader struct {
	r          io.Reader
	err        error
	endOnError bool
}

func (t *trackedReader) Read(p []byte) (int, error) {
	if t.err != nil && t.endOnError {
		return 0, io.EOF
	}
	n, err := t.r.Read(p)
	if err != nil && err != io.EOF && t.err == nil {
		t.err = err
		if t.endOnError {
			return n, io.EOF
		}
	}
	return n, err
}

// restoreInto streams checkpoint ck (already read for owner and checked
// against lease's image) from the store into lease's agent. A corrupt blob
// fails the store's reader before its end, so the agent, which commits
// only after a clean end of the body, changes nothing: the answer is the
// store's ErrCorrupt whatever the agent said.
func (g *Gateway) restoreInto(ctx context.Context, lease warmpool.Lease, ck checkpoints.Checkpoint) (agentapi.RestoreResult, error) {
	store, err := g.ck.on()
	if err != nil {
		return agentapi.RestoreResult{}, err
	}
	ctx, cancel := g.ckTimeout(ctx)
	defer cancel()
	start := time.Now()
	rc, ck, err := store.Open(ctx, ck.ID, lease.Owner)
	if err != nil {
		return agentapi.RestoreResult{}, err
	}
	defer rc.Close()
	// A failing store reader ends the body as if it were whole: the agent
	// then finds that it does not hash to ck.SHA256 and refuses it after
	// removing what it staged, so the answer waits for the sandbox to be
	// as it was (an aborted body would be cleaned up after the answer).
	src := &trackedReader{r: rc, endOnError: true}
	res, err := g.ckAgent(lease).Restore(ctx, ck.SHA256, src)
	if src.err != nil {
		err = fmt.Errorf("read checkpoint %s: %w", ck.ID, src.err)
	} else if err != nil {
		err = g.ckAgentFailed(ctx, lease, err)
	}
	if err != nil {
		g.metrics.checkpointFailed("restore")
		return res, err
	}
	g.metrics.checkpointRestored(ck.SizeBytes, time.Since(start))
	return res, nil
}

// checkImage refuses to restore ck into a sandbox of pool, whose image is
// image, when the checkpoint was taken on another image.
func checkImage(ck checkpoints.Checkpoint, pool, image string) error {
	if ck.Image == image {
		return nil
	}
	return badinput.New("checkpoint", "checkpoint %s was taken on image %q (pool %s); pool %s runs image %q: restore it into a sandbox of the same image",
		ck.ID, ck.Image, ck.Pool, pool, image)
}

// ownCheckpoint reads owner's checkpoint id (a malformed id is not found).
func (g *Gateway) ownCheckpoint(ctx context.Context, id, owner string) (checkpoints.Checkpoint, error) {
	store, err := g.ck.on()
	if err != nil {
		return checkpoints.Checkpoint{}, err
	}
	if !checkpoints.ValidID(id) {
		return checkpoints.Checkpoint{}, fmt.Errorf("checkpoint %q: %w", id, checkpoints.ErrNotFound)
	}
	ctx, cancel := context.WithTimeout(ctx, g.cfg.ManagerTimeout)
	defer cancel()
	return store.Get(ctx, id, owner)
}

// restoreSandbox handles POST /v1/sandboxes/{id}/restore: the sandbox's
// paths roll back to the checkpoint, in place.
func (g *Gateway) restoreSandbox(c *fiber.Ctx) error {
	var req api.RestoreRequest
	id, err := g.sandboxBody(c, &req, restoreFields)
	if err != nil {
		return err
	}
	if req.Checkpoint == "" {
		return badinput.New("checkpoint", "required: the id of a checkpoint (ckp-...)")
	}
	res, err := g.restoreChecked(c, id, req.Checkpoint)
	if err != nil {
		return err
	}
	return c.JSON(res)
}

// restoreChecked restores the caller's checkpoint ckID into sandbox id:
// it reads the lease and the checkpoint, checks the image, and restores
// (the restore route and the env API's reset).
func (g *Gateway) restoreChecked(c *fiber.Ctx, id, ckID string) (api.RestoreResult, error) {
	if _, err := g.ck.on(); err != nil {
		return api.RestoreResult{}, err
	}
	lease, err := g.activeLease(c, id)
	if err != nil {
		return api.RestoreResult{}, err
	}
	ctx := c.UserContext()
	ck, err := g.ownCheckpoint(ctx, ckID, lease.Owner)
	if err != nil {
		return api.RestoreResult{}, err
	}
	image, err := g.poolImage(ctx, lease.Pool)
	if err != nil {
		return api.RestoreResult{}, err
	}
	if err := checkImage(ck, lease.Pool, image); err != nil {
		return api.RestoreResult{}, err
	}
	res, err := g.restoreInto(ctx, lease, ck)
	if err != nil {
		return api.RestoreResult{}, errclass.Sandbox(id, err)
	}
	return api.RestoreResult{SandboxID: id, Checkpoint: ck.ID, Files: res.Files, Bytes: res.Bytes, DurationMS: res.DurationMS}, nil
}

// fromCheckpoint resolves the pool of a create from a checkpoint: the
// request's pool ("" the checkpoint's), which must run the checkpoint's
// image.
func (g *Gateway) fromCheckpoint(ctx context.Context, owner, id, pool string) (checkpoints.Checkpoint, string, error) {
	ck, err := g.ownCheckpoint(ctx, id, owner)
	if err != nil {
		return ck, "", err
	}
	if pool == "" {
		pool = ck.Pool
	}
	image, err := g.poolImage(ctx, pool)
	if err != nil {
		return ck, "", err
	}
	return ck, pool, checkImage(ck, pool, image)
}

// acquireRestored leases a sandbox and restores ck into it before it is
// handed out: the claim comes first (a warm sandbox stays warm), and a
// failed restore releases the sandbox and returns the restore's error, so
// nothing half-restored is handed out. A replayed lease (an idempotency
// key used before) is returned as it is.
func (g *Gateway) acquireRestored(ctx context.Context, req warmpool.AcquireRequest, ck checkpoints.Checkpoint) (warmpool.Lease, bool, error) {
	lease, replayed, err := g.mgr.Acquire(ctx, req)
	if err != nil || replayed {
		return lease, replayed, err
	}
	if _, err := g.restoreInto(ctx, lease, ck); err != nil {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.cfg.ManagerTimeout)
		defer cancel()
		if l, rerr := g.mgr.Release(rctx, lease.ID, lease.Owner); rerr != nil {
			g.log.Warn("release sandbox after a failed restore", "lease", lease.ID, "err", rerr)
		} else {
			g.leaseGone(l)
		}
		return warmpool.Lease{}, false, fmt.Errorf("restore checkpoint %s into a new sandbox of pool %s: %w", ck.ID, req.Pool, err)
	}
	return lease, false, nil
}

// forkSandbox handles POST /v1/sandboxes/{id}/fork: a checkpoint now, then
// count new sandboxes of the same pool with it restored, each its own
// lease (relay token, transcript). The forks are made concurrently; each
// result is its sandbox or its own error.
func (g *Gateway) forkSandbox(c *fiber.Ctx) error {
	var req api.ForkRequest
	id, err := g.sandboxBody(c, &req, forkFields)
	if err != nil {
		return err
	}
	if req.Count < 1 || req.Count > MaxForks {
		return badinput.New("count", "must be between 1 and %d, got %d", MaxForks, req.Count)
	}
	lease, err := g.archiveLease(c, id, api.CreateCheckpointRequest{Paths: req.Paths, Exclude: req.Exclude})
	if err != nil {
		return err
	}
	labels := req.Labels
	if labels == nil {
		labels = lease.Labels
	}
	cr := api.CreateSandboxRequest{Pool: lease.Pool, LeaseSeconds: req.LeaseSeconds, Env: lease.Env, Labels: labels}
	if err := validateCreate(&cr); err != nil {
		return err
	}
	ctx := c.UserContext()
	ck, err := g.takeCheckpoint(ctx, lease, api.CreateCheckpointRequest{Paths: req.Paths, Exclude: req.Exclude})
	if err != nil {
		return errclass.Sandbox(id, err)
	}
	out := api.ForkResult{Checkpoint: toCheckpoint(ck), Forks: make([]api.Fork, req.Count)}
	fctx, cancel := context.WithTimeout(ctx, g.cfg.CreateTimeout)
	defer cancel()
	var eg errgroup.Group // every fork runs: count is bounded by MaxForks
	for i := range req.Count {
		eg.Go(func() error {
			l, _, err := g.acquireRestored(fctx, warmpool.AcquireRequest{
				Pool: lease.Pool, Owner: lease.Owner, LeaseSeconds: req.LeaseSeconds, Env: lease.Env, Labels: labels,
			}, ck)
			if err != nil {
				a := errclass.Of(err)
				out.Forks[i].Error = &api.ForkError{Status: a.Status, Code: a.Code, Message: a.Message}
				return nil
			}
			sbx := g.toSandbox(l)
			out.Forks[i].Sandbox = &sbx
			return nil
		})
	}
	_ = eg.Wait()
	g.metrics.forked(out.Forks)
	if !req.KeepCheckpoint {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.cfg.ManagerTimeout)
		defer cancel()
		if err := g.ck.store.Delete(dctx, ck.ID, ck.Owner); err != nil {
			g.log.Warn("delete the checkpoint of a fork", "checkpoint", ck.ID, "err", err)
		}
	}
	return c.JSON(out)
}

// listCheckpoints handles GET /v1/checkpoints?label=k=v&limit=: the
// caller's checkpoints, newest first.
func (g *Gateway) listCheckpoints(c *fiber.Ctx) error {
	store, err := g.ck.on()
	if err != nil {
		return err
	}
	args := c.Context().QueryArgs()
	labels, err := labelFilter(args.PeekMulti("label"))
	if err != nil {
		return err
	}
	limit, err := queryInt(args, "limit", checkpoints.DefaultListLimit, 1, checkpoints.MaxListLimit)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(c.UserContext(), g.cfg.ManagerTimeout)
	defer cancel()
	cks, err := store.List(ctx, checkpoints.Filter{Owner: ownerOf(c), Labels: labels, Limit: int(limit)})
	if err != nil {
		return err
	}
	out := api.CheckpointList{Checkpoints: make([]api.Checkpoint, 0, len(cks))}
	for _, ck := range cks {
		out.Checkpoints = append(out.Checkpoints, toCheckpoint(ck))
	}
	return c.JSON(out)
}

// getCheckpoint handles GET /v1/checkpoints/{id}.
func (g *Gateway) getCheckpoint(c *fiber.Ctx) error {
	id, err := pathID(c, "id")
	if err != nil {
		return err
	}
	ck, err := g.ownCheckpoint(c.UserContext(), id, ownerOf(c))
	if err != nil {
		return err
	}
	return c.JSON(toCheckpoint(ck))
}

// deleteCheckpoint handles DELETE /v1/checkpoints/{id}: 204, also for an id
// the caller deleted before; another owner's is 404.
func (g *Gateway) deleteCheckpoint(c *fiber.Ctx) error {
	id, err := pathID(c, "id")
	if err != nil {
		return err
	}
	store, err := g.ck.on()
	if err != nil {
		return err
	}
	if !checkpoints.ValidID(id) {
		return fmt.Errorf("checkpoint %q: %w", id, checkpoints.ErrNotFound)
	}
	ctx, cancel := context.WithTimeout(c.UserContext(), g.cfg.ManagerTimeout)
	defer cancel()
	if err := store.Delete(ctx, id, ownerOf(c)); err != nil {
		return err
	}
	return c.SendStatus(http.StatusNoContent)
}

// forkOutcomes counts fork results by outcome for the metrics: "ok" or the
// error's code.
func forkOutcomes(forks []api.Fork) map[string]int {
	out := map[string]int{}
	for _, f := range forks {
		if f.Error != nil {
			out[f.Error.Code]++
		} else {
			out["ok"]++
		}
	}
	return out
}
