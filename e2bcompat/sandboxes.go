package e2bcompat

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/quarryhq/quarry/errclass"
	"github.com/quarryhq/quarry/internal/badinput"
	"github.com/quarryhq/quarry/warmpool"
)

// DefaultTemplate is the template E2B's SDK asks for when its user names
// none (Sandbox.default_template).
const DefaultTemplate = "base"

// clientID is every sandbox's clientID, a deprecated field the spec still
// requires.
const clientID = "quarry"

// Limits of GET /v2/sandboxes (openapi.yml, paginationLimit).
const (
	defaultListLimit = 100
	maxListLimit     = 100
)

// create handles POST /sandboxes and POST /v2/sandboxes: a lease of the
// template's pool (a snapshot's: with its files restored), 201 with the
// sandbox.
func (s *Service) create(c *fiber.Ctx, owner string) (err error) {
	var req NewSandbox
	if err := s.decode(c, &req, true); err != nil {
		return err
	}
	if req.TemplateID == "" {
		return badinput.New("templateID", "is required: a pool (GET /v1/pools), %q for the default pool, or an image", DefaultTemplate)
	}
	for _, f := range []struct {
		name string
		v    []byte
	}{{"mcp", req.MCP}, {"iam", req.IAM}, {"volumeMounts", req.VolumeMounts}} {
		if v := strings.TrimSpace(string(f.v)); v != "" && v != "null" && v != "[]" && v != "{}" {
			return badinput.New(f.name, "is not supported by Quarry")
		}
	}
	if err := s.timeoutOf("timeout", req.Timeout); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(c.UserContext(), s.cfg.CreateTimeout)
	defer cancel()
	areq := warmpool.AcquireRequest{Owner: owner, LeaseSeconds: req.Timeout, Env: req.EnvVars, Labels: req.Metadata}
	var lease warmpool.Lease
	if s.isSnapshot(req.TemplateID) {
		lease, err = s.ck.AcquireFrom(ctx, areq, req.TemplateID)
	} else if areq.Pool, err = s.poolOf(ctx, owner, req.TemplateID); err == nil {
		lease, _, err = s.leases.Acquire(ctx, areq)
	}
	if err != nil {
		return err
	}
	sbx := s.sandboxOf(lease)
	sbx.TemplateID = req.TemplateID
	return c.Status(http.StatusCreated).JSON(sbx)
}

// poolOf resolves a templateID: a pool of that name; else E2B's default
// template, "base", is the default pool; else, with images on demand, the
// on-demand pool of the image it names. Without the ImagePools capability a
// templateID is taken for a pool's name ("base" for the default pool).
func (s *Service) poolOf(ctx context.Context, owner, template string) (string, error) {
	if s.pools == nil {
		if template == DefaultTemplate {
			return s.cfg.DefaultPool, nil
		}
		return template, nil
	}
	_, err := s.pools.Pool(ctx, template)
	switch {
	case err == nil:
		return template, nil
	case !errors.Is(err, warmpool.ErrNotFound):
		return "", err
	case template == DefaultTemplate:
		return s.cfg.DefaultPool, nil
	}
	pool, err := s.pools.ImagePool(ctx, warmpool.ImageRequest{Image: template, Owner: owner})
	var bad *badinput.Error
	if errors.As(err, &bad) {
		return "", badinput.New("templateID", "%q names no pool, and no image on demand: %s", template, bad.Error())
	}
	return pool, err
}

// templateOf is the templateID a lease reports: its image for an on-demand
// pool, else its pool.
func templateOf(l warmpool.Lease) string {
	if strings.HasPrefix(l.Pool, warmpool.OnDemandPrefix) && l.Image != "" {
		return l.Image
	}
	return l.Pool
}

// domain is Sandbox.domain: Config.Domain, or null.
func (s *Service) domain() *string {
	if s.cfg.Domain == "" {
		return nil
	}
	d := s.cfg.Domain
	return &d
}

// sandboxOf is the Sandbox of a lease.
func (s *Service) sandboxOf(l warmpool.Lease) Sandbox {
	return Sandbox{TemplateID: templateOf(l), SandboxID: l.ID, ClientID: clientID, EnvdVersion: EnvdVersion,
		EnvdAccessToken: s.token(l), Domain: s.domain()}
}

// active reads lease id of owner and returns it while it may be used: an
// ended one is its *warmpool.LeaseEndedError (answered 404, as E2B answers
// for a killed sandbox).
func (s *Service) active(ctx context.Context, id, owner string) (warmpool.Lease, error) {
	l, err := s.leases.Get(ctx, id, owner)
	if err != nil {
		return l, errclass.Sandbox(id, err)
	}
	if gone := l.Ended(s.clock.Now()); gone != nil {
		return l, errclass.Sandbox(id, gone)
	}
	return l, nil
}

// activeWith reads c's optional JSON body into req, then the active lease
// id of owner.
func (s *Service) activeWith(ctx context.Context, c *fiber.Ctx, id, owner string, req any) (warmpool.Lease, error) {
	if err := s.decode(c, req, false); err != nil {
		return warmpool.Lease{}, err
	}
	return s.active(ctx, id, owner)
}

// sandboxFunc serves one route of a sandbox (the path's id) for an
// authenticated owner, its lease-store calls bounded by ctx.
type sandboxFunc func(ctx context.Context, c *fiber.Ctx, id, owner string) error

// sandbox wraps fn: the path's id checked, ctx bounded by ManagerTimeout.
func (s *Service) sandbox(fn sandboxFunc) handlerFunc {
	return func(c *fiber.Ctx, owner string) error {
		id, err := sandboxID(c)
		if err != nil {
			return err
		}
		ctx, cancel := s.withTimeout(c)
		defer cancel()
		return fn(ctx, c, id, owner)
	}
}

// sandboxID is the path's id: a sandbox's, or a template's.
func sandboxID(c *fiber.Ctx) (string, error) {
	id := c.Params("id")
	if !validID([]byte(id)) {
		return "", badinput.New("id", "must be 1 to %d letters, digits, '.', '_' or '-', not starting with '.'", maxID)
	}
	return strings.Clone(id), nil
}

// connect handles POST /sandboxes/{id}/connect (and /v2/...): 200 with
// the sandbox, its time to live extended (never shortened) to timeout
// seconds from now when the body names one.
//
// A paused sandbox is resumed first, and answered 201 (E2B: resumed).
func (s *Service) connect(ctx context.Context, c *fiber.Ctx, id, owner string) error {
	var req TimeoutRequest
	lease, err := s.activeWith(ctx, c, id, owner, &req)
	if err != nil {
		return err
	}
	status := fiber.StatusOK
	if !lease.PausedAt.IsZero() && s.pauser != nil {
		if lease, err = s.pauser.Resume(ctx, id, owner); err != nil {
			return errclass.Sandbox(id, err)
		}
		status = fiber.StatusCreated
	}
	if req.Timeout != nil {
		if lease, err = s.extend(ctx, lease, owner, "timeout", *req.Timeout); err != nil {
			return err
		}
	}
	return c.Status(status).JSON(s.sandboxOf(lease))
}

// pause handles POST /sandboxes/{id}/pause: 204 once the sandbox is
// frozen (its body, {memory}, is read and ignored: a frozen container
// keeps its memory); 409 when it is paused already.
func (s *Service) pause(ctx context.Context, c *fiber.Ctx, id, owner string) error {
	var body json.RawMessage
	if _, err := s.activeWith(ctx, c, id, owner, &body); err != nil {
		return err
	}
	if _, err := s.pauser.Pause(ctx, id, owner); err != nil {
		return errclass.Sandbox(id, err)
	}
	return c.SendStatus(fiber.StatusNoContent)
}

// resume handles POST /sandboxes/{id}/resume (deprecated by E2B for
// connect): 201 with the sandbox, its time to live extended to the body's
// timeout when that is later; 409 when it is not paused.
func (s *Service) resume(ctx context.Context, c *fiber.Ctx, id, owner string) error {
	var req TimeoutRequest
	if _, err := s.activeWith(ctx, c, id, owner, &req); err != nil {
		return err
	}
	lease, err := s.pauser.Resume(ctx, id, owner)
	if err != nil {
		return errclass.Sandbox(id, err)
	}
	if req.Timeout != nil {
		if lease, err = s.extend(ctx, lease, owner, "timeout", *req.Timeout); err != nil {
			return err
		}
	}
	return c.Status(fiber.StatusCreated).JSON(s.sandboxOf(lease))
}

// extend moves lease's expiry to secs from now if that is later.
func (s *Service) extend(ctx context.Context, lease warmpool.Lease, owner, field string, secs int) (warmpool.Lease, error) {
	if err := s.timeoutOf(field, secs); err != nil {
		return lease, err
	}
	at := s.clock.Now().Add(time.Duration(secs) * time.Second)
	if !at.After(lease.ExpiresAt) {
		return lease, nil
	}
	return s.expire(ctx, lease.ID, owner, at)
}

// expire sets lease id's expiry to at (SetExpiry), or heartbeats it without
// the Expirer capability.
func (s *Service) expire(ctx context.Context, id, owner string, at time.Time) (warmpool.Lease, error) {
	var (
		l   warmpool.Lease
		err error
	)
	if s.expirer != nil {
		l, err = s.expirer.SetExpiry(ctx, id, owner, at)
	} else {
		l, err = s.leases.Heartbeat(ctx, id, owner)
	}
	if err != nil {
		return l, s.ended(id, l, err)
	}
	return l, nil
}

// ended says how lease l ended when err is warmpool.ErrLeaseEnded, for the
// sandbox's message; other errors are classified for the sandbox as they
// are.
func (s *Service) ended(id string, l warmpool.Lease, err error) error {
	if errors.Is(err, warmpool.ErrLeaseEnded) {
		if gone := l.Ended(s.clock.Now()); gone != nil {
			return errclass.Sandbox(id, gone)
		}
	}
	return errclass.Sandbox(id, err)
}

// setTimeout handles POST /sandboxes/{id}/timeout: the sandbox expires
// timeout seconds from now (sooner or later than it would have); 204.
func (s *Service) setTimeout(ctx context.Context, c *fiber.Ctx, id, owner string) error {
	var req TimeoutRequest
	if err := s.decode(c, &req, true); err != nil {
		return err
	}
	if req.Timeout == nil {
		return badinput.New("timeout", "is required: seconds from now")
	}
	if err := s.timeoutOf("timeout", *req.Timeout); err != nil {
		return err
	}
	// A timeout of 0 ends the sandbox at once: a second from now.
	secs := max(*req.Timeout, 1)
	if _, err := s.expire(ctx, id, owner, s.clock.Now().Add(time.Duration(secs)*time.Second)); err != nil {
		return err
	}
	return c.SendStatus(http.StatusNoContent)
}

// refresh handles POST /sandboxes/{id}/refreshes: the time to live extended
// to duration seconds from now (at most 3600), or by the lease's own
// duration without one; 204.
func (s *Service) refresh(ctx context.Context, c *fiber.Ctx, id, owner string) error {
	var req RefreshRequest
	if err := s.decode(c, &req, false); err != nil {
		return err
	}
	if req.Duration == nil {
		if l, err := s.leases.Heartbeat(ctx, id, owner); err != nil {
			return s.ended(id, l, err)
		}
		return c.SendStatus(http.StatusNoContent)
	}
	if d := *req.Duration; d < 0 || d > 3600 {
		return badinput.New("duration", "must be from 0 to 3600 seconds, got %d", d)
	}
	lease, err := s.active(ctx, id, owner)
	if err != nil {
		return err
	}
	if _, err := s.extend(ctx, lease, owner, "duration", *req.Duration); err != nil {
		return err
	}
	return c.SendStatus(http.StatusNoContent)
}

// get handles GET /sandboxes/{id}: the sandbox's detail; one that ended is
// 404.
func (s *Service) get(ctx context.Context, c *fiber.Ctx, id, owner string) error {
	l, err := s.active(ctx, id, owner)
	if err != nil {
		return err
	}
	cpu, mem, disk := s.resources(ctx, l.Pool)
	return c.JSON(SandboxDetail{ListedSandbox: listedOf(l, cpu, mem, disk),
		EnvdAccessToken: s.token(l), Domain: s.domain(), Lifecycle: &Lifecycle{OnTimeout: OnTimeoutKill}})
}

// listedOf is what every sandbox's listing says of lease l, whose pool has
// cpu, mem and disk.
func listedOf(l warmpool.Lease, cpu, mem, disk int) ListedSandbox {
	return ListedSandbox{TemplateID: templateOf(l), SandboxID: l.ID, ClientID: clientID,
		StartedAt: l.CreatedAt.UTC(), EndAt: l.ExpiresAt.UTC(), CPUCount: cpu, MemoryMB: mem, DiskSizeMB: disk,
		Metadata: l.Labels, State: stateOf(l), EnvdVersion: EnvdVersion}
}

// stateOf is E2B's state of lease l: paused or running.
func stateOf(l warmpool.Lease) string {
	if !l.PausedAt.IsZero() {
		return StatePaused
	}
	return StateRunning
}

// resources are a pool's CPUs (whole, at least 1), memory in MiB (at least
// 128, the spec's minimum) and disk in MiB (0: unbounded), from its
// configuration when the ImagePools capability reads it; the minimums
// otherwise.
func (s *Service) resources(ctx context.Context, pool string) (cpu, memMiB, diskMiB int) {
	cpu, memMiB = 1, 128
	if s.pools == nil {
		return cpu, memMiB, 0
	}
	p, err := s.pools.Pool(ctx, pool)
	if err != nil {
		return cpu, memMiB, 0
	}
	return max(cpu, int(math.Ceil(p.CPU))), max(memMiB, int(p.Memory)), int(p.Disk)
}

// kill handles DELETE /sandboxes/{id}: the lease released; 204. One that
// ended is 404 (the SDK's kill then answers False).
func (s *Service) kill(ctx context.Context, c *fiber.Ctx, id, owner string) error {
	if l, err := s.leases.Release(ctx, id, owner); err != nil {
		return s.ended(id, l, err)
	}
	return c.SendStatus(http.StatusNoContent)
}

// logs handles GET /sandboxes/{id}/logs and /v2/sandboxes/{id}/logs, and
// metrics GET /sandboxes/{id}/metrics: Quarry records neither, so a sandbox
// the caller holds (in any state) has empty ones.
func (s *Service) logs(ctx context.Context, c *fiber.Ctx, id, owner string) error {
	if _, err := s.leases.Get(ctx, id, owner); err != nil {
		return errclass.Sandbox(id, err)
	}
	if strings.HasPrefix(c.Path(), "/v2/") {
		return c.JSON(SandboxLogsV2{Logs: []json.RawMessage{}})
	}
	return c.JSON(SandboxLogs{Logs: []json.RawMessage{}, LogEntries: []json.RawMessage{}})
}

func (s *Service) metrics(ctx context.Context, c *fiber.Ctx, id, owner string) error {
	if _, err := s.leases.Get(ctx, id, owner); err != nil {
		return errclass.Sandbox(id, err)
	}
	return c.JSON([]json.RawMessage{})
}

// list handles GET /v2/sandboxes?metadata=&state=&limit=&nextToken=: the
// caller's running sandboxes, newest first, with the labels metadata
// names; X-Next-Token names the next page. nextToken is an offset into
// that list (LeaseFilter has no cursor): a page reads offset + limit + 1
// leases through the owner's index, at most the manager's list bound.
func (s *Service) list(c *fiber.Ctx, owner string) error {
	args := c.Context().QueryArgs()
	labels, err := metadataFilter(string(args.Peek("metadata")))
	if err != nil {
		return err
	}
	states, err := statesOf(string(args.Peek("state")))
	if err != nil {
		return err
	}
	if o := string(args.Peek("order")); o != "" && o != "desc" {
		return badinput.New("order", "Quarry lists sandboxes newest first (desc), got %q", o)
	}
	var after time.Time
	if v := string(args.Peek("startedAfter")); v != "" {
		if after, err = time.Parse(time.RFC3339Nano, v); err != nil {
			return badinput.New("startedAfter", "must be an RFC 3339 time, got %q", v)
		}
	}
	limit, offset, err := pageOf(args.Peek)
	if err != nil {
		return err
	}
	out := []ListedSandbox{}
	ctx, cancel := s.withTimeout(c)
	defer cancel()
	f := warmpool.LeaseFilter{Owner: owner, State: warmpool.LeaseActive, Labels: labels, Limit: offset + limit + 1}
	if len(states) == 1 {
		f.Limit = 0 // one state: read the owner's leases (the manager's list bound), then page the matches
	}
	ls, err := s.leases.List(ctx, f)
	if err != nil {
		return err
	}
	if len(states) == 1 {
		ls = slices.DeleteFunc(ls, func(l warmpool.Lease) bool { return !states[stateOf(l)] })
	}
	more := len(ls) > offset+limit
	type res struct{ cpu, mem, disk int }
	pools := map[string]res{} // each pool's configuration read once
	for i := offset; i < len(ls) && i < offset+limit; i++ {
		l := ls[i]
		if !after.IsZero() && l.CreatedAt.Before(after) {
			more = false // newest first: every later one started before too
			break
		}
		r, ok := pools[l.Pool]
		if !ok {
			r.cpu, r.mem, r.disk = s.resources(ctx, l.Pool)
			pools[l.Pool] = r
		}
		out = append(out, listedOf(l, r.cpu, r.mem, r.disk))
	}
	if more {
		c.Set(HeaderNextToken, strconv.Itoa(offset+limit))
	}
	return c.JSON(out)
}

// metadataFilter parses the metadata query of a list: "k=v&k2=v2" with
// each key and value URL-encoded (the SDK encodes them, then the whole).
func metadataFilter(q string) (map[string]string, error) {
	if q == "" {
		return nil, nil
	}
	vals, err := url.ParseQuery(q)
	if err != nil {
		return nil, badinput.New("metadata", "must be k=v pairs joined by &, each URL-encoded: %s", err.Error())
	}
	out := make(map[string]string, len(vals))
	for k, v := range vals {
		if len(v) != 1 {
			return nil, badinput.New("metadata", "key %q is given %d times", k, len(v))
		}
		out[k] = v[0]
	}
	return out, nil
}

// statesOf reads the state filter of a list (comma-separated running,
// paused; none: both).
func statesOf(q string) (map[string]bool, error) {
	if q == "" {
		return map[string]bool{StateRunning: true, StatePaused: true}, nil
	}
	out := map[string]bool{}
	for _, st := range strings.Split(q, ",") {
		switch st {
		case StateRunning, StatePaused:
			out[st] = true
		default:
			return nil, badinput.New("state", "must be %s or %s, got %q", StateRunning, StatePaused, st)
		}
	}
	return out, nil
}

// pageOf reads a page's limit (1 to 100, default 100) and nextToken (an
// offset, default 0) from a query (peek).
func pageOf(peek func(string) []byte) (limit, offset int, err error) {
	if limit, err = intArg(string(peek("limit")), "limit", defaultListLimit, 1, maxListLimit); err != nil {
		return 0, 0, err
	}
	offset, err = intArg(string(peek("nextToken")), "nextToken", 0, 0, math.MaxInt32)
	return limit, offset, err
}

// intArg parses a query integer from lo to hi; def when absent.
func intArg(v, name string, def, lo, hi int) (int, error) {
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		return 0, badinput.New(name, "must be an integer from %d to %d, got %q", lo, hi, v)
	}
	return n, nil
}
