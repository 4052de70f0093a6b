//go:build integration

package tests

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// readmeMarker, alone on the line before a ```sh fence, marks a README
// block that TestReadme_MarkedBlocksRunInOrder runs.
const readmeMarker = "<!-- readme-test -->"

// readmeBlock is one marked block: its lines and the README line of its first.
type readmeBlock struct {
	line  int
	lines []string
}

// readmeBlocks are the marked blocks of the Markdown file at path, in order.
// A marker not followed by a ```sh fence, or a fence never closed, fails t.
func readmeBlocks(t *testing.T, path string) []readmeBlock {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	lines := strings.Split(string(data), "\n")
	var blocks []readmeBlock
	for i := 0; i < len(lines); i++ {
		if strings.TrimSpace(lines[i]) != readmeMarker {
			continue
		}
		require.Less(t, i+1, len(lines), "%s:%d: %s at the end of the file", path, i+1, readmeMarker)
		require.Equal(t, "```sh", strings.TrimSpace(lines[i+1]), "%s:%d: %s must come right before a ```sh fence", path, i+1, readmeMarker)
		b := readmeBlock{line: i + 3}
		for i += 2; ; i++ {
			require.Less(t, i, len(lines), "%s:%d: the block is not closed", path, b.line-1)
			if strings.TrimSpace(lines[i]) == "```" {
				break
			}
			b.lines = append(b.lines, lines[i])
		}
		blocks = append(blocks, b)
	}
	return blocks
}

// readmeScript is one bash script of the blocks, in order, after prelude
// (the banner's export line): it stops at the first command that fails and
// says which (line, status, command), and ends with "readme-test: all N
// blocks ran". at maps the script's lines to the README's.
func readmeScript(prelude string, blocks []readmeBlock) (script string, at map[int]int) {
	at = map[int]int{}
	var b strings.Builder
	n := 0
	add := func(readmeLine int, l string) {
		n++
		if readmeLine > 0 {
			at[n] = readmeLine
		}
		b.WriteString(l + "\n")
	}
	add(0, "set -euo pipefail")
	add(0, `trap 'rc=$?; echo "readme-test: line $LINENO exited $rc: $BASH_COMMAND" >&2' ERR`)
	add(0, prelude)
	for _, blk := range blocks {
		add(0, fmt.Sprintf("printf '\\n== README.md:%d\\n'", blk.line))
		for i, l := range blk.lines {
			add(blk.line+i, l)
		}
	}
	add(0, fmt.Sprintf("echo 'readme-test: all %d blocks ran'", len(blocks)))
	return b.String(), at
}

var readmeFailure = regexp.MustCompile(`readme-test: line (\d+) exited (\d+): (.*)`)

// The README's shell blocks marked <!-- readme-test --> run as a reader runs
// them: in order, in one bash (variables carry from one block to the next),
// after the export line make run's banner prints, against a gateway that
// scripts/run.sh started, in a fresh directory whose bin/ holds the built
// binaries (as make build's bin/ in a checkout). Every command must succeed:
// curl is curl --fail-with-body, so an HTTP error fails the block too (a
// block that used a released sandbox answered 410 and went on).
func TestReadme_MarkedBlocksRunInOrder(t *testing.T) {
	_, err := exec.LookPath("jq")
	require.NoError(t, err, "the README's blocks use jq: apt-get install jq (make test installs it)")
	blocks := readmeBlocks(t, "../README.md")
	require.NotEmpty(t, blocks, "README.md marks no block with %s", readmeMarker)

	m := startMakeRun(t)
	export := m.bannerLine("export QUARRY_URL=")
	require.NotEmpty(t, export, "the banner's export line:\n%s", strings.Join(m.banner, "\n"))
	script, at := readmeScript(export, blocks)

	work, env := readerShell(t)
	scriptFile := filepath.Join(t.TempDir(), "readme.sh")
	require.NoError(t, os.WriteFile(scriptFile, []byte(script), 0o644))

	c, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(c, "bash", scriptFile)
	cmd.Dir, cmd.Env = work, env
	// Its own process group, killed whole: a block's background job dies with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	var out bytes.Buffer // one writer for both: exec writes it from one goroutine
	cmd.Stdout, cmd.Stderr = &out, &out
	runErr := cmd.Run()
	if cmd.Process != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	if runErr != nil {
		where := "README.md"
		if f := readmeFailure.FindStringSubmatch(out.String()); f != nil {
			line, _ := strconv.Atoi(f[1])
			where = fmt.Sprintf("README.md:%d: %s exited %s", at[line], f[3], f[2])
		}
		t.Fatalf("%s (%v); the blocks' output:\n%s", where, runErr, tail(out.String(), 8000))
	}
	require.True(t, strings.HasSuffix(strings.TrimSpace(out.String()), fmt.Sprintf("readme-test: all %d blocks ran", len(blocks))),
		"the script ran to its end:\n%s", tail(out.String(), 8000))
	if os.Getenv("E2E_LOGS") != "" {
		t.Logf("the blocks' output:\n%s", out.String())
	}
}

// readerShell is where a test runs commands as a reader of make run's
// banner or the README would: a fresh directory whose bin/ holds the built
// binaries (as make build's bin/ in a checkout), and an environment without
// the caller's QUARRY_* settings in which curl is curl --fail-with-body, so
// that an HTTP error fails the command.
func readerShell(t *testing.T) (dir string, env []string) {
	t.Helper()
	realCurl, err := exec.LookPath("curl")
	require.NoError(t, err, "needs curl (make test installs it)")
	dir, tools := t.TempDir(), t.TempDir()
	require.NoError(t, os.Symlink(bins.dir, filepath.Join(dir, "bin")))
	require.NoError(t, os.WriteFile(filepath.Join(tools, "curl"),
		[]byte("#!/bin/sh\nexec "+strconv.Quote(realCurl)+" --fail-with-body \"$@\"\n"), 0o755))
	for _, kv := range os.Environ() {
		switch {
		case strings.HasPrefix(kv, "QUARRY_"):
		case strings.HasPrefix(kv, "PATH="):
			env = append(env, "PATH="+tools+":"+kv[len("PATH="):])
		default:
			env = append(env, kv)
		}
	}
	return dir, env
}

// tail is at most the last n bytes of s.
func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}
