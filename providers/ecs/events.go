package ecs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ecs/types"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/quarryhq/quarry/internal/awserr"
	"github.com/quarryhq/quarry/providers"
)

var (
	_ providers.Provider = (*Watching)(nil)
	_ providers.Closer   = (*Watching)(nil)
	_ providers.Watcher  = (*Watching)(nil)
)

// The event ECS sends EventBridge for a task's state change.
const (
	eventSource     = "aws.ecs"
	eventDetailType = "ECS Task State Change"
)

const (
	// receiveBatch is the most messages one ReceiveMessage returns (SQS's limit).
	receiveBatch = 10
	// receiveMargin is how much longer than its long poll a ReceiveMessage may take.
	receiveMargin = 10 * time.Second
	// deleteTimeout bounds one DeleteMessageBatch; it runs even when Watch's ctx ended.
	deleteTimeout = 10 * time.Second
	// logBodyBytes bounds the part of a bad message a log line quotes.
	logBodyBytes = 200
)

// Watching is a Provider that also learns its tasks' states from ECS's
// task state change events (providers.Watcher): an EventBridge rule sends
// the cluster's "ECS Task State Change" events to an SQS queue
// (Config.EventsQueueURL), which Watch drains. docs/ECS.md, "Events".
type Watching struct {
	*Provider
	sqs SQSAPI
	url string
}

// NewWatching returns a Provider for cfg, as New does, that also reads
// cfg.EventsQueueURL (required) with deps.SQS (required). Like New, it
// makes no AWS call.
func NewWatching(cfg Config, api API, deps Deps) (*Watching, error) {
	if cfg.EventsQueueURL == "" {
		return nil, errors.New("ecs provider config: EventsQueueURL: must be set (the SQS queue of the cluster's task state change events)")
	}
	if deps.SQS == nil {
		return nil, errors.New("ecs provider: no SQS client for the events queue")
	}
	p, err := newProvider(cfg, api, deps)
	if err != nil {
		return nil, err
	}
	return &Watching{Provider: p, sqs: deps.SQS, url: cfg.EventsQueueURL}, nil
}

// Watch delivers the state changes of this gateway's tasks (running or
// stopped; ECS's intermediate states are left out) until ctx ends, then
// returns nil. It long-polls the queue (up to 10 messages, Config.EventsWait
// a call), sends the events of a batch on events (waiting for the
// consumer), then deletes the batch's messages with one
// DeleteMessageBatch; messages of other clusters or gateways and ones that
// are not task state change events are deleted unsent (a bad one is
// logged). A message whose delete fails comes back: events may repeat, and
// arrive out of order. Name and Pool come from what the provider saw of the
// task (its launches, describes, lists), else from one DescribeTasks of the
// batch's unknown tasks; a task it cannot describe comes without them.
// Throttling and unavailability are retried with backoff; any other error
// of the queue (no such queue, access denied) is returned: the events
// fail for good, and the caller falls back to Describe. Safe to call from
// several goroutines (and replicas): each receives a share of the queue.
func (w *Watching) Watch(ctx context.Context, events chan<- providers.TaskEvent) error {
	backoff := w.cfg.RetryBase
	for ctx.Err() == nil {
		msgs, err := w.receive(ctx)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil && !isSQSRetryable(err):
			return fmt.Errorf("read the events queue %s: %w", w.url, err)
		case err != nil:
			w.logger.Warn("read the events queue; retrying", "queue", w.url, "backoff", backoff, "err", err)
			if !sleep(ctx, backoff) {
				return nil
			}
			backoff = min(2*backoff, w.cfg.RetryMax)
			continue
		}
		backoff = w.cfg.RetryBase
		if len(msgs) == 0 {
			if w.cfg.EventsWait < time.Second && !sleep(ctx, w.cfg.PollInterval) { // a short poll found nothing
				return nil
			}
			continue
		}
		for _, ev := range w.events(ctx, msgs) {
			select {
			case events <- ev:
				w.metrics.events.WithLabelValues(eventDelivered).Inc()
			case <-ctx.Done():
				return nil // the batch is not deleted: it comes back
			}
		}
		w.delete(ctx, msgs)
	}
	return nil
}

// receive makes one ReceiveMessage call (its long poll bounded).
func (w *Watching) receive(ctx context.Context) ([]sqstypes.Message, error) {
	wait := int32(w.cfg.EventsWait / time.Second)
	rctx, cancel := context.WithTimeout(ctx, time.Duration(wait)*time.Second+receiveMargin)
	defer cancel()
	out, err := w.sqs.ReceiveMessage(rctx, &sqs.ReceiveMessageInput{
		QueueUrl: aws.String(w.url), MaxNumberOfMessages: receiveBatch, WaitTimeSeconds: wait,
	})
	if err != nil {
		return nil, err
	}
	return out.Messages, nil
}

// delete deletes msgs with one DeleteMessageBatch; failures are logged
// (those messages come back, as repeats).
func (w *Watching) delete(ctx context.Context, msgs []sqstypes.Message) {
	entries := make([]sqstypes.DeleteMessageBatchRequestEntry, len(msgs))
	for i, m := range msgs {
		entries[i] = sqstypes.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: m.ReceiptHandle}
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), deleteTimeout)
	defer cancel()
	out, err := w.sqs.DeleteMessageBatch(dctx, &sqs.DeleteMessageBatchInput{QueueUrl: aws.String(w.url), Entries: entries})
	if err != nil {
		w.logger.Warn("delete events from the queue; they will come again", "queue", w.url, "messages", len(msgs), "err", err)
		return
	}
	if len(out.Failed) > 0 {
		w.logger.Warn("delete events from the queue; some will come again", "queue", w.url, "failed", len(out.Failed),
			"code", aws.ToString(out.Failed[0].Code), "message", aws.ToString(out.Failed[0].Message))
	}
}

// events turns a batch of messages into the events of this gateway's
// tasks, naming them (one DescribeTasks for the tasks the provider does
// not know), and hands running and stopped states to the starting tasks'
// watcher too (a launch learns of its task without waiting for a poll).
func (w *Watching) events(ctx context.Context, msgs []sqstypes.Message) []providers.TaskEvent {
	var out []providers.TaskEvent
	var unnamed []int // indexes into out
	for _, m := range msgs {
		body := aws.ToString(m.Body)
		e, t, ok, err := w.parseEvent(body)
		if err != nil {
			w.metrics.events.WithLabelValues(eventMalformed).Inc()
			w.logger.Warn("events queue: a message that is no ECS task state change event; deleted", "queue", w.url,
				"message_id", aws.ToString(m.MessageId), "err", err, "body", body[:min(len(body), logBodyBytes)])
			continue
		}
		if !ok {
			w.metrics.events.WithLabelValues(eventIgnored).Inc()
			continue
		}
		w.watch.offer(e.ID, t)
		if e.Name == "" {
			unnamed = append(unnamed, len(out))
		}
		out = append(out, e)
	}
	if len(unnamed) == 0 {
		return out
	}
	ids := make([]string, 0, len(unnamed))
	for _, i := range unnamed {
		ids = append(ids, out[i].ID)
	}
	found, _, err := w.launcher.describe(ctx, ids)
	if err != nil {
		w.logger.Debug("events: describe unnamed tasks; delivered without names", "tasks", len(ids), "err", err)
		return out
	}
	for _, i := range unnamed {
		t, ok := found[out[i].ID]
		if !ok {
			continue
		}
		v := viewOf(t)
		if w.ours(v.labels) {
			out[i].Name, out[i].Pool = v.name, v.pool
			w.names.put(v.arn, v.name, v.pool)
		}
	}
	return out
}

// eventEnvelope is the EventBridge event of an SQS message (the fields
// Quarry reads). docs/ECS.md, "Events", has an example.
type eventEnvelope struct {
	Source     string      `json:"source"`
	DetailType string      `json:"detail-type"`
	Time       time.Time   `json:"time"`
	Detail     *taskDetail `json:"detail"`
}

// taskDetail is the part of an "ECS Task State Change" event's detail
// (the task, in DescribeTasks' shape with ISO 8601 times) that Quarry
// reads. It carries no tags unless ECS adds them.
type taskDetail struct {
	TaskArn       string `json:"taskArn"`
	ClusterArn    string `json:"clusterArn"`
	LastStatus    string `json:"lastStatus"`
	DesiredStatus string `json:"desiredStatus"`
	StopCode      string `json:"stopCode"`
	StoppedReason string `json:"stoppedReason"`
	StartedBy     string `json:"startedBy"`
	Containers    []struct {
		Name     string `json:"name"`
		ExitCode *int32 `json:"exitCode"`
		Reason   string `json:"reason"`
	} `json:"containers"`
	Attachments []struct {
		Type    string `json:"type"`
		Details []struct {
			Name  string `json:"name"`
			Value string `json:"value"`
		} `json:"details"`
	} `json:"attachments"`
	Tags []struct {
		Key   string `json:"key"`
		Value string `json:"value"`
	} `json:"tags"`
	CreatedAt *time.Time `json:"createdAt"`
	UpdatedAt *time.Time `json:"updatedAt"`
	StoppedAt *time.Time `json:"stoppedAt"`
}

// parseEvent reads one message into its event and the task it describes
// (in DescribeTasks' shape): ok is false (and err nil) for a task state
// change that is not of this provider's cluster and gateway, or of a state
// that is neither running nor stopped; err says why a message is no task
// state change event. The event's Name and Pool are set when the event's
// tags or the provider know them.
func (w *Watching) parseEvent(body string) (_ providers.TaskEvent, _ types.Task, ok bool, _ error) {
	var env eventEnvelope
	if err := json.Unmarshal([]byte(body), &env); err != nil {
		return providers.TaskEvent{}, types.Task{}, false, fmt.Errorf("not JSON: %w", err)
	}
	switch {
	case env.Source != eventSource || env.DetailType != eventDetailType:
		return providers.TaskEvent{}, types.Task{}, false, fmt.Errorf("source %q detail-type %q, want %q %q", env.Source, env.DetailType, eventSource, eventDetailType)
	case env.Detail == nil || env.Detail.TaskArn == "":
		return providers.TaskEvent{}, types.Task{}, false, errors.New("no detail.taskArn")
	}
	d := env.Detail
	if !w.ourCluster(d.ClusterArn) || d.StartedBy != w.startedBy {
		return providers.TaskEvent{}, types.Task{}, false, nil // another cluster's or gateway's task
	}
	t := d.task()
	v := viewOf(t)
	state := v.state()
	if state != providers.TaskRunning && state != providers.TaskStopped {
		return providers.TaskEvent{}, types.Task{}, false, nil
	}
	e := providers.TaskEvent{ID: d.TaskArn, State: state, At: env.Time}
	for _, at := range []*time.Time{d.UpdatedAt, d.StoppedAt} {
		if at != nil {
			e.At = *at
			break
		}
	}
	if state == providers.TaskStopped {
		e.Reason = v.reason()
	}
	switch {
	case v.name != "":
		e.Name, e.Pool = v.name, v.pool
	default:
		if n, ok := w.names.get(d.TaskArn); ok {
			e.Name, e.Pool = n.name, n.pool
		} else if name, pool, ok := w.watch.lookup(d.TaskArn); ok {
			e.Name, e.Pool = name, pool
		}
	}
	return e, t, true, nil
}

// ourCluster reports whether a cluster ARN is Config.Cluster's (a name or
// an ARN).
func (w *Watching) ourCluster(arn string) bool {
	return arn == w.cfg.Cluster || strings.HasSuffix(arn, ":cluster/"+w.cfg.Cluster)
}

// task returns the event's task in DescribeTasks' shape (the fields the
// provider reads), so that events and describes share their rules.
func (d *taskDetail) task() types.Task {
	t := types.Task{
		TaskArn: aws.String(d.TaskArn), ClusterArn: aws.String(d.ClusterArn),
		LastStatus: aws.String(d.LastStatus), DesiredStatus: aws.String(d.DesiredStatus),
		StopCode: types.TaskStopCode(d.StopCode), StoppedReason: aws.String(d.StoppedReason),
		StartedBy: aws.String(d.StartedBy), CreatedAt: d.CreatedAt, StoppedAt: d.StoppedAt,
	}
	for _, c := range d.Containers {
		t.Containers = append(t.Containers, types.Container{Name: aws.String(c.Name), ExitCode: c.ExitCode, Reason: aws.String(c.Reason)})
	}
	for _, a := range d.Attachments {
		att := types.Attachment{Type: aws.String(a.Type)}
		for _, kv := range a.Details {
			att.Details = append(att.Details, types.KeyValuePair{Name: aws.String(kv.Name), Value: aws.String(kv.Value)})
		}
		t.Attachments = append(t.Attachments, att)
	}
	for _, tag := range d.Tags {
		t.Tags = append(t.Tags, types.Tag{Key: aws.String(tag.Key), Value: aws.String(tag.Value)})
	}
	return t
}

// isSQSRetryable: throttling or a transient failure of SQS.
func isSQSRetryable(err error) bool {
	if awserr.IsUnavailable(err) {
		return true
	}
	code, _ := apiError(err)
	switch code {
	case "OverLimit", "RequestThrottled", "KmsThrottled", "AWS.SimpleQueueService.RequestThrottled":
		return true
	}
	return false
}

// sleep waits d or until ctx ends; false when ctx ended.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
