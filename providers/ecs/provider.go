package ecs

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ecs"
	"github.com/aws/aws-sdk-go-v2/service/ecs/types"
	"golang.org/x/sync/singleflight"

	"github.com/quarryhq/quarry/providers"
)

var (
	_ providers.Provider = (*Provider)(nil)
	_ providers.Closer   = (*Provider)(nil)
)

const (
	// cleanupTimeout bounds the StopTask of a task whose start failed; it
	// runs even when the caller's ctx is done.
	cleanupTimeout = 30 * time.Second
	// nonceBytes is the size of a task's token nonce (hex in its overrides).
	nonceBytes = 16
	// maxNameLen bounds task names (they are tag values).
	maxNameLen = 200
	// maxStopReason is ECS's limit on StopTask's reason.
	maxStopReason = 255
	// maxTags is ECS's limit of tags per resource; the provider uses 5.
	maxTags = 50
)

// Provider runs sandbox tasks on ECS Fargate. It is safe for concurrent
// use, and Providers (in one or many gateways) with the same Cluster,
// GatewayID and TokenKey share their tasks: every method reads the state
// from ECS (the only memory is a cache of registered task definitions and
// the rate limiters).
type Provider struct {
	cfg       Config
	api       API
	launcher  *launcher
	logger    *slog.Logger
	startedBy string

	regs    singleflight.Group
	mu      sync.Mutex
	taskDef map[string]string // family → task definition ARN
	closed  atomic.Bool
}

// New returns a Provider for cfg (after defaults and Validate) on api (an
// *ecs.Client, or a fake in tests). It makes no AWS call. logger may be
// nil (logs are discarded).
func New(cfg Config, api API, logger *slog.Logger) (*Provider, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if api == nil {
		return nil, errors.New("ecs provider: no ECS client")
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	sum := sha256.Sum256([]byte(cfg.GatewayID))
	return &Provider{
		cfg: cfg, api: api, launcher: newLauncher(api, cfg, logger), logger: logger,
		startedBy: "quarry-" + hex.EncodeToString(sum[:8]),
		taskDef:   map[string]string{},
	}, nil
}

// Close makes later Launch calls fail; tasks keep running (leases outlive
// a gateway process) and Describe, Stop and List still work. Idempotent.
func (p *Provider) Close(context.Context) error {
	p.closed.Store(true)
	return nil
}

// Launch starts one Fargate task per name (RunTask, one task per call: each
// carries its own name tag and token nonce) within the launch controller's
// rates and its cap on tasks starting at once, then waits (batched
// DescribeTasks) until each runs with a private IP and returns them, in the
// order of names, with their agent URL and token. The agent may need a
// moment more to answer /healthz: the warm pool checks it.
//
// A spec this provider cannot serve fails with a *providers.LaunchError
// wrapping ErrInvalidSpec before any task starts (an unknown or bad option,
// a size Fargate does not have, reserved env names or labels, bad names),
// and so does a task definition or RunTask that ECS refuses. A task that
// stops while starting (an image that cannot be pulled, no shell, Spot
// capacity) or that is not running within Config.StartTimeout is stopped
// and reported with its reason; ECS's capacity failures wrap
// ErrNoCapacity, throttling that outlasts the retries ErrThrottled. The
// other tasks are returned together with an error joining the failures.
// When ctx ends while tasks start, they are returned pending (they are
// real) with ctx's error.
func (p *Provider) Launch(ctx context.Context, spec providers.Spec, names []string) ([]providers.Task, error) {
	if p.closed.Load() {
		return nil, errors.New("launch tasks: provider closed")
	}
	set, err := resolve(p.cfg, spec)
	if err != nil {
		return nil, err
	}
	if err := checkLabels(spec); err != nil {
		return nil, err
	}
	seen := make(map[string]bool, len(names))
	for i, name := range names {
		if err := validateName(name); err != nil {
			return nil, invalidSpec(spec, fmt.Sprintf("names[%d] %q: %s", i, name, err))
		}
		if seen[name] {
			return nil, invalidSpec(spec, fmt.Sprintf("names[%d] %q: repeated", i, name))
		}
		seen[name] = true
	}
	if len(names) == 0 {
		return nil, nil
	}
	taskDef, err := p.taskDefinition(ctx, spec, set)
	if err != nil {
		return nil, err
	}

	w := newWatcher(p.launcher)
	wctx, stopWatch := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); w.run(wctx) }()

	tasks := make([]*providers.Task, len(names))
	errs := make([]error, len(names))
	var starters sync.WaitGroup
	for i, name := range names {
		starters.Add(1)
		go func() {
			defer starters.Done()
			tasks[i], errs[i] = p.launchOne(ctx, w, spec, set, taskDef, name)
		}()
	}
	starters.Wait()
	stopWatch()
	wg.Wait()

	out := make([]providers.Task, 0, len(names))
	for i := range names {
		if tasks[i] != nil {
			out = append(out, *tasks[i])
		}
	}
	if err := errors.Join(errs...); err != nil {
		return out, fmt.Errorf("launch %d of %d tasks: %w", len(names)-len(out), len(names), err)
	}
	return out, nil
}

// launchOne starts the task of one name and waits until it runs. It
// returns the task (pending) with ctx's error when ctx ends first.
func (p *Provider) launchOne(ctx context.Context, w *watcher, spec providers.Spec, set settings, taskDef, name string) (_ *providers.Task, err error) {
	defer func() {
		var lerr *providers.LaunchError
		if err != nil && !errors.As(err, &lerr) {
			err = fmt.Errorf("launch task %q: %w", name, err)
		}
	}()
	if err := p.launcher.starting.Acquire(ctx, 1); err != nil {
		return nil, fmt.Errorf("wait for a start slot: %w", err)
	}
	defer p.launcher.starting.Release(1)
	start := time.Now()
	nonce, err := newNonce()
	if err != nil {
		return nil, err
	}
	in := p.runTaskInput(spec, set, taskDef, name, nonce, start)
	started, failures, err := p.launcher.runTask(ctx, in, 1)
	switch {
	case err != nil && isInvalid(err):
		_, msg := apiError(err)
		return nil, invalidSpec(spec, "run task: "+msg)
	case err != nil:
		return nil, err
	case len(failures) > 0:
		return nil, failureError(failures[0])
	case len(started) == 0:
		return nil, errors.New("run task: ECS started no task and reported no failure")
	}
	v := viewOf(started[0])
	if v.name == "" { // a backend that does not echo tags
		v.name, v.pool, v.labels = name, spec.Pool, tagMap(in.Tags)
	}
	pending := p.toTask(v)
	pending.State, pending.AgentURL, pending.AgentToken = providers.TaskPending, "", ""
	if v.state() == providers.TaskRunning {
		t := p.toTask(v)
		return &t, nil
	}

	ch := w.add(v.arn)
	defer w.remove(v.arn)
	deadline := time.NewTimer(p.cfg.StartTimeout)
	defer deadline.Stop()
	last := v
	for {
		select {
		case <-ctx.Done():
			return &pending, fmt.Errorf("wait for the task to run: %w", ctx.Err())
		case <-deadline.C:
			why := fmt.Sprintf("did not run within %s (last status %s)", p.cfg.StartTimeout, last.last)
			return nil, p.failStart(ctx, v.arn, why)
		case t := <-ch:
			last = viewOf(t)
			switch last.state() {
			case providers.TaskRunning:
				task := p.toTask(last)
				p.logger.Info("task launched", "task", name, "pool", spec.Pool, "arn", v.arn,
					"agent_url", task.AgentURL, "took", time.Since(start).Round(time.Millisecond))
				return &task, nil
			case providers.TaskStopped:
				why := "stopped while starting: " + last.reason()
				if last.last == statusStopped {
					return nil, errors.New(why)
				}
				return nil, p.failStart(ctx, v.arn, why)
			}
		}
	}
}

// failStart stops a task that did not start and returns the error saying why.
func (p *Provider) failStart(ctx context.Context, arn, why string) error {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	err := errors.New(why)
	if serr := p.stopTask(cctx, arn, "quarry: the task "+why); serr != nil {
		err = errors.Join(err, fmt.Errorf("clean up: %w", serr))
	}
	return err
}

// failureError translates a RunTask failure: capacity ones wrap ErrNoCapacity.
func failureError(f types.Failure) error {
	reason, detail := aws.ToString(f.Reason), aws.ToString(f.Detail)
	msg := strings.TrimSpace(reason + " " + detail)
	l := strings.ToLower(msg)
	if strings.Contains(l, "capacity") || strings.HasPrefix(reason, "RESOURCE") {
		return fmt.Errorf("run task: %s: %w", msg, providers.ErrNoCapacity)
	}
	return fmt.Errorf("run task: %s", msg)
}

// runTaskInput builds the RunTask request of one task: its tags (name,
// pool, gateway, creation time, the pool's labels) and its token nonce in
// the sandbox container's overrides (and as the idempotency token). The
// token itself is never in it.
func (p *Provider) runTaskInput(spec providers.Spec, set settings, taskDef, name, nonce string, now time.Time) ecs.RunTaskInput {
	tags := []types.Tag{
		{Key: aws.String(providers.LabelManaged), Value: aws.String("true")},
		{Key: aws.String(providers.LabelPool), Value: aws.String(spec.Pool)},
		{Key: aws.String(providers.LabelTask), Value: aws.String(name)},
		{Key: aws.String(providers.LabelGateway), Value: aws.String(p.cfg.GatewayID)},
		{Key: aws.String(tagCreated), Value: aws.String(strconv.FormatInt(now.Unix(), 10))},
	}
	for k, v := range spec.Labels {
		tags = append(tags, types.Tag{Key: aws.String(k), Value: aws.String(v)})
	}
	public := types.AssignPublicIpDisabled
	if set.publicIP {
		public = types.AssignPublicIpEnabled
	}
	return ecs.RunTaskInput{
		Cluster:                  aws.String(p.cfg.Cluster),
		TaskDefinition:           aws.String(taskDef),
		CapacityProviderStrategy: set.strategy,
		PlatformVersion:          aws.String(p.cfg.PlatformVersion),
		NetworkConfiguration: &types.NetworkConfiguration{AwsvpcConfiguration: &types.AwsVpcConfiguration{
			Subnets: set.subnets, SecurityGroups: set.sgs, AssignPublicIp: public,
		}},
		Overrides: &types.TaskOverride{ContainerOverrides: []types.ContainerOverride{{
			Name:        aws.String(SandboxContainer),
			Environment: []types.KeyValuePair{{Name: aws.String(envTokenNonce), Value: aws.String(nonce)}},
		}}},
		StartedBy: aws.String(p.startedBy),
		Tags:      tags,
		// The nonce makes retries of this call (the SDK's and the
		// controller's) idempotent: a lost answer never starts a twin.
		ClientToken: aws.String(nonce),
	}
}

// taskDefinition returns the task definition to run for a pool: the one
// the pool supplies, or the rendered one, looked up by its family (named by
// the content's hash) and registered only when ECS has none. Found ARNs are
// cached; concurrent launches of one pool register it once.
func (p *Provider) taskDefinition(ctx context.Context, spec providers.Spec, set settings) (string, error) {
	if set.taskDef != "" {
		return set.taskDef, nil
	}
	in := renderTaskDef(p.cfg, spec, set)
	fam := aws.ToString(in.Family)
	p.mu.Lock()
	arn, ok := p.taskDef[fam]
	p.mu.Unlock()
	if ok {
		return arn, nil
	}
	v, err, _ := p.regs.Do(fam, func() (any, error) {
		var out *ecs.DescribeTaskDefinitionOutput
		err := p.launcher.retry(ctx, "describe task definition", nil, func(ctx context.Context) error {
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
		err = p.launcher.retry(ctx, "register task definition", nil, func(ctx context.Context) error {
			var err error
			reg, err = p.api.RegisterTaskDefinition(ctx, in)
			return err
		})
		if err != nil {
			if isInvalid(err) {
				_, msg := apiError(err)
				return "", invalidSpec(spec, "register task definition: "+msg)
			}
			return "", fmt.Errorf("register task definition %s: %w", fam, err)
		}
		arn := aws.ToString(reg.TaskDefinition.TaskDefinitionArn)
		p.logger.Info("task definition registered", "pool", spec.Pool, "family", fam, "arn", arn)
		return arn, nil
	})
	if err != nil {
		return "", err
	}
	arn = v.(string)
	p.mu.Lock()
	p.taskDef[fam] = arn
	p.mu.Unlock()
	return arn, nil
}

// Describe returns one task per id, in order, from batched DescribeTasks
// (100 ids a call). Ids of no task of this gateway come back stopped with
// Reason "not found". A task Fargate Spot reclaims is stopped, with a
// Reason starting "spot interruption", from the moment ECS marks it to
// stop (up to two minutes before it ends).
func (p *Provider) Describe(ctx context.Context, ids []string) ([]providers.Task, error) {
	var arns []string
	for _, id := range ids {
		if isTaskARN(id) {
			arns = append(arns, id)
		}
	}
	found := map[string]types.Task{}
	if len(arns) > 0 {
		var err error
		if found, _, err = p.launcher.describe(ctx, arns); err != nil {
			return nil, fmt.Errorf("describe tasks: %w", err)
		}
	}
	out := make([]providers.Task, len(ids))
	for i, id := range ids {
		t, ok := found[id]
		if !ok || !p.ours(viewOf(t).labels) {
			out[i] = stoppedTask(id, reasonNotFound)
			continue
		}
		out[i] = p.toTask(viewOf(t))
	}
	return out, nil
}

// List returns this gateway's tasks of pool ("" for every pool) that ECS
// still reports (ListTasks by startedBy, running and stopped, then
// DescribeTasks for their tags), oldest first.
func (p *Provider) List(ctx context.Context, pool string) ([]providers.Task, error) {
	seen := map[string]bool{}
	var arns []string
	for _, status := range []types.DesiredStatus{types.DesiredStatusRunning, types.DesiredStatusStopped} {
		in := &ecs.ListTasksInput{Cluster: aws.String(p.cfg.Cluster), StartedBy: aws.String(p.startedBy), DesiredStatus: status}
		for {
			var out *ecs.ListTasksOutput
			err := p.launcher.retry(ctx, "list tasks", nil, func(ctx context.Context) error {
				var err error
				out, err = p.api.ListTasks(ctx, in)
				return err
			})
			if err != nil {
				return nil, fmt.Errorf("list tasks: %w", err)
			}
			for _, arn := range out.TaskArns {
				if !seen[arn] {
					seen[arn] = true
					arns = append(arns, arn)
				}
			}
			if aws.ToString(out.NextToken) == "" {
				break
			}
			in.NextToken = out.NextToken
		}
	}
	found, _, err := p.launcher.describe(ctx, arns)
	if err != nil {
		return nil, fmt.Errorf("list tasks: %w", err)
	}
	out := make([]providers.Task, 0, len(found))
	for _, t := range found {
		v := viewOf(t)
		if p.ours(v.labels) && (pool == "" || v.pool == pool) {
			out = append(out, p.toTask(v))
		}
	}
	sortTasks(out)
	return out, nil
}

// Stop stops the task with StopTask and reason (cut to ECS's 255
// characters). It is idempotent: an unknown id, a stopped task or one that
// is not this gateway's returns nil and is left alone.
func (p *Provider) Stop(ctx context.Context, id string, reason string) error {
	if !isTaskARN(id) {
		return nil
	}
	found, _, err := p.launcher.describe(ctx, []string{id})
	if err != nil {
		return fmt.Errorf("stop task %s: %w", id, err)
	}
	t, ok := found[id]
	if !ok {
		return nil
	}
	v := viewOf(t)
	if !p.ours(v.labels) {
		p.logger.Debug("stop: not a task of this gateway; left alone", "arn", id)
		return nil
	}
	if v.last == statusStopped || v.desired == statusStopped {
		return nil
	}
	if err := p.stopTask(ctx, id, reason); err != nil {
		return fmt.Errorf("stop task %s: %w", id, err)
	}
	p.logger.Info("task stopped", "task", v.name, "pool", v.pool, "arn", id, "reason", reason)
	return nil
}

// stopTask calls StopTask (retrying throttles); a task ECS does not know is stopped.
func (p *Provider) stopTask(ctx context.Context, arn, reason string) error {
	if len(reason) > maxStopReason {
		reason = reason[:maxStopReason]
	}
	err := p.launcher.retry(ctx, "stop task", nil, func(ctx context.Context) error {
		_, err := p.api.StopTask(ctx, &ecs.StopTaskInput{Cluster: aws.String(p.cfg.Cluster), Task: aws.String(arn), Reason: aws.String(reason)})
		return err
	})
	if err != nil && !isNotFound(err) {
		return err
	}
	return nil
}

// ours reports whether tags mark a task of this gateway.
func (p *Provider) ours(labels map[string]string) bool {
	return labels[providers.LabelManaged] == "true" && labels[providers.LabelGateway] == p.cfg.GatewayID
}

// isTaskARN reports whether id has the shape of an ECS task ARN.
func isTaskARN(id string) bool {
	return strings.HasPrefix(id, "arn:") && strings.Contains(id, ":task/") && len(id) <= 2048
}

// validateName checks a task name: it becomes a tag value.
func validateName(name string) error {
	if name == "" || len(name) > maxNameLen {
		return fmt.Errorf("want 1 to %d characters", maxNameLen)
	}
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("-_.:/=+@", c)) {
			return fmt.Errorf("character %q not allowed (letters, digits and -_.:/=+@)", c)
		}
	}
	return nil
}

// checkLabels refuses labels ECS cannot carry as tags or that would
// overwrite the provider's own.
func checkLabels(spec providers.Spec) error {
	if len(spec.Labels) > maxTags-5 {
		return invalidSpec(spec, fmt.Sprintf("labels: at most %d (ECS allows %d tags, the provider uses 5)", maxTags-5, maxTags))
	}
	for k, v := range spec.Labels {
		switch {
		case strings.HasPrefix(k, "quarry."):
			return invalidSpec(spec, fmt.Sprintf("labels.%s: the quarry. prefix is the provider's own", k))
		case strings.HasPrefix(strings.ToLower(k), "aws:"):
			return invalidSpec(spec, fmt.Sprintf("labels.%s: the aws: prefix is reserved by AWS", k))
		case len(k) > 128 || len(v) > 256:
			return invalidSpec(spec, fmt.Sprintf("labels.%s: ECS tags have keys of at most 128 and values of at most 256 characters", k))
		}
	}
	return nil
}

// tagMap turns tags into labels.
func tagMap(tags []types.Tag) map[string]string {
	m := make(map[string]string, len(tags))
	for _, t := range tags {
		m[aws.ToString(t.Key)] = aws.ToString(t.Value)
	}
	return m
}

// newNonce returns a random nonce for one task.
func newNonce() (string, error) {
	b := make([]byte, nonceBytes)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("generate token nonce: %w", err)
	}
	return hex.EncodeToString(b), nil
}
