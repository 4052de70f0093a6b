package testenv

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// recorder is the testing.TB the functions under test get: it records a
// skip or a failure and ends the goroutine, as testing does. Methods it
// does not override panic (the embedded TB is nil): the functions must
// call nothing else.
type recorder struct {
	testing.TB
	outcome string // "ran", "skip" or "fail"
	msg     string
}

func (r *recorder) Helper() {}

func (r *recorder) Skipf(format string, args ...any) {
	r.outcome, r.msg = "skip", fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func (r *recorder) Fatalf(format string, args ...any) {
	r.outcome, r.msg = "fail", fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// call runs fn with a recorder in a goroutine of its own (a skip or a
// failure ends it) and returns the recorder.
func call(fn func(tb testing.TB)) *recorder {
	r := &recorder{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(r)
		r.outcome = "ran"
	}()
	<-done
	return r
}

// fakeEngine serves a Docker API that has the image "present".
func fakeEngine(t *testing.T) string {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /_ping", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("OK")) })
	mux.HandleFunc("GET /images/present/json", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("{}")) })
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return "tcp://" + srv.Listener.Addr().String()
}

// fakeRegistry serves a registry's /v2/: 200, or with auth 401 unless the
// request carries quarry:secret. It returns its host:port.
func fakeRegistry(t *testing.T, auth bool) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); auth && (!ok || u != "quarry" || p != "secret") {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		_, _ = w.Write([]byte("{}"))
	}))
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String()
}

// closedAddr returns an address on which nothing listens.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}

// script writes an executable sh script and returns its path.
func script(t *testing.T, dir, name, body string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(path, []byte("#!/bin/sh\n"+body+"\n"), 0o755))
	return path
}

func TestDependencies_SkipFailOrRun(t *testing.T) {
	answering := httptest.NewServer(http.NotFoundHandler()) // moto answers a bare GET with a 404
	t.Cleanup(answering.Close)
	dir := t.TempDir()
	exe := script(t, dir, "busybox", "exit 0")
	notExe := filepath.Join(dir, "plain")
	require.NoError(t, os.WriteFile(notExe, nil, 0o644))
	goodPython := script(t, dir, "good-python", "exit 0")
	badPython := script(t, dir, "bad-python", `echo "ModuleNotFoundError: No module named 'rock'" >&2; exit 1`)
	fakeBin := t.TempDir() // a python3 on PATH that imports only "json"
	script(t, fakeBin, "python3", `case "$2" in *json*) exit 0;; *) echo "No module named x" >&2; exit 1;; esac`)

	aws := func(tb testing.TB) { AWS(tb) }
	docker := func(images ...string) func(testing.TB) { return func(tb testing.TB) { Docker(tb, images...) } }
	busybox := func(tb testing.TB) { Busybox(tb) }
	pythonPath := func(modules ...string) func(testing.TB) {
		return func(tb testing.TB) { PythonPath(tb, modules...) }
	}
	rock := func(tb testing.TB) { RockPython(tb) }
	chromium := func(tb testing.TB) { Chromium(tb) }
	goodChromium := script(t, dir, "chromium", `echo "Chromium 156.0.8078.114 built on Debian GNU/Linux 12 (bookworm)"`)
	otherBinary := script(t, dir, "not-chromium", `echo "busybox v1.35"`)
	failingChromium := script(t, dir, "broken-chromium", `echo "error while loading shared libraries" >&2; exit 127`)
	registry := func(tb testing.TB) { Registry(tb) }
	registryAuth := func(tb testing.TB) { RegistryAuth(tb) }
	open, authed := fakeRegistry(t, false), fakeRegistry(t, true)
	tests := []struct {
		name    string
		env     map[string]string
		fn      func(testing.TB)
		outcome string
		msg     []string
	}{
		{name: "aws not asked: skip saying what and how", fn: aws, outcome: "skip",
			msg: []string{"skipped: needs the AWS API emulator", "QUARRY_TEST_AWS is not set", "make test", "QUARRY_TEST_AWS=1 AWS_ENDPOINT_URL="}},
		{name: "aws not asked, strict: fail", env: map[string]string{EnvStrict: "1"}, fn: aws, outcome: "fail",
			msg: []string{"QUARRY_TEST_AWS is not set", "QUARRY_TEST_STRICT=1", "make test"}},
		{name: "aws asked with another value: fail", env: map[string]string{EnvAWS: "true"}, fn: aws, outcome: "fail",
			msg: []string{"QUARRY_TEST_AWS=true", "want QUARRY_TEST_AWS=1"}},
		{name: "aws asked, nothing on the endpoint: fail", env: map[string]string{EnvAWS: "1", envEndpoint: "http://" + closedAddr(t)},
			fn: aws, outcome: "fail", msg: []string{"nothing answers on AWS_ENDPOINT_URL=http://127.0.0.1:"}},
		{name: "aws asked, endpoint answers: run", env: map[string]string{EnvAWS: "1", envEndpoint: answering.URL}, fn: aws, outcome: "ran"},
		{name: "aws asked, no endpoint (AWS itself): run", env: map[string]string{EnvAWS: "1", envEndpoint: ""}, fn: aws, outcome: "ran"},
		{name: "bad strict value: fail", env: map[string]string{EnvStrict: "yes"}, fn: aws, outcome: "fail", msg: []string{`QUARRY_TEST_STRICT="yes"`}},

		{name: "docker not asked: skip", fn: docker(), outcome: "skip",
			msg: []string{"needs a Docker engine", "QUARRY_TEST_DOCKER is not set", "scripts/docker-up.sh"}},
		{name: "docker not asked, strict: fail", env: map[string]string{EnvStrict: "1"}, fn: docker(), outcome: "fail"},
		{name: "docker asked, no engine: fail", env: map[string]string{EnvDocker: "1", "DOCKER_HOST": "unix://" + filepath.Join(dir, "none.sock")},
			fn: docker(), outcome: "fail", msg: []string{"no Docker engine answers"}},
		{name: "docker asked, engine and image: run", env: map[string]string{EnvDocker: "1", "DOCKER_HOST": fakeEngine(t)},
			fn: docker("present"), outcome: "ran"},
		{name: "docker asked, image missing: fail", env: map[string]string{EnvDocker: "1", "DOCKER_HOST": fakeEngine(t)},
			fn: docker("present", "missing"), outcome: "fail", msg: []string{"image missing", "scripts/images/build.sh"}},
		{name: "docker asked, host of another kind: fail", env: map[string]string{EnvDocker: "1", "DOCKER_HOST": "ssh://box"},
			fn: docker(), outcome: "fail", msg: []string{"want unix:// or tcp://"}},

		{name: "busybox not asked: skip", fn: busybox, outcome: "skip", msg: []string{"QUARRY_TEST_BUSYBOX is not set", "busybox-static"}},
		{name: "busybox missing: fail", env: map[string]string{EnvBusybox: filepath.Join(dir, "none")}, fn: busybox, outcome: "fail"},
		{name: "busybox a directory: fail", env: map[string]string{EnvBusybox: dir}, fn: busybox, outcome: "fail", msg: []string{"not an executable file"}},
		{name: "busybox not executable: fail", env: map[string]string{EnvBusybox: notExe}, fn: busybox, outcome: "fail"},
		{name: "busybox there: run", env: map[string]string{EnvBusybox: exe}, fn: busybox, outcome: "ran"},

		{name: "python packages not asked: skip", fn: pythonPath("json"), outcome: "skip", msg: []string{"scripts/python-deps.sh"}},
		{name: "python packages import: run", env: map[string]string{EnvPythonPath: dir, "PATH": fakeBin}, fn: pythonPath("json"), outcome: "ran"},
		{name: "python package does not import: fail", env: map[string]string{EnvPythonPath: dir, "PATH": fakeBin},
			fn: pythonPath("openai"), outcome: "fail", msg: []string{"cannot import openai", "No module named"}},

		{name: "rock not asked: skip", fn: rock, outcome: "skip", msg: []string{"ROCK's Python SDK", "scripts/rock-sdk.sh"}},
		{name: "rock imports: run", env: map[string]string{EnvRockPython: goodPython}, fn: rock, outcome: "ran"},
		{name: "rock does not import: fail", env: map[string]string{EnvRockPython: badPython}, fn: rock, outcome: "fail",
			msg: []string{"cannot import rock.sdk.sandbox.client", "No module named 'rock'"}},
		{name: "rock python missing: fail", env: map[string]string{EnvRockPython: filepath.Join(dir, "none")}, fn: rock, outcome: "fail"},

		{name: "chromium not asked: skip", fn: chromium, outcome: "skip", msg: []string{"a headless Chromium", "QUARRY_TEST_CHROMIUM is not set", "apt-get install chromium"}},
		{name: "chromium not asked, strict: fail", env: map[string]string{EnvStrict: "1"}, fn: chromium, outcome: "fail"},
		{name: "chromium there: run", env: map[string]string{EnvChromium: goodChromium}, fn: chromium, outcome: "ran"},
		{name: "chromium missing: fail", env: map[string]string{EnvChromium: filepath.Join(dir, "none")}, fn: chromium, outcome: "fail"},
		{name: "chromium another binary: fail", env: map[string]string{EnvChromium: otherBinary}, fn: chromium, outcome: "fail", msg: []string{"not a Chromium"}},
		{name: "registry not asked: skip", fn: registry, outcome: "skip", msg: []string{"an image registry", "QUARRY_TEST_REGISTRY is not set", "scripts/registry.sh start"}},
		{name: "registry not asked, strict: fail", env: map[string]string{EnvStrict: "1"}, fn: registry, outcome: "fail"},
		{name: "registry there: run", env: map[string]string{EnvRegistry: open}, fn: registry, outcome: "ran"},
		{name: "registry not answering: fail", env: map[string]string{EnvRegistry: closedAddr(t)}, fn: registry, outcome: "fail", msg: []string{"no registry answers"}},
		{name: "registry off the machine: fail", env: map[string]string{EnvRegistry: "192.0.2.1:5000"}, fn: registry, outcome: "fail", msg: []string{"on 127.0.0.1"}},
		{name: "registry asking for credentials: fail", env: map[string]string{EnvRegistry: authed}, fn: registry, outcome: "fail", msg: []string{"401"}},
		{name: "auth registry not asked: skip", fn: registryAuth, outcome: "skip", msg: []string{"htpasswd", "QUARRY_TEST_REGISTRY_AUTH is not set"}},
		{name: "auth registry there: run", env: map[string]string{EnvRegistryAuth: authed, EnvRegistryUser: "quarry:secret"}, fn: registryAuth, outcome: "ran"},
		{name: "auth registry, wrong password: fail", env: map[string]string{EnvRegistryAuth: authed, EnvRegistryUser: "quarry:nope"}, fn: registryAuth, outcome: "fail", msg: []string{"401"}},
		{name: "auth registry, no user: fail", env: map[string]string{EnvRegistryAuth: authed}, fn: registryAuth, outcome: "fail", msg: []string{"QUARRY_TEST_REGISTRY_USER must be user:password"}},
		{name: "auth registry without auth: fail", env: map[string]string{EnvRegistryAuth: open, EnvRegistryUser: "quarry:secret"}, fn: registryAuth, outcome: "fail", msg: []string{"want 401"}},

		{name: "chromium does not start: fail", env: map[string]string{EnvChromium: failingChromium}, fn: chromium, outcome: "fail", msg: []string{"shared libraries"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, name := range []string{EnvStrict, EnvAWS, EnvDocker, EnvBusybox, EnvPythonPath, EnvRockPython, EnvChromium, EnvRegistry, EnvRegistryAuth, EnvRegistryUser} {
				t.Setenv(name, "")
			}
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			r := call(tt.fn)
			assert.Equal(t, tt.outcome, r.outcome, "message: %s", r.msg)
			for _, m := range tt.msg {
				assert.Contains(t, r.msg, m)
			}
		})
	}
}

func TestAWS_ReturnsTheEndpoint(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(srv.Close)
	t.Setenv(EnvStrict, "")
	t.Setenv(EnvAWS, "1")
	t.Setenv(envEndpoint, srv.URL)
	assert.Equal(t, srv.URL, AWS(t))
}
