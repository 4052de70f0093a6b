package modelservice

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base32"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"time"
)

// TokenPrefix starts every relay token, so that a leaked one is recognisable.
const TokenPrefix = "qrt-"

// MinSecretLen is the shortest relay secret accepted.
const MinSecretLen = 32

// Tokens mints and checks relay tokens: a lease's token is
// HMAC-SHA256(secret, lease id), so every replica that shares the secret
// verifies it without shared memory. It is immutable and safe for
// concurrent use.
type Tokens struct {
	key []byte
}

// NewTokens returns Tokens for secret, which must be at least MinSecretLen
// bytes.
func NewTokens(secret []byte) (*Tokens, error) {
	if len(secret) < MinSecretLen {
		return nil, fmt.Errorf("relay secret: %d bytes; at least %d are required", len(secret), MinSecretLen)
	}
	return &Tokens{key: append([]byte(nil), secret...)}, nil
}

// NewSecret returns a new random secret, hex-free printable (base64url),
// suitable for QUARRY_RELAY_SECRET.
func NewSecret() string {
	var b [32]byte
	_, _ = rand.Read(b[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// Token returns the relay token of leaseID.
func (t *Tokens) Token(leaseID string) string {
	return TokenPrefix + base64.RawURLEncoding.EncodeToString(t.mac(leaseID))
}

// Verify reports whether token is leaseID's token, in constant time.
func (t *Tokens) Verify(leaseID, token string) bool {
	raw, ok := strings.CutPrefix(token, TokenPrefix)
	if !ok {
		return false
	}
	got, err := base64.RawURLEncoding.DecodeString(raw)
	if err != nil {
		return false
	}
	return subtle.ConstantTimeCompare(got, t.mac(leaseID)) == 1
}

func (t *Tokens) mac(leaseID string) []byte {
	m := hmac.New(sha256.New, t.key)
	m.Write([]byte("quarry-relay\x00"))
	m.Write([]byte(leaseID))
	return m.Sum(nil)
}

// RequestIDPrefix starts every model request id.
const RequestIDPrefix = "mrq-"

var idEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// NewRequestID returns a new request id: "mrq-", the time in nanoseconds as
// 16 hex digits (ids sort by creation time across replicas whose clocks
// agree), and 80 random bits. Safe for concurrent use.
func NewRequestID(now time.Time) string {
	var b [18]byte
	binary.BigEndian.PutUint64(b[:8], uint64(now.UnixNano()))
	_, _ = rand.Read(b[8:])
	return fmt.Sprintf("%s%016x%s", RequestIDPrefix, b[:8], idEncoding.EncodeToString(b[8:]))
}

// CheckRequestID returns an error when id does not have the shape of a
// request id.
func CheckRequestID(id string) error {
	rest, ok := strings.CutPrefix(id, RequestIDPrefix)
	if !ok || len(rest) != 32 {
		return errors.New("must be a model request id (mrq- and 32 characters)")
	}
	for i := 0; i < len(rest); i++ {
		c := rest[i]
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			return errors.New("must be a model request id (mrq- and 32 characters)")
		}
	}
	return nil
}
