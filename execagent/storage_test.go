package execagent

import (
	"errors"
	"io/fs"
	"net/http"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

// A write that finds its file system full is 507 insufficient_storage
// naming the path and the file system's size (real full disks: the Docker
// suites, tests/docker_disk_test.go).
func TestDiskFull_Is507NamingThePathAndTheSize(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "not", "yet", "there.bin") // statfs falls back to a parent that exists
	tests := []struct {
		name string
		err  error
		want string
	}{
		{name: "ENOSPC", err: diskFull(p, &fs.PathError{Op: "write", Path: p, Err: syscall.ENOSPC}), want: "no space left on device"},
		{name: "EDQUOT", err: diskFull(p, &fs.PathError{Op: "write", Path: p, Err: syscall.EDQUOT}), want: "disk quota exceeded"},
		{name: "through fsError", err: fsError("path", p, &fs.PathError{Op: "open", Path: p, Err: syscall.ENOSPC}), want: "no space left on device"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.err
			require.Error(t, err)
			assert.True(t, errors.Is(err, errNoSpace))
			status, code, msg := classify(err)
			assert.Equal(t, http.StatusInsufficientStorage, status)
			assert.Equal(t, agentapi.CodeInsufficientStorage, code)
			assert.Contains(t, msg, p)
			assert.Contains(t, msg, tt.want)
			assert.Regexp(t, `the file system holding it is full \([0-9.e+]+ MiB, [0-9.e+]+ (MiB|bytes) free\)`, msg)
		})
	}
	assert.NoError(t, diskFull(p, &fs.PathError{Op: "write", Path: p, Err: syscall.EIO}), "other errors are not a full disk")
	assert.NoError(t, diskFull(p, nil))
}
