package main

import (
	"archive/tar"
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

// ckArchive is a checkpoint archive of root, taken by an agent of work dir
// from, holding files (name below root → content), and its SHA-256.
func ckArchive(t *testing.T, root, from string, files map[string]string) ([]byte, string) {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	roots, err := json.Marshal([]string{root})
	require.NoError(t, err)
	require.NoError(t, tw.WriteHeader(&tar.Header{Typeflag: tar.TypeXGlobalHeader, Format: tar.FormatPAX,
		PAXRecords: map[string]string{agentapi.PAXRoots: string(roots), agentapi.PAXWorkdir: from}}))
	name := strings.TrimPrefix(root, "/")
	require.NoError(t, tw.WriteHeader(&tar.Header{Name: name + "/", Typeflag: tar.TypeDir, Mode: 0o750}))
	for rel, data := range files {
		require.NoError(t, tw.WriteHeader(&tar.Header{Name: name + "/" + rel, Typeflag: tar.TypeReg, Mode: 0o640, Size: int64(len(data))}))
		_, err := tw.Write([]byte(data))
		require.NoError(t, err)
	}
	require.NoError(t, tw.Close())
	sum := sha256.Sum256(buf.Bytes())
	return buf.Bytes(), hex.EncodeToString(sum[:])
}

// runRestore runs the built agent's one-shot restore into workdir.
func runRestore(t *testing.T, workdir, sum string, archive []byte) (string, string, error) {
	t.Helper()
	cmd := exec.Command(buildAgent(t), "-restore", sum)
	cmd.Env = append(os.Environ(), "QUARRY_AGENT_WORKDIR="+workdir)
	cmd.Stdin = bytes.NewReader(archive)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	return out.String(), errOut.String(), err
}

// The one-shot restore puts an archive taken in another work dir into
// this one, as a restore through the agent's API does, and says what it
// restored; without a token or a server.
func TestRestoreOnce_RebasesIntoTheWorkDir(t *testing.T) {
	workdir := filepath.Join(t.TempDir(), "layer", "home", "sandbox")
	require.NoError(t, os.MkdirAll(workdir, 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(workdir, "stale"), []byte("x"), 0o600))
	archive, sum := ckArchive(t, "/home/sandbox", "/home/sandbox", map[string]string{"a.txt": "alpha", "d/b.txt": "beta"})
	// d/ has no entry of its own: the restore makes it.
	out, errOut, err := runRestore(t, workdir, sum, archive)
	require.NoError(t, err, errOut)
	var res agentapi.RestoreResult
	require.NoError(t, json.Unmarshal([]byte(out), &res), out)
	assert.Equal(t, int64(len("alpha")+len("beta")), res.Bytes)
	got, err := os.ReadFile(filepath.Join(workdir, "a.txt"))
	require.NoError(t, err)
	assert.Equal(t, "alpha", string(got))
	got, err = os.ReadFile(filepath.Join(workdir, "d", "b.txt"))
	require.NoError(t, err)
	assert.Equal(t, "beta", string(got))
	assert.NoFileExists(t, filepath.Join(workdir, "stale"), "a restore replaces the work dir's entries")
	fi, err := os.Stat(workdir)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o750), fi.Mode().Perm(), "the root's mode is the archive's")
	ents, err := os.ReadDir(workdir)
	require.NoError(t, err)
	assert.Len(t, ents, 2, "no staging directory is left: %v", ents)
}

// A body that is not the archive the sum names changes nothing and fails.
func TestRestoreOnce_WrongSumChangesNothing(t *testing.T) {
	workdir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(workdir, "kept"), []byte("x"), 0o600))
	archive, _ := ckArchive(t, workdir, workdir, map[string]string{"a.txt": "alpha"})
	_, errOut, err := runRestore(t, workdir, strings.Repeat("0", 64), archive)
	require.Error(t, err)
	assert.Contains(t, errOut, "the body hashes to")
	ents, err := os.ReadDir(workdir)
	require.NoError(t, err)
	require.Len(t, ents, 1)
	assert.Equal(t, "kept", ents[0].Name())
}

// A missing work dir is made (and its parents); a sum that is not one is
// refused before reading.
func TestRestoreOnce_MakesTheWorkDirAndRefusesABadSum(t *testing.T) {
	workdir := filepath.Join(t.TempDir(), "layer", "home", "sandbox")
	archive, sum := ckArchive(t, "/home/sandbox", "/home/sandbox", map[string]string{"a.txt": "alpha"})
	_, errOut, err := runRestore(t, workdir, sum, archive)
	require.NoError(t, err, errOut)
	assert.FileExists(t, filepath.Join(workdir, "a.txt"))
	_, errOut, err = runRestore(t, t.TempDir(), "abc", nil)
	require.Error(t, err)
	assert.Contains(t, errOut, "64 hex digits")
}

// With -hold a stop ends the agent cleanly after a restore that succeeded
// (its result printed), and one that failed exits at once. That it keeps
// running until then is shown by the Docker provider's memory layers,
// whose files live only while it runs (providers/docker, TestProvider_Layers_*).
func TestRestoreOnce_HoldsUntilStopped(t *testing.T) {
	workdir := t.TempDir()
	archive, sum := ckArchive(t, workdir, workdir, map[string]string{"a.txt": "alpha"})
	cmd := exec.Command(buildAgent(t), "-restore", sum, "-hold")
	cmd.Env = append(os.Environ(), "QUARRY_AGENT_WORKDIR="+workdir)
	cmd.Stdin = bytes.NewReader(archive)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err)
	assert.Contains(t, line, `"files":`)
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, cmd.Wait(), "a stop ends it cleanly")

	failed := exec.Command(buildAgent(t), "-restore", strings.Repeat("0", 64), "-hold")
	failed.Env = append(os.Environ(), "QUARRY_AGENT_WORKDIR="+t.TempDir())
	failed.Stdin = bytes.NewReader(archive)
	require.Error(t, failed.Run(), "a failed restore exits at once, held or not")
}
