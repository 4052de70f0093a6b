package rockcompat

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/quarryhq/quarry/errclass"
	"github.com/quarryhq/quarry/internal/badinput"
	"github.com/quarryhq/quarry/warmpool"
)

// Labels Quarry puts on leases created through ROCK's routes.
const (
	// LabelSandboxID holds the sandbox_id a ROCK caller chose.
	LabelSandboxID = "rock.sandbox_id"
	// LabelImage holds the image the caller asked for.
	LabelImage = "rock.image"
	labelUser  = "rock.user_id"
	labelExp   = "rock.experiment_id"
	labelNS    = "rock.namespace"
)

// Limits on ROCK input.
const (
	maxSandboxIDLen = 128
	maxLabelLen     = 256
)

// startRequest is the part of ROCK's SandboxStartRequest that Quarry uses;
// the other fields (memory, cpus, disk, registry credentials, ...) are
// accepted and ignored: the pool decides them.
type startRequest struct {
	Image                 string   `json:"image"`
	SandboxID             *string  `json:"sandbox_id"`
	AutoClearTimeMinutes  *float64 `json:"auto_clear_time_minutes"`
	AutoClearTime         *float64 `json:"auto_clear_time"`
	StartupTimeoutSeconds *float64 `json:"startup_timeout"`
}

// startResult is ROCK's SandboxStartResponse.
type startResult struct {
	SandboxID string  `json:"sandbox_id"`
	HostName  string  `json:"host_name"`
	HostIP    *string `json:"host_ip"`
}

// start serves start and start_async: both lease a ready sandbox (Quarry's
// acquire waits for the agent, cold starts included), so both answer once
// the sandbox is alive.
func (s *Service) start(c *fiber.Ctx, owner string) (any, error) {
	var req startRequest
	if err := s.decode(c, &req); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(c.UserContext(), s.cfg.CreateTimeout)
	defer cancel()
	pools, err := s.poolList(ctx)
	if err != nil {
		return nil, err
	}
	pool, err := s.poolFor(req.Image, pools)
	if errors.Is(err, errNoPool) {
		pool, err = s.imagePool(ctx, owner, req.Image, err)
	}
	if err != nil {
		return nil, err
	}
	areq := warmpool.AcquireRequest{Pool: pool.Name, Owner: owner, Labels: map[string]string{}}
	if req.Image != "" {
		if len(req.Image) > maxLabelLen || !badinput.Printable(req.Image) {
			return nil, badinput.New("image", "must be at most %d printable ASCII characters", maxLabelLen)
		}
		areq.Labels[LabelImage] = req.Image
	}
	if req.SandboxID != nil && *req.SandboxID != "" {
		id := *req.SandboxID
		if err := checkSandboxID(id); err != nil {
			return nil, err
		}
		areq.IdempotencyKey = chosenKey(id)
		areq.Labels[LabelSandboxID] = id
	}
	minutes := req.AutoClearTimeMinutes
	if minutes == nil {
		minutes = req.AutoClearTime
	}
	if minutes != nil && (*minutes < 0 || math.IsNaN(*minutes) || math.IsInf(*minutes, 0)) {
		return nil, badinput.New("auto_clear_time_minutes", "must be a positive number of minutes (0 or absent: the pool's default), got %v", *minutes)
	}
	if minutes != nil && *minutes > 0 {
		limit := pool.MaxLeaseSeconds
		if limit <= 0 {
			limit = warmpool.DefaultMaxLeaseSeconds
		}
		secs := math.Ceil(*minutes * 60)
		if secs > float64(limit) {
			secs = float64(limit) // longer asks get the pool's longest lease
		}
		areq.LeaseSeconds = int(secs)
	}
	for header, label := range map[string]string{"X-User-Id": labelUser, "X-Experiment-Id": labelExp, "X-Namespace": labelNS} {
		if v := string(c.Request().Header.Peek(header)); v != "" && len(v) <= maxLabelLen && badinput.Printable(v) {
			areq.Labels[label] = v
		}
	}
	chosen := areq.Labels[LabelSandboxID]
	lease, replayed, err := s.leases.Acquire(ctx, areq)
	if errors.Is(err, warmpool.ErrIdempotencyMismatch) {
		// The chosen id names a sandbox started with other settings:
		// say first whether it has ended, as for a plain second start.
		earlier, lerr := s.lookup(ctx, owner, chosen)
		if lerr == nil {
			if ended := chosenEnded(chosen, earlier); ended != nil {
				return nil, ended
			}
			return nil, badinput.New("sandbox_id", "%q names sandbox %s, started with other settings (image, auto_clear_time_minutes, or the X-User-Id, X-Experiment-Id and X-Namespace headers); choose a new sandbox_id",
				chosen, earlier.ID)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("acquire: %w", err)
	}
	if replayed {
		if ended := chosenEnded(chosen, lease); ended != nil {
			return nil, ended
		}
	}
	return startResult{SandboxID: lease.ID, HostName: lease.TaskID}, nil
}

// chosenEnded is the refusal of a start whose chosen sandbox id names a
// sandbox that has ended, or nil while it runs.
func chosenEnded(chosen string, l warmpool.Lease) error {
	if l.State == warmpool.LeaseActive {
		return nil
	}
	why := string(l.State)
	if l.Reason != "" {
		why += ": " + l.Reason
	}
	return badinput.New("sandbox_id", "%q named sandbox %s, which has ended (%s); a sandbox does not start again: choose a new sandbox_id",
		chosen, l.ID, why)
}

// poolFor picks the pool of a ROCK image: the Images table, a pool named
// like the image, a pool running the image, and for an empty image or the
// SDK's default the default pool.
func (s *Service) poolFor(image string, pools []warmpool.PoolConfig) (warmpool.PoolConfig, error) {
	byName := make(map[string]warmpool.PoolConfig, len(pools))
	names := make([]string, 0, len(pools))
	for _, p := range pools {
		byName[p.Name] = p
		names = append(names, p.Name)
	}
	sort.Strings(names)
	find := func(name string) (warmpool.PoolConfig, error) {
		if p, ok := byName[name]; ok {
			return p, nil
		}
		return warmpool.PoolConfig{}, badinput.New("image", "image %q maps to pool %q, which does not exist (pools: %s)",
			image, name, strings.Join(names, ", "))
	}
	if name, ok := s.cfg.Images[image]; ok {
		return find(name)
	}
	if p, ok := byName[image]; ok && image != "" {
		return p, nil
	}
	for _, name := range names {
		if p := byName[name]; image != "" && p.Image == image {
			return p, nil
		}
	}
	if image == "" || image == SDKDefaultImage {
		return find(s.cfg.DefaultPool)
	}
	return warmpool.PoolConfig{}, fmt.Errorf("%w: %w", errNoPool, badinput.New("image",
		"no pool serves image %q: name a pool as the image, run a pool with that image, map it in QUARRY_ROCK_IMAGES, or configure a pool class that serves it (pools: %s)",
		image, strings.Join(names, ", ")))
}

// errNoPool marks poolFor's answer for an image no configured pool serves.
var errNoPool = errors.New("no configured pool serves the image")

// imagePool is the on-demand pool of an image no configured pool serves
// (ImagePools), or noPool (poolFor's error) when the gateway serves no
// image on demand. ROCK's resources (cpus, memory) are not asked for: the
// SDK sends its defaults (2 CPUs, 8g) with every start, so the class's
// sizes apply.
func (s *Service) imagePool(ctx context.Context, owner, image string, noPool error) (warmpool.PoolConfig, error) {
	ip, ok := s.leases.(ImagePools)
	if !ok {
		return warmpool.PoolConfig{}, noPool
	}
	name, err := ip.ImagePool(ctx, warmpool.ImageRequest{Image: image, Owner: owner})
	var bad, none *badinput.Error
	if errors.As(err, &bad) && errors.As(noPool, &none) {
		return warmpool.PoolConfig{}, badinput.New("image", "%s; %s", none.Message, bad.Message) // both halves of the story
	}
	if err != nil {
		return warmpool.PoolConfig{}, err
	}
	return ip.Pool(ctx, name)
}

// checkSandboxID accepts 1..128 letters, digits, '.', '_' and '-'.
func checkSandboxID(id string) error {
	if id == "" || len(id) > maxSandboxIDLen {
		return badinput.New("sandbox_id", "must be 1 to %d characters", maxSandboxIDLen)
	}
	for i := 0; i < len(id); i++ {
		if b := id[i]; !badinput.Alnum(b) && b != '.' && b != '_' && b != '-' {
			return badinput.New("sandbox_id", "must be letters, digits, '.', '_' or '-', got %q", id)
		}
	}
	return nil
}

// chosenKey is the idempotency key of the start that chose sandbox id.
func chosenKey(id string) string { return "rock:" + id }

// lookup returns the lease of a ROCK sandbox id in any state: a lease id,
// or the id a caller chose at start: the lease its start's idempotency key
// names (KeyLookup: one read), else the newest of the owner's leases with
// its label, an active one first.
func (s *Service) lookup(ctx context.Context, owner, id string) (warmpool.Lease, error) {
	if err := checkSandboxID(id); err != nil {
		return warmpool.Lease{}, err
	}
	if warmpool.ValidLeaseID(id) {
		l, err := s.leases.Get(ctx, id, owner)
		if err != nil {
			return l, errclass.Sandbox(id, err)
		}
		return l, nil
	}
	if kl, ok := s.leases.(KeyLookup); ok {
		l, err := kl.ByKey(ctx, owner, chosenKey(id))
		if err != nil {
			return warmpool.Lease{}, errclass.Sandbox(id, err)
		}
		return l, nil
	}
	ls, err := s.leases.List(ctx, warmpool.LeaseFilter{Owner: owner, Labels: map[string]string{LabelSandboxID: id}, Limit: 100})
	if err != nil {
		return warmpool.Lease{}, errclass.Sandbox(id, err)
	}
	if len(ls) == 0 {
		return warmpool.Lease{}, errclass.Sandbox(id, warmpool.ErrNotFound)
	}
	best := ls[0]
	for _, l := range ls[1:] {
		if (l.State == warmpool.LeaseActive) != (best.State == warmpool.LeaseActive) {
			if l.State == warmpool.LeaseActive {
				best = l
			}
			continue
		}
		if l.CreatedAt.After(best.CreatedAt) {
			best = l
		}
	}
	return best, nil
}

// active returns the lease of id if it can be used now. Like ROCK's
// auto-clear timer, every call on a sandbox keeps it alive: once less than
// half of the lease's duration is left, the lease is renewed.
func (s *Service) active(ctx context.Context, owner, id string) (warmpool.Lease, error) {
	l, err := s.lookup(ctx, owner, id)
	if err != nil {
		return l, err
	}
	now := s.clock.Now()
	if gone := l.Ended(now); gone != nil {
		return l, errclass.Sandbox(id, gone)
	}
	if l.Duration > 0 && l.ExpiresAt.Sub(now) < l.Duration/2 {
		renewed, err := s.leases.Heartbeat(ctx, l.ID, owner)
		switch {
		case errors.Is(err, warmpool.ErrLeaseEnded):
			return l, errclass.Sandbox(id, err)
		case err != nil:
			s.log.Warn("renew lease", "lease", l.ID, "err", err)
		default:
			l = renewed
		}
	}
	return l, nil
}

// phase is one entry of SandboxStatusResponse.status, which the SDK's start
// loop scans for "failed" or "timeout".
type phase struct {
	Status  string `json:"status"`
	Message string `json:"message"`
}

// statusResult is ROCK's SandboxStatusResponse (the fields Quarry knows).
type statusResult struct {
	SandboxID    string           `json:"sandbox_id"`
	Status       map[string]phase `json:"status"`
	HostName     string           `json:"host_name"`
	HostIP       *string          `json:"host_ip"`
	IsAlive      bool             `json:"is_alive"`
	Image        string           `json:"image,omitempty"`
	UserID       *string          `json:"user_id"`
	ExperimentID *string          `json:"experiment_id"`
	Namespace    *string          `json:"namespace"`
	CPUs         *float64         `json:"cpus"`
	Memory       *string          `json:"memory"`
	State        string           `json:"state"`
	CreateTime   string           `json:"create_time"`
	StartTime    string           `json:"start_time"`
	StopTime     *string          `json:"stop_time"`
	AutoStopTime string           `json:"auto_stop_time"`
}

// getStatus serves GET get_status?sandbox_id=: the lease as ROCK's status.
func (s *Service) getStatus(c *fiber.Ctx, owner string) (any, error) {
	id := string(c.Context().QueryArgs().Peek("sandbox_id"))
	ctx, cancel := context.WithTimeout(c.UserContext(), s.cfg.ManagerTimeout)
	defer cancel()
	l, err := s.lookup(ctx, owner, id)
	if err != nil {
		return nil, err
	}
	now := s.clock.Now()
	state := l.StateAt(now)
	alive := state == warmpool.LeaseActive
	res := statusResult{
		SandboxID: id, HostName: l.TaskID, IsAlive: alive, Image: l.Labels[LabelImage],
		UserID: labelPtr(l, labelUser), ExperimentID: labelPtr(l, labelExp), Namespace: labelPtr(l, labelNS),
		CreateTime: l.CreatedAt.UTC().Format(time.RFC3339), StartTime: l.CreatedAt.UTC().Format(time.RFC3339),
		AutoStopTime: l.ExpiresAt.UTC().Format(time.RFC3339),
	}
	if alive {
		res.State = "running"
		res.Status = map[string]phase{"lease": {Status: "running", Message: "leased from pool " + l.Pool}}
	} else {
		res.State = "stopped"
		msg := fmt.Sprintf("sandbox %s is %s", id, state)
		if l.Reason != "" {
			msg += " (" + l.Reason + ")"
		}
		res.Status = map[string]phase{"lease": {Status: "failed", Message: msg}}
		if !l.EndedAt.IsZero() {
			t := l.EndedAt.UTC().Format(time.RFC3339)
			res.StopTime = &t
		}
	}
	if pools, err := s.poolList(ctx); err == nil {
		for _, p := range pools {
			if p.Name != l.Pool {
				continue
			}
			if res.Image == "" {
				res.Image = p.Image
			}
			if p.CPU > 0 {
				cpu := p.CPU
				res.CPUs = &cpu
			}
			if p.Memory > 0 {
				m := fmt.Sprintf("%dm", p.Memory)
				res.Memory = &m
			}
		}
	}
	return res, nil
}

func labelPtr(l warmpool.Lease, key string) *string {
	if v, ok := l.Labels[key]; ok {
		return &v
	}
	return nil
}

// aliveResult is ROCK's IsAliveResponse.
type aliveResult struct {
	IsAlive bool   `json:"is_alive"`
	Message string `json:"message"`
}

// isAlive serves GET is_alive?sandbox_id=. Like ROCK, an unknown or ended
// sandbox is not alive (Success), and the message says why.
func (s *Service) isAlive(c *fiber.Ctx, owner string) (any, error) {
	id := string(c.Context().QueryArgs().Peek("sandbox_id"))
	ctx, cancel := context.WithTimeout(c.UserContext(), s.cfg.ManagerTimeout)
	defer cancel()
	l, err := s.lookup(ctx, owner, id)
	var ve *badinput.Error
	switch {
	case errors.As(err, &ve):
		return nil, err
	case err != nil:
		return aliveResult{Message: errclass.Of(err).Message}, nil
	}
	if st := l.StateAt(s.clock.Now()); st != warmpool.LeaseActive {
		return aliveResult{Message: fmt.Sprintf("sandbox %s is %s", id, st)}, nil
	}
	return aliveResult{IsAlive: true, Message: l.TaskID}, nil
}

// sandboxRequest is the body of stop and delete.
type sandboxRequest struct {
	SandboxID string `json:"sandbox_id"`
}

// stop serves stop and delete: release the lease (its task is stopped). An
// ended sandbox stops again successfully.
func (s *Service) stop(c *fiber.Ctx, owner string) (any, error) {
	var req sandboxRequest
	if err := s.decode(c, &req); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(c.UserContext(), s.cfg.ManagerTimeout)
	defer cancel()
	l, err := s.lookup(ctx, owner, req.SandboxID)
	if err != nil {
		return nil, err
	}
	if _, err := s.leases.Release(ctx, l.ID, owner); err != nil && !errors.Is(err, warmpool.ErrLeaseEnded) {
		return nil, errclass.Sandbox(req.SandboxID, err)
	}
	return req.SandboxID + " stopped", nil
}

// decode reads the JSON body (bounded by MaxJSONBody) into v. ROCK's models
// ignore fields they do not know, and so does decode; a malformed body or a
// field of the wrong type is refused as on Quarry's routes (badinput.JSON),
// in ROCK's envelope.
func (s *Service) decode(c *fiber.Ctx, v any) error {
	r, err := s.body(c, s.cfg.MaxJSONBody)
	if err != nil {
		return err
	}
	b, err := io.ReadAll(io.LimitReader(r, s.cfg.MaxJSONBody+1))
	if err != nil {
		return badinput.New("body", "read: %s", err.Error())
	}
	if int64(len(b)) > s.cfg.MaxJSONBody {
		return badinput.New("body", "larger than %d bytes", s.cfg.MaxJSONBody)
	}
	if len(strings.TrimSpace(string(b))) == 0 {
		return badinput.New("body", "a JSON object is required")
	}
	return badinput.JSON(json.Unmarshal(b, v))
}
