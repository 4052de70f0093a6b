package gateway

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/quarryhq/quarry/errclass"
	"github.com/quarryhq/quarry/internal/badinput"
)

// PreviewConfig configures signed preview URLs (docs/API.md "Ports and
// preview URLs"). It is part of Config; cmd/gateway fills it with envconfig.
type PreviewConfig struct {
	// PreviewSecret keys the preview tokens' HMAC; replicas must share it.
	// Empty in Config given to New: a random secret that lives as long as
	// the process (cmd/gateway generates one into
	// $QUARRY_DATA_DIR/preview-secret instead).
	PreviewSecret string `envconfig:"QUARRY_PREVIEW_SECRET"`
	// PreviewMaxTTL bounds a preview URL's ttl_seconds (default 24h).
	PreviewMaxTTL time.Duration `envconfig:"QUARRY_PREVIEW_MAX_TTL"`
	// PreviewDefaultTTL is the ttl of a request that names none (default
	// 1h; at most PreviewMaxTTL).
	PreviewDefaultTTL time.Duration `envconfig:"QUARRY_PREVIEW_DEFAULT_TTL"`
}

// MinPreviewSecretLen is the shortest accepted QUARRY_PREVIEW_SECRET.
const MinPreviewSecretLen = 32

const (
	defaultPreviewMaxTTL     = 24 * time.Hour
	defaultPreviewDefaultTTL = time.Hour
)

// previewParam is the query parameter and the cookie that carry a preview
// token.
const previewParam = "quarry_preview"

// maxPreviewToken bounds the token the gateway parses.
const maxPreviewToken = 1024

func (p PreviewConfig) withDefaults() PreviewConfig {
	if p.PreviewMaxTTL == 0 {
		p.PreviewMaxTTL = defaultPreviewMaxTTL
	}
	if p.PreviewDefaultTTL == 0 {
		p.PreviewDefaultTTL = min(defaultPreviewDefaultTTL, p.PreviewMaxTTL)
	}
	return p
}

func (p PreviewConfig) validate() error {
	if p.PreviewSecret != "" && len(p.PreviewSecret) < MinPreviewSecretLen {
		return fmt.Errorf("QUARRY_PREVIEW_SECRET: %d characters; at least %d are required", len(p.PreviewSecret), MinPreviewSecretLen)
	}
	if p.PreviewMaxTTL < 0 || (p.PreviewMaxTTL > 0 && p.PreviewMaxTTL < time.Second) {
		return fmt.Errorf("QUARRY_PREVIEW_MAX_TTL: %s; at least 1s", p.PreviewMaxTTL)
	}
	if p.PreviewDefaultTTL < 0 || (p.PreviewMaxTTL > 0 && p.PreviewDefaultTTL > p.PreviewMaxTTL) {
		return fmt.Errorf("QUARRY_PREVIEW_DEFAULT_TTL: %s; between 1s and QUARRY_PREVIEW_MAX_TTL (%s)", p.PreviewDefaultTTL, p.PreviewMaxTTL)
	}
	return nil
}

// NewPreviewSecret returns a random secret for QUARRY_PREVIEW_SECRET.
func NewPreviewSecret() string {
	var b [32]byte
	_, _ = rand.Read(b[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// previewClaims is what a preview token says: the sandbox, the port, the
// lease generation it was issued for, the lease's owner and its expiry.
type previewClaims struct {
	Sandbox    string `json:"sbx"`
	Port       int    `json:"port"`
	Generation int64  `json:"gen"`
	Owner      string `json:"own"`
	Expires    int64  `json:"exp"` // unix seconds
}

// tokenSigner signs and verifies the gateway's tokens (preview URLs, E2B's
// envdAccessToken, e2btoken.go): base64url(JSON claims) "."
// base64url(HMAC-SHA256(secret, domain + payload)), where domain separates
// one kind of token from every other signed with the same key. It is
// immutable and safe for concurrent use.
type tokenSigner struct {
	key []byte
}

// previewDomain separates the preview HMAC from any other use of the key.
const previewDomain = "quarry-preview-v1\x00"

func newTokenSigner(secret string) *tokenSigner {
	if secret == "" {
		secret = NewPreviewSecret()
	}
	return &tokenSigner{key: []byte(secret)}
}

func (s *tokenSigner) mac(domain, payload string) []byte {
	m := hmac.New(sha256.New, s.key)
	m.Write([]byte(domain))
	m.Write([]byte(payload))
	return m.Sum(nil)
}

// seal returns the token of claims (JSON-encoded) for domain. The same
// claims give the same token.
func (s *tokenSigner) seal(domain string, claims any) string {
	b, _ := json.Marshal(claims)
	payload := base64.RawURLEncoding.EncodeToString(b)
	return payload + "." + base64.RawURLEncoding.EncodeToString(s.mac(domain, payload))
}

// Why open refuses a token.
var (
	errTokenMalformed = errors.New("malformed token")
	errTokenForged    = errors.New("the token's signature does not match (forged, or signed with another QUARRY_PREVIEW_SECRET)")
)

// open checks tok's signature for domain and decodes its claims into
// claims: errTokenMalformed or errTokenForged. What the claims say is the
// caller's to check.
func (s *tokenSigner) open(domain, tok string, claims any) error {
	payload, sig, ok := strings.Cut(tok, ".")
	if !ok || len(tok) > maxPreviewToken {
		return errTokenMalformed
	}
	got, err := base64.RawURLEncoding.DecodeString(sig)
	if err != nil || !hmac.Equal(got, s.mac(domain, payload)) {
		return errTokenForged
	}
	b, err := base64.RawURLEncoding.DecodeString(payload)
	if err != nil || json.Unmarshal(b, claims) != nil {
		return errTokenMalformed
	}
	return nil
}

// sign returns the preview token of cl.
func (s *tokenSigner) sign(cl previewClaims) string { return s.seal(previewDomain, cl) }

// errPreview is the 401 of a preview token that may not be used.
func errPreview(format string, args ...any) error {
	return errclass.Unauthorized("preview URL refused: " + fmt.Sprintf(format, args...))
}

// verify checks preview token tok's signature and that it is for sandbox id
// and port and unexpired at now. The lease checks (active, same
// generation) are the caller's. Every failure is a 401 saying why.
func (s *tokenSigner) verify(tok, id string, port int, now time.Time) (previewClaims, error) {
	var cl previewClaims
	if err := s.open(previewDomain, tok, &cl); err != nil {
		return cl, errPreview("%s", err.Error())
	}
	switch {
	case cl.Sandbox != id:
		return cl, errPreview("the token is for another sandbox")
	case cl.Port != port:
		return cl, errPreview("the token is for port %d, not %d", cl.Port, port)
	case !now.Before(time.Unix(cl.Expires, 0)):
		return cl, errPreview("it expired at %s; ask for a new one (POST /v1/sandboxes/%s/ports/%d/url)",
			time.Unix(cl.Expires, 0).UTC().Format(time.RFC3339), id, port)
	}
	return cl, nil
}

// previewRequest is the body of POST /v1/sandboxes/{id}/ports/{port}/url.
type previewRequest struct {
	TTLSeconds int64 `json:"ttl_seconds"`
}

// previewAnswer is its answer.
type previewAnswer struct {
	URL       string    `json:"url"`
	ExpiresAt time.Time `json:"expires_at"`
}

// createPreviewURL handles POST /v1/sandboxes/{id}/ports/{port}/url: a URL
// of the port route that works without the API key until ttl_seconds pass
// or the lease ends, whichever is first.
func (g *Gateway) createPreviewURL(c *fiber.Ctx) error {
	id, port, err := portPathParams(c)
	if err != nil {
		return err
	}
	var req previewRequest
	if err := g.decodeBody(c, &req, []string{"ttl_seconds"}); err != nil {
		return err
	}
	ttl := g.cfg.PreviewDefaultTTL
	if req.TTLSeconds != 0 {
		if req.TTLSeconds < 1 || req.TTLSeconds > int64(g.cfg.PreviewMaxTTL/time.Second) {
			return badinput.New("ttl_seconds", "must be from 1 to %d (QUARRY_PREVIEW_MAX_TTL), got %d",
				int64(g.cfg.PreviewMaxTTL/time.Second), req.TTLSeconds)
		}
		ttl = time.Duration(req.TTLSeconds) * time.Second
	}
	lease, err := g.activeLease(c, id)
	if err != nil {
		return err
	}
	exp := g.clock.Now().Add(ttl).Truncate(time.Second)
	tok := g.preview.sign(previewClaims{Sandbox: id, Port: port, Generation: lease.Generation, Owner: lease.Owner, Expires: exp.Unix()})
	return c.JSON(previewAnswer{
		URL:       c.BaseURL() + portPath(id, port) + "?" + previewParam + "=" + tok,
		ExpiresAt: exp.UTC(),
	})
}

// portPath is the port route's path of a sandbox and port, with its
// trailing slash: the preview cookie's scope.
func portPath(id string, port int) string {
	return "/v1/sandboxes/" + id + "/ports/" + strconv.Itoa(port) + "/"
}

// previewToken returns the preview token of a port call, from the query
// (fromQuery) or the cookie, or "" when it carries none.
func previewToken(c *fiber.Ctx) (tok string, fromQuery bool) {
	if v := c.Context().QueryArgs().Peek(previewParam); len(v) > 0 {
		return string(v), true
	}
	return string(c.Request().Header.Cookie(previewParam)), false
}

// errPreviewLease turns the lease read of a preview call into its 401: a
// preview URL ends with the lease it was issued for.
func errPreviewLease(err error) error {
	a := errclass.Of(err)
	if a.Status == fiber.StatusGone || a.Status == fiber.StatusNotFound {
		return errPreview("the sandbox's lease it was issued for has ended (%s)", a.Message)
	}
	return err
}
