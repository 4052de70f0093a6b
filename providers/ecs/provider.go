package ecs

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ecs"
	"github.com/aws/aws-sdk-go-v2/service/ecs/types"
	"golang.org/x/sync/singleflight"
	"golang.org/x/time/rate"

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
	// batchIDBytes is the size of a RunTask call's id (hex in its tasks'
	// quarry.batch tag and its clientToken).
	batchIDBytes = 16
	// maxNameLen bounds task names (they are tag values).
	maxNameLen = 200
	// maxStopReason is ECS's limit on StopTask's reason.
	maxStopReason = 255
	// maxTags is ECS's limit of tags per resource; the provider uses ownTags
	// (quarry.managed, .pool, .gateway, .created, .batch, .task and, on an
	// on-demand pool's tasks, .class).
	maxTags = 50
	ownTags = 7
)

// Provider runs sandbox tasks on ECS Fargate. It is safe for concurrent
// use, and Providers (in one or many gateways) with the same Cluster,
// GatewayID and TokenKey share their tasks: every method reads the state
// from ECS (the only memory is a bounded cache of task definitions, the
// names of tasks it saw, its launch queue and its rate limiters).
type Provider struct {
	cfg       Config
	api       API
	launcher  *launcher
	logger    *slog.Logger
	startedBy string

	regs        singleflight.Group // task definitions being looked up or registered, by family
	images      *imageTable
	register    RateLimiter   // RegisterTaskDefinition and DeregisterTaskDefinition calls
	tdDescribes *rate.Limiter // DescribeTaskDefinition calls (look-ups)
	names       *nameCache
	metrics     *metrics
	closed      atomic.Bool

	// The launch queue, its dispatcher and the starting tasks' watcher
	// run from the first Launch until Close.
	queue   *launchQueue
	watch   *watcher
	lifeMu  sync.Mutex
	started bool            // the dispatcher and the watcher run
	ended   bool            // Close was called: nothing starts any more
	life    context.Context // ends at Close
	stop    context.CancelFunc
	wg      sync.WaitGroup // the dispatcher, the watcher and the RunTask batches
}

// Deps are the provider's dependencies besides its ECS client. Every
// field is optional.
type Deps struct {
	// Rate admits RunTask calls; nil takes the in-process buckets of
	// Config's RunTaskRate and LaunchRate (right for one replica; several
	// share ddbrate.Limiter).
	Rate RateLimiter
	// Register admits RegisterTaskDefinition and DeregisterTaskDefinition
	// calls, one each (Wait(ctx, 1)); nil takes an in-process bucket of
	// Config's RegisterRate and RegisterBurst (one replica; several share a
	// ddbrate.Limiter on ddbrate.RegisterKey with no task bucket).
	Register RateLimiter
	// SQS reads Config.EventsQueueURL (NewWatching only).
	SQS SQSAPI
	// Logger receives the provider's logs; nil discards them.
	Logger *slog.Logger
}

// New returns a Provider for cfg (after defaults and Validate) on api (an
// *ecs.Client, or a fake in tests). It makes no AWS call and starts no
// goroutine (the first Launch starts the launch controller's, Close stops
// them). A cfg with EventsQueueURL is refused: NewWatching reads it.
func New(cfg Config, api API, deps Deps) (*Provider, error) {
	if cfg.EventsQueueURL != "" {
		return nil, errors.New("ecs provider config: EventsQueueURL: set, but New reads no events (use NewWatching)")
	}
	return newProvider(cfg, api, deps)
}

func newProvider(cfg Config, api API, deps Deps) (*Provider, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if api == nil {
		return nil, errors.New("ecs provider: no ECS client")
	}
	logger := deps.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	sum := sha256.Sum256([]byte(cfg.GatewayID))
	life, stop := context.WithCancel(context.Background())
	l := newLauncher(api, cfg, deps.Rate, logger)
	register := deps.Register
	if register == nil {
		register = newCallRate(cfg.RegisterRate, cfg.RegisterBurst)
	}
	p := &Provider{
		cfg: cfg, api: api, launcher: l, logger: logger,
		startedBy:   "quarry-" + hex.EncodeToString(sum[:8]),
		images:      newImageTable(imageCacheSize),
		register:    register,
		tdDescribes: rate.NewLimiter(rate.Limit(cfg.DescribeRate), cfg.DescribeBurst),
		names:       newNameCache(nameCacheSize),
		queue:       newLaunchQueue(cfg.MaxQueued),
		watch:       newWatcher(l),
		life:        life, stop: stop,
	}
	p.metrics = newMetrics(p)
	return p, nil
}

// Close makes later Launch calls fail, fails the names still queued and
// stops the launch controller's goroutines, waiting for them within ctx;
// tasks keep running (leases outlive a gateway process), a Launch waiting
// for its tasks to run returns them pending, and Describe, Stop and List
// still work. Idempotent.
func (p *Provider) Close(ctx context.Context) error {
	p.closed.Store(true)
	p.lifeMu.Lock()
	p.ended = true
	p.lifeMu.Unlock()
	p.stop()
	done := make(chan struct{})
	go func() { p.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("close ecs provider: %w", ctx.Err())
	}
}

// start starts the dispatcher and the watcher, once, unless Close was
// called.
func (p *Provider) start() {
	p.lifeMu.Lock()
	defer p.lifeMu.Unlock()
	if p.started || p.ended {
		return
	}
	p.started = true
	p.wg.Add(2)
	go func() { defer p.wg.Done(); p.dispatch() }()
	go func() { defer p.wg.Done(); p.watch.run(p.life) }()
}

// Launch starts one Fargate task per name and returns those that run, in
// the order of names, each with its agent URL and token (its agent may need
// a moment more to answer /healthz). docs/ECS.md ("A launch") says how.
//
// A spec this provider cannot serve, or a task definition or RunTask that
// ECS refuses, fails every name with a *providers.LaunchError wrapping
// ErrInvalidSpec. Otherwise each name that does not become a running task
// fails with its reason (ECS's failure or stopped reason, or not running
// within Config.StartTimeout): ECS's capacity failures wrap ErrNoCapacity;
// a name a full launch queue refuses (Config.MaxQueued) and throttling
// that outlasts the retries wrap ErrThrottled. The tasks that run are
// returned with an error joining the failures. When ctx ends, the names still queued fail with
// ctx's error and the started tasks are returned pending (they are real).
// After Close it fails at once. Safe for concurrent use.
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
	if err := providers.CheckNames(spec, names, validateName); err != nil {
		return nil, err
	}
	if len(names) == 0 {
		return nil, nil
	}
	taskDef, err := p.taskDefinitionARN(ctx, spec, set)
	if err != nil {
		return nil, err
	}
	p.start()

	// The names join the launch queue (one FIFO per pool, at most
	// Config.MaxQueued names); the dispatcher (dispatch.go) gives them out
	// in batches of one pool at a time, taking the pools in turn, and
	// delivers each name's task or error on its item. Names of concurrent
	// calls with the same request (launchKey) may share a RunTask call.
	key := launchKey(spec, set, taskDef)
	items := make([]*launchItem, len(names))
	for i, name := range names {
		items[i] = &launchItem{ctx: ctx, spec: spec, set: set, taskDef: taskDef, key: key, name: name, done: make(chan launchResult, 1)}
	}
	if refused := p.queue.push(spec.Pool, items); len(refused) > 0 {
		p.logger.Warn("launch queue full: names refused", "pool", spec.Pool, "refused", len(refused),
			"limit", "QUARRY_ECS_MAX_QUEUED", "max_queued", p.cfg.MaxQueued)
		p.metrics.refused.WithLabelValues("max_queued").Add(float64(len(refused)))
		for _, it := range refused {
			it.finish(nil, fmt.Errorf("the launch queue holds its limit of %d names (QUARRY_ECS_MAX_QUEUED): %w", p.cfg.MaxQueued, providers.ErrThrottled))
		}
	}
	if p.closed.Load() { // closed while queueing: nothing will take them
		for _, it := range items {
			if p.queue.abandon(it) {
				it.finish(nil, errors.New("provider closed"))
			}
		}
	}

	out := make([]providers.Task, 0, len(names))
	errs := make([]error, len(names))
	for i, it := range items {
		var r launchResult
		select {
		case r = <-it.done:
		case <-ctx.Done():
			if p.queue.abandon(it) {
				r = launchResult{err: fmt.Errorf("wait in the launch queue: %w", ctx.Err())}
			} else {
				r = <-it.done // its RunTask is made: its answer comes promptly (the waits for its task end with ctx)
			}
		}
		if r.task != nil {
			out = append(out, *r.task)
		}
		if r.err != nil {
			var lerr *providers.LaunchError
			if !errors.As(r.err, &lerr) {
				r.err = fmt.Errorf("launch task %q: %w", names[i], r.err)
			}
			errs[i] = r.err
		}
	}
	if err := errors.Join(errs...); err != nil {
		return out, fmt.Errorf("launch %d of %d tasks: %w", len(names)-len(out), len(names), err)
	}
	return out, nil
}

// launchKey is the same for launches whose RunTask requests differ only
// in their batch id and time: they may share a RunTask call.
func launchKey(spec providers.Spec, set settings, taskDef string) string {
	b, _ := json.Marshal(struct {
		Pool, TaskDef string
		Strategy      []types.CapacityProviderStrategyItem
		Subnets, SGs  []string
		PublicIP      bool
		Labels        map[string]string
	}{spec.Pool, taskDef, set.strategy, set.subnets, set.sgs, set.publicIP, spec.Labels})
	return string(b)
}

var (
	_ providers.StartSlots = (*Provider)(nil)
	_ providers.StartSlots = (*Watching)(nil)
	_ providers.Watcher    = (*Watching)(nil)
)

// StartSlots is how many tasks may be between RunTask and running at once
// (Config.MaxStarting): providers.StartSlots.
func (p *Provider) StartSlots() int { return p.cfg.MaxStarting }

// startOne names one task RunTask started (its quarry.task tag) and waits
// until it runs. A task that cannot be named is stopped: nothing could
// find it by its name. It returns the task (pending) with ctx's error when
// ctx ends first.
func (p *Provider) startOne(ctx context.Context, spec providers.Spec, name string, shared map[string]string, t types.Task, start time.Time) (*providers.Task, error) {
	arn := aws.ToString(t.TaskArn)
	tag := []types.Tag{{Key: aws.String(providers.LabelTask), Value: aws.String(name)}}
	if err := p.launcher.tagTask(ctx, arn, tag); err != nil {
		return nil, p.giveUp(ctx, arn, fmt.Errorf("name the task (tag %s): %w", providers.LabelTask, err))
	}
	// The provider knows the task's tags; a description may not show the
	// name tag yet (or at all, on a backend that does not echo tags).
	named := func(v taskView) taskView {
		labels := make(map[string]string, len(shared)+len(v.labels)+1)
		maps.Copy(labels, shared)
		maps.Copy(labels, v.labels)
		labels[providers.LabelTask] = name
		v.labels, v.name, v.pool = labels, name, labels[providers.LabelPool]
		return v
	}
	v := named(viewOf(t))
	if v.state() == providers.TaskRunning {
		task := p.toTask(v)
		return &task, nil
	}
	pending := p.toTask(v)
	pending.State, pending.AgentURL, pending.AgentToken = providers.TaskPending, "", ""

	ch := p.watch.add(arn, name, spec.Pool)
	defer p.watch.remove(arn)
	deadline := time.NewTimer(p.cfg.StartTimeout)
	defer deadline.Stop()
	last := v
	for {
		select {
		case <-ctx.Done():
			return &pending, fmt.Errorf("wait for the task to run: %w", ctx.Err())
		case <-p.life.Done():
			return &pending, errors.New("wait for the task to run: provider closed")
		case <-deadline.C:
			return nil, p.giveUp(ctx, arn, fmt.Errorf("did not run within %s (last status %s)", p.cfg.StartTimeout, last.last))
		case t := <-ch:
			last = named(viewOf(t))
			switch last.state() {
			case providers.TaskRunning:
				task := p.toTask(last)
				p.images.ran(aws.ToString(t.TaskDefinitionArn))
				p.logger.Info("task launched", "task", name, "pool", spec.Pool, "arn", arn,
					"agent_url", task.AgentURL, "took", time.Since(start).Round(time.Millisecond))
				return &task, nil
			case providers.TaskStopped:
				why := p.startFailure(spec, last, aws.ToString(t.TaskDefinitionArn))
				if last.last == statusStopped {
					return nil, why
				}
				return nil, p.giveUp(ctx, arn, why)
			}
		}
	}
}

// startFailure says why a task of spec stopped while starting: an
// *providers.ImageError when its image could not be pulled (recorded on
// the image's task definition, taskDef), else ECS's reason.
func (p *Provider) startFailure(spec providers.Spec, v taskView, taskDef string) error {
	if img := pullFailure(spec, p.cfg.AgentImage, v.stoppedReason, v.sandboxReason); img != nil {
		p.images.pullFailed(taskDef, img.Error())
		return fmt.Errorf("stopped while starting: %w", img)
	}
	return errors.New("stopped while starting: " + v.reason())
}

// giveUp stops a task that did not start and returns why, joined with the
// clean-up's error. The stop runs even when ctx is done.
func (p *Provider) giveUp(ctx context.Context, arn string, why error) error {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	if serr := p.stopTask(cctx, arn, "quarry: the task "+why.Error()); serr != nil {
		return errors.Join(why, fmt.Errorf("clean up: %w", serr))
	}
	return why
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

// runTaskInput builds the RunTask request of one batch: the tags its tasks
// share (pool, gateway, creation time, batch id, an on-demand pool's
// class, the pool's labels; each task's name is tagged after the call) and no overrides (each agent
// derives its token from its own task ARN). The batch id is also the
// idempotency token. The token itself is never in it.
func (p *Provider) runTaskInput(spec providers.Spec, set settings, taskDef, batch string, now time.Time) ecs.RunTaskInput {
	tags := []types.Tag{
		{Key: aws.String(providers.LabelManaged), Value: aws.String("true")},
		{Key: aws.String(providers.LabelPool), Value: aws.String(spec.Pool)},
		{Key: aws.String(providers.LabelGateway), Value: aws.String(p.cfg.GatewayID)},
		{Key: aws.String(tagCreated), Value: aws.String(strconv.FormatInt(now.Unix(), 10))},
		{Key: aws.String(tagBatch), Value: aws.String(batch)},
	}
	if spec.Class != "" {
		tags = append(tags, types.Tag{Key: aws.String(providers.LabelClass), Value: aws.String(spec.Class)})
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
		StartedBy: aws.String(p.startedBy),
		Tags:      tags,
		// The batch id makes retries of this call (the SDK's and the
		// controller's) idempotent: a lost answer never starts twins.
		ClientToken: aws.String(batch),
	}
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
	if len(spec.Labels) > maxTags-ownTags {
		return providers.InvalidSpec(spec, fmt.Sprintf("labels: at most %d (ECS allows %d tags, the provider uses %d)", maxTags-ownTags, maxTags, ownTags))
	}
	for k, v := range spec.Labels {
		switch {
		case strings.HasPrefix(k, "quarry."):
			return providers.InvalidSpec(spec, fmt.Sprintf("labels.%s: the quarry. prefix is the provider's own", k))
		case strings.HasPrefix(strings.ToLower(k), "aws:"):
			return providers.InvalidSpec(spec, fmt.Sprintf("labels.%s: the aws: prefix is reserved by AWS", k))
		case len(k) > 128 || len(v) > 256:
			return providers.InvalidSpec(spec, fmt.Sprintf("labels.%s: ECS tags have keys of at most 128 and values of at most 256 characters", k))
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

// newBatchID returns a random id for one RunTask call.
func newBatchID() (string, error) {
	b := make([]byte, batchIDBytes)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("generate batch id: %w", err)
	}
	return hex.EncodeToString(b), nil
}
