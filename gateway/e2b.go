package gateway

import (
	"context"
	"io"

	"github.com/gofiber/fiber/v2"

	"github.com/quarryhq/quarry/checkpoints"
	"github.com/quarryhq/quarry/checkpoints/ckflow"
	"github.com/quarryhq/quarry/e2bcompat"
	"github.com/quarryhq/quarry/warmpool"
)

// newE2B builds E2B's control plane over the gateway's manager: its leases
// (SetExpiry and images on demand when the manager has them), the owner the
// credential stored, and the envdAccessToken of e2btoken.go.
func (g *Gateway) newE2B() (*e2bcompat.Service, error) {
	return e2bcompat.New(e2bcompat.Config{
		DefaultPool:    g.cfg.DefaultPool,
		Domain:         g.cfg.E2BDomain,
		MaxJSONBody:    g.cfg.MaxJSONBody,
		MaxTimeout:     maxLeaseSeconds,
		CreateTimeout:  g.cfg.CreateTimeout,
		ManagerTimeout: g.cfg.ManagerTimeout,
		RetryAfter:     g.cfg.RetryAfter,
	}, e2bcompat.Deps{
		Leases: g.mgr,
		Owner:  ownerOf,
		Token:  g.envdToken,
		Body: func(c *fiber.Ctx, limit int64) (io.Reader, error) {
			return openBody(c, limit)
		},
		Checkpoints: g.e2bCheckpoints(),
		Logger:      g.log.With("api", "e2b"),
		Clock:       g.clock,
	})
}

// e2bCheckpoints gives E2B's fork and snapshots the checkpoint workflows,
// or nil when the gateway has no checkpoint store.
func (g *Gateway) e2bCheckpoints() e2bcompat.Checkpoints {
	if g.ck.flow == nil {
		return nil
	}
	return e2bCheckpoints{flow: g.ck.flow}
}

// e2bCheckpoints is e2bcompat.Checkpoints over ckflow: a snapshot or fork
// archives the sandbox's work directory.
type e2bCheckpoints struct{ flow *ckflow.Service }

var _ e2bcompat.Checkpoints = e2bCheckpoints{}

func (e e2bCheckpoints) Fork(ctx context.Context, lease warmpool.Lease, count, leaseSeconds int) ([]warmpool.Lease, []error, error) {
	_, forks, err := e.flow.Fork(ctx, lease, ckflow.ForkRequest{Count: count, LeaseSeconds: leaseSeconds, Labels: lease.Labels})
	if err != nil {
		return nil, nil, err
	}
	leases, errs := make([]warmpool.Lease, len(forks)), make([]error, len(forks))
	for i, f := range forks {
		leases[i], errs[i] = f.Lease, f.Err
	}
	return leases, errs, nil
}

func (e e2bCheckpoints) Take(ctx context.Context, lease warmpool.Lease, labels map[string]string) (checkpoints.Checkpoint, error) {
	return e.flow.Take(ctx, lease, ckflow.TakeRequest{Labels: labels})
}

func (e e2bCheckpoints) Get(ctx context.Context, id, owner string) (checkpoints.Checkpoint, error) {
	return e.flow.Get(ctx, id, owner)
}

func (e e2bCheckpoints) List(ctx context.Context, owner string, limit int) ([]checkpoints.Checkpoint, error) {
	return e.flow.List(ctx, checkpoints.Filter{Owner: owner, Limit: limit})
}

func (e e2bCheckpoints) Delete(ctx context.Context, id, owner string) error {
	return e.flow.Delete(ctx, id, owner)
}

func (e e2bCheckpoints) AcquireFrom(ctx context.Context, req warmpool.AcquireRequest, id string) (warmpool.Lease, error) {
	ck, pool, err := e.flow.Resolve(ctx, req.Owner, id, "")
	if err != nil {
		return warmpool.Lease{}, err
	}
	req.Pool = pool
	lease, _, err := e.flow.AcquireRestored(ctx, req, ck)
	return lease, err
}

// e2bRoutes lists E2B's control-plane routes (docs/ARCHITECTURE.md, "E2B's
// routes"), each with credE2BKey. The data plane is routed before the route
// table (e2broute.go).
func (g *Gateway) e2bRoutes() []route {
	var out []route
	for _, rt := range g.e2b.Routes() {
		out = append(out, route{method: rt.Method, path: rt.Path, cred: credE2BKey, handler: rt.Handler})
	}
	return out
}
