package ecs

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/providers"
	"github.com/quarryhq/quarry/providers/providertest"
)

// taskEvent is the body EventBridge puts in the queue for one "ECS Task
// State Change" event, shaped as AWS documents it (the developer guide's
// "Task state change events" example for a Fargate task: envelope, the
// task in DescribeTasks' shape with ISO 8601 times, an eni attachment with
// the private IP once it runs, the containers, version, no tags).
type taskEvent struct {
	cluster, arn, startedBy  string
	last, desired            string
	stopCode, stoppedReason  string
	ip                       string
	sandboxExit              *int
	detailType, source, time string
}

func (e taskEvent) body() string {
	detailType, source, at := e.detailType, e.source, e.time
	if detailType == "" {
		detailType = "ECS Task State Change"
	}
	if source == "" {
		source = "aws.ecs"
	}
	if at == "" {
		at = "2026-01-23T17:57:58Z"
	}
	containers := []map[string]any{{
		"containerArn": "arn:aws:ecs:us-east-1:123456789012:container/cf159fd6-3e3f-4a9e-84f9-66cbe726af01",
		"lastStatus":   e.last, "name": SandboxContainer, "image": "python:3.12-slim", "taskArn": e.arn, "cpu": "0",
	}, {
		"containerArn": "arn:aws:ecs:us-east-1:123456789012:container/0e0f0f2a-3e3f-4a9e-84f9-66cbe726af02",
		"lastStatus":   "STOPPED", "name": "agent-init", "image": "quarry-agent:1", "taskArn": e.arn, "exitCode": 0, "cpu": "0",
	}}
	if e.sandboxExit != nil {
		containers[0]["exitCode"] = *e.sandboxExit
		containers[0]["reason"] = "OutOfMemoryError: Container killed due to memory usage"
	}
	details := []map[string]string{
		{"name": "subnetId", "value": "subnet-abcd1234"},
		{"name": "networkInterfaceId", "value": "eni-abcd1234"},
		{"name": "macAddress", "value": "0a:98:eb:a7:29:ba"},
	}
	if e.ip != "" {
		details = append(details, map[string]string{"name": "privateIPv4Address", "value": e.ip})
	}
	detail := map[string]any{
		"attachments":       []map[string]any{{"id": "1789bcae-ddfb-4d10-8ebe-8ac87ddba5b8", "type": "eni", "status": "ATTACHED", "details": details}},
		"availabilityZone":  "us-east-1c",
		"clusterArn":        e.cluster,
		"containers":        containers,
		"createdAt":         "2026-01-23T17:57:34.402Z",
		"launchType":        "FARGATE",
		"cpu":               "512",
		"memory":            "1024",
		"desiredStatus":     e.desired,
		"group":             "family:quarry-py-0123456789ab",
		"lastStatus":        e.last,
		"overrides":         map[string]any{"containerOverrides": []map[string]any{{"name": SandboxContainer}, {"name": "agent-init"}}},
		"connectivity":      "CONNECTED",
		"connectivityAt":    "2026-01-23T17:57:38.453Z",
		"pullStartedAt":     "2026-01-23T17:57:52.103Z",
		"startedAt":         "2026-01-23T17:57:58.103Z",
		"startedBy":         e.startedBy,
		"pullStoppedAt":     "2026-01-23T17:57:55.103Z",
		"updatedAt":         "2026-01-23T17:57:58.103Z",
		"taskArn":           e.arn,
		"taskDefinitionArn": "arn:aws:ecs:us-east-1:123456789012:task-definition/quarry-py-0123456789ab:1",
		"version":           4,
		"platformVersion":   "1.4.0",
	}
	if e.stopCode != "" {
		detail["stopCode"], detail["stoppedReason"] = e.stopCode, e.stoppedReason
		detail["stoppingAt"], detail["stoppedAt"] = "2026-01-23T18:07:58.103Z", "2026-01-23T18:08:08.103Z"
		detail["updatedAt"] = "2026-01-23T18:08:08.103Z"
	}
	b, err := json.Marshal(map[string]any{
		"version": "0", "id": "3317b2af-7005-947d-b652-f55e762e571a", "detail-type": detailType, "source": source,
		"account": "123456789012", "time": at, "region": "us-east-1", "resources": []string{e.arn}, "detail": detail,
	})
	if err != nil {
		panic(err)
	}
	return string(b)
}

// fakeSQS is a scriptable queue: messages are handed out at most 10 a
// receive, each until deleted (a received message stays invisible until
// the test makes it visible again with redeliver); receiveErrs are
// returned first, one per receive.
type fakeSQS struct {
	mu          sync.Mutex
	next        int
	messages    map[string]string // receipt handle → body, not yet deleted
	visible     []string          // receipt handles to hand out, in order
	receiveErrs []error
	receives    int
	deletes     [][]string // receipt handles of each DeleteMessageBatch
}

func newFakeSQS() *fakeSQS { return &fakeSQS{messages: map[string]string{}} }

func (f *fakeSQS) send(bodies ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, b := range bodies {
		f.next++
		h := fmt.Sprintf("rh-%d", f.next)
		f.messages[h] = b
		f.visible = append(f.visible, h)
	}
}

func (f *fakeSQS) ReceiveMessage(ctx context.Context, in *sqs.ReceiveMessageInput, _ ...func(*sqs.Options)) (*sqs.ReceiveMessageOutput, error) {
	f.mu.Lock()
	f.receives++
	if len(f.receiveErrs) > 0 {
		err := f.receiveErrs[0]
		f.receiveErrs = f.receiveErrs[1:]
		f.mu.Unlock()
		return nil, err
	}
	n := min(int(in.MaxNumberOfMessages), len(f.visible))
	if in.MaxNumberOfMessages > 10 || in.WaitTimeSeconds > 20 {
		f.mu.Unlock()
		return nil, apiErr("InvalidParameterValue", "MaxNumberOfMessages at most 10, WaitTimeSeconds at most 20")
	}
	out := &sqs.ReceiveMessageOutput{}
	for _, h := range f.visible[:n] {
		out.Messages = append(out.Messages, sqstypes.Message{MessageId: aws.String("id-" + h), ReceiptHandle: aws.String(h), Body: aws.String(f.messages[h])})
	}
	f.visible = f.visible[n:]
	f.mu.Unlock()
	if n == 0 && in.WaitTimeSeconds > 0 { // a long poll of an empty queue
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Millisecond):
		}
	}
	return out, nil
}

func (f *fakeSQS) DeleteMessageBatch(_ context.Context, in *sqs.DeleteMessageBatchInput, _ ...func(*sqs.Options)) (*sqs.DeleteMessageBatchOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(in.Entries) > 10 {
		return nil, apiErr("AWS.SimpleQueueService.TooManyEntriesInBatchRequest", "at most 10 entries")
	}
	var handles []string
	for _, e := range in.Entries {
		h := aws.ToString(e.ReceiptHandle)
		handles = append(handles, h)
		delete(f.messages, h)
	}
	f.deletes = append(f.deletes, handles)
	return &sqs.DeleteMessageBatchOutput{}, nil
}

// left returns the number of messages not deleted.
func (f *fakeSQS) left() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.messages)
}

func (f *fakeSQS) deleteBatches() [][]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([][]string(nil), f.deletes...)
}

const testQueueURL = "https://sqs.us-east-1.amazonaws.com/123456789012/quarry-ecs-events"

func newWatchingProvider(t *testing.T, cfg Config, api API, q SQSAPI) *Watching {
	t.Helper()
	cfg.EventsQueueURL = testQueueURL
	cfg.EventsWait = time.Second
	w, err := NewWatching(cfg, api, Deps{SQS: q})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, w.Close(context.Background())) })
	return w
}

// watch runs Watch until the test ends and returns its events.
func watch(t *testing.T, w *Watching) <-chan providers.TaskEvent {
	events, _ := providertest.StartWatch(t, w, waitLong)
	return events
}

func next(t *testing.T, events <-chan providers.TaskEvent) providers.TaskEvent {
	t.Helper()
	select {
	case e := <-events:
		return e
	case <-time.After(waitLong):
		t.Fatal("no event")
	}
	return providers.TaskEvent{}
}

func exit(n int) *int { return &n }

func TestWatching_Watch_DeliversTheStateChangesOfItsTasks(t *testing.T) {
	f := newFake()
	q := newFakeSQS()
	w := newWatchingProvider(t, testConfig(), f, q)
	tasks, err := w.Launch(testCtx(t), testSpec(), []string{"known"})
	require.NoError(t, err)
	known := tasks[0].ID
	cluster := "arn:aws:ecs:us-east-1:123456789012:cluster/" + testConfig().Cluster
	other := func(e taskEvent) taskEvent { e.arn = known; e.cluster = cluster; e.startedBy = w.startedBy; return e }

	q.send(
		other(taskEvent{last: "PENDING", desired: "RUNNING"}).body(), // not delivered: neither running nor stopped
		other(taskEvent{last: "RUNNING", desired: "RUNNING", ip: "10.0.0.139"}).body(),
		other(taskEvent{last: "RUNNING", desired: "STOPPED", stopCode: "SpotInterruption", stoppedReason: "Your Spot Task was interrupted."}).body(),
		other(taskEvent{last: "STOPPED", desired: "STOPPED", stopCode: "EssentialContainerExited", stoppedReason: "Essential container in task exited", sandboxExit: exit(137)}).body(),
		taskEvent{arn: known, cluster: "arn:aws:ecs:us-east-1:123456789012:cluster/elsewhere", startedBy: w.startedBy, last: "STOPPED", desired: "STOPPED"}.body(), // another cluster
		taskEvent{arn: known, cluster: cluster, startedBy: "ecs-svc/9223370545345641169", last: "STOPPED", desired: "STOPPED"}.body(),                              // another gateway's
		`{"version": "0", "detail-type": "ECS Service Action", "source": "aws.ecs", "detail": {"eventName": "SERVICE_STEADY_STATE"}}`,
		`not json`,
	)
	events := watch(t, w)

	running := next(t, events)
	assert.Equal(t, providers.TaskEvent{ID: known, Name: "known", Pool: "py", State: providers.TaskRunning,
		At: time.Date(2026, 1, 23, 17, 57, 58, 103e6, time.UTC)}, running, "named from what the provider launched")
	spot := next(t, events)
	assert.Equal(t, providers.TaskStopped, spot.State, "a Spot interruption: stopped as soon as ECS wants it stopped")
	assert.True(t, strings.HasPrefix(spot.Reason, ReasonSpotInterruption), spot.Reason)
	assert.Equal(t, "known", spot.Name)
	stopped := next(t, events)
	assert.Equal(t, providers.TaskStopped, stopped.State)
	assert.Equal(t, "the sandbox container exited: Essential container in task exited; sandbox exit code 137; OutOfMemoryError: Container killed due to memory usage", stopped.Reason)
	assert.Equal(t, time.Date(2026, 1, 23, 18, 8, 8, 103e6, time.UTC), stopped.At)

	require.Eventually(t, func() bool { return q.left() == 0 }, waitLong, time.Millisecond, "every message is deleted, delivered or not")
	select {
	case e := <-events:
		t.Fatalf("an event of another cluster, gateway or kind was delivered: %+v", e)
	case <-time.After(50 * time.Millisecond):
	}
	batches := q.deleteBatches()
	require.Len(t, batches, 1, "one DeleteMessageBatch for the received batch")
	assert.Len(t, batches[0], 8)
	for outcome, n := range map[string]float64{eventDelivered: 3, eventIgnored: 3, eventMalformed: 2} {
		assert.Equal(t, n, counterValue(t, w.metrics.events.WithLabelValues(outcome)), outcome)
	}
}

// Tasks the provider never saw (another replica launched them) are named
// with one DescribeTasks of the batch's unknown tasks; a task of another
// gateway (its tags say so) stays unnamed.
func TestWatching_Watch_NamesUnknownTasksWithOneDescribe(t *testing.T) {
	f := newFake()
	q := newFakeSQS()
	other := newTestProvider(t, testConfig(), f) // another replica of the same gateway
	tasks, err := other.Launch(testCtx(t), testSpec(), names("r", 3))
	require.NoError(t, err)
	w := newWatchingProvider(t, testConfig(), f, q)
	describes := f.describeCount()
	for _, task := range tasks {
		q.send(taskEvent{arn: task.ID, cluster: testConfig().Cluster, startedBy: w.startedBy, last: "STOPPED", desired: "STOPPED",
			stopCode: "UserInitiated", stoppedReason: "lease released"}.body())
	}
	events := watch(t, w)
	for i := range tasks {
		e := next(t, events)
		assert.Equal(t, tasks[i].ID, e.ID)
		assert.Equal(t, tasks[i].Name, e.Name)
		assert.Equal(t, "py", e.Pool)
		assert.Equal(t, "stopped through the API: lease released", e.Reason)
	}
	assert.Equal(t, 1, f.describeCount()-describes, "one DescribeTasks names the batch")
}

// A launch learns from an event that its task runs, without waiting for
// the starting tasks' poll.
func TestWatching_Watch_TellsAStartingTaskItRuns(t *testing.T) {
	f := newFake()
	f.neverRun["evented"] = true // DescribeTasks never shows it running
	q := newFakeSQS()
	w := newWatchingProvider(t, testConfig(), f, q)
	events := watch(t, w)
	go func() {
		for {
			if et, ok := f.task("evented"); ok {
				q.send(taskEvent{arn: aws.ToString(et.TaskArn), cluster: testConfig().Cluster, startedBy: w.startedBy,
					last: "RUNNING", desired: "RUNNING", ip: "10.1.2.3"}.body())
				return
			}
			time.Sleep(time.Millisecond)
		}
	}()
	tasks, err := w.Launch(testCtx(t), testSpec(), []string{"evented"})
	require.NoError(t, err)
	require.Len(t, tasks, 1)
	assert.Equal(t, "http://10.1.2.3:8000", tasks[0].AgentURL)
	e := next(t, events)
	assert.Equal(t, "evented", e.Name, "named from the starting tasks")
}

func TestWatching_Watch_RetriesThrottlingAndFailsForGood(t *testing.T) {
	f := newFake()
	q := newFakeSQS()
	q.receiveErrs = []error{apiErr("RequestThrottled", "slow down"), &smithy.GenericAPIError{Code: "InternalError", Message: "oops", Fault: smithy.FaultServer}, apiErr("AWS.SimpleQueueService.NonExistentQueue", "The specified queue does not exist.")}
	w := newWatchingProvider(t, testConfig(), f, q)
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	err := w.Watch(ctx, make(chan providers.TaskEvent))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "NonExistentQueue")
	assert.Contains(t, err.Error(), testQueueURL)
	assert.Equal(t, 3, q.receives, "throttling and a server error are retried")
}

func TestNewWatching_NeedsTheQueueAndItsClient(t *testing.T) {
	_, err := NewWatching(testConfig(), newFake(), Deps{SQS: newFakeSQS()})
	assert.ErrorContains(t, err, "EventsQueueURL")
	cfg := testConfig()
	cfg.EventsQueueURL = testQueueURL
	_, err = NewWatching(cfg, newFake(), Deps{})
	assert.ErrorContains(t, err, "no SQS client")
	_, err = New(cfg, newFake(), Deps{})
	assert.ErrorContains(t, err, "NewWatching", "New reads no events: a queue given to it would be ignored")
	cfg.EventsQueueURL = "quarry-ecs-events"
	_, err = NewWatching(cfg, newFake(), Deps{SQS: newFakeSQS()})
	assert.ErrorContains(t, err, "EventsQueueURL: want the queue's URL")
	var p providers.Provider = &Watching{}
	_, ok := p.(providers.Watcher)
	assert.True(t, ok)
	p = &Provider{}
	_, ok = p.(providers.Watcher)
	assert.False(t, ok, "without a queue the provider is no Watcher")
}
