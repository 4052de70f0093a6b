package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"runtime"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// maxTokenBytes bounds what is read from the token pipe.
const maxTokenBytes = 4 << 10

// Variables of the derived-token hand-over (see hideKey).
const (
	envTokenKey       = "QUARRY_AGENT_TOKEN_KEY"
	envTokenNonce     = "QUARRY_AGENT_TOKEN_NONCE"
	envTokenNonceFrom = "QUARRY_AGENT_TOKEN_NONCE_FROM"
	envTokenFD        = "QUARRY_AGENT_TOKEN_FD"
)

// Where QUARRY_AGENT_TOKEN_NONCE_FROM takes the nonce from.
const (
	// nonceFromTaskARN: the task's ARN, from the ECS task metadata
	// endpoint v4 ($ECS_CONTAINER_METADATA_URI_V4/task, field TaskARN),
	// which ECS (Fargate too) provides in every container. The gateway
	// knows each task's ARN from RunTask and DescribeTasks.
	nonceFromTaskARN = "ecs-task-arn"
	// envMetadataURI is set by ECS, not by Quarry.
	envMetadataURI = "ECS_CONTAINER_METADATA_URI_V4"
)

// Bounds of the task metadata read.
const (
	maxMetadataBytes = 1 << 20
	maxTaskARNLen    = 2048
)

// metadataClient reads the task ARN from the ECS task metadata endpoint:
// attempts tries, each bounded by timeout, with backoff (doubling) between
// them, since the endpoint may answer late or incompletely while the
// container starts.
type metadataClient struct {
	attempts int
	timeout  time.Duration
	backoff  time.Duration
}

// defaultMetadataClient tries for about 20 s at most.
func defaultMetadataClient() metadataClient {
	return metadataClient{attempts: 5, timeout: 2 * time.Second, backoff: 500 * time.Millisecond}
}

// taskARN returns the TaskARN of GET base/task. base is the value of
// ECS_CONTAINER_METADATA_URI_V4; errors name it. Proxies are not used
// (the endpoint is link-local; a sandbox image's HTTP_PROXY must not
// catch it).
func (m metadataClient) taskARN(ctx context.Context, base string) (string, error) {
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("%s: want the http URL ECS sets, got %q", envMetadataURI, base)
	}
	endpoint := strings.TrimSuffix(base, "/") + "/task"
	client := &http.Client{Timeout: m.timeout, Transport: &http.Transport{Proxy: nil}}
	defer client.CloseIdleConnections()
	var last error
	wait := m.backoff
	for attempt := 1; attempt <= m.attempts; attempt++ {
		if attempt > 1 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return "", fmt.Errorf("read the task ARN from %s (%s): %w (last error: %w)", envMetadataURI, endpoint, ctx.Err(), last)
			case <-t.C:
			}
			wait *= 2
		}
		var arn string
		if arn, last = getTaskARN(ctx, client, endpoint); last == nil {
			return arn, nil
		}
	}
	return "", fmt.Errorf("read the task ARN from %s (%s): %d tries: %w", envMetadataURI, endpoint, m.attempts, last)
}

// getTaskARN makes one try of taskARN.
func getTaskARN(ctx context.Context, client *http.Client, endpoint string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, endpoint, nil)
	if err != nil {
		return "", fmt.Errorf("build request: %w", err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxMetadataBytes+1))
	if err != nil {
		return "", fmt.Errorf("read the answer: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("status %d", resp.StatusCode)
	}
	if len(body) > maxMetadataBytes {
		return "", fmt.Errorf("the answer exceeds %d bytes", maxMetadataBytes)
	}
	var meta struct {
		TaskARN string `json:"TaskARN"`
	}
	if err := json.Unmarshal(body, &meta); err != nil {
		return "", fmt.Errorf("decode the answer: %w", err)
	}
	arn := meta.TaskARN
	if !strings.HasPrefix(arn, "arn:") || !strings.Contains(arn, ":task/") || len(arn) > maxTaskARNLen || strings.ContainsAny(arn, " \t\r\n") {
		return "", fmt.Errorf("TaskARN %.100q is not a task ARN", arn)
	}
	return arn, nil
}

// hideKey re-executes the agent with QUARRY_AGENT_TOKEN_KEY,
// QUARRY_AGENT_TOKEN_NONCE and _NONCE_FROM removed from its environment and the derived
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
		if k != envTokenKey && k != envTokenNonce && k != envTokenNonceFrom && k != envTokenFD {
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
