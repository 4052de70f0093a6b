package ecs

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ecs"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/internal/testenv"
	"github.com/quarryhq/quarry/providers"
)

// emulatorQueue creates an SQS queue on the emulator that it deletes when
// t ends, and returns its client and URL.
func emulatorQueue(t *testing.T) (*sqs.Client, string) {
	t.Helper()
	c := sqs.NewFromConfig(emulatorConfig(t))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := c.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(fmt.Sprintf("quarry-ecs-events-%s-%d", runID, clusterSeq.Add(1)))})
	require.NoError(t, err)
	url := aws.ToString(out.QueueUrl)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := c.DeleteQueue(ctx, &sqs.DeleteQueueInput{QueueUrl: aws.String(url)}); err != nil {
			t.Errorf("delete test queue: %v", err)
		}
	})
	return c, url
}

// The events path against the emulator's SQS. moto's ECS emits no events
// (nothing runs there, and it has no EventBridge integration), so the test
// puts into the queue what EventBridge would: messages shaped exactly as
// AWS documents "ECS Task State Change" events, for tasks the emulator's
// ECS really launched and stopped. A second replica, which never saw the
// tasks, reads them: named through DescribeTasks, delivered, deleted.
func TestWatching_Emulator_EventsFromTheQueue(t *testing.T) {
	e := newEmulator(t, testenv.AWS(t))
	q, url := emulatorQueue(t)
	ctx := testCtx(t)
	spec := testSpec()
	spec.Pool = "emu-events-" + runID
	tasks, err := newTestProvider(t, e.config(), e.client).Launch(ctx, spec, []string{"ev-0", "ev-1"})
	require.NoError(t, err)
	require.Len(t, tasks, 2)
	_, err = e.client.StopTask(ctx, &ecs.StopTaskInput{Cluster: aws.String(e.cluster), Task: aws.String(tasks[0].ID), Reason: aws.String("killed by an operator")})
	require.NoError(t, err)
	out, err := e.client.DescribeTasks(ctx, &ecs.DescribeTasksInput{Cluster: aws.String(e.cluster), Tasks: []string{tasks[0].ID}})
	require.NoError(t, err)
	require.Len(t, out.Tasks, 1)
	clusterARN := aws.ToString(out.Tasks[0].ClusterArn)

	cfg := e.config()
	cfg.EventsQueueURL, cfg.EventsWait = url, 0 // short polls: the serialized emulator must not hold a long poll
	w, err := NewWatching(cfg, e.client, Deps{SQS: q})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, w.Close(context.Background())) })

	bodies := []string{
		taskEvent{arn: tasks[1].ID, cluster: clusterARN, startedBy: w.startedBy, last: "RUNNING", desired: "RUNNING", ip: "10.0.0.139"}.body(),
		taskEvent{arn: tasks[0].ID, cluster: clusterARN, startedBy: w.startedBy, last: "STOPPED", desired: "STOPPED",
			stopCode: "UserInitiated", stoppedReason: "killed by an operator"}.body(),
		taskEvent{arn: tasks[0].ID, cluster: clusterARN, startedBy: "someone-else", last: "STOPPED", desired: "STOPPED"}.body(),
	}
	entries := make([]sqstypes.SendMessageBatchRequestEntry, len(bodies))
	for i, b := range bodies {
		entries[i] = sqstypes.SendMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), MessageBody: aws.String(b)}
	}
	sent, err := q.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: aws.String(url), Entries: entries})
	require.NoError(t, err)
	require.Empty(t, sent.Failed)

	events := watch(t, w)
	got := map[string]providers.TaskEvent{}
	for range 2 {
		ev := next(t, events)
		got[ev.Name] = ev
	}
	assert.Equal(t, providers.TaskEvent{ID: tasks[1].ID, Name: "ev-1", Pool: spec.Pool, State: providers.TaskRunning,
		At: time.Date(2026, 1, 23, 17, 57, 58, 103e6, time.UTC)}, got["ev-1"])
	assert.Equal(t, tasks[0].ID, got["ev-0"].ID)
	assert.Equal(t, providers.TaskStopped, got["ev-0"].State)
	assert.Equal(t, "stopped through the API: killed by an operator", got["ev-0"].Reason)

	require.Eventually(t, func() bool {
		a, err := q.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: aws.String(url),
			AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameApproximateNumberOfMessages, sqstypes.QueueAttributeNameApproximateNumberOfMessagesNotVisible}})
		return err == nil && a.Attributes["ApproximateNumberOfMessages"] == "0" && a.Attributes["ApproximateNumberOfMessagesNotVisible"] == "0"
	}, waitLong, 100*time.Millisecond, "the messages are deleted, the other gateway's too")
	select {
	case ev := <-events:
		t.Fatalf("another gateway's task was delivered: %+v", ev)
	case <-time.After(300 * time.Millisecond):
	}
}
