// Package testimages builds small images on a Docker engine, pushes them to
// a registry on 127.0.0.1 and removes them again: the images that the tests
// of images on demand (providers/docker, tests/) and the images benchmark
// (bench/imagebench) pull. Every image is a base image the engine has plus
// one layer of a few files, built with the engine's classic builder, so it
// needs nothing from a network.
//
// For tests and benchmarks only. It imports no other Quarry package.
package testimages

import (
	"archive/tar"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/docker/docker/api/types/build"
	"github.com/docker/docker/api/types/events"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/api/types/registry"
	dockerclient "github.com/docker/docker/client"
	"github.com/docker/docker/pkg/jsonmessage"
)

// Engine is the part of the Docker client the package uses.
type Engine interface {
	ImageBuild(ctx context.Context, buildContext io.Reader, options build.ImageBuildOptions) (build.ImageBuildResponse, error)
	ImageInspect(ctx context.Context, image string, opts ...dockerclient.ImageInspectOption) (image.InspectResponse, error)
	ImagePush(ctx context.Context, image string, options image.PushOptions) (io.ReadCloser, error)
	ImageRemove(ctx context.Context, image string, options image.RemoveOptions) ([]image.DeleteResponse, error)
	Events(ctx context.Context, options events.ListOptions) (<-chan events.Message, <-chan error)
}

// User is a registry's basic credentials ("" user: none).
type User struct{ Name, Password string }

// header is the engine's X-Registry-Auth of u for host ("e30=", {}, for none).
func (u User) header(host string) (string, error) {
	if u.Name == "" {
		return "e30=", nil
	}
	return registry.EncodeAuthConfig(registry.AuthConfig{Username: u.Name, Password: u.Password, ServerAddress: host})
}

// ContextTar returns a build context: the Dockerfile and files.
func ContextTar(dockerfile string, files map[string][]byte) (*bytes.Buffer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	all := map[string][]byte{"Dockerfile": []byte(dockerfile)}
	for name, b := range files {
		all[name] = b
	}
	for name, b := range all {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(b))}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(b); err != nil {
			return nil, err
		}
	}
	return &buf, tw.Close()
}

// ReadStream reads an engine's JSON message stream to its end; the stream's
// error message, if any, is the error.
func ReadStream(rc io.ReadCloser) error {
	defer rc.Close()
	dec := json.NewDecoder(rc)
	for {
		var m jsonmessage.JSONMessage
		if err := dec.Decode(&m); errors.Is(err, io.EOF) {
			return nil
		} else if err != nil {
			return err
		}
		if m.Error != nil {
			return errors.New(m.Error.Message)
		}
	}
}

// Build builds ref from base plus a layer holding data (at /data) with
// the classic builder, and returns its size as the engine has it.
func Build(ctx context.Context, e Engine, base, ref string, data []byte) (int64, error) {
	bctx, err := ContextTar("FROM "+base+"\nCOPY data /data\n", map[string][]byte{"data": data})
	if err != nil {
		return 0, err
	}
	resp, err := e.ImageBuild(ctx, bctx, build.ImageBuildOptions{Tags: []string{ref}, Remove: true, ForceRemove: true, Version: build.BuilderV1})
	if err != nil {
		return 0, fmt.Errorf("build %s: %w", ref, err)
	}
	if err := ReadStream(resp.Body); err != nil {
		return 0, fmt.Errorf("build %s: %w", ref, err)
	}
	ins, err := e.ImageInspect(ctx, ref)
	if err != nil {
		return 0, fmt.Errorf("inspect %s: %w", ref, err)
	}
	return ins.Size, nil
}

// Push pushes ref (host/...) to the registry at host with u's credentials.
func Push(ctx context.Context, e Engine, host string, u User, ref string) error {
	auth, err := u.header(host)
	if err != nil {
		return err
	}
	rc, err := e.ImagePush(ctx, ref, image.PushOptions{RegistryAuth: cmp.Or(auth, "e30=")})
	if err != nil {
		return fmt.Errorf("push %s: %w", ref, err)
	}
	if err := ReadStream(rc); err != nil {
		return fmt.Errorf("push %s: %w", ref, err)
	}
	return nil
}

// BuildPushed builds ref (Build), pushes it (Push) and removes it from the
// engine, so that it is only in the registry; it returns its size as the
// engine had it.
func BuildPushed(ctx context.Context, e Engine, base, host string, u User, ref string, data []byte) (int64, error) {
	size, err := Build(ctx, e, base, ref, data)
	if err != nil {
		return 0, err
	}
	if err := Push(ctx, e, host, u, ref); err != nil {
		return 0, err
	}
	if _, err := e.ImageRemove(ctx, ref, image.RemoveOptions{PruneChildren: true}); err != nil {
		return 0, fmt.Errorf("remove %s from the engine: %w", ref, err)
	}
	return size, nil
}

// Remove removes ref from the engine (if it is there) and its manifest from
// the registry at host (if it was pushed).
func Remove(ctx context.Context, e Engine, host string, u User, ref string) error {
	var errs []error
	if _, err := e.ImageRemove(ctx, ref, image.RemoveOptions{PruneChildren: true}); err != nil && !dockerclient.IsErrNotFound(err) {
		errs = append(errs, fmt.Errorf("remove image %s: %w", ref, err))
	}
	repo, tag, _ := strings.Cut(strings.TrimPrefix(ref, host+"/"), ":")
	url := fmt.Sprintf("http://%s/v2/%s/manifests/", host, repo)
	do := func(method, url string) (*http.Response, error) {
		req, err := http.NewRequestWithContext(ctx, method, url, nil)
		if err != nil {
			return nil, err
		}
		req.Header.Set("Accept", "application/vnd.docker.distribution.manifest.v2+json")
		if u.Name != "" {
			req.SetBasicAuth(u.Name, u.Password)
		}
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		return resp, err
	}
	resp, err := do(http.MethodHead, url+tag)
	if err != nil || resp.StatusCode != http.StatusOK {
		return errors.Join(errs...) // never pushed
	}
	resp, err = do(http.MethodDelete, url+resp.Header.Get("Docker-Content-Digest"))
	if err != nil {
		errs = append(errs, fmt.Errorf("delete %s from the registry: %w", ref, err))
	} else if resp.StatusCode != http.StatusAccepted {
		errs = append(errs, fmt.Errorf("delete %s from the registry: %s", ref, resp.Status))
	}
	return errors.Join(errs...)
}

// Pulls counts the engine's pull events of ref between since and now.
func Pulls(ctx context.Context, e Engine, ref string, since time.Time) (int, error) {
	msgs, errs := e.Events(ctx, events.ListOptions{
		Since: stamp(since), Until: stamp(time.Now()),
		Filters: filters.NewArgs(filters.Arg("type", string(events.ImageEventType)), filters.Arg("event", string(events.ActionPull))),
	})
	n := 0
	for {
		select {
		case m := <-msgs:
			if m.Actor.ID == ref {
				n++
			}
		case err := <-errs:
			if err != nil && !errors.Is(err, io.EOF) {
				return n, err
			}
			return n, nil
		}
	}
}

// stamp is t as the engine's events API takes it.
func stamp(t time.Time) string { return fmt.Sprintf("%d.%09d", t.Unix(), t.Nanosecond()) }

// WatchPulls counts the engine's pull events by image from now until stop
// is called, and returns the counts then. Unlike Pulls it sees every pull
// of a long run: the engine keeps only its last events.
func WatchPulls(ctx context.Context, e Engine) (stop func() map[string]int) {
	ctx, cancel := context.WithCancel(ctx)
	msgs, errs := e.Events(ctx, events.ListOptions{
		Filters: filters.NewArgs(filters.Arg("type", string(events.ImageEventType)), filters.Arg("event", string(events.ActionPull))),
	})
	counts := map[string]int{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case m := <-msgs:
				counts[m.Actor.ID]++
			case <-errs:
				return
			case <-ctx.Done():
				return
			}
		}
	}()
	return func() map[string]int {
		cancel()
		<-done
		return counts
	}
}
