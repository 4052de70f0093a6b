//go:build integration

package tests

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/api"
	"github.com/quarryhq/quarry/client"
	"github.com/quarryhq/quarry/execagent/agentapi"
)

// Checkpoints end to end (issue 14): a gateway binary, real agents, the
// embedded checkpoint store, on the process provider and on Docker.

// ckSetup writes a tree with modes, a symlink and an empty directory in
// the sandbox's work dir.
const ckSetup = `mkdir -p src/deep empty ro/sub && echo a > a.txt && chmod 640 a.txt &&
printf '#!/bin/sh\necho hi\n' > run.sh && chmod 755 run.sh && echo b > src/deep/b.txt && ln -s src/deep/b.txt link &&
echo s > ro/sub/s && echo g > ro/g && chmod 555 ro`

// ckMutate changes what ckSetup wrote and adds to it.
const ckMutate = `echo changed > a.txt && chmod 600 run.sh && rm link && echo new > new.txt && rm -r empty && mkdir -p made/since && echo x > made/since/f && echo G > ro/g`

// ckInodes prints the inodes of two files ckMutate leaves as they were
// (run.sh's mode aside) and of one it rewrites.
const ckInodes = `stat -c %i src/deep/b.txt run.sh a.txt`

// ckDirInodes prints the inodes of two directories ckMutate leaves whole,
// one of them in a read-only directory it changes.
const ckDirInodes = `stat -c %i src ro/sub`

// ckState lists the work dir: every entry with its kind, mode, link target
// or a digest of its content (busybox and GNU tools alike).
const ckState = `find . | sort | while read f; do
  if [ -L "$f" ]; then echo "$f L $(readlink "$f")";
  elif [ -d "$f" ]; then echo "$f D $(stat -c %a "$f")";
  else echo "$f F $(stat -c %a "$f") $(md5sum < "$f" | cut -c1-8)"; fi; done`

// sh runs a shell command in sandbox id and returns its stdout; it must
// exit 0.
func sh(ctx context.Context, t *testing.T, c *client.Client, id, cmd string) string {
	t.Helper()
	res, err := c.Exec(ctx, id, agentapi.ExecRequest{Command: cmd})
	require.NoError(t, err, cmd)
	require.Equal(t, 0, res.ExitCode, "%s: %s", cmd, res.Stderr)
	return res.Stdout
}

// errStatus returns the status and code of a client error.
func errStatus(t *testing.T, err error) (int, string) {
	t.Helper()
	var ce *client.Error
	require.True(t, errors.As(err, &ce), "want a gateway error, got %v", err)
	return ce.Status, ce.Code
}

// ckPools: one pool with room for the source and three forks.
const ckPools = `pools:
  - name: default
    image: host
    min_warm: 2
    max_total: 4
`

func TestCheckpoints_Process(t *testing.T) {
	g := startGateway(t, ckPools, withEnv("QUARRY_MAX_CHECKPOINT_BYTES=262144"))
	c, other := g.client(), g.otherClient()
	ctx := ctx(t)
	g.waitReady("default", 2)

	src, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Labels: map[string]string{"run": "ck"}})
	require.NoError(t, err)
	sh(ctx, t, c, src.ID, ckSetup)
	want := sh(ctx, t, c, src.ID, ckState)

	// Create, list, get; another key sees nothing.
	ck, err := c.CreateCheckpoint(ctx, src.ID, client.CreateCheckpointRequest{Labels: map[string]string{"step": "0"}})
	require.NoError(t, err)
	assert.Equal(t, src.ID, ck.Sandbox)
	assert.Equal(t, "host", ck.Image)
	assert.Equal(t, 12, ck.Files, "the root, a.txt, run.sh, src, src/deep, b.txt, link, empty, ro, ro/sub, ro/sub/s, ro/g")
	require.Len(t, ck.Paths, 1)
	assert.True(t, filepath.IsAbs(ck.Paths[0]), "the work dir, absolute: %s", ck.Paths[0])
	assert.Len(t, ck.SHA256, 64)
	list, err := c.ListCheckpoints(ctx, map[string]string{"step": "0"}, 0)
	require.NoError(t, err)
	require.Len(t, list, 1)
	assert.Equal(t, ck.ID, list[0].ID)
	got, err := c.GetCheckpoint(ctx, ck.ID)
	require.NoError(t, err)
	assert.Equal(t, ck, got)
	_, err = other.GetCheckpoint(ctx, ck.ID)
	assert.True(t, client.IsNotFound(err), "another key's checkpoint is 404: %v", err)
	list, err = other.ListCheckpoints(ctx, nil, 0)
	require.NoError(t, err)
	assert.Empty(t, list)

	// Restore in place: files made since are gone, modes and the link are
	// back, and a running process keeps running.
	proc, err := c.StartProcess(ctx, src.ID, agentapi.ProcessStartRequest{Command: "sleep 300"})
	require.NoError(t, err)
	sh(ctx, t, c, src.ID, ckMutate)
	require.NotEqual(t, want, sh(ctx, t, c, src.ID, ckState))
	res, err := c.RestoreSandbox(ctx, src.ID, ck.ID)
	require.NoError(t, err)
	assert.Equal(t, ck.Files, res.Files)
	assert.Equal(t, want, sh(ctx, t, c, src.ID, ckState), "the tree as it was")
	pi, err := c.GetProcess(ctx, src.ID, proc.ID)
	require.NoError(t, err)
	assert.Equal(t, agentapi.ProcessRunning, pi.State, "processes keep running")

	// from_checkpoint: a new sandbox with the tree, in its own work dir.
	sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{FromCheckpoint: ck.ID})
	require.NoError(t, err)
	assert.Equal(t, "default", sb.Pool)
	assert.Equal(t, want, sh(ctx, t, c, sb.ID, ckState))
	sh(ctx, t, c, sb.ID, "echo mine > a.txt")
	assert.Equal(t, want, sh(ctx, t, c, src.ID, ckState), "the new sandbox's files are its own")
	_, err = c.DeleteSandbox(ctx, sb.ID)
	require.NoError(t, err)

	// Fork ×4 into a pool with room for 3 more: three sandboxes, one 503.
	fr, err := c.ForkSandbox(ctx, src.ID, client.ForkRequest{Count: 4, LeaseSeconds: 120})
	require.NoError(t, err)
	require.Len(t, fr.Forks, 4)
	var forks []string
	for i, f := range fr.Forks {
		if f.Error != nil {
			assert.Equal(t, http.StatusServiceUnavailable, f.Error.Status, "fork %d: %s", i, f.Error.Message)
			assert.Equal(t, api.CodeNoCapacity, f.Error.Code, "fork %d", i)
			continue
		}
		require.NotNil(t, f.Sandbox, "fork %d", i)
		forks = append(forks, f.Sandbox.ID)
		assert.Equal(t, map[string]string{"run": "ck"}, f.Sandbox.Labels, "the source's labels")
		assert.Equal(t, 120, f.Sandbox.LeaseSeconds)
	}
	assert.Len(t, forks, 3, "the pool's room: max_total 4, the source holds one")
	for i, id := range forks {
		assert.Equal(t, want, sh(ctx, t, c, id, ckState), "fork %s", id)
		sh(ctx, t, c, id, "echo fork"+string(rune('0'+i))+" > a.txt")
	}
	for i, id := range forks {
		assert.Equal(t, "fork"+string(rune('0'+i))+"\n", sh(ctx, t, c, id, "cat a.txt"), "each fork is its own sandbox")
	}
	_, err = c.GetCheckpoint(ctx, fr.Checkpoint.ID)
	assert.True(t, client.IsNotFound(err), "the fork's checkpoint is deleted: %v", err)
	for _, id := range forks {
		_, err := c.DeleteSandbox(ctx, id)
		require.NoError(t, err)
	}

	// Bad input.
	for _, n := range []int{0, 101} {
		_, err = c.ForkSandbox(ctx, src.ID, client.ForkRequest{Count: n})
		assert.True(t, client.IsBadRequest(err), "count %d: %v", n, err)
	}
	_, err = c.RestoreSandbox(ctx, src.ID, "ckp-aaaaaaaaaaaaaaaaaaaaaaaaaa")
	assert.True(t, client.IsNotFound(err), "unknown: %v", err)
	theirs, err := other.CreateSandbox(ctx, client.CreateSandboxRequest{})
	require.NoError(t, err)
	_, err = other.RestoreSandbox(ctx, theirs.ID, ck.ID)
	assert.True(t, client.IsNotFound(err), "another key's: %v", err)
	_, err = other.CreateSandbox(ctx, client.CreateSandboxRequest{FromCheckpoint: ck.ID})
	assert.True(t, client.IsNotFound(err), "another key's from_checkpoint: %v", err)
	_, err = other.DeleteSandbox(ctx, theirs.ID)
	require.NoError(t, err)

	// Over QUARRY_MAX_CHECKPOINT_BYTES (256 KiB of stored archive): 413,
	// nothing kept.
	sh(ctx, t, c, src.ID, "head -c 1048576 /dev/urandom > big.bin")
	_, err = c.CreateCheckpoint(ctx, src.ID, client.CreateCheckpointRequest{})
	status, code := errStatus(t, err)
	assert.Equal(t, http.StatusRequestEntityTooLarge, status, "%v", err)
	assert.Equal(t, agentapi.CodeTooLarge, code)
	assert.Contains(t, err.Error(), "QUARRY_MAX_CHECKPOINT_BYTES")
	list, err = c.ListCheckpoints(ctx, nil, 0)
	require.NoError(t, err)
	assert.Len(t, list, 1, "only the first checkpoint")
	sh(ctx, t, c, src.ID, "rm big.bin")

	// A corrupt blob is refused, and the sandbox is left as it was.
	sh(ctx, t, c, src.ID, ckMutate)
	before := sh(ctx, t, c, src.ID, ckState)
	blob := filepath.Join(g.dataDir, "checkpoints", "blobs", ck.SHA256[:2], ck.SHA256)
	b, err := os.ReadFile(blob)
	require.NoError(t, err)
	b[len(b)/2] ^= 0xff
	require.NoError(t, os.WriteFile(blob, b, 0o600))
	_, err = c.RestoreSandbox(ctx, src.ID, ck.ID)
	status, code = errStatus(t, err)
	assert.Equal(t, http.StatusInternalServerError, status, "%v", err)
	assert.Equal(t, "checkpoint_corrupt", code)
	assert.Equal(t, before, sh(ctx, t, c, src.ID, ckState), "untouched")
	assert.NotContains(t, sh(ctx, t, c, src.ID, "ls -a"), ".quarry-restore", "nothing staged is left")
	_, err = c.CreateSandbox(ctx, client.CreateSandboxRequest{FromCheckpoint: ck.ID})
	status, _ = errStatus(t, err)
	assert.Equal(t, http.StatusInternalServerError, status, "from a corrupt checkpoint: %v", err)

	// Delete: gone, and again is fine.
	require.NoError(t, c.DeleteCheckpoint(ctx, ck.ID))
	require.NoError(t, c.DeleteCheckpoint(ctx, ck.ID))
	_, err = c.GetCheckpoint(ctx, ck.ID)
	assert.True(t, client.IsNotFound(err), "%v", err)
}

// TestCheckpoints_Docker runs on both paths of a sandbox made from a
// checkpoint: restored by copy, and started on a copy-on-write layer
// (every checkpoint: QUARRY_CHECKPOINT_COW_MIN_BYTES=1).
func TestCheckpoints_Docker(t *testing.T) {
	for _, tt := range []struct {
		name     string
		minBytes string
	}{{"copy", "-1"}, {"cow", "1"}} {
		t.Run(tt.name, func(t *testing.T) { checkpointsOnDocker(t, tt.minBytes) })
	}
}

func checkpointsOnDocker(t *testing.T, cowMinBytes string) {
	d := requireDocker(t)
	g, c, ctx := d.startTwoPools(withEnv("QUARRY_CHECKPOINT_COW_MIN_BYTES=" + cowMinBytes))
	cow := cowMinBytes == "1"

	src, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Pool: "plain"})
	require.NoError(t, err)
	sh(ctx, t, c, src.ID, ckSetup)
	want := sh(ctx, t, c, src.ID, ckState)
	ck, err := c.CreateCheckpoint(ctx, src.ID, client.CreateCheckpointRequest{})
	require.NoError(t, err)
	assert.Equal(t, dockerImageBusybox, ck.Image)

	// Restore in place on the work dir's tmpfs; a process keeps running.
	proc, err := c.StartProcess(ctx, src.ID, agentapi.ProcessStartRequest{Command: "sleep 300"})
	require.NoError(t, err)
	inodes := strings.Fields(sh(ctx, t, c, src.ID, ckInodes))
	sh(ctx, t, c, src.ID, ckMutate)
	_, err = c.RestoreSandbox(ctx, src.ID, ck.ID)
	require.NoError(t, err)
	assert.Equal(t, want, sh(ctx, t, c, src.ID, ckState))
	// The files the restore found unchanged (b.txt; run.sh, its mode
	// alone changed) were kept, not copied; a.txt was written anew.
	after := strings.Fields(sh(ctx, t, c, src.ID, ckInodes))
	require.Len(t, after, 3)
	assert.Equal(t, inodes[:2], after[:2], "b.txt and run.sh kept")
	assert.NotEqual(t, inodes[2], after[2], "a.txt written anew")
	// Again, now that the tree has the archive's mtimes: a directory left
	// whole is moved in whole (src; ro/sub, out of the read-only ro, by the
	// sandbox's unprivileged user).
	dirs := sh(ctx, t, c, src.ID, ckDirInodes)
	sh(ctx, t, c, src.ID, ckMutate)
	_, err = c.RestoreSandbox(ctx, src.ID, ck.ID)
	require.NoError(t, err)
	assert.Equal(t, want, sh(ctx, t, c, src.ID, ckState))
	assert.Equal(t, dirs, sh(ctx, t, c, src.ID, ckDirInodes), "src and ro/sub moved in whole")
	pi, err := c.GetProcess(ctx, src.ID, proc.ID)
	require.NoError(t, err)
	assert.Equal(t, agentapi.ProcessRunning, pi.State)

	// Another image: 400 naming both.
	other, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Pool: "bash"})
	require.NoError(t, err)
	otherBefore := sh(ctx, t, c, other.ID, ckState)
	_, err = c.RestoreSandbox(ctx, other.ID, ck.ID)
	require.True(t, client.IsBadRequest(err), "%v", err)
	assert.Contains(t, err.Error(), dockerImageBusybox)
	assert.Contains(t, err.Error(), dockerImageBash)
	assert.Equal(t, otherBefore, sh(ctx, t, c, other.ID, ckState))
	_, err = c.CreateSandbox(ctx, client.CreateSandboxRequest{Pool: "bash", FromCheckpoint: ck.ID})
	assert.True(t, client.IsBadRequest(err), "from_checkpoint into another image: %v", err)
	_, err = c.DeleteSandbox(ctx, other.ID)
	require.NoError(t, err)

	// from_checkpoint from the warm pool.
	g.waitReady("plain", 1)
	sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{FromCheckpoint: ck.ID})
	require.NoError(t, err)
	assert.Equal(t, "plain", sb.Pool)
	assert.Equal(t, want, sh(ctx, t, c, sb.ID, ckState))
	_, err = c.DeleteSandbox(ctx, sb.ID)
	require.NoError(t, err)

	// Fork ×4 into plain (max_total 4, the source holds one): three, one 503.
	fr, err := c.ForkSandbox(ctx, src.ID, client.ForkRequest{Count: 4, KeepCheckpoint: true})
	require.NoError(t, err)
	made := 0
	for i, f := range fr.Forks {
		if f.Error != nil {
			assert.Equal(t, api.CodeNoCapacity, f.Error.Code, "fork %d: %s", i, f.Error.Message)
			continue
		}
		made++
		assert.Equal(t, want, sh(ctx, t, c, f.Sandbox.ID, ckState), "fork %s", f.Sandbox.ID)
		assert.NotEqual(t, src.ID, f.Sandbox.ID)
	}
	assert.Equal(t, 3, made)
	kept, err := c.GetCheckpoint(ctx, fr.Checkpoint.ID)
	require.NoError(t, err, "keep_checkpoint")
	assert.Equal(t, want, sh(ctx, t, c, src.ID, ckState))
	assert.True(t, strings.HasPrefix(kept.ID, "ckp-"))

	// A change in one fork is in no other fork, nor in the checkpoint.
	var forks []string
	for _, f := range fr.Forks {
		if f.Error == nil {
			forks = append(forks, f.Sandbox.ID)
		}
	}
	sh(ctx, t, c, forks[0], ckMutate)
	assert.NotEqual(t, want, sh(ctx, t, c, forks[0], ckState))
	assert.Equal(t, want, sh(ctx, t, c, forks[1], ckState))
	if cow {
		assert.NotEmpty(t, d.volumes(volumeRoleOverlay), "the forks run on overlays")
	} else {
		assert.Empty(t, d.volumes(""), "a copy makes no volume")
	}
	_, err = c.DeleteSandbox(ctx, forks[1])
	require.NoError(t, err)
	sb, err = c.CreateSandbox(ctx, client.CreateSandboxRequest{FromCheckpoint: kept.ID})
	require.NoError(t, err)
	assert.Equal(t, want, sh(ctx, t, c, sb.ID, ckState), "the checkpoint is as it was taken")

	// Deleted while sandboxes use it: they keep working; once they and
	// the checkpoint are gone, nothing of them is left on the engine.
	require.NoError(t, c.DeleteCheckpoint(ctx, kept.ID))
	assert.Equal(t, want, sh(ctx, t, c, sb.ID, ckState))
	for _, id := range append([]string{sb.ID, src.ID}, forks[0], forks[2]) {
		_, err = c.DeleteSandbox(ctx, id)
		require.NoError(t, err)
	}
	eventually(t, dockerWait, "no volume of the forks and the checkpoint is left", func() error {
		if v := d.volumes(""); len(v) > 0 {
			return fmt.Errorf("volumes left: %v", v)
		}
		return nil
	})
}
