package gateway

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net/http"

	"github.com/gofiber/fiber/v2"
	"github.com/valyala/fasthttp"

	"github.com/quarryhq/quarry/e2bcompat"
	"github.com/quarryhq/quarry/errclass"
	"github.com/quarryhq/quarry/modelservice"
	"github.com/quarryhq/quarry/rockcompat"
	"github.com/quarryhq/quarry/warmpool"
)

// ownerLocal is the fiber Locals key of the authenticated caller's owner id.
const ownerLocal = "quarry.owner"

// OwnerOf returns the lease owner recorded for leases created with apiKey: a
// hex SHA-256 of the key (domain separated, truncated to 128 bits), never the
// key itself. It is a pure function, safe for concurrent use.
func OwnerOf(apiKey string) string {
	sum := sha256.Sum256([]byte("quarry-owner\x00" + apiKey))
	return hex.EncodeToString(sum[:16])
}

// apiKey is one accepted key: its SHA-256 (what requests are compared with)
// and its owner id.
type apiKey struct {
	hash  [sha256.Size]byte
	owner string
}

// keyring checks bearer keys in constant time. It is immutable after
// newKeyring and safe for concurrent use.
type keyring []apiKey

func newKeyring(keys []string) keyring {
	kr := make(keyring, 0, len(keys))
	for _, k := range keys {
		kr = append(kr, apiKey{hash: sha256.Sum256([]byte(k)), owner: OwnerOf(k)})
	}
	return kr
}

// owner returns the owner of key, comparing hashes in constant time against
// every configured key (so neither the match nor its position leaks through
// timing).
func (kr keyring) owner(key []byte) (string, bool) {
	sum := sha256.Sum256(key)
	found := ""
	for i := range kr {
		if subtle.ConstantTimeCompare(sum[:], kr[i].hash[:]) == 1 {
			found = kr[i].owner
		}
	}
	return found, found != ""
}

// credential is how the caller of a route proves who it is. Every route
// names one (route.cred); register puts its check before the handler
// (admit), so no handler reads a credential itself.
type credential uint8

const (
	// credNone: public (health, the OpenAPI document, the console's
	// static files: the page sends the API key on every call it makes).
	credNone credential = iota + 1
	// credAPIKey: Authorization: Bearer <API key>.
	credAPIKey
	// credAPIKeyOrWS: credAPIKey or, for browsers, which cannot set
	// headers on a WebSocket, the subprotocol quarry.auth.<base64url(key)>.
	// Never a query parameter.
	credAPIKeyOrWS
	// credRelayToken: the lease's relay token as Authorization: Bearer
	// (the sandbox side of the model relay); the lease it names is read
	// and kept for the handler (relayLeaseOf).
	credRelayToken
	// credPreviewOrKey: a preview token for the path's sandbox and port
	// (query quarry_preview or its cookie), else credAPIKey. The token's
	// grant is kept for the fence (grantedLease), which checks the lease
	// generation it names.
	credPreviewOrKey
	// credRock: the API key sent any way ROCK's SDK sends it (rockKey);
	// refusals in ROCK's envelope.
	credRock
	// credE2BKey: E2B's control plane: X-API-KEY: <API key>; refusals in
	// E2B's Error body.
	credE2BKey
	// credE2BEnvd: E2B's data plane on envd's port (e2broute.go): the
	// sandbox's envdAccessToken as X-Access-Token (e2btoken.go), or a
	// signed file URL. The grant (owner, generation) is kept for the fence
	// (grantedLease).
	credE2BEnvd
	// credE2BPort: E2B's data plane on any other port: the
	// envdAccessToken, else a preview token for the sandbox and port (as
	// credPreviewOrKey), else credAPIKey.
	credE2BPort
)

// String names the credential as openapi.json's security schemes do.
func (k credential) String() string {
	switch k {
	case credNone:
		return "none"
	case credAPIKey, credAPIKeyOrWS, credRock:
		return "apiKey"
	case credRelayToken:
		return "relayToken"
	case credPreviewOrKey:
		return "apiKey|previewToken"
	case credE2BKey:
		return "e2bApiKey"
	case credE2BEnvd:
		return "e2bAccessToken"
	case credE2BPort:
		return "e2bAccessToken|apiKey|previewToken"
	}
	return "unset"
}

// admit returns the middleware that checks credential k, or nil for
// credNone. It panics on a credential no route may have (a route table
// without one is a programming error, TestRoutes_EveryRouteHasACredential).
func (g *Gateway) admit(k credential) fiber.Handler {
	switch k {
	case credNone:
		return nil
	case credAPIKey:
		return g.authenticate
	case credAPIKeyOrWS:
		return g.authenticateWS
	case credRelayToken:
		return g.authenticateRelay
	case credPreviewOrKey:
		return g.authenticatePreview
	case credRock:
		return g.rockAuth
	case credE2BKey:
		return g.authenticateE2B
	case credE2BEnvd, credE2BPort:
		return func(c *fiber.Ctx) error {
			t, _ := c.Locals(e2bTargetLocal).(*e2bcompat.Target)
			if t == nil {
				return errclass.Unauthorized("no sandbox named: send " + e2bcompat.HeaderSandboxID + " and " + e2bcompat.HeaderSandboxPort)
			}
			if err := g.admitSandbox(c, k, *t); err != nil {
				return err
			}
			return c.Next()
		}
	}
	panic(fmt.Sprintf("gateway: a route without a credential (%d)", k))
}

// bearerToken parses an Authorization value "Bearer <token>": the scheme
// is case-insensitive and the token trimmed. ok is false for another scheme
// or none. It is the one bearer parser of every credential.
func bearerToken(v []byte) (tok []byte, ok bool) {
	const prefix = "Bearer "
	if len(v) < len(prefix) || !bytes.EqualFold(v[:len(prefix)], []byte(prefix)) {
		return nil, false
	}
	return bytes.TrimSpace(v[len(prefix):]), true
}

// basicCredentials parses an Authorization value "Basic base64(user:password)"
// (the scheme case-insensitive). ok is false for another scheme, bad base64
// or no ':'. It is the one Basic parser of every credential.
func basicCredentials(v []byte) (user, password []byte, ok bool) {
	const prefix = "Basic "
	if len(v) <= len(prefix) || !bytes.EqualFold(v[:len(prefix)], []byte(prefix)) {
		return nil, nil, false
	}
	dec, err := base64.StdEncoding.DecodeString(string(bytes.TrimSpace(v[len(prefix):])))
	if err != nil {
		return nil, nil, false
	}
	return bytes.Cut(dec, []byte(":"))
}

// authenticate is the middleware of credAPIKey: it answers 401 for a
// missing or wrong key and stores the caller's owner id.
func (g *Gateway) authenticate(c *fiber.Ctx) error {
	if err := g.checkKey(c); err != nil {
		return err
	}
	return c.Next()
}

// checkKey is authenticate without going on to the next handler.
func (g *Gateway) checkKey(c *fiber.Ctx) error {
	h := c.Request().Header.Peek(fiber.HeaderAuthorization)
	if len(h) == 0 {
		return errclass.Unauthorized("missing API key: send Authorization: Bearer <api key>")
	}
	key, ok := bearerToken(h)
	if !ok {
		return errclass.Unauthorized("malformed Authorization header: expected Bearer <api key>")
	}
	return g.admitKey(c, key)
}

// admitKey checks key and stores its owner; a missing or unknown key is
// 401.
func (g *Gateway) admitKey(c *fiber.Ctx, key []byte) error {
	owner, ok := g.keyOwner(key)
	if !ok {
		return errclass.Unauthorized("invalid API key")
	}
	c.Locals(ownerLocal, owner)
	return nil
}

// keyOwner returns the owner of an API key, false for a key that is empty,
// too long or unknown.
func (g *Gateway) keyOwner(key []byte) (string, bool) {
	if len(key) == 0 || len(key) > maxAPIKeyLen {
		return "", false
	}
	return g.keys.owner(key)
}

// ownerOf returns the owner stored by a credential's middleware.
func ownerOf(c *fiber.Ctx) string {
	s, _ := c.Locals(ownerLocal).(string)
	return s
}

// wsAuthKey returns the API key a browser carries in the quarry.auth.
// subprotocol, or nil.
func wsAuthKey(h *fasthttp.RequestHeader) ([]byte, error) {
	for _, p := range bytes.Split(h.Peek(fiber.HeaderSecWebSocketProtocol), []byte(",")) {
		enc, ok := bytes.CutPrefix(bytes.TrimSpace(p), []byte(WSAuthProtocolPrefix))
		if !ok {
			continue
		}
		key, err := base64.RawURLEncoding.AppendDecode(nil, enc)
		if err != nil {
			return nil, errclass.Unauthorized("malformed " + WSAuthProtocolPrefix + " subprotocol: want base64url(API key) without padding")
		}
		return key, nil
	}
	return nil, nil
}

// authenticateWS is the middleware of credAPIKeyOrWS: the Authorization
// header as on every route or, for browsers, the API key in the subprotocol
// quarry.auth.<base64url(key)>. Never a query parameter.
func (g *Gateway) authenticateWS(c *fiber.Ctx) error {
	if len(c.Request().Header.Peek(fiber.HeaderAuthorization)) > 0 {
		return g.authenticate(c)
	}
	key, err := wsAuthKey(&c.Request().Header)
	if err != nil {
		return err
	}
	if key == nil {
		return errclass.Unauthorized("missing API key: send Authorization: Bearer <api key> or the subprotocol " + WSAuthProtocolPrefix + "<base64url(api key)>")
	}
	if err := g.admitKey(c, key); err != nil {
		return err
	}
	return c.Next()
}

// relayLeaseLocal is the fiber Locals key of the lease credRelayToken
// authenticated.
const relayLeaseLocal = "quarry.relayLease"

// authenticateRelay is the middleware of credRelayToken: the relay token
// names an active lease, which the handler gets from relayLeaseOf. Without
// a model relay its routes answer 404 first.
func (g *Gateway) authenticateRelay(c *fiber.Ctx) error {
	lease, err := g.relayLease(c)
	if err != nil {
		return err
	}
	c.Locals(relayLeaseLocal, &lease)
	return c.Next()
}

// relayLeaseOf returns the lease authenticateRelay stored.
func relayLeaseOf(c *fiber.Ctx) warmpool.Lease {
	if l, _ := c.Locals(relayLeaseLocal).(*warmpool.Lease); l != nil {
		return *l
	}
	return warmpool.Lease{}
}

// relayToken returns the relay token of c (401 when there is none).
func relayToken(c *fiber.Ctx) (string, error) {
	h := c.Request().Header.Peek(fiber.HeaderAuthorization)
	if len(h) == 0 {
		return "", errclass.Unauthorized("missing relay token: send Authorization: Bearer $OPENAI_API_KEY")
	}
	tok, ok := bearerToken(h)
	if !ok {
		return "", errclass.Unauthorized("malformed Authorization header: expected Bearer <relay token>")
	}
	if len(tok) == 0 || len(tok) > maxAPIKeyLen {
		return "", modelservice.ErrBadToken
	}
	return string(tok), nil
}

// previewGrant is an admitted preview token: its claims, the token, and
// whether it came in the query (the handler then sets its cookie).
type previewGrant struct {
	claims    previewClaims
	token     string
	fromQuery bool
}

// authenticatePreview is the middleware of credPreviewOrKey: a preview
// token signed for the path's sandbox and port and not expired admits its
// owner; without a token, the API key.
func (g *Gateway) authenticatePreview(c *fiber.Ctx) error {
	id, port, err := portPathParams(c)
	if err != nil {
		return err
	}
	if ok, err := g.admitPreview(c, id, port); err != nil {
		return err
	} else if !ok {
		return g.authenticate(c)
	}
	return c.Next()
}

// admitPreview admits the preview token of a call to a sandbox's port, when
// it carries one (ok): its owner and its grant are kept for the fence
// (grantedLease).
func (g *Gateway) admitPreview(c *fiber.Ctx, id string, port int) (ok bool, err error) {
	tok, fromQuery := previewToken(c)
	if tok == "" {
		return false, nil
	}
	cl, err := g.preview.verify(tok, id, port, g.clock.Now())
	if err != nil {
		return true, err
	}
	c.Locals(ownerLocal, cl.Owner)
	c.Locals(sandboxGrantLocal, &sandboxGrant{owner: cl.Owner, generation: cl.Generation, fenced: true,
		preview: &previewGrant{claims: cl, token: tok, fromQuery: fromQuery}})
	return true, nil
}

// sandboxGrantOf returns the grant a credential kept, or nil (the API key).
func sandboxGrantOf(c *fiber.Ctx) *sandboxGrant {
	sg, _ := c.Locals(sandboxGrantLocal).(*sandboxGrant)
	return sg
}

// rockAuth is the middleware of credRock: a Quarry API key sent any way
// ROCK's SDK can send it (rockKey). A missing or wrong key answers 401 in
// ROCK's envelope.
func (g *Gateway) rockAuth(c *fiber.Ctx) error {
	key, ok := rockKey(&c.Request().Header)
	if !ok {
		return rockcompat.WriteFailed(c, http.StatusUnauthorized, "authentication failed", 4000,
			"missing API key: send the Quarry API key as XRL-Authorization: Bearer <key>, X-Key, or in the base URL (http://rock:<key>@host)")
	}
	owner, ok := g.keyOwner(key)
	if !ok {
		return rockcompat.WriteFailed(c, http.StatusUnauthorized, "authentication failed", 4000, "invalid API key")
	}
	c.Locals(ownerLocal, owner)
	return c.Next()
}

// rockKey finds the API key in a ROCK request's headers: Authorization:
// Bearer <key>, Authorization: Basic (the key as password: a base URL
// http://rock:<key>@host), XRL-Authorization: Bearer <key> or the bare key
// (SandboxConfig.xrl_authorization), or X-Key / X-API-Key
// (SandboxConfig.extra_headers).
func rockKey(h *fasthttp.RequestHeader) ([]byte, bool) {
	if v := h.Peek(fiber.HeaderAuthorization); len(v) > 0 {
		if k, ok := bearerToken(v); ok && len(k) > 0 {
			return k, true
		}
		if _, pass, ok := basicCredentials(v); ok && len(pass) > 0 {
			return pass, true
		}
	}
	if v := h.Peek("XRL-Authorization"); len(v) > 0 {
		if k, ok := bearerToken(v); ok && len(k) > 0 {
			return k, true
		}
		return bytes.TrimSpace(v), true
	}
	for _, name := range []string{"X-Key", "X-API-Key"} {
		if v := bytes.TrimSpace(h.Peek(name)); len(v) > 0 {
			return v, true
		}
	}
	return nil, false
}

// authenticateE2B is the middleware of credE2BKey: a Quarry API key as
// X-API-KEY, as E2B's SDK sends its key. A missing or wrong key answers
// 401 in E2B's Error body.
func (g *Gateway) authenticateE2B(c *fiber.Ctx) error {
	key := bytes.TrimSpace(c.Request().Header.Peek(e2bcompat.HeaderAPIKey))
	if len(key) == 0 {
		g.writeE2BError(c, errclass.Unauthorized("missing API key: send the Quarry API key as "+e2bcompat.HeaderAPIKey+" (E2B_API_KEY)"))
		return nil
	}
	if err := g.admitKey(c, key); err != nil {
		g.writeE2BError(c, err)
		return nil
	}
	return c.Next()
}

// sandboxGrantLocal is the fiber Locals key of the *sandboxGrant that
// credE2BEnvd or credE2BPort admitted.
const sandboxGrantLocal = "quarry.sandboxGrant"

// sandboxGrant is what a data-plane credential admitted: the owner the
// lease is read as, the generation a token or signature was made for
// (fenced), and a preview token's grant.
type sandboxGrant struct {
	owner      string
	generation int64
	fenced     bool
	preview    *previewGrant
}

// admitSandbox checks the credential k (credE2BEnvd or credE2BPort) of a
// data-plane request for t and keeps its owner and grant, as every
// credential does; the lease itself is the fence's (grantedLease).
func (g *Gateway) admitSandbox(c *fiber.Ctx, k credential, t e2bcompat.Target) error {
	var grant sandboxGrant
	if tok := c.Request().Header.Peek(e2bcompat.HeaderAccessToken); len(tok) > 0 {
		cl, err := g.verifyEnvdToken(string(tok), t.ID, g.clock.Now())
		if err != nil {
			return err
		}
		grant = sandboxGrant{owner: cl.Owner, generation: cl.Generation, fenced: true}
	} else if k == credE2BEnvd {
		sg, ok, err := g.signedFileGrant(c, t.ID)
		switch {
		case err != nil:
			return err
		case !ok:
			return errAccess("missing access token: send the sandbox's envdAccessToken as " + e2bcompat.HeaderAccessToken)
		}
		grant = sg
	} else if ok, err := g.admitPreview(c, t.ID, t.Port); ok || err != nil {
		return err
	} else if len(c.Request().Header.Peek(fiber.HeaderAuthorization)) == 0 {
		return errAccess("send the sandbox's envdAccessToken as " + e2bcompat.HeaderAccessToken +
			", a preview token (?" + previewParam + "=, POST /v1/sandboxes/{id}/ports/{port}/url) or the API key as Authorization: Bearer")
	} else {
		return g.checkKey(c)
	}
	c.Locals(ownerLocal, grant.owner)
	c.Locals(sandboxGrantLocal, &grant)
	return nil
}
