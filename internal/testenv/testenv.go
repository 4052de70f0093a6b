package testenv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// The variables that ask for a dependency, and the strict flag. scripts/test.sh
// sets every one of them.
const (
	// EnvStrict, when "1", turns a dependency that was not asked for into
	// a failure instead of a skip (make test sets it).
	EnvStrict = "QUARRY_TEST_STRICT"
	// EnvAWS, when "1", asks for an AWS API endpoint (AWS).
	EnvAWS = "QUARRY_TEST_AWS"
	// EnvDocker, when "1", asks for a Docker engine (Docker).
	EnvDocker = "QUARRY_TEST_DOCKER"
	// EnvBusybox names a busybox binary (Busybox).
	EnvBusybox = "QUARRY_TEST_BUSYBOX"
	// EnvPythonPath names a directory of Python packages (PythonPath).
	EnvPythonPath = "QUARRY_TEST_PYTHONPATH"
	// EnvRockPython names the python of a venv with ROCK's SDK (RockPython).
	EnvRockPython = "QUARRY_ROCK_PYTHON"
	// EnvE2BPythons names the pythons of venvs with E2B's SDK, one per
	// pinned version: "version=python,…" (E2BPythons).
	EnvE2BPythons = "QUARRY_E2B_PYTHONS"
	// EnvSchemathesisPython names the python of a venv with schemathesis
	// (SchemathesisPython).
	EnvSchemathesisPython = "QUARRY_SCHEMATHESIS_PYTHON"
	// EnvChromium names a Chromium binary for browser tests (Chromium).
	EnvChromium = "QUARRY_TEST_CHROMIUM"
	// EnvRegistry names an image registry without authentication,
	// host:port on 127.0.0.1 (Registry).
	EnvRegistry = "QUARRY_TEST_REGISTRY"
	// EnvRegistryAuth names a registry that answers 401 without
	// credentials (RegistryAuth); EnvRegistryUser holds its user:password.
	EnvRegistryAuth = "QUARRY_TEST_REGISTRY_AUTH"
	EnvRegistryUser = "QUARRY_TEST_REGISTRY_USER"
)

// envEndpoint is the AWS SDK's own variable for the endpoint of every
// service (the emulator, LocalStack).
const envEndpoint = "AWS_ENDPOINT_URL"

// defaultDockerHost is where the engine answers when DOCKER_HOST is not set.
const defaultDockerHost = "unix:///var/run/docker.sock"

// probeTimeout bounds each check that a dependency answers. The emulator
// answers one request at a time, so a busy one can take seconds.
const probeTimeout = 30 * time.Second

// maxProbeBody bounds what a probe reads of an answer.
const maxProbeBody = 64 << 10

// passed holds the checks that succeeded in this test binary (by what they
// checked), so that each runs once however many tests ask. A failed check
// is not kept: the next test checks again. It is the package's only state.
var passed sync.Map

// dependency is one kind of thing a test may need from outside Go.
type dependency struct {
	env  string // the variable that asks for it
	what string // what the test needs
	how  string // how to provide it
}

var (
	awsDep = dependency{
		env:  EnvAWS,
		what: "the AWS API emulator",
		how: "run `make test`, or start it with `localstack/emulator.sh start` and set " + EnvAWS + "=1 " + envEndpoint +
			"=http://127.0.0.1:4566 AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_REGION=us-east-1" +
			" (LocalStack or AWS itself serve too: point AWS_ENDPOINT_URL at LocalStack, or leave it unset for AWS)",
	}
	dockerDep = dependency{
		env:  EnvDocker,
		what: "a Docker engine and the test images",
		how:  "run `make test`, or `scripts/docker-up.sh && scripts/images/build.sh` and set " + EnvDocker + "=1",
	}
	busyboxDep = dependency{
		env:  EnvBusybox,
		what: "a static busybox",
		how:  "run `make test`, or install busybox-static and set " + EnvBusybox + "=/bin/busybox",
	}
	pythonPathDep = dependency{
		env:  EnvPythonPath,
		what: "Python packages for programs run in sandboxes",
		how:  "run `make test`, or set " + EnvPythonPath + "=\"$(scripts/python-deps.sh)\" (it installs them into .cache/python-deps)",
	}
	chromiumDep = dependency{
		env:  EnvChromium,
		what: "a headless Chromium",
		how:  "run `make test`, or `apt-get install chromium` and set " + EnvChromium + "=/usr/bin/chromium",
	}
	registryHow = "run `make test`, or `scripts/registry.sh start && export $(scripts/registry.sh env)`" +
		" (Debian's docker-registry on 127.0.0.1)"
	registryDep = dependency{
		env:  EnvRegistry,
		what: "an image registry on 127.0.0.1",
		how:  registryHow,
	}
	registryAuthDep = dependency{
		env:  EnvRegistryAuth,
		what: "an image registry with htpasswd authentication on 127.0.0.1, and its " + EnvRegistryUser,
		how:  registryHow,
	}
	rockDep = dependency{
		env:  EnvRockPython,
		what: "ROCK's Python SDK (rl-rock)",
		how:  "run `make test`, or set " + EnvRockPython + "=\"$(scripts/rock-sdk.sh)\" (it installs the SDK into .cache/rock-venv and prints its python)",
	}
	schemathesisDep = dependency{
		env:  EnvSchemathesisPython,
		what: "schemathesis (API fuzzing from openapi.json)",
		how:  "run `make test`, or set " + EnvSchemathesisPython + "=\"$(scripts/schemathesis.sh)\" (it installs schemathesis into .cache/schemathesis-venv and prints its python)",
	}
	e2bDep = dependency{
		env:  EnvE2BPythons,
		what: "E2B's Python SDK (e2b) at its pinned versions",
		how:  "run `make test`, or set " + EnvE2BPythons + "=\"$(scripts/e2b-sdk.sh)\" (it installs each version into .cache/e2b-venv-<version> and prints version=python pairs)",
	}
)

// Strict reports whether a dependency that was not asked for fails the test
// instead of skipping it: EnvStrict is "1". Another value than "" or "1"
// fails t.
func Strict(t testing.TB) bool {
	t.Helper()
	switch v := os.Getenv(EnvStrict); v {
	case "":
		return false
	case "1":
		return true
	default:
		t.Fatalf("%s=%q: want 1 (make test sets it) or nothing", EnvStrict, v)
		return false
	}
}

// value returns the dependency's variable, or skips t (fails it, when
// strict) when the variable is not set.
func (d dependency) value(t testing.TB) string {
	t.Helper()
	v := os.Getenv(d.env)
	if v != "" {
		return v
	}
	if Strict(t) {
		t.Fatalf("needs %s, and %s is not set (%s=1: a missing dependency is a failure, not a skip): %s", d.what, d.env, EnvStrict, d.how)
	}
	t.Skipf("skipped: needs %s (%s is not set): %s", d.what, d.env, d.how)
	return ""
}

// asked is value for a dependency whose variable is "1" when set.
func (d dependency) asked(t testing.TB) {
	t.Helper()
	if v := d.value(t); v != "1" {
		d.broken(t, "want %s=1 or nothing", d.env)
	}
}

// broken fails t: the dependency was asked for and is not usable.
func (d dependency) broken(t testing.TB, format string, args ...any) {
	t.Helper()
	t.Fatalf("%s=%s, but %s. This test needs %s: %s", d.env, os.Getenv(d.env), fmt.Sprintf(format, args...), d.what, d.how)
}

// check runs probe unless a check of key passed before in this binary.
func check(key string, probe func() error) error {
	if _, ok := passed.Load(key); ok {
		return nil
	}
	if err := probe(); err != nil {
		return err
	}
	passed.Store(key, true)
	return nil
}

// AWS makes t need an AWS API endpoint: the emulator make test starts (moto
// on 127.0.0.1:4566), LocalStack, or AWS itself. It is asked for with
// QUARRY_TEST_AWS=1; the SDK's default chain finds the rest
// (AWS_ENDPOINT_URL, AWS_REGION, credentials). Not asked for: t is skipped,
// or fails when Strict. Asked for with another value than "1", or with an
// AWS_ENDPOINT_URL on which nothing answers HTTP within 30 s: t fails. It
// returns AWS_ENDPOINT_URL; "" means the SDK's own endpoints (AWS), which
// it cannot check without a service call: the test's first call is the
// check then. Safe for concurrent use.
func AWS(t testing.TB) string {
	t.Helper()
	awsDep.asked(t)
	endpoint := os.Getenv(envEndpoint)
	if endpoint == "" {
		return ""
	}
	err := check("aws "+endpoint, func() error {
		c := &http.Client{Timeout: probeTimeout}
		return get(c, endpoint, false)
	})
	if err != nil {
		awsDep.broken(t, "nothing answers on %s=%s: %v", envEndpoint, endpoint, err)
	}
	return endpoint
}

// Docker makes t need a Docker engine with images (by name, e.g.
// "quarry-test/busybox:latest"). It is asked for with QUARRY_TEST_DOCKER=1;
// the engine is DOCKER_HOST (unix:// or tcp://), by default
// unix:///var/run/docker.sock. Not asked for: t is skipped, or fails when
// Strict. Asked for with another value than "1", or when the engine does
// not answer its /_ping within 30 s or lacks one of the images: t fails.
// Safe for concurrent use.
func Docker(t testing.TB, images ...string) {
	t.Helper()
	dockerDep.asked(t)
	host := os.Getenv("DOCKER_HOST")
	if host == "" {
		host = defaultDockerHost
	}
	c, base, err := dockerClient(host)
	if err != nil {
		dockerDep.broken(t, "DOCKER_HOST=%s: %v", host, err)
	}
	if err := check("docker "+host, func() error { return get(c, base+"/_ping", true) }); err != nil {
		dockerDep.broken(t, "no Docker engine answers on %s: %v", host, err)
	}
	for _, img := range images {
		err := check("docker "+host+" image "+img, func() error {
			return get(c, base+"/images/"+img+"/json", true)
		})
		if err != nil {
			dockerDep.broken(t, "image %s: %v", img, err)
		}
	}
}

// Registry makes t need an image registry (the Docker Registry HTTP API
// V2) without authentication, and returns its host:port. It is asked for
// with QUARRY_TEST_REGISTRY=127.0.0.1:PORT (make test: scripts/registry.sh).
// Not asked for: t is skipped, or fails when Strict. An address that is
// not on 127.0.0.1 (tests send no traffic off the machine), or on which
// /v2/ does not answer 200 within 30 s, fails t. Safe for concurrent use.
func Registry(t testing.TB) string {
	t.Helper()
	addr := registryDep.value(t)
	if err := checkRegistry(addr, http.StatusOK); err != nil {
		registryDep.broken(t, "%v", err)
	}
	return addr
}

// RegistryAuth makes t need an image registry that asks for credentials,
// and returns its host:port, user and password. It is asked for with
// QUARRY_TEST_REGISTRY_AUTH=127.0.0.1:PORT and
// QUARRY_TEST_REGISTRY_USER=user:password (make test:
// scripts/registry.sh). Not asked for: t is skipped, or fails when
// Strict. An address not on 127.0.0.1, a /v2/ that does not answer 401
// without credentials and 200 with them within 30 s, or a user without
// a password fails t. Safe for concurrent use.
func RegistryAuth(t testing.TB) (addr, user, password string) {
	t.Helper()
	addr = registryAuthDep.value(t)
	userPass := os.Getenv(EnvRegistryUser)
	user, password, ok := strings.Cut(userPass, ":")
	if !ok || user == "" || password == "" {
		registryAuthDep.broken(t, "%s must be user:password", EnvRegistryUser)
	}
	err := checkRegistry(addr, http.StatusUnauthorized)
	if err == nil {
		err = check("registry "+addr+" as "+userPass, func() error { return getRegistry(addr, user, password, http.StatusOK) })
	}
	if err != nil {
		registryAuthDep.broken(t, "%v", err)
	}
	return addr, user, password
}

// checkRegistry checks that the registry at addr is on 127.0.0.1 and that
// its /v2/ answers status without credentials.
func checkRegistry(addr string, status int) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("want 127.0.0.1:PORT, got %q", addr)
	}
	if host != "127.0.0.1" {
		return fmt.Errorf("want a registry on 127.0.0.1 (tests send no traffic off the machine), got %q", addr)
	}
	return check(fmt.Sprintf("registry %s %d", addr, status), func() error { return getRegistry(addr, "", "", status) })
}

// getRegistry asks the registry's /v2/ (with basic credentials unless
// user is "") and wants status.
func getRegistry(addr, user, password string, status int) error {
	req, err := http.NewRequest(http.MethodGet, "http://"+addr+"/v2/", nil)
	if err != nil {
		return err
	}
	if user != "" {
		req.SetBasicAuth(user, password)
	}
	c := &http.Client{Timeout: probeTimeout}
	resp, err := c.Do(req)
	if err != nil {
		return fmt.Errorf("no registry answers on %s: %w", addr, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxProbeBody))
	if resp.StatusCode != status {
		return fmt.Errorf("GET http://%s/v2/ answered %s, want %d: %s", addr, resp.Status, status, bytesTail(body))
	}
	return nil
}

// Busybox makes t need a busybox binary, and returns its path. It is asked
// for with QUARRY_TEST_BUSYBOX=<path> (make test: /bin/busybox, from
// busybox-static). Not asked for: t is skipped, or fails when Strict. A
// path that is not an executable file fails t.
func Busybox(t testing.TB) string {
	t.Helper()
	path := busyboxDep.value(t)
	fi, err := os.Stat(path)
	switch {
	case err != nil:
		busyboxDep.broken(t, "%v", err)
	case !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0:
		busyboxDep.broken(t, "%s is not an executable file (mode %s)", path, fi.Mode())
	}
	return path
}

// Chromium makes t need a Chromium (or Chrome) binary that runs headless,
// and returns its path. It is asked for with QUARRY_TEST_CHROMIUM=<path>
// (make test: /usr/bin/chromium, from Debian's chromium). Not asked for: t
// is skipped, or fails when Strict. A path that is not an executable, or a
// binary that does not print its version, fails t. Safe for concurrent use.
func Chromium(t testing.TB) string {
	t.Helper()
	path := chromiumDep.value(t)
	err := check("chromium "+path, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
		defer cancel()
		out, err := exec.CommandContext(ctx, path, "--version").CombinedOutput()
		if err != nil {
			return fmt.Errorf("%s --version: %w: %s", path, err, bytesTail(out))
		}
		if !strings.Contains(strings.ToLower(string(out)), "chrom") {
			return fmt.Errorf("%s --version printed %q: not a Chromium", path, bytesTail(out))
		}
		return nil
	})
	if err != nil {
		chromiumDep.broken(t, "%v", err)
	}
	return path
}

// PythonPath makes t need a directory from which the host's python3
// imports modules (e.g. "openai"), and returns it: the PYTHONPATH of the
// Python programs the test runs. It is asked for with
// QUARRY_TEST_PYTHONPATH=<dir> (make test: the directory
// scripts/python-deps.sh prints). Not asked for: t is skipped, or fails
// when Strict. A directory from which a module does not import fails t.
// Safe for concurrent use.
func PythonPath(t testing.TB, modules ...string) string {
	t.Helper()
	dir := pythonPathDep.value(t)
	err := check("pythonpath "+dir+" "+strings.Join(modules, ","), func() error {
		return pythonImports("python3", []string{"PYTHONPATH=" + dir}, modules)
	})
	if err != nil {
		pythonPathDep.broken(t, "%v", err)
	}
	return dir
}

// rockModules are the parts of ROCK's SDK the tests' drivers import.
var rockModules = []string{"rock.sdk.sandbox.client", "rock.sdk.envs"}

// RockPython makes t need ROCK's Python SDK (rl-rock), and returns the
// python that imports it. It is asked for with QUARRY_ROCK_PYTHON=<path>
// (make test: the venv's python scripts/rock-sdk.sh prints, an absolute
// path). Not asked for: t is skipped, or fails when Strict. A python that
// does not run or does not import the SDK fails t. Safe for concurrent use.
func RockPython(t testing.TB) string {
	t.Helper()
	py := rockDep.value(t)
	if err := check("rock "+py, func() error { return pythonImports(py, nil, rockModules) }); err != nil {
		rockDep.broken(t, "%v", err)
	}
	return py
}

// SchemathesisPython returns the python of a venv with schemathesis,
// checked to import it. Not asked for: t is skipped, or fails when Strict.
func SchemathesisPython(t testing.TB) string {
	t.Helper()
	py := schemathesisDep.value(t)
	if err := check("schemathesis "+py, func() error { return pythonImports(py, nil, []string{"schemathesis"}) }); err != nil {
		schemathesisDep.broken(t, "%v", err)
	}
	return py
}

// E2BPythons returns the python of each pinned version of E2B's SDK, by
// version, each checked to import the SDK.
func E2BPythons(t testing.TB) map[string]string {
	t.Helper()
	v := e2bDep.value(t)
	out := map[string]string{}
	for _, pair := range strings.Split(v, ",") {
		version, py, ok := strings.Cut(pair, "=")
		if !ok || version == "" || py == "" {
			e2bDep.broken(t, "%s=%q: want version=python pairs joined by commas", EnvE2BPythons, v)
		}
		if err := check("e2b "+py, func() error { return pythonImports(py, nil, []string{"e2b"}) }); err != nil {
			e2bDep.broken(t, "%v", err)
		}
		out[version] = py
	}
	return out
}

// pythonImports runs python (with env added to the test's environment) to
// import modules, and returns its output in the error when it fails.
func pythonImports(python string, env, modules []string) error {
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, python, "-c", "import "+strings.Join(append([]string{"sys"}, modules...), ", "))
	cmd.Env = append(os.Environ(), env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s cannot import %s: %w: %s", python, strings.Join(modules, ", "), err, bytesTail(out))
	}
	return nil
}

// bytesTail returns the end of a program's output, for an error message.
func bytesTail(b []byte) string {
	const max = 2 << 10
	if len(b) > max {
		b = b[len(b)-max:]
	}
	return strings.TrimSpace(string(b))
}

// dockerClient returns an HTTP client of the engine at host and the base URL
// of its API.
func dockerClient(host string) (*http.Client, string, error) {
	u, err := url.Parse(host)
	if err != nil {
		return nil, "", fmt.Errorf("parse: %w", err)
	}
	switch u.Scheme {
	case "unix":
		var d net.Dialer
		tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return d.DialContext(ctx, "unix", u.Path)
		}}
		return &http.Client{Timeout: probeTimeout, Transport: tr}, "http://docker", nil
	case "tcp":
		return &http.Client{Timeout: probeTimeout}, "http://" + u.Host, nil
	default:
		return nil, "", fmt.Errorf("want unix:// or tcp://, got %q", u.Scheme)
	}
}

// get fetches url with c. With wantOK, only a 200 counts; else any HTTP
// answer does (an endpoint's root answers 404 or 403 to a bare GET).
func get(c *http.Client, url string, wantOK bool) error {
	resp, err := c.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxProbeBody))
	if wantOK && resp.StatusCode != http.StatusOK {
		return errors.New(resp.Status + ": " + bytesTail(body))
	}
	return nil
}
