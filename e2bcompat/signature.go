package e2bcompat

import (
	"crypto/sha256"
	"encoding/base64"
	"strconv"
)

// The operations a signed file URL is for (e2b/sandbox/signature.py):
// download_url signs "read", upload_url "write".
const (
	OpRead  = "read"
	OpWrite = "write"
)

// FileSignature returns the signature E2B's SDK puts in a file URL's
// signature parameter: "v1_" and the unpadded standard base64 of
// SHA-256("path:operation:user:token"), with ":expiration" appended when
// expiration (unix seconds) is not 0. user is "" for the sandbox's default
// user. It is a pure function.
func FileSignature(path, operation, user, token string, expiration int64) string {
	raw := path + ":" + operation + ":" + user + ":" + token
	if expiration != 0 {
		raw += ":" + strconv.FormatInt(expiration, 10)
	}
	sum := sha256.Sum256([]byte(raw))
	return "v1_" + base64.RawStdEncoding.EncodeToString(sum[:])
}
