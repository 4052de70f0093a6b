package execagent

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

// errNoSpace: a write found its file system full or over quota.
var errNoSpace = errors.New("insufficient storage")

// diskFull returns the 507 insufficient_storage answer of a write to p that
// failed with ENOSPC or EDQUOT, or nil when err is anything else. The
// message names p and the size of the file system holding it (statfs of p,
// or of its nearest existing parent): in a sandbox that is the pool's disk.
func diskFull(p string, err error) error {
	var what string
	switch {
	case errors.Is(err, syscall.ENOSPC):
		what = "no space left on device"
	case errors.Is(err, syscall.EDQUOT):
		what = "disk quota exceeded"
	default:
		return nil
	}
	return statusError(errNoSpace, http.StatusInsufficientStorage, agentapi.CodeInsufficientStorage,
		"write %q: %s: %s; delete files in the sandbox, or use a pool with a larger disk", p, what, fsSize(p))
}

// drained reads what is left of an upload's body (bounded by its
// MaxBytesReader) and returns err. An upload refused in the middle is
// answered only after its body is read: the gateway sends the whole body
// before it reads the answer, and a connection closed under it would turn
// the answer into a broken pipe (502) instead.
func drained(body io.Reader, err error) error {
	_, _ = io.Copy(io.Discard, body)
	return err
}

// fsSize describes the size of the file system holding p, for messages.
func fsSize(p string) string {
	var st unix.Statfs_t
	for dir := p; ; dir = filepath.Dir(dir) {
		if unix.Statfs(dir, &st) == nil {
			break
		}
		if dir == filepath.Dir(dir) {
			return "the size of the file system holding it is unknown"
		}
	}
	bsize := uint64(st.Bsize)
	return fmt.Sprintf("the file system holding it is full (%s, %s free)", mib(st.Blocks*bsize), mib(st.Bavail*bsize))
}

// mib formats a byte count as MiB (bytes below 1 MiB).
func mib(n uint64) string {
	if n < 1<<20 {
		return fmt.Sprintf("%d bytes", n)
	}
	return fmt.Sprintf("%.4g MiB", float64(n)/(1<<20))
}
