package providertest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// buildTimeout bounds one build of the exec agent.
const buildTimeout = 5 * time.Minute

// maxBuildOutput bounds how much compiler output a failure quotes.
const maxBuildOutput = 8 << 10

// agentBuild caches the one build of the exec agent per test binary.
// It is the only package-level state, and this package is for tests only.
var agentBuild struct {
	once sync.Once
	dir  string
	path string
	err  error
}

// BuildAgent builds ./cmd/execagent of the module under test (found with
// `go env GOMOD`) as a static binary (CGO_ENABLED=0), once per test binary,
// and returns its path. It fails the test if the build fails. The binary
// lives in a temporary directory; call RemoveAgentBuild from TestMain after
// m.Run to delete it. Safe for concurrent use.
func BuildAgent(t testing.TB) string {
	t.Helper()
	agentBuild.once.Do(func() {
		agentBuild.dir, agentBuild.path, agentBuild.err = buildAgent()
	})
	if agentBuild.err != nil {
		t.Fatalf("build exec agent: %v", agentBuild.err)
	}
	return agentBuild.path
}

// RemoveAgentBuild deletes the binary built by BuildAgent, if any. Call it
// once, after every test has run.
func RemoveAgentBuild() {
	if agentBuild.dir != "" {
		_ = os.RemoveAll(agentBuild.dir)
	}
}

func buildAgent() (dir, path string, err error) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		return "", "", fmt.Errorf("find go: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, goBin, "env", "GOMOD").Output()
	if err != nil {
		return "", "", fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", "", fmt.Errorf("go env GOMOD: not inside a module")
	}
	dir, err = os.MkdirTemp("", "quarry-execagent-")
	if err != nil {
		return "", "", fmt.Errorf("create build directory: %w", err)
	}
	path = filepath.Join(dir, "execagent")
	cmd := exec.CommandContext(ctx, goBin, "build", "-o", path, "./cmd/execagent")
	cmd.Dir = filepath.Dir(gomod)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		_ = os.RemoveAll(dir)
		if len(out) > maxBuildOutput {
			out = out[len(out)-maxBuildOutput:]
		}
		return "", "", fmt.Errorf("go build ./cmd/execagent: %w\n%s", err, out)
	}
	return dir, path, nil
}
