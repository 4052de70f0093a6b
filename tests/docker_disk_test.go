//go:build integration

package tests

import (
	"archive/tar"
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/client"
	"github.com/quarryhq/quarry/execagent/agentapi"
)

// dockerSmallDisk is a pool whose work directory holds 25 MiB.
const dockerSmallDisk = `pools:
  - name: small
    image: quarry-test/busybox:latest
    memory: 64Mi
    disk: 25Mi
    min_warm: 1
    max_total: 2
`

// A full disk is 507 insufficient_storage naming the path and the limit,
// for file writes and archive uploads, and the sandbox lives on: its lease
// stays active and commands run.
func TestDocker_FullDiskIs507AndTheSandboxLives(t *testing.T) {
	d := requireDocker(t)
	g := d.startGateway(dockerSmallDisk)
	g.waitReady("small", 1)
	c, ctx := g.client(), ctx(t)

	pools, err := c.Pools(ctx)
	require.NoError(t, err)
	require.Len(t, pools, 1)
	assert.Equal(t, 25, pools[0].DiskMiB, "GET /v1/pools reports the disk")

	sbx, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Pool: "small"})
	require.NoError(t, err)
	chunk := bytes.Repeat([]byte{'x'}, 10_000_000)
	for _, name := range []string{"a.bin", "b.bin"} {
		_, err := c.WriteFile(ctx, sbx.ID, name, 0o644, bytes.NewReader(chunk))
		require.NoError(t, err, "write %s: 20 MB fit in 25 MiB", name)
	}
	_, err = c.WriteFile(ctx, sbx.ID, "c.bin", 0o644, bytes.NewReader(chunk))
	var cerr *client.Error
	require.True(t, errors.As(err, &cerr), "the third write fails with the gateway's error: %v", err)
	assert.Equal(t, 507, cerr.Status, "%v", err)
	assert.Equal(t, agentapi.CodeInsufficientStorage, cerr.Code)
	assert.Contains(t, cerr.Message, `"/home/sandbox/c.bin"`, "names the path")
	assert.Contains(t, cerr.Message, "no space left on device")
	assert.Contains(t, cerr.Message, "(25 MiB,", "names the limit")

	var tarball bytes.Buffer
	tw := tar.NewWriter(&tarball)
	require.NoError(t, tw.WriteHeader(&tar.Header{Name: "big/d.bin", Mode: 0o644, Size: int64(len(chunk)), Typeflag: tar.TypeReg}))
	_, err = tw.Write(chunk)
	require.NoError(t, err)
	require.NoError(t, tw.Close())
	_, err = c.UploadArchive(ctx, sbx.ID, "up", &tarball)
	require.True(t, errors.As(err, &cerr), "the archive upload fails with the gateway's error: %v", err)
	assert.Equal(t, 507, cerr.Status, "%v", err)
	assert.Equal(t, agentapi.CodeInsufficientStorage, cerr.Code)
	assert.Contains(t, cerr.Message, "/home/sandbox/up/big/d.bin")
	assert.Contains(t, cerr.Message, "(25 MiB,")

	res, err := c.Exec(ctx, sbx.ID, agentapi.ExecRequest{Command: "echo ok; ls -A"})
	require.NoError(t, err)
	assert.Equal(t, 0, res.ExitCode)
	assert.True(t, strings.HasPrefix(res.Stdout, "ok\n"), res.Stdout)
	assert.NotContains(t, res.Stdout, "quarry-upload", "a failed write leaves no temporary file")
	assert.Equal(t, "ok\na.bin\nb.bin\n", res.Stdout, "nothing of the refused archive is left: not even up/, which the upload made")
	got, err := c.GetSandbox(ctx, sbx.ID)
	require.NoError(t, err)
	assert.Equal(t, client.StateActive, got.State, "the lease stays active")

	require.NoError(t, c.DeleteFile(ctx, sbx.ID, "a.bin"))
	_, err = c.WriteFile(ctx, sbx.ID, "c.bin", 0o644, bytes.NewReader(chunk))
	assert.NoError(t, err, "freed space can be written again")
}
