package warmpool

import (
	"crypto/rand"
	"encoding/base32"
	"strings"
)

// Prefixes of the ids the manager generates.
const (
	LeaseIDPrefix = "sbx-" // lease (sandbox) ids, as clients see them
	TaskIDPrefix  = "tsk-" // task ids, used as provider task names
)

// idEncoding is lowercase base32 without padding: URL-safe, and valid in
// container and task names.
var idEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// NewLeaseID returns a new lease id: "sbx-" and 128 random bits (26
// lowercase base32 characters). Safe for concurrent use.
func NewLeaseID() string { return LeaseIDPrefix + randomID() }

// NewTaskID returns a new task id: "tsk-" and 128 random bits.
func NewTaskID() string { return TaskIDPrefix + randomID() }

// randomID returns 128 random bits, base32 encoded. crypto/rand.Read never
// fails (it panics on a broken system source).
func randomID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return idEncoding.EncodeToString(b[:])
}

// ValidLeaseID reports whether id has the shape of a lease id, so that
// callers can refuse garbage before a store read.
func ValidLeaseID(id string) bool {
	rest, ok := strings.CutPrefix(id, LeaseIDPrefix)
	if !ok || len(rest) != 26 {
		return false
	}
	_, err := idEncoding.DecodeString(rest)
	return err == nil
}
