package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// maxTokenBytes bounds what is read from the token pipe.
const maxTokenBytes = 4 << 10

// Variables of the derived-token hand-over (see hideKey).
const (
	envTokenKey   = "QUARRY_AGENT_TOKEN_KEY"
	envTokenNonce = "QUARRY_AGENT_TOKEN_NONCE"
	envTokenFD    = "QUARRY_AGENT_TOKEN_FD"
)

// hideKey re-executes the agent with QUARRY_AGENT_TOKEN_KEY and
// QUARRY_AGENT_TOKEN_NONCE removed from its environment and the derived
// token on an inherited pipe (QUARRY_AGENT_TOKEN_FD): /proc/<pid>/environ
// shows a process's initial environment for its whole life, and on ECS the
// agent is PID 1 of a container whose commands run as its user, so without
// the new image they could read the deployment's key there. It returns only
// when the exec failed.
func hideKey(token string) error {
	r, w, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("hand the token over: %w", err)
	}
	defer r.Close()
	_, werr := io.WriteString(w, token) // far below the pipe's buffer
	if err := errors.Join(werr, w.Close()); err != nil {
		return fmt.Errorf("hand the token over: %w", err)
	}
	fd := int(r.Fd())
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, 0); err != nil { // survive the exec
		return fmt.Errorf("hand the token over: %w", err)
	}
	env := []string{fmt.Sprintf("%s=%d", envTokenFD, fd)}
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if k != envTokenKey && k != envTokenNonce && k != envTokenFD {
			env = append(env, kv)
		}
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("hand the token over: find the agent's executable: %w", err)
	}
	err = syscall.Exec(exe, os.Args, env)
	runtime.KeepAlive(r)
	return fmt.Errorf("hand the token over: re-execute %s: %w", exe, err)
}

// readTokenFD reads the token hideKey left on the pipe fd, then closes it
// (so no command inherits it).
func readTokenFD(fd int) (string, error) {
	f := os.NewFile(uintptr(fd), "token pipe")
	if f == nil {
		return "", fmt.Errorf("%s: %d is not a file descriptor", envTokenFD, fd)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxTokenBytes))
	if err != nil {
		return "", fmt.Errorf("%s: %w", envTokenFD, err)
	}
	t := strings.TrimSpace(string(b))
	if t == "" {
		return "", fmt.Errorf("%s: no token on the pipe", envTokenFD)
	}
	return t, nil
}
