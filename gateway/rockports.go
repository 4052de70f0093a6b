package gateway

import (
	"bytes"

	"github.com/quarryhq/quarry/rockcompat"
)

// isRockPortPath reports whether uri (without its query) is one of ROCK's
// proxy routes.
func isRockPortPath(uri []byte) bool {
	rest, ok := bytes.CutPrefix(uri, []byte(rockcompat.Prefix+"/sandboxes/"))
	if !ok {
		return false
	}
	i := bytes.IndexByte(rest, '/')
	return i > 0 && (bytes.HasPrefix(rest[i:], []byte("/proxy")) || bytes.HasPrefix(rest[i:], []byte("/vnc")))
}
