package docker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/docker/docker/api/types/build"
	"github.com/docker/docker/pkg/jsonmessage"

	"github.com/quarryhq/quarry/providers"
)

var _ providers.ImageBuilder = (*Provider)(nil)

// buildInputWords are the words of the engine's refusals of a build's
// input (Docker 20.10: "dockerfile parse error line 2: unknown
// instruction: FOO" (400), "Cannot locate specified Dockerfile: nope" and
// "unexpected EOF" for a context that is no tar (500)).
var buildInputWords = []string{"dockerfile", "unexpected eof", "tar", "context"}

// BuildImage builds req's context with the engine's classic builder
// (builder version 1: no BuildKit, which Docker 20.10's API does not run
// without a session; a base image the engine has is used as it is, never
// pulled again), tags it req.Tag with req.Labels, and writes the build's
// output to log as it comes. ctx bounds the build (the engine stops a
// build whose client went away); the caller bounds the context's size.
// Intermediate containers are removed, also after a failure. A build that
// fails (a step's command, a bad Dockerfile, a COPY of a missing file, a
// context that is no tar) is a *providers.BuildError with the engine's
// message, after the step it failed in; the image built is reported as the
// engine has it.
func (p *Provider) BuildImage(ctx context.Context, req providers.BuildRequest, log io.Writer) (providers.ImageInfo, error) {
	resp, err := p.api.ImageBuild(ctx, req.Context, build.ImageBuildOptions{
		Tags:        []string{req.Tag},
		Dockerfile:  req.Dockerfile,
		Labels:      req.Labels,
		Remove:      true,
		ForceRemove: true,
		Version:     build.BuilderV1,
	})
	if err != nil {
		return providers.ImageInfo{}, buildError(ctx, req.Tag, "", err)
	}
	defer resp.Body.Close()
	step := ""
	dec := json.NewDecoder(resp.Body)
	for {
		var m jsonmessage.JSONMessage
		err := dec.Decode(&m)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return providers.ImageInfo{}, buildError(ctx, req.Tag, step, err)
		}
		if m.Error != nil {
			return providers.ImageInfo{}, &providers.BuildError{Tag: req.Tag, Message: stepMessage(step, m.Error.Message)}
		}
		text := m.Stream
		if text == "" && m.Status != "" && m.Progress == nil {
			text = m.Status + "\n"
		}
		if strings.HasPrefix(text, "Step ") {
			step = strings.TrimSpace(text)
		}
		if text != "" {
			if _, err := io.WriteString(log, text); err != nil {
				return providers.ImageInfo{}, fmt.Errorf("build %s: write its log: %w", req.Tag, err)
			}
		}
	}
	ref, err := parseRef(req.Tag)
	if err != nil {
		return providers.ImageInfo{}, err
	}
	img, found, err := p.img.inspect(ctx, ref)
	if err == nil && !found {
		err = errors.New("the engine does not have the image after its build")
	}
	if err != nil {
		return providers.ImageInfo{}, fmt.Errorf("build %s: %w", req.Tag, err)
	}
	return p.img.infoOf(req.Tag, ref, img), nil
}

// buildError translates the failure of a build's request or stream: the
// engine's refusal of its input is a *providers.BuildError, ctx's end and
// the rest are errors of their own.
func buildError(ctx context.Context, tag, step string, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("build %s: %w", tag, ctx.Err())
	}
	msg := strings.TrimPrefix(err.Error(), daemonPrefix)
	if isInvalid(err) || strings.HasPrefix(err.Error(), daemonPrefix) && containsAny(strings.ToLower(msg), buildInputWords) {
		return &providers.BuildError{Tag: tag, Message: stepMessage(step, msg)}
	}
	return fmt.Errorf("build %s: %w", tag, err)
}

// stepMessage prefixes msg with the step it failed in, when known.
func stepMessage(step, msg string) string {
	if step == "" {
		return msg
	}
	return step + ": " + msg
}
