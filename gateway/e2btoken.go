package gateway

import (
	"context"
	"crypto/subtle"
	"errors"
	"strconv"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/quarryhq/quarry/e2bcompat"
	"github.com/quarryhq/quarry/errclass"
	"github.com/quarryhq/quarry/warmpool"
)

// E2B's envdAccessToken (docs/ARCHITECTURE.md, "E2B's routes"): a token the
// gateway signs for one lease (tokenSigner, its own domain), sent by the SDK
// as X-Access-Token on the data plane and hashed into the signatures of its
// file URLs. It is a pure function of the lease, so every replica mints the
// same one; it is never an API key.

// envdDomain separates envdAccessTokens from preview tokens.
const envdDomain = "quarry-e2b-envd-v1\x00"

// envdTokenLifetime is how long after its lease's creation an
// envdAccessToken is accepted: the longest lease a create may ask for. The
// lease's end (or a new generation) ends it earlier.
const envdTokenLifetime = maxLeaseSeconds * time.Second

// envdClaims is what an envdAccessToken says: the sandbox, its lease's
// generation and owner, and its expiry.
type envdClaims struct {
	Sandbox    string `json:"sbx"`
	Generation int64  `json:"gen"`
	Owner      string `json:"own"`
	Expires    int64  `json:"exp"` // unix seconds
}

// envdToken returns lease l's envdAccessToken.
func (g *Gateway) envdToken(l warmpool.Lease) string {
	return g.preview.seal(envdDomain, envdClaims{
		Sandbox: l.ID, Generation: l.Generation, Owner: l.Owner,
		Expires: l.CreatedAt.Add(envdTokenLifetime).Unix(),
	})
}

// errAccess is the 401 of a refused envdAccessToken or file signature.
func errAccess(msg string) error {
	return errclass.Unauthorized("E2B access refused: " + msg)
}

// verifyEnvdToken checks an envdAccessToken's signature and that it is for
// sandbox id and unexpired at now. The lease checks (active, the claims'
// owner and generation) are the fence's (sandboxGrant).
func (g *Gateway) verifyEnvdToken(tok, id string, now time.Time) (envdClaims, error) {
	var cl envdClaims
	if err := g.preview.open(envdDomain, tok, &cl); err != nil {
		return cl, errAccess(err.Error() + " (send the envdAccessToken the sandbox was created or connected with as " + e2bcompat.HeaderAccessToken + ")")
	}
	switch {
	case cl.Sandbox != id:
		return cl, errAccess("the access token is for another sandbox")
	case !now.Before(time.Unix(cl.Expires, 0)):
		return cl, errAccess("the access token expired at " + time.Unix(cl.Expires, 0).UTC().Format(time.RFC3339))
	}
	return cl, nil
}

// signedFileGrant admits a signed file URL (GET /files to read, POST /files
// to write) of sandbox id: its signature must be the SDK's over the token
// the gateway mints for the sandbox's lease (e2bcompat.FileSignature), and
// its expiration, when it has one, in the future. ok is false for a request
// that carries no signature. A signed URL names no owner, so the lease is
// read as each configured key's owner in turn (the first read fills the
// lease cache; no other owner sees the lease).
func (g *Gateway) signedFileGrant(c *fiber.Ctx, id string) (grant sandboxGrant, ok bool, err error) {
	args := c.Context().QueryArgs()
	sig := args.Peek("signature")
	if len(sig) == 0 || c.Path() != "/files" {
		return sandboxGrant{}, false, nil
	}
	op := e2bcompat.OpRead
	switch c.Method() {
	case fiber.MethodGet:
	case fiber.MethodPost:
		op = e2bcompat.OpWrite
	default:
		return sandboxGrant{}, true, errAccess("a signed file URL is for GET (download) or POST (upload) /files")
	}
	var exp int64
	if v := args.Peek("signature_expiration"); len(v) > 0 {
		if exp, err = strconv.ParseInt(string(v), 10, 64); err != nil || exp <= 0 {
			return sandboxGrant{}, true, errAccess("malformed signature_expiration: want unix seconds")
		}
		if !g.clock.Now().Before(time.Unix(exp, 0)) {
			return sandboxGrant{}, true, errAccess("the signed URL expired at " + time.Unix(exp, 0).UTC().Format(time.RFC3339))
		}
	}
	lease, err := g.leaseOfAnyKey(c.UserContext(), id)
	if err != nil {
		return sandboxGrant{}, true, errclass.Sandbox(id, err)
	}
	want := e2bcompat.FileSignature(string(args.Peek("path")), op, string(args.Peek("username")), g.envdToken(lease), exp)
	if subtle.ConstantTimeCompare(sig, []byte(want)) != 1 {
		return sandboxGrant{}, true, errAccess("the file URL's signature does not match (made for another path, user, operation or sandbox, or changed)")
	}
	return sandboxGrant{owner: lease.Owner, generation: lease.Generation, fenced: true}, true, nil
}

// leaseOfAnyKey reads lease id as the owner of each configured API key
// until one owns it; warmpool.ErrNotFound when none does.
func (g *Gateway) leaseOfAnyKey(ctx context.Context, id string) (warmpool.Lease, error) {
	err := error(warmpool.ErrNotFound)
	seen := make(map[string]bool, len(g.keys))
	for _, k := range g.keys {
		if seen[k.owner] {
			continue
		}
		seen[k.owner] = true
		var l warmpool.Lease
		if l, err = g.usableLease(ctx, id, k.owner); !errors.Is(err, warmpool.ErrNotFound) {
			return l, err
		}
	}
	return warmpool.Lease{}, err
}
