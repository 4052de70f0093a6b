package ecs

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ecs/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"

	"github.com/quarryhq/quarry/providers"
)

// onDemandSpec is the spec of an on-demand pool of class for image (the
// warm pool names such a pool after class, image and resources).
func onDemandSpec(class, image string) providers.Spec {
	return providers.Spec{Pool: fmt.Sprintf("i-%s-%x", class, image), Image: image, CPU: 0.5, MemoryMB: 1024, Class: class}
}

// Twenty concurrent preparations of one new image register its task
// definition once; the same image in another class gets its own; a second
// provider (another replica, or a restarted gateway) finds both without
// registering.
func TestProvider_PrepareImage_RegistersOncePerImageAndClass(t *testing.T) {
	f := newFake()
	p := newTestProvider(t, testConfig(), f)
	spec := onDemandSpec("default", "docker.io/library/python:3.11")

	infos := make([]providers.ImageInfo, 20)
	var wg sync.WaitGroup
	for i := range infos {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			infos[i], err = p.PrepareImage(testCtx(t), spec)
			assert.NoError(t, err)
		}()
	}
	wg.Wait()
	registered, _, _ := f.registerStats()
	assert.Equal(t, 1, registered, "one registration however many wait")
	for _, info := range infos {
		assert.Equal(t, providers.ImageReady, info.State)
		assert.Regexp(t, `^arn:aws:ecs:us-east-1:123456789012:task-definition/quarry-i-default-[0-9a-f]+-[0-9a-f]{16}:1$`, info.Ref)
		assert.Equal(t, infos[0].Ref, info.Ref)
		assert.Equal(t, spec.Image, info.Image)
		assert.False(t, info.Pinned, "an on-demand pool's image is a cache entry")
	}
	assert.Equal(t, types.TaskDefinitionStatusActive, f.taskDefStatus(infos[0].Ref))

	other := onDemandSpec("big", spec.Image)
	big, err := p.PrepareImage(testCtx(t), other)
	require.NoError(t, err)
	assert.NotEqual(t, infos[0].Ref, big.Ref, "another class, another task definition")

	again, err := p.PrepareImage(testCtx(t), spec)
	require.NoError(t, err)
	assert.Equal(t, infos[0].Ref, again.Ref)

	replica := newTestProvider(t, testConfig(), f)
	for _, s := range []providers.Spec{spec, other} {
		info, err := replica.PrepareImage(testCtx(t), s)
		require.NoError(t, err)
		assert.Contains(t, []string{infos[0].Ref, big.Ref}, info.Ref)
	}
	registered, _, _ = f.registerStats()
	assert.Equal(t, 2, registered, "the second provider registered nothing")
}

// A pool that supplies its own task definition needs nothing: no call.
func TestProvider_PrepareImage_SuppliedTaskDefinitionNeedsNothing(t *testing.T) {
	f := newFake()
	p := newTestProvider(t, testConfig(), f)
	spec := testSpec()
	spec.Options = map[string]string{"task_definition": "quarry-terraform:3"}
	info, err := p.PrepareImage(testCtx(t), spec)
	require.NoError(t, err)
	assert.Equal(t, providers.ImageInfo{Image: spec.Image, State: providers.ImageReady, Pinned: true}, info)
	registered, _, _ := f.registerStats()
	assert.Zero(t, registered)

	bad := testSpec()
	bad.CPU = 64
	_, err = p.PrepareImage(testCtx(t), bad)
	assert.ErrorIs(t, err, providers.ErrInvalidSpec, "a spec the provider cannot serve")
}

// A burst of new images is registered within the register rate: the
// admissions, counted on the limiter's clock, never exceed the bucket and
// take at least (images − burst) / rate, and each image is registered
// once. The fake refuses calls beyond its bucket (retried); its refusals
// are logged, not asserted: a call leaves after its admission, when its
// goroutine runs, so on a loaded machine two may arrive together.
func TestProvider_PrepareImage_StaysWithinTheRegisterRate(t *testing.T) {
	const (
		rateHz = 50.0 // AWS: 1/s; scaled up so that the test is quick
		burst  = 5    // AWS: 20
		images = 30
	)
	f := newFake()
	f.registers = rate.NewLimiter(rateHz, burst+1) // ECS's bucket; one token for a timer that fires early
	rec := &admissions{l: newCallRate(rateHz, burst)}
	p, err := New(testConfig(), f, Deps{Register: rec})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, p.Close(context.Background())) })

	var wg sync.WaitGroup
	for i := range images {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := p.PrepareImage(testCtx(t), onDemandSpec("default", fmt.Sprintf("registry.example/task-%d:1", i)))
			assert.NoError(t, err)
		}()
	}
	wg.Wait()
	registered, _, refused := f.registerStats()
	assert.Equal(t, images, registered)
	t.Logf("%d registrations; the fake refused %d", registered, refused)
	at := rec.times()
	require.Len(t, at, images, "one admission per registration (the look-ups have a bucket of their own)")
	checkAdmissions(t, at, rateHz, burst)
}

// A caller that gives up ends its own wait, not the registration that
// others wait for.
func TestProvider_PrepareImage_ACallerGivingUpLeavesTheSharedRegistration(t *testing.T) {
	f := newFake()
	release := make(chan struct{})
	waiting := make(chan struct{}, 1)
	p, err := New(testConfig(), f, Deps{Register: rateFunc(func(ctx context.Context, _ int) error {
		waiting <- struct{}{}
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, p.Close(context.Background())) })
	spec := onDemandSpec("default", "registry.example/slow:1")

	first, cancel := context.WithCancel(testCtx(t))
	firstErr := make(chan error, 1)
	go func() { _, err := p.PrepareImage(first, spec); firstErr <- err }()
	<-waiting // the registration waits for the register rate
	second := make(chan providers.ImageInfo, 1)
	go func() {
		info, err := p.PrepareImage(testCtx(t), spec)
		assert.NoError(t, err)
		second <- info
	}()
	cancel()
	require.ErrorIs(t, <-firstErr, context.Canceled)
	infos, err := p.Images(testCtx(t))
	require.NoError(t, err)
	require.Len(t, infos, 1)
	assert.Equal(t, providers.ImagePulling, infos[0].State, "still being registered")
	close(release)
	info := <-second
	assert.Equal(t, providers.ImageReady, info.State)
	assert.NotEmpty(t, info.Ref)
	registered, _, _ := f.registerStats()
	assert.Equal(t, 1, registered)
}

// ForgetImage deregisters an on-demand pool's task definition, once
// (again, or an unknown one, is nil), never a configured pool's, and
// refuses one outside the provider's family prefix. The image is prepared
// again with a new revision.
func TestProvider_ForgetImage_DeregistersOnDemandTaskDefinitions(t *testing.T) {
	f := newFake()
	p := newTestProvider(t, testConfig(), f)
	spec := onDemandSpec("default", "registry.example/forget:1")
	info, err := p.PrepareImage(testCtx(t), spec)
	require.NoError(t, err)

	require.NoError(t, p.ForgetImage(testCtx(t), spec, info.Ref))
	assert.Equal(t, types.TaskDefinitionStatusInactive, f.taskDefStatus(info.Ref))
	require.NoError(t, p.ForgetImage(testCtx(t), spec, info.Ref), "idempotent")
	require.NoError(t, p.ForgetImage(testCtx(t), spec, "arn:aws:ecs:us-east-1:123456789012:task-definition/quarry-i-gone-0123456789abcdef:4"), "unknown")
	require.NoError(t, p.ForgetImage(testCtx(t), spec, ""), "nothing made")
	infos, err := p.Images(testCtx(t))
	require.NoError(t, err)
	assert.Empty(t, infos, "forgotten")

	again, err := p.PrepareImage(testCtx(t), spec)
	require.NoError(t, err)
	assert.Equal(t, familyOf(info.Ref)+":2", again.Ref[len(again.Ref)-len(familyOf(info.Ref))-2:], "registered again: a new revision")

	configured := testSpec()
	_, err = p.Launch(testCtx(t), configured, []string{"c-0"})
	require.NoError(t, err)
	ct, ok := f.task("c-0")
	require.True(t, ok)
	pinnedRef := aws.ToString(ct.TaskDefinitionArn)
	require.NoError(t, p.ForgetImage(testCtx(t), configured, pinnedRef))
	asOnDemand := configured
	asOnDemand.Class = "default"
	require.NoError(t, p.ForgetImage(testCtx(t), asOnDemand, pinnedRef), "a configured pool's family, whatever the spec says")
	assert.Equal(t, types.TaskDefinitionStatusActive, f.taskDefStatus(pinnedRef), "a configured pool's task definition is never deregistered")

	err = p.ForgetImage(testCtx(t), spec, "arn:aws:ecs:us-east-1:123456789012:task-definition/someone-else:1")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "QUARRY_ECS_FAMILY_PREFIX")
	_, deregistered, _ := f.registerStats()
	assert.Equal(t, 2, deregistered, "the on-demand one, and its repeat")
}

// Images reports what the provider registered or found: on-demand pools'
// images with their ARN and last launch, configured pools' pinned.
func TestProvider_Images_ReportsOnDemandAndConfiguredPools(t *testing.T) {
	f := newFake()
	p := newTestProvider(t, testConfig(), f)
	spec := onDemandSpec("default", "registry.example/a:1")
	before := time.Now()
	_, err := p.Launch(testCtx(t), spec, []string{"a-0"})
	require.NoError(t, err)
	_, err = p.Launch(testCtx(t), testSpec(), []string{"c-0"})
	require.NoError(t, err)

	infos, err := p.Images(testCtx(t))
	require.NoError(t, err)
	require.Len(t, infos, 2)
	byImage := map[string]providers.ImageInfo{}
	for _, i := range infos {
		byImage[i.Image] = i
	}
	od := byImage[spec.Image]
	assert.Equal(t, providers.ImageReady, od.State)
	assert.NotEmpty(t, od.Ref)
	assert.False(t, od.Pinned)
	assert.False(t, od.LastUsed.Before(before), "a launch marks the image used")
	assert.True(t, byImage[testSpec().Image].Pinned, "a configured pool's image is pinned")

	et, ok := f.task("a-0")
	require.True(t, ok)
	assert.Equal(t, "default", tagMap(et.Tags)[providers.LabelClass], "an on-demand pool's tasks carry their class")
	ct, ok := f.task("c-0")
	require.True(t, ok)
	assert.NotContains(t, tagMap(ct.Tags), providers.LabelClass, "a configured pool's do not")
}

// A task that cannot pull its image fails its launch with the image's
// error (a 4xx, not a 500), and Images says why until a task of it runs.
func TestProvider_Launch_MissingImageIsAnImageError(t *testing.T) {
	f := newFake()
	p := newTestProvider(t, testConfig(), f)
	spec := onDemandSpec("default", "docker.io/library/no-such-image:1")
	reason := "CannotPullContainerError: pull image manifest has been retried 5 time(s): failed to resolve ref docker.io/library/no-such-image:1: docker.io/library/no-such-image:1: not found"
	f.failStart["m-0"] = reason

	tasks, err := p.Launch(testCtx(t), spec, []string{"m-0"})
	assert.Empty(t, tasks)
	var img *providers.ImageError
	require.ErrorAs(t, err, &img)
	assert.Equal(t, providers.ImageNotFound, img.Kind)
	assert.Equal(t, "docker.io", img.Registry)
	assert.Equal(t, reason, img.Answer)
	assert.ErrorIs(t, err, providers.ErrInvalidSpec)

	infos, err := p.Images(testCtx(t))
	require.NoError(t, err)
	require.Len(t, infos, 1)
	assert.Equal(t, providers.ImageFailed, infos[0].State)
	assert.Contains(t, infos[0].Reason, "not found")

	_, err = p.Launch(testCtx(t), spec, []string{"m-1"})
	require.NoError(t, err, "the image came back (pushed since)")
	infos, err = p.Images(testCtx(t))
	require.NoError(t, err)
	assert.Equal(t, providers.ImageReady, infos[0].State)
}

func TestPullFailure_ReadsStoppedReasons(t *testing.T) {
	spec := providers.Spec{Image: "123456789012.dkr.ecr.us-east-1.amazonaws.com/tasks/django-1:v1"}
	const agent = "123456789012.dkr.ecr.us-east-1.amazonaws.com/quarry-agent:1"
	tests := []struct {
		name   string
		reason string
		want   providers.ImageErrorKind // "" = not the image's failure
	}{
		{"ecr tag not found", "CannotPullContainerError: pull image manifest has been retried 5 time(s): failed to resolve ref " + spec.Image + ": " + spec.Image + ": not found", providers.ImageNotFound},
		{"docker hub repository", "CannotPullContainerError: pull access denied for nosuch/repo, repository does not exist or may require 'docker login'", providers.ImageNotFound},
		{"ecr access denied", "CannotPullContainerError: ... AccessDeniedException: User: arn:aws:sts::123456789012:assumed-role/exec is not authorized to perform: ecr:BatchGetImage", providers.ImageDenied},
		{"private registry 401", "CannotPullContainerError: failed to resolve ref: unexpected status from HEAD request: 401 Unauthorized", providers.ImageDenied},
		{"docker hub rate limit", "CannotPullContainerError: ref pull has been retried 1 time(s): 429 Too Many Requests - Server message: toomanyrequests: You have reached your pull rate limit.", providers.ImageUnreachable},
		{"no route", "CannotPullContainerError: pull image manifest has been retried 5 time(s): failed to do request: Head \"https://registry-1.docker.io/v2/\": dial tcp 3.1.2.3:443: i/o timeout", providers.ImageUnreachable},
		{"ecr auth unreachable", "ResourceInitializationError: unable to pull secrets or registry auth: execution resource retrieval failed: unable to retrieve ecr registry auth: service call has been retried 3 time(s): RequestError: send request failed: dial tcp: i/o timeout", providers.ImageUnreachable},
		{"other platform", "CannotPullContainerError: image Manifest does not contain descriptor matching platform 'linux/arm64'", providers.ImageInvalid},
		{"cause unknown", "CannotPullContainerError: pull image manifest has been retried 5 time(s)", providers.ImageUnreachable},
		{"the agent image", "CannotPullContainerError: failed to resolve ref " + agent + ": not found", ""},
		{"the token secret", "ResourceInitializationError: unable to pull secrets or registry auth: unable to retrieve secret from asm: AccessDeniedException", ""},
		{"the sandbox exited", "Essential container in task exited", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := pullFailure(spec, agent, tt.reason)
			if tt.want == "" {
				assert.Nil(t, got)
				return
			}
			require.NotNil(t, got)
			assert.Equal(t, tt.want, got.Kind)
			assert.Equal(t, tt.reason, got.Answer)
			assert.Equal(t, "123456789012.dkr.ecr.us-east-1.amazonaws.com", got.Registry)
		})
	}
	assert.NotNil(t, pullFailure(spec, agent, "", "CannotPullContainerError: x: not found"), "the sandbox container's reason counts too")
}

func TestRegistryOf(t *testing.T) {
	for image, want := range map[string]string{
		"python:3.11":                      "docker.io",
		"library/python:3.11":              "docker.io",
		"docker.io/library/python":         "docker.io",
		"ghcr.io/org/img:1":                "ghcr.io",
		"127.0.0.1:5000/img":               "127.0.0.1:5000",
		"localhost/img":                    "localhost",
		"public.ecr.aws/docker/library/go": "public.ecr.aws",
	} {
		assert.Equal(t, want, registryOf(image), image)
	}
}

// The table keeps at most its bound of on-demand images (the least
// recently used go first) and every configured pool's.
func TestImageTable_BoundsOnDemandEntries(t *testing.T) {
	tb := newImageTable(2)
	od := func(i int) providers.Spec { return onDemandSpec("c", fmt.Sprintf("img-%d", i)) }
	tb.put("f0", od(0), "arn:0")
	tb.put("f1", od(1), "arn:1")
	tb.put("pinned", testSpec(), "arn:p")
	_, ok := tb.launched("f0", time.Now()) // f0 used: f1 is the least recent
	require.True(t, ok)
	tb.put("f2", od(2), "arn:2")
	assert.True(t, tb.known("f0", od(0)))
	assert.False(t, tb.known("f1", od(1)), "evicted")
	assert.True(t, tb.known("f2", od(2)))
	assert.True(t, tb.pinned("pinned"))
	assert.Len(t, tb.list(), 3)
}

// A task definition another replica deregistered (ForgetImage) fails this
// replica's next launch as retryable, and the launch after registers it
// again.
func TestProvider_Launch_ATaskDefinitionDeregisteredElsewhereIsRegisteredAgain(t *testing.T) {
	f := newFake()
	a := newTestProvider(t, testConfig(), f)
	b := newTestProvider(t, testConfig(), f)
	spec := onDemandSpec("default", "registry.example/shared:1")
	info, err := a.PrepareImage(testCtx(t), spec)
	require.NoError(t, err)
	_, err = b.Launch(testCtx(t), spec, []string{"b-0"})
	require.NoError(t, err)
	require.NoError(t, a.ForgetImage(testCtx(t), spec, info.Ref))

	_, err = b.Launch(testCtx(t), spec, []string{"b-1"})
	require.ErrorIs(t, err, providers.ErrThrottled, "retryable")
	assert.Contains(t, err.Error(), "INACTIVE")
	tasks, err := b.Launch(testCtx(t), spec, []string{"b-2"})
	require.NoError(t, err)
	require.Len(t, tasks, 1)
	et, ok := f.task("b-2")
	require.True(t, ok)
	assert.Equal(t, strings.TrimSuffix(info.Ref, ":1")+":2", aws.ToString(et.TaskDefinitionArn))
}
