package ecs

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ecs"
	"github.com/aws/aws-sdk-go-v2/service/ecs/types"

	"github.com/quarryhq/quarry/providers"
)

var (
	_ providers.ImagePreparer = (*Provider)(nil)
	_ providers.ImageCache    = (*Provider)(nil)
	_ providers.ImagePreparer = (*Watching)(nil)
	_ providers.ImageCache    = (*Watching)(nil)
)

// prepareTimeout bounds one shared preparation (its look-up, its wait for
// the register rate and its registration): at 1 registration a second an
// hour is a backlog of 3,600 new images. A preparation whose turn would
// come later fails at once, saying when it could start.
const prepareTimeout = time.Hour

// PrepareImage makes spec's image launchable: it finds or registers the
// pool's task definition (the family is named by the hash of the rendered
// definition; looked up with DescribeTaskDefinition, registered only when
// ECS has no ACTIVE one) and returns its ARN as Ref, State ready. A pool
// that supplies its own task definition needs nothing (Ref ""). Concurrent
// calls for one family share one look-up and registration, which ctx does
// not end (only this caller's wait); registrations go through the
// RegisterTaskDefinition rate (Deps.Register). ECS cannot check an image
// before a task starts: an image that does not exist or is refused shows
// as its tasks' stopped reason, which Launch reports as an
// *providers.ImageError. Errors: a spec the provider cannot serve is a
// *providers.LaunchError (ErrInvalidSpec); an image reference ECS refuses
// an *providers.ImageError (invalid); a throttle that outlasts the retries
// wraps ErrThrottled. Safe for concurrent use; one lookup in memory when
// the task definition is known.
func (p *Provider) PrepareImage(ctx context.Context, spec providers.Spec) (providers.ImageInfo, error) {
	set, err := resolve(p.cfg, spec)
	if err != nil {
		return providers.ImageInfo{}, err
	}
	if set.taskDef != "" {
		return providers.ImageInfo{Image: spec.Image, State: providers.ImageReady, Pinned: spec.Class == ""}, nil
	}
	fam, err := p.taskDefinition(ctx, spec, set)
	if err != nil {
		return providers.ImageInfo{Image: spec.Image, State: providers.ImageFailed, Reason: err.Error()}, err
	}
	info, _ := p.images.info(fam)
	info.State, info.Reason = providers.ImageReady, ""
	return info, nil
}

// Images reports the task definitions this provider registered or found,
// from its memory (at most imageCacheSize of on-demand pools, the least
// recently used forgotten first, and every configured pool's, Pinned): each
// with its image, Ref (the ARN), the time a task of it last launched, and
// State failed with the reason when its last preparation failed or its
// last task could not pull the image. It makes no AWS call.
func (p *Provider) Images(context.Context) ([]providers.ImageInfo, error) {
	return p.images.list(), nil
}

// ForgetImage deregisters ref, the task definition PrepareImage returned
// for spec (DeregisterTaskDefinition, within the register rate), and
// forgets it. It is idempotent: "" or an INACTIVE or unknown task
// definition is nil. It never touches a configured pool's (spec.Class ""
// or a family a configured pool launched with: nil, logged) and refuses a
// ref outside Config.FamilyPrefix. Tasks still running keep running (an
// INACTIVE task definition starts no new ones).
func (p *Provider) ForgetImage(ctx context.Context, spec providers.Spec, ref string) error {
	if ref == "" {
		return nil
	}
	fam := familyOf(ref)
	if spec.Class == "" || p.images.pinned(fam) {
		p.logger.Info("forget image: left alone, a configured pool uses it", "pool", spec.Pool, "image", spec.Image, "task_definition", ref)
		return nil
	}
	if !strings.HasPrefix(fam, p.cfg.FamilyPrefix) {
		return fmt.Errorf("forget image %s: task definition %s is not one this provider registers (family prefix %q, QUARRY_ECS_FAMILY_PREFIX)",
			spec.Image, ref, p.cfg.FamilyPrefix)
	}
	err := p.launcher.retry(ctx, "deregister task definition", p.waitRegister, func(ctx context.Context) error {
		_, err := p.api.DeregisterTaskDefinition(ctx, &ecs.DeregisterTaskDefinitionInput{TaskDefinition: aws.String(ref)})
		return err
	})
	if err != nil && !isNotFound(err) && !isInactive(err) {
		return fmt.Errorf("forget image %s: deregister task definition %s: %w", spec.Image, ref, err)
	}
	p.images.forget(fam, ref)
	p.logger.Info("task definition deregistered", "pool", spec.Pool, "class", spec.Class, "image", spec.Image, "task_definition", ref)
	return nil
}

// waitRegister waits for one call of the register rate.
func (p *Provider) waitRegister(ctx context.Context) error { return p.register.Wait(ctx, 1) }

// taskDefinition returns the family of spec's rendered task definition
// (not a supplied one), after making sure it is registered: known in memory,
// else looked up, else registered, once however many callers wait.
func (p *Provider) taskDefinition(ctx context.Context, spec providers.Spec, set settings) (string, error) {
	in := renderTaskDef(p.cfg, spec, set)
	fam := aws.ToString(in.Family)
	if p.images.known(fam, spec) {
		return fam, nil
	}
	_, err := p.shared(ctx, fam, func(ctx context.Context) (any, error) {
		p.images.pending(fam, spec)
		arn, err := p.findOrRegister(ctx, spec, in)
		if err != nil {
			p.images.failed(fam, spec, err.Error())
			return nil, err
		}
		p.images.put(fam, spec, arn)
		return arn, nil
	})
	if err != nil {
		return "", err
	}
	return fam, nil
}

// taskDefinitionARN returns the ARN to run spec's tasks with: the pool's
// own, or the rendered one's (found or registered), marking its image
// used now.
func (p *Provider) taskDefinitionARN(ctx context.Context, spec providers.Spec, set settings) (string, error) {
	if set.taskDef != "" {
		return set.taskDef, nil
	}
	for range 2 { // forgotten between the two (ForgetImage, or evicted): once more
		fam, err := p.taskDefinition(ctx, spec, set)
		if err != nil {
			return "", err
		}
		if arn, ok := p.images.launched(fam, time.Now()); ok {
			return arn, nil
		}
	}
	return "", fmt.Errorf("task definition of pool %s: forgotten while launching; retry: %w", spec.Pool, providers.ErrThrottled)
}

// shared runs fn once for key however many callers wait on it, under a
// context of its own (prepareTimeout, ended by Close) so that a caller
// that gives up ends only its own wait. It fails when the provider is
// closed.
func (p *Provider) shared(ctx context.Context, key string, fn func(context.Context) (any, error)) (any, error) {
	ch := p.regs.DoChan(key, func() (any, error) {
		if !p.track() {
			return nil, errors.New("provider closed")
		}
		defer p.wg.Done()
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), prepareTimeout)
		defer cancel()
		defer context.AfterFunc(p.life, cancel)()
		return fn(wctx)
	})
	select {
	case r := <-ch:
		return r.Val, r.Err
	case <-ctx.Done():
		return nil, fmt.Errorf("wait for the task definition: %w", ctx.Err())
	}
}

// track counts one more goroutine Close waits for, unless Close was called.
func (p *Provider) track() bool {
	p.lifeMu.Lock()
	defer p.lifeMu.Unlock()
	if p.ended {
		return false
	}
	p.wg.Add(1)
	return true
}

// findOrRegister looks in's family up (its own DescribeTaskDefinition
// bucket) and registers it when ECS has no ACTIVE revision (within the
// register rate). A registration ECS refuses is a LaunchError naming the
// call, or an ImageError when ECS refused the image's reference.
func (p *Provider) findOrRegister(ctx context.Context, spec providers.Spec, in *ecs.RegisterTaskDefinitionInput) (string, error) {
	fam := aws.ToString(in.Family)
	var out *ecs.DescribeTaskDefinitionOutput
	err := p.launcher.retry(ctx, "describe task definition", p.tdDescribes.Wait, func(ctx context.Context) error {
		var err error
		out, err = p.api.DescribeTaskDefinition(ctx, &ecs.DescribeTaskDefinitionInput{TaskDefinition: aws.String(fam)})
		return err
	})
	if err == nil && out.TaskDefinition != nil && out.TaskDefinition.Status == types.TaskDefinitionStatusActive {
		return aws.ToString(out.TaskDefinition.TaskDefinitionArn), nil
	}
	if err != nil && !isNotFound(err) {
		return "", fmt.Errorf("look up task definition %s: %w", fam, err)
	}
	var reg *ecs.RegisterTaskDefinitionOutput
	err = p.launcher.retry(ctx, "register task definition", p.waitRegister, func(ctx context.Context) error {
		var err error
		reg, err = p.api.RegisterTaskDefinition(ctx, in)
		return err
	})
	if err != nil {
		if isInvalid(err) {
			_, msg := apiError(err)
			if strings.Contains(strings.ToLower(msg), "image") {
				return "", &providers.ImageError{Image: spec.Image, Kind: providers.ImageInvalid, Registry: registryOf(spec.Image), Answer: "RegisterTaskDefinition: " + msg}
			}
			return "", providers.InvalidSpec(spec, "register task definition: "+msg)
		}
		return "", fmt.Errorf("register task definition %s: %w", fam, err)
	}
	arn := aws.ToString(reg.TaskDefinition.TaskDefinitionArn)
	p.logger.Info("task definition registered", "pool", spec.Pool, "class", spec.Class, "image", spec.Image, "family", fam, "arn", arn)
	return arn, nil
}

// familyOf returns the family of a task definition ARN or family:revision.
func familyOf(ref string) string {
	if i := strings.LastIndex(ref, ":task-definition/"); i >= 0 {
		ref = ref[i+len(":task-definition/"):]
	}
	fam, _, _ := strings.Cut(ref, ":")
	return fam
}
