package gateway

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"

	"github.com/gofiber/fiber/v2"

	"github.com/quarryhq/quarry/errclass"
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

var bearerPrefix = []byte("Bearer ")

// authenticate is the middleware of every route that needs an API key: it
// answers 401 for a missing or wrong key and stores the caller's owner id.
func (g *Gateway) authenticate(c *fiber.Ctx) error {
	if err := g.checkKey(c); err != nil {
		return err
	}
	return c.Next()
}

// checkKey is authenticate without going on to the next handler: it
// answers the 401 error of a missing or wrong key, or stores the caller's
// owner id.
func (g *Gateway) checkKey(c *fiber.Ctx) error {
	h := c.Request().Header.Peek(fiber.HeaderAuthorization)
	if len(h) == 0 {
		return errclass.Unauthorized("missing API key: send Authorization: Bearer <api key>")
	}
	if len(h) < len(bearerPrefix) || !bytes.EqualFold(h[:len(bearerPrefix)], bearerPrefix) {
		return errclass.Unauthorized("malformed Authorization header: expected Bearer <api key>")
	}
	return g.admitKey(c, bytes.TrimSpace(h[len(bearerPrefix):]))
}

// admitKey checks key and stores its owner; a missing or unknown key is
// 401.
func (g *Gateway) admitKey(c *fiber.Ctx, key []byte) error {
	if len(key) == 0 || len(key) > maxAPIKeyLen {
		return errclass.Unauthorized("invalid API key")
	}
	owner, ok := g.keys.owner(key)
	if !ok {
		return errclass.Unauthorized("invalid API key")
	}
	c.Locals(ownerLocal, owner)
	return nil
}

// ownerOf returns the owner stored by authenticate.
func ownerOf(c *fiber.Ctx) string {
	s, _ := c.Locals(ownerLocal).(string)
	return s
}
