package ecs

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ecs"
	"github.com/aws/aws-sdk-go-v2/service/ecs/types"
	"github.com/aws/smithy-go"
	"golang.org/x/time/rate"
)

// fakeECS is an in-memory ECS that enforces AWS's limits: RunTask count
// 1..10, DescribeTasks at most 100 ids, a RunTask call rate (refused with
// ThrottlingException), a task launch rate (refused, as Fargate does,
// with InvalidParameterException "Rate exceeded") and a rate of
// RegisterTaskDefinition and DeregisterTaskDefinition calls (refused with
// ThrottlingException). Task definitions have revisions per family;
// DescribeTaskDefinition of a family answers its latest ACTIVE one, and
// RunTask refuses an INACTIVE one. Tasks start PENDING and
// run after runAfter DescribeTasks calls see them (with a private IP),
// unless their name (the quarry.task tag TagResource set) is in neverRun
// or failStart. runErrs scripts errors that the next RunTask calls return
// first; runFailures the failures the next RunTask call reports instead of
// starting as many of its tasks; tagErrs errors TagResource returns for a
// name (each is used once).
type fakeECS struct {
	mu          sync.Mutex
	calls       *rate.Limiter
	launches    *rate.Limiter
	registers   *rate.Limiter // RegisterTaskDefinition and DeregisterTaskDefinition calls
	runAfter    int
	startTime   func() time.Duration // set: a task runs this long after its RunTask (instead of runAfter)
	neverRun    map[string]bool
	failStart   map[string]string // name → stopped reason
	runFailures []types.Failure
	tagErrs     map[string][]error // name → the next TagResource errors
	runErrs     []error
	loseAnswers int // the next RunTask calls start their tasks, then answer with a server fault
	tasks       map[string]*fakeTask
	order       []string
	taskDefs    map[string][]*types.TaskDefinition // family → revisions, revision i at [i-1]
	defByARN    map[string]*types.TaskDefinition
	seq         int
	runCalls    int
	counts      []int       // count of each RunTask call that started tasks
	runPools    []string    // pool (quarry.pool tag) of each RunTask call that started tasks
	runTimes    []time.Time // when each RunTask call that started tasks came
	describes   int         // DescribeTasks calls
	tagCalls    int
	tasksRun    int
	throttled   int
	registered  int // RegisterTaskDefinition calls that registered
	regRefused  int // RegisterTaskDefinition and DeregisterTaskDefinition calls refused by their rate
	deregisters int
	starting    int
	maxStarting int
	firstRun    time.Time
	lastRun     time.Time
}

type fakeTask struct {
	t           types.Task
	name        string
	clientToken string
	describe    int
	runsAt      time.Time // with startTime: when it runs
}

func newFake() *fakeECS {
	return &fakeECS{
		calls:     rate.NewLimiter(rate.Inf, 1),
		launches:  rate.NewLimiter(rate.Inf, 1),
		registers: rate.NewLimiter(rate.Inf, 1),
		runAfter:  1,
		neverRun:  map[string]bool{},
		failStart: map[string]string{},
		tagErrs:   map[string][]error{},
		tasks:     map[string]*fakeTask{},
		taskDefs:  map[string][]*types.TaskDefinition{},
		defByARN:  map[string]*types.TaskDefinition{},
	}
}

func apiErr(code, msg string) error { return &smithy.GenericAPIError{Code: code, Message: msg} }

func (f *fakeECS) RunTask(_ context.Context, in *ecs.RunTaskInput, _ ...func(*ecs.Options)) (*ecs.RunTaskOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.runCalls++
	if len(f.runErrs) > 0 {
		err := f.runErrs[0]
		f.runErrs = f.runErrs[1:]
		return nil, err
	}
	if td := f.defByARN[aws.ToString(in.TaskDefinition)]; td != nil && td.Status != types.TaskDefinitionStatusActive {
		return nil, apiErr("ClientException", "TaskDefinition is inactive")
	}
	count := int(aws.ToInt32(in.Count))
	if count < 1 || count > 10 {
		return nil, apiErr("InvalidParameterException", fmt.Sprintf("count must be between 1 and 10, got %d", count))
	}
	if !f.calls.Allow() {
		f.throttled++
		return nil, apiErr("ThrottlingException", "Rate exceeded")
	}
	if !f.launches.AllowN(time.Now(), count) {
		f.throttled++
		return nil, apiErr("InvalidParameterException", "Rate exceeded")
	}
	now := time.Now()
	if f.firstRun.IsZero() {
		f.firstRun = now
	}
	f.lastRun = now
	if tok := aws.ToString(in.ClientToken); tok != "" { // idempotent, as ECS is
		var again []types.Task
		for _, arn := range f.order {
			if f.tasks[arn].clientToken == tok {
				again = append(again, f.tasks[arn].t)
			}
		}
		if len(again) > 0 {
			return &ecs.RunTaskOutput{Tasks: again}, nil
		}
	}
	f.counts = append(f.counts, count)
	f.runPools = append(f.runPools, tagMap(in.Tags)["quarry.pool"])
	f.runTimes = append(f.runTimes, now)
	out := &ecs.RunTaskOutput{Failures: f.runFailures}
	f.runFailures = nil
	for range max(0, count-len(out.Failures)) {
		f.seq++
		arn := fmt.Sprintf("arn:aws:ecs:us-east-1:123456789012:task/%s/%032x", aws.ToString(in.Cluster), f.seq)
		t := types.Task{
			TaskArn: aws.String(arn), LastStatus: aws.String("PROVISIONING"), DesiredStatus: aws.String("RUNNING"),
			Tags: in.Tags, Overrides: in.Overrides, StartedBy: in.StartedBy, CreatedAt: aws.Time(now),
			TaskDefinitionArn: in.TaskDefinition,
		}
		f.tasks[arn] = &fakeTask{t: t, name: tagMap(in.Tags)["quarry.task"], clientToken: aws.ToString(in.ClientToken)}
		if f.startTime != nil {
			f.tasks[arn].runsAt = now.Add(f.startTime())
		}
		f.order = append(f.order, arn)
		f.tasksRun++
		f.starting++
		f.maxStarting = max(f.maxStarting, f.starting)
		out.Tasks = append(out.Tasks, t)
	}
	if f.loseAnswers > 0 {
		f.loseAnswers--
		return nil, &smithy.GenericAPIError{Code: "ServerException", Message: "answer lost", Fault: smithy.FaultServer}
	}
	return out, nil
}

func (f *fakeECS) DescribeTasks(_ context.Context, in *ecs.DescribeTasksInput, _ ...func(*ecs.Options)) (*ecs.DescribeTasksOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(in.Tasks) > 100 {
		return nil, apiErr("InvalidParameterException", "tasks can have at most 100 items")
	}
	f.describes++
	out := &ecs.DescribeTasksOutput{}
	for _, id := range in.Tasks {
		ft, ok := f.tasks[id]
		if !ok {
			out.Failures = append(out.Failures, types.Failure{Arn: aws.String(id), Reason: aws.String("MISSING")})
			continue
		}
		ft.describe++
		if aws.ToString(ft.t.LastStatus) == "PROVISIONING" {
			switch {
			case f.failStart[ft.name] != "":
				f.starting--
				ft.t.LastStatus, ft.t.DesiredStatus = aws.String("STOPPED"), aws.String("STOPPED")
				ft.t.StopCode, ft.t.StoppedReason = types.TaskStopCodeTaskFailedToStart, aws.String(f.failStart[ft.name])
			case !f.neverRun[ft.name] && (f.startTime == nil && ft.describe >= f.runAfter || f.startTime != nil && !time.Now().Before(ft.runsAt)):
				f.starting--
				ft.t.LastStatus = aws.String("RUNNING")
				ft.t.Attachments = []types.Attachment{{Type: aws.String("ElasticNetworkInterface"), Details: []types.KeyValuePair{
					{Name: aws.String("privateIPv4Address"), Value: aws.String(fmt.Sprintf("10.0.%d.%d", f.seq/250, f.seq%250+1))},
				}}}
			}
		}
		out.Tasks = append(out.Tasks, ft.t)
	}
	return out, nil
}

func (f *fakeECS) TagResource(_ context.Context, in *ecs.TagResourceInput, _ ...func(*ecs.Options)) (*ecs.TagResourceOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tagCalls++
	ft, ok := f.tasks[aws.ToString(in.ResourceArn)]
	if !ok {
		return nil, apiErr("InvalidParameterException", "The specified task is not found.")
	}
	set := tagMap(in.Tags)
	if errs := f.tagErrs[set["quarry.task"]]; len(errs) > 0 {
		f.tagErrs[set["quarry.task"]] = errs[1:]
		return nil, errs[0]
	}
	tags := make([]types.Tag, 0, len(ft.t.Tags)+len(in.Tags))
	for _, t := range ft.t.Tags {
		if _, replaced := set[aws.ToString(t.Key)]; !replaced {
			tags = append(tags, t)
		}
	}
	ft.t.Tags = append(tags, in.Tags...)
	if name, ok := set["quarry.task"]; ok {
		ft.name = name
	}
	return &ecs.TagResourceOutput{}, nil
}

func (f *fakeECS) StopTask(_ context.Context, in *ecs.StopTaskInput, _ ...func(*ecs.Options)) (*ecs.StopTaskOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ft, ok := f.tasks[aws.ToString(in.Task)]
	if !ok {
		return nil, apiErr("InvalidParameterException", "The referenced task was not found.")
	}
	if aws.ToString(ft.t.LastStatus) == "PROVISIONING" {
		f.starting--
	}
	ft.t.LastStatus, ft.t.DesiredStatus = aws.String("STOPPED"), aws.String("STOPPED")
	ft.t.StopCode, ft.t.StoppedReason = types.TaskStopCodeUserInitiated, in.Reason
	return &ecs.StopTaskOutput{Task: &ft.t}, nil
}

func (f *fakeECS) ListTasks(_ context.Context, in *ecs.ListTasksInput, _ ...func(*ecs.Options)) (*ecs.ListTasksOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	want := in.DesiredStatus
	if want == "" {
		want = types.DesiredStatusRunning
	}
	out := &ecs.ListTasksOutput{}
	for _, arn := range f.order {
		t := f.tasks[arn].t
		if in.StartedBy != nil && aws.ToString(t.StartedBy) != aws.ToString(in.StartedBy) {
			continue
		}
		if aws.ToString(t.DesiredStatus) == string(want) {
			out.TaskArns = append(out.TaskArns, arn)
		}
	}
	return out, nil
}

func (f *fakeECS) RegisterTaskDefinition(_ context.Context, in *ecs.RegisterTaskDefinitionInput, _ ...func(*ecs.Options)) (*ecs.RegisterTaskDefinitionOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.registers.Allow() {
		f.regRefused++
		return nil, apiErr("ThrottlingException", "Rate exceeded")
	}
	f.registered++
	fam := aws.ToString(in.Family)
	rev := len(f.taskDefs[fam]) + 1
	td := &types.TaskDefinition{
		Family: in.Family, Revision: int32(rev), Status: types.TaskDefinitionStatusActive, ContainerDefinitions: in.ContainerDefinitions,
		TaskDefinitionArn: aws.String(fmt.Sprintf("arn:aws:ecs:us-east-1:123456789012:task-definition/%s:%d", fam, rev)),
	}
	f.taskDefs[fam] = append(f.taskDefs[fam], td)
	f.defByARN[aws.ToString(td.TaskDefinitionArn)] = td
	return &ecs.RegisterTaskDefinitionOutput{TaskDefinition: td, Tags: in.Tags}, nil
}

func (f *fakeECS) DescribeTaskDefinition(_ context.Context, in *ecs.DescribeTaskDefinitionInput, _ ...func(*ecs.Options)) (*ecs.DescribeTaskDefinitionOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ref := aws.ToString(in.TaskDefinition)
	td := f.defByARN[ref]
	if td == nil {
		for _, r := range slices.Backward(f.taskDefs[ref]) {
			if r.Status == types.TaskDefinitionStatusActive {
				td = r
				break
			}
		}
	}
	if td == nil {
		return nil, apiErr("ClientException", "Unable to describe task definition.")
	}
	return &ecs.DescribeTaskDefinitionOutput{TaskDefinition: td}, nil
}

func (f *fakeECS) DeregisterTaskDefinition(_ context.Context, in *ecs.DeregisterTaskDefinitionInput, _ ...func(*ecs.Options)) (*ecs.DeregisterTaskDefinitionOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.registers.Allow() {
		f.regRefused++
		return nil, apiErr("ThrottlingException", "Rate exceeded")
	}
	td := f.defByARN[aws.ToString(in.TaskDefinition)]
	if td == nil {
		return nil, apiErr("ClientException", "The specified task definition does not exist.")
	}
	f.deregisters++
	td.Status = types.TaskDefinitionStatusInactive
	return &ecs.DeregisterTaskDefinitionOutput{TaskDefinition: td}, nil
}

// registerStats returns the registrations, deregistrations and the calls
// of either refused by their rate.
func (f *fakeECS) registerStats() (registered, deregistered, refused int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.registered, f.deregisters, f.regRefused
}

// taskDefStatus returns the status of the task definition arn ("" when unknown).
func (f *fakeECS) taskDefStatus(arn string) types.TaskDefinitionStatus {
	f.mu.Lock()
	defer f.mu.Unlock()
	if td := f.defByARN[arn]; td != nil {
		return td.Status
	}
	return ""
}

// task returns the fake's task of a name.
func (f *fakeECS) task(name string) (types.Task, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, arn := range f.order {
		if f.tasks[arn].name == name {
			return f.tasks[arn].t, true
		}
	}
	return types.Task{}, false
}

// clientToken returns the idempotency token t was started with.
func (f *fakeECS) clientToken(t types.Task) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.tasks[aws.ToString(t.TaskArn)].clientToken
}

// tagCount returns the number of TagResource calls.
func (f *fakeECS) tagCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.tagCalls
}

// runCounts returns the count of each RunTask call that started tasks.
func (f *fakeECS) runCounts() []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]int(nil), f.counts...)
}

// describeCount returns the number of DescribeTasks calls.
func (f *fakeECS) describeCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.describes
}

// runLog returns the time and count of each RunTask call that started tasks.
func (f *fakeECS) runLog() ([]time.Time, []int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]time.Time(nil), f.runTimes...), append([]int(nil), f.counts...)
}

// runPoolOrder returns the pool of each RunTask call that started tasks.
func (f *fakeECS) runPoolOrder() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.runPools...)
}

// simulatedFargate makes f start tasks as Fargate does, with every
// duration divided by scale: a task runs 30-90 s (uniform) after its
// RunTask.
func (f *fakeECS) simulatedFargate(scale float64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.startTime = func() time.Duration {
		return time.Duration((30 + 60*rand.Float64()) * float64(time.Second) / scale)
	}
}

// stats returns a snapshot of the counters.
func (f *fakeECS) stats() (runCalls, tasksRun, throttled, registers, maxStarting int, first, last time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.runCalls, f.tasksRun, f.throttled, f.registered, f.maxStarting, f.firstRun, f.lastRun
}
