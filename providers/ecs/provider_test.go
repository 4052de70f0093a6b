package ecs

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ecs"
	"github.com/aws/aws-sdk-go-v2/service/ecs/types"
	"github.com/aws/smithy-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"

	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/providers"
)

// waitLong bounds the tests' waits (a busy CI machine).
const waitLong = 60 * time.Second

// testConfig is a valid config with fast polling and retries.
func testConfig() Config {
	return Config{
		Cluster:           "quarry-test",
		GatewayID:         "gw-test",
		Subnets:           []string{"subnet-0123456789abcdef0"},
		SecurityGroups:    []string{"sg-0123456789abcdef0"},
		ExecutionRoleARN:  "arn:aws:iam::123456789012:role/quarry-exec",
		AgentImage:        "123456789012.dkr.ecr.us-east-1.amazonaws.com/quarry-agent:1",
		TokenKey:          []byte(strings.Repeat("k", 32)),
		TokenKeySecretARN: "arn:aws:secretsmanager:us-east-1:123456789012:secret:quarry-token-key",
		LogGroup:          "/quarry/sandboxes",
		LogRegion:         "us-east-1",
		StartTimeout:      waitLong,
		PollInterval:      5 * time.Millisecond,
		RetryBase:         time.Millisecond,
		RetryMax:          5 * time.Millisecond,
		RunTaskRate:       1000,
		RunTaskBurst:      1000,
		LaunchRate:        1000,
		LaunchBurst:       1000,
		TagRate:           1000,
		TagBurst:          1000,
		RegisterRate:      1000,
		RegisterBurst:     1000,
	}
}

func testSpec() providers.Spec {
	return providers.Spec{Pool: "py", Image: "python:3.12-slim", CPU: 0.5, MemoryMB: 1024,
		Env: map[string]string{"A": "1"}, Labels: map[string]string{"team": "rl"}}
}

func newTestProvider(t *testing.T, cfg Config, api API) *Provider {
	t.Helper()
	p, err := New(cfg, api, Deps{})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, p.Close(context.Background())) })
	return p
}

func names(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	return out
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	t.Cleanup(cancel)
	return ctx
}

func TestProvider_Launch_RunsTasksWithTheirOwnTokens(t *testing.T) {
	f := newFake()
	f.runAfter = 3
	p := newTestProvider(t, testConfig(), f)
	ctx := testCtx(t)

	tasks, err := p.Launch(ctx, testSpec(), names("t", 3))
	require.NoError(t, err)
	require.Len(t, tasks, 3)
	assert.Equal(t, []int{3}, f.runCounts(), "one RunTask call starts the batch")
	tokens := map[string]bool{}
	batches := map[string]bool{}
	for i, task := range tasks {
		assert.Equal(t, fmt.Sprintf("t-%d", i), task.Name)
		assert.Equal(t, fmt.Sprintf("t-%d", i), task.Labels[providers.LabelTask])
		assert.Equal(t, "py", task.Pool)
		assert.Equal(t, providers.TaskRunning, task.State)
		assert.True(t, strings.HasPrefix(task.AgentURL, "http://10.0."), task.AgentURL)
		assert.True(t, strings.HasSuffix(task.AgentURL, ":8000"), task.AgentURL)
		assert.Len(t, task.AgentToken, 64)
		tokens[task.AgentToken] = true
		assert.Equal(t, "rl", task.Labels["team"])
		assert.Equal(t, agentapi.DeriveToken(testConfig().TokenKey, task.ID), task.AgentToken, "the agent derives the same token from its task ARN")

		et, ok := f.task(task.Name)
		require.True(t, ok, "the task carries its name tag")
		assert.Equal(t, task.ID, aws.ToString(et.TaskArn))
		assert.Equal(t, p.startedBy, aws.ToString(et.StartedBy))
		assert.Nil(t, et.Overrides, "no per-task overrides: the batch shares one request")
		batch := tagMap(et.Tags)[tagBatch]
		require.NotEmpty(t, batch)
		batches[batch] = true
		assert.Equal(t, batch, f.clientToken(et), "retries of the RunTask are idempotent")
		for _, tag := range et.Tags {
			assert.NotEqual(t, task.AgentToken, aws.ToString(tag.Value), "the token is never in the tags")
		}
	}
	assert.Len(t, tokens, 3, "each task has its own token")
	assert.Len(t, batches, 1, "the tasks of one call share its batch id")
	_, _, _, registers, _, _, _ := f.stats()
	assert.Equal(t, 1, registers)
}

func TestProvider_Launch_BatchesTenPerRunTaskAndNamesEachTask(t *testing.T) {
	f := newFake()
	p := newTestProvider(t, testConfig(), f)

	tasks, err := p.Launch(testCtx(t), testSpec(), names("n", 25))
	require.NoError(t, err)
	require.Len(t, tasks, 25)
	counts := f.runCounts()
	slices.Sort(counts)
	assert.Equal(t, []int{5, 10, 10}, counts, "three RunTask calls")
	assert.Equal(t, 25, f.tagCount(), "one TagResource per task")
	ids := map[string]bool{}
	for i, task := range tasks {
		assert.Equal(t, fmt.Sprintf("n-%d", i), task.Name, "in the order of names")
		et, ok := f.task(task.Name)
		require.True(t, ok)
		assert.Equal(t, task.ID, aws.ToString(et.TaskArn), "the name tag is on the task returned under that name")
		ids[task.ID] = true
	}
	assert.Len(t, ids, 25)

	list, err := newTestProvider(t, testConfig(), f).List(testCtx(t), "py")
	require.NoError(t, err)
	require.Len(t, list, 25)
	byID := map[string]providers.Task{}
	for _, task := range list {
		byID[task.ID] = task
	}
	for _, task := range tasks {
		assert.Equal(t, task.Name, byID[task.ID].Name, "a restarted gateway reads the names")
		assert.Equal(t, task.AgentToken, byID[task.ID].AgentToken, "and derives the same tokens")
	}
}

func TestProvider_Launch_PartialRunTaskFailuresFailTheirNames(t *testing.T) {
	f := newFake()
	f.runFailures = []types.Failure{
		{Reason: aws.String("RESOURCE:ENI"), Detail: aws.String("no free addresses in the subnet")},
		{Reason: aws.String("Capacity is unavailable at this time.")},
	}
	p := newTestProvider(t, testConfig(), f)

	tasks, err := p.Launch(testCtx(t), testSpec(), names("p", 4))
	require.Error(t, err)
	require.Len(t, tasks, 2, "the started tasks are returned")
	assert.Equal(t, []string{"p-0", "p-1"}, []string{tasks[0].Name, tasks[1].Name})
	assert.Equal(t, []int{4}, f.runCounts())
	assert.Equal(t, 2, f.tagCount(), "only started tasks are named")
	assert.ErrorIs(t, err, providers.ErrNoCapacity)
	assert.Contains(t, err.Error(), `launch task "p-2": run task: RESOURCE:ENI no free addresses`)
	assert.Contains(t, err.Error(), `launch task "p-3": run task: Capacity is unavailable`)
	assert.Contains(t, err.Error(), "launch 2 of 4 tasks")
}

func TestProvider_Launch_TaggingFailureStopsTheTask(t *testing.T) {
	f := newFake()
	f.tagErrs["bad"] = []error{apiErr("AccessDeniedException", "not authorized to perform ecs:TagResource")}
	f.tagErrs["slow"] = []error{apiErr("ThrottlingException", "Rate exceeded"), apiErr("ThrottlingException", "Rate exceeded")}
	p := newTestProvider(t, testConfig(), f)

	tasks, err := p.Launch(testCtx(t), testSpec(), []string{"ok", "bad", "slow"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), `launch task "bad": name the task (tag quarry.task): `)
	assert.Contains(t, err.Error(), "not authorized to perform ecs:TagResource")
	assert.NotContains(t, err.Error(), `"slow"`, "a throttled TagResource is retried")
	require.Len(t, tasks, 2)
	assert.Equal(t, []string{"ok", "slow"}, []string{tasks[0].Name, tasks[1].Name})
	assert.Equal(t, 5, f.tagCount())

	list, err := p.List(testCtx(t), "py")
	require.NoError(t, err)
	require.Len(t, list, 3)
	var unnamed []providers.Task
	for _, task := range list {
		if task.Name == "" {
			unnamed = append(unnamed, task)
		}
	}
	require.Len(t, unnamed, 1, "the unnamed task is listed (for the orphan sweep) without a name")
	assert.Equal(t, providers.TaskStopped, unnamed[0].State, "and stopped")
	assert.Contains(t, unnamed[0].Reason, "quarry: the task name the task (tag quarry.task)")
	assert.False(t, unnamed[0].CreatedAt.IsZero(), "its age counts for the orphan sweep's grace period")
}

func TestProvider_Launch_RegistersTaskDefinitionOncePerPoolContent(t *testing.T) {
	f := newFake()
	ctx := testCtx(t)
	_, err := newTestProvider(t, testConfig(), f).Launch(ctx, testSpec(), names("a", 2))
	require.NoError(t, err)
	_, err = newTestProvider(t, testConfig(), f).Launch(ctx, testSpec(), names("b", 1))
	require.NoError(t, err, "a new instance finds the definition")
	_, _, _, registers, _, _, _ := f.stats()
	assert.Equal(t, 1, registers)

	changed := testSpec()
	changed.Image = "python:3.13-slim"
	_, err = newTestProvider(t, testConfig(), f).Launch(ctx, changed, names("c", 1))
	require.NoError(t, err)
	_, _, _, registers, _, _, _ = f.stats()
	assert.Equal(t, 2, registers, "a changed pool gets its own definition")

	supplied := testSpec()
	supplied.Options = map[string]string{"task_definition": "quarry-terraform:3"}
	_, err = newTestProvider(t, testConfig(), f).Launch(ctx, supplied, names("d", 1))
	require.NoError(t, err)
	et, ok := f.task("d-0")
	require.True(t, ok)
	assert.Equal(t, "quarry-terraform:3", aws.ToString(et.TaskDefinitionArn))
	_, _, _, registers, _, _, _ = f.stats()
	assert.Equal(t, 2, registers, "a supplied definition is not registered")
}

func TestProvider_Launch_StaysWithinRateLimits(t *testing.T) {
	// ECS's limits scaled down so the test is quick; the provider's buckets
	// are set below them, as the defaults are below AWS's.
	f := newFake()
	f.calls = rate.NewLimiter(100, 10)
	f.launches = rate.NewLimiter(50, 20)
	cfg := testConfig()
	cfg.RunTaskRate, cfg.RunTaskBurst = 80, 5
	cfg.LaunchRate, cfg.LaunchBurst = 40, 10
	p := newTestProvider(t, cfg, f)
	const n = 40

	start := time.Now()
	tasks, err := p.Launch(testCtx(t), testSpec(), names("r", n))
	require.NoError(t, err)
	assert.Len(t, tasks, n)
	_, tasksRun, throttled, _, _, _, last := f.stats()
	assert.Equal(t, n, tasksRun)
	// The client's bucket admitted at most burst + rate × elapsed tasks by
	// the last call, whatever the scheduling.
	elapsed := last.Sub(start).Seconds()
	assert.LessOrEqual(t, float64(n), float64(cfg.LaunchBurst)+cfg.LaunchRate*elapsed+1,
		"%d tasks in %.3fs exceed the launch bucket", n, elapsed)
	t.Logf("%d tasks in %.3fs, %d throttled calls (retried)", n, elapsed, throttled)
}

func TestLauncher_RunTask_BatchesAtMostTenPerCall(t *testing.T) {
	f := newFake()
	l := newLauncher(f, testConfig().WithDefaults(), nil, nopLogger())
	ctx := testCtx(t)
	in := ecs.RunTaskInput{Cluster: aws.String("c"), TaskDefinition: aws.String("td")}

	tasks, _, err := l.runTask(ctx, in, 10)
	require.NoError(t, err)
	assert.Len(t, tasks, 10)
	_, _, err = l.runTask(ctx, in, 11)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "count 11")
	runCalls, _, _, _, _, _, _ := f.stats()
	assert.Equal(t, 1, runCalls, "a count over 10 never reaches ECS")
}

func TestLauncher_RunTask_RetriesThrottles(t *testing.T) {
	tests := []struct {
		name      string
		errs      []error
		attempts  int
		wantCalls int
		wantErr   error
		wantSpec  bool
	}{
		{name: "ThrottlingException", errs: []error{apiErr("ThrottlingException", "Rate exceeded")}, attempts: 4, wantCalls: 2},
		{name: "InvalidParameterException Rate exceeded", errs: []error{
			apiErr("InvalidParameterException", "Rate exceeded"), apiErr("InvalidParameterException", "Rate exceeded"),
		}, attempts: 4, wantCalls: 3},
		{name: "ClientException Rate exceeded", errs: []error{apiErr("ClientException", "Rate exceeded.")}, attempts: 4, wantCalls: 2},
		{name: "server error", errs: []error{&smithy.GenericAPIError{Code: "ServerException", Message: "oops", Fault: smithy.FaultServer}}, attempts: 4, wantCalls: 2},
		{name: "throttled past the attempts", errs: []error{
			apiErr("ThrottlingException", "Rate exceeded"), apiErr("ThrottlingException", "Rate exceeded"), apiErr("ThrottlingException", "Rate exceeded"),
		}, attempts: 3, wantCalls: 3, wantErr: providers.ErrThrottled},
		{name: "invalid parameter is not retried", errs: []error{apiErr("InvalidParameterException", "No Fargate configuration exists for given values")},
			attempts: 4, wantCalls: 1, wantErr: providers.ErrInvalidSpec, wantSpec: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake()
			f.runErrs = tt.errs
			cfg := testConfig()
			cfg.MaxAttempts = tt.attempts
			p := newTestProvider(t, cfg, f)
			tasks, err := p.Launch(testCtx(t), testSpec(), []string{"x"})
			runCalls, _, _, _, _, _, _ := f.stats()
			assert.Equal(t, tt.wantCalls, runCalls)
			if tt.wantErr != nil {
				require.Error(t, err)
				assert.ErrorIs(t, err, tt.wantErr)
				assert.Empty(t, tasks)
				if tt.wantSpec {
					var le *providers.LaunchError
					require.ErrorAs(t, err, &le)
					assert.Contains(t, le.Reason, "No Fargate configuration")
				}
				return
			}
			require.NoError(t, err)
			assert.Len(t, tasks, 1)
		})
	}
}

func TestProvider_Launch_RetryAfterLostAnswerStartsNoTwin(t *testing.T) {
	f := newFake()
	f.loseAnswers = 1
	p := newTestProvider(t, testConfig(), f)

	tasks, err := p.Launch(testCtx(t), testSpec(), []string{"once"})
	require.NoError(t, err)
	require.Len(t, tasks, 1)
	runCalls, tasksRun, _, _, _, _, _ := f.stats()
	assert.Equal(t, 2, runCalls, "the lost answer is retried")
	assert.Equal(t, 1, tasksRun, "the retry carries the same client token")
}

func TestProvider_Launch_StopsTaskPastItsDeadline(t *testing.T) {
	f := newFake()
	f.neverRun["slow"] = true
	cfg := testConfig()
	cfg.StartTimeout = 300 * time.Millisecond
	p := newTestProvider(t, cfg, f)

	tasks, err := p.Launch(testCtx(t), testSpec(), []string{"slow", "quick"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), `"slow"`)
	assert.Contains(t, err.Error(), "did not run within 300ms")
	require.Len(t, tasks, 1, "the task that ran is returned")
	assert.Equal(t, "quick", tasks[0].Name)
	et, ok := f.task("slow")
	require.True(t, ok)
	assert.Equal(t, "STOPPED", aws.ToString(et.LastStatus), "the late task is stopped")
	assert.Contains(t, aws.ToString(et.StoppedReason), "did not run within")
}

func TestProvider_Launch_ReportsStoppedReasonOfFailedStart(t *testing.T) {
	f := newFake()
	f.failStart["bad"] = "CannotPullContainerError: pull image manifest has been retried 5 time(s)"
	f.runFailures = []types.Failure{{Reason: aws.String("Capacity is unavailable at this time. Please try again later or in a different availability zone")}} // "full", the last of the batch
	p := newTestProvider(t, testConfig(), f)

	tasks, err := p.Launch(testCtx(t), testSpec(), []string{"bad", "ok", "full"})
	require.Error(t, err)
	var img *providers.ImageError
	require.ErrorAs(t, err, &img, "a task that could not pull its image is the image's failure")
	assert.Equal(t, providers.ImageUnreachable, img.Kind, "a pull that failed for no reason it says: retry later")
	assert.Equal(t, "CannotPullContainerError: pull image manifest has been retried 5 time(s)", img.Answer)
	assert.Contains(t, err.Error(), `launch task "bad": stopped while starting: image "python:3.12-slim"`)
	assert.ErrorIs(t, err, providers.ErrNoCapacity)
	require.Len(t, tasks, 1)
	assert.Equal(t, "ok", tasks[0].Name)
}

func TestProvider_Launch_CapsTasksStartingAtOnce(t *testing.T) {
	f := newFake()
	f.runAfter = 3
	cfg := testConfig()
	cfg.MaxStarting = 2
	p := newTestProvider(t, cfg, f)

	tasks, err := p.Launch(testCtx(t), testSpec(), names("c", 8))
	require.NoError(t, err)
	assert.Len(t, tasks, 8)
	_, _, _, _, maxStarting, _, _ := f.stats()
	assert.LessOrEqual(t, maxStarting, 2)
	assert.Positive(t, maxStarting)
}

func TestProvider_Launch_CancelledReturnsPendingTasks(t *testing.T) {
	f := newFake()
	f.neverRun["p"] = true
	p := newTestProvider(t, testConfig(), f)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		for {
			if _, ok := f.task("p"); ok {
				cancel()
				return
			}
			time.Sleep(time.Millisecond)
		}
	}()
	tasks, err := p.Launch(ctx, testSpec(), []string{"p"})
	require.ErrorIs(t, err, context.Canceled)
	require.Len(t, tasks, 1, "a started task is real and returned")
	assert.Equal(t, providers.TaskPending, tasks[0].State)
	assert.Empty(t, tasks[0].AgentURL)
}

func TestProvider_Launch_BadSpecNamesTheField(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*providers.Spec)
		names  []string
		want   string
	}{
		{"cpu too large", func(s *providers.Spec) { s.CPU = 32 }, nil, "cpu:"},
		{"memory too large", func(s *providers.Spec) { s.CPU, s.MemoryMB = 0.25, 200000 }, nil, "memory_mb:"},
		{"unknown option", func(s *providers.Spec) { s.Options = map[string]string{"network": "host"} }, nil, "options.network"},
		{"bad capacity provider", func(s *providers.Spec) { s.Options = map[string]string{"capacity_provider": "FARGATE:x"} }, nil, "options.capacity_provider"},
		{"bad subnet", func(s *providers.Spec) { s.Options = map[string]string{"subnets": "subnet-0123456789abcdef0,nope"} }, nil, "options.subnets[1]"},
		{"bad public ip", func(s *providers.Spec) { s.Options = map[string]string{"assign_public_ip": "maybe"} }, nil, "options.assign_public_ip"},
		{"bad user", func(s *providers.Spec) { s.Options = map[string]string{"user": "root; rm"} }, nil, "options.user"},
		{"bad arch", func(s *providers.Spec) { s.Options = map[string]string{"arch": "mips"} }, nil, "options.arch"},
		{"reserved env", func(s *providers.Spec) { s.Env = map[string]string{"QUARRY_AGENT_TOKEN": "x"} }, nil, "env.QUARRY_AGENT_TOKEN"},
		{"reserved label", func(s *providers.Spec) { s.Labels = map[string]string{"quarry.task": "x"} }, nil, "labels.quarry.task"},
		{"no image", func(s *providers.Spec) { s.Image = "" }, nil, "image:"},
		{"bad name", func(*providers.Spec) {}, []string{"has space"}, "names[0]"},
		{"repeated name", func(*providers.Spec) {}, []string{"a", "a"}, "names[1]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake()
			p := newTestProvider(t, testConfig(), f)
			spec := testSpec()
			tt.mutate(&spec)
			n := tt.names
			if n == nil {
				n = []string{"x"}
			}
			_, err := p.Launch(testCtx(t), spec, n)
			var le *providers.LaunchError
			require.ErrorAs(t, err, &le)
			assert.ErrorIs(t, err, providers.ErrInvalidSpec)
			assert.Contains(t, le.Reason, tt.want)
			runCalls, _, _, registers, _, _, _ := f.stats()
			assert.Zero(t, runCalls+registers, "nothing reaches ECS")
		})
	}
}

func TestProvider_DescribeListStop(t *testing.T) {
	f := newFake()
	ctx := testCtx(t)
	p := newTestProvider(t, testConfig(), f)
	a, err := p.Launch(ctx, testSpec(), names("a", 2))
	require.NoError(t, err)
	other := testSpec()
	other.Pool = "other"
	b, err := p.Launch(ctx, other, names("b", 1))
	require.NoError(t, err)
	cfg := testConfig()
	cfg.GatewayID = "someone-else"
	foreign, err := newTestProvider(t, cfg, f).Launch(ctx, testSpec(), names("f", 1))
	require.NoError(t, err)

	second := newTestProvider(t, testConfig(), f) // a restarted gateway
	list, err := second.List(ctx, "py")
	require.NoError(t, err)
	require.Len(t, list, 2)
	assert.ElementsMatch(t, []string{"a-0", "a-1"}, []string{list[0].Name, list[1].Name})
	assert.False(t, list[1].CreatedAt.Before(list[0].CreatedAt), "oldest first")
	assert.False(t, list[0].CreatedAt.IsZero())
	all, err := second.List(ctx, "")
	require.NoError(t, err)
	assert.Len(t, all, 3, "another gateway's task is not listed")

	require.NoError(t, second.Stop(ctx, a[0].ID, "lease released"))
	require.NoError(t, second.Stop(ctx, a[0].ID, "again"), "idempotent")
	require.NoError(t, second.Stop(ctx, foreign[0].ID, "not ours"))
	require.NoError(t, second.Stop(ctx, "arn:aws:ecs:us-east-1:123456789012:task/quarry-test/none", "unknown"))
	require.NoError(t, second.Stop(ctx, "garbage", "unknown"))

	got, err := second.Describe(ctx, []string{a[0].ID, a[1].ID, b[0].ID, foreign[0].ID, "garbage"})
	require.NoError(t, err)
	require.Len(t, got, 5)
	assert.Equal(t, providers.TaskStopped, got[0].State)
	assert.Equal(t, "stopped through the API: lease released", got[0].Reason)
	assert.Equal(t, providers.TaskRunning, got[1].State)
	assert.Equal(t, a[1].AgentToken, got[1].AgentToken, "a new instance derives the same token")
	assert.Equal(t, providers.TaskRunning, got[2].State)
	assert.Equal(t, providers.Task{ID: foreign[0].ID, State: providers.TaskStopped, Reason: "not found"}, got[3])
	assert.Equal(t, providers.Task{ID: "garbage", State: providers.TaskStopped, Reason: "not found"}, got[4])
	et, ok := f.task("f-0")
	require.True(t, ok)
	assert.Equal(t, "RUNNING", aws.ToString(et.LastStatus), "another gateway's task is left alone")

	list, err = second.List(ctx, "py")
	require.NoError(t, err)
	assert.Len(t, list, 2, "stopped tasks are listed while ECS reports them")
}

func TestProvider_Describe_BatchesOfAHundred(t *testing.T) {
	f := newFake()
	p := newTestProvider(t, testConfig(), f)
	tasks, err := p.Launch(testCtx(t), testSpec(), names("m", 120))
	require.NoError(t, err)
	ids := make([]string, len(tasks))
	for i, task := range tasks {
		ids[i] = task.ID
	}
	got, err := p.Describe(testCtx(t), ids)
	require.NoError(t, err, "the fake refuses more than 100 ids per call")
	assert.Len(t, got, 120)
}

func TestNew_ValidatesConfig(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*Config)
		want   string
	}{
		{"no cluster", func(c *Config) { c.Cluster = "" }, "Cluster"},
		{"no subnets", func(c *Config) { c.Subnets = nil }, "Subnets"},
		{"bad security group", func(c *Config) { c.SecurityGroups = []string{"default"} }, "SecurityGroups"},
		{"short key", func(c *Config) { c.TokenKey = []byte("short") }, "TokenKey"},
		{"no secret", func(c *Config) { c.TokenKeySecretARN = "" }, "TokenKeySecretARN"},
		{"log group without region", func(c *Config) { c.LogRegion = "" }, "LogRegion"},
		{"bad strategy", func(c *Config) { c.CapacityProvider = "FARGATE:1:2:3" }, "CapacityProvider"},
		{"launch burst below a call", func(c *Config) { c.LaunchBurst = 5 }, "LaunchRate"},
		{"negative tag rate", func(c *Config) { c.TagRate = -1 }, "TagRate"},
		{"negative register rate", func(c *Config) { c.RegisterRate = -1 }, "RegisterRate"},
		{"bad family prefix", func(c *Config) { c.FamilyPrefix = "quarry/" }, "FamilyPrefix"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig()
			tt.mutate(&cfg)
			_, err := New(cfg, newFake(), Deps{})
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
	_, err := New(testConfig(), nil, Deps{})
	assert.Error(t, err, "no client")
}
