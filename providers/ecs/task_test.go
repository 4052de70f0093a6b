package ecs

import (
	"cmp"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ecs/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/providers"
)

func TestToTask_MapsECSTask(t *testing.T) {
	created := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	eni := []types.Attachment{{Type: aws.String("ElasticNetworkInterface"), Details: []types.KeyValuePair{
		{Name: aws.String("subnetId"), Value: aws.String("subnet-1")},
		{Name: aws.String("privateIPv4Address"), Value: aws.String("10.1.2.3")},
	}}}
	base := func(last, desired string) types.Task {
		return types.Task{
			TaskArn: aws.String("arn:aws:ecs:us-east-1:1:task/c/abc"), LastStatus: aws.String(last), DesiredStatus: aws.String(desired),
			CreatedAt: aws.Time(created),
			Tags: []types.Tag{
				{Key: aws.String("quarry.managed"), Value: aws.String("true")}, {Key: aws.String("quarry.gateway"), Value: aws.String("gw-test")},
				{Key: aws.String("quarry.pool"), Value: aws.String("py")}, {Key: aws.String("quarry.task"), Value: aws.String("t1")},
			},
		}
	}
	const arn = "arn:aws:ecs:us-east-1:1:task/c/abc"
	with := func(t types.Task, f func(*types.Task)) types.Task { f(&t); return t }
	tests := []struct {
		name       string
		task       types.Task
		wantState  providers.TaskState
		wantURL    string
		wantReason string
		wantNonce  string // what the token derives from ("" = the task ARN)
	}{
		{name: "provisioning", task: base("PROVISIONING", "RUNNING"), wantState: providers.TaskPending},
		{name: "pending with ip", task: with(base("PENDING", "RUNNING"), func(t *types.Task) { t.Attachments = eni }), wantState: providers.TaskPending},
		{name: "running without ip yet", task: base("RUNNING", "RUNNING"), wantState: providers.TaskPending},
		{name: "running with ip", task: with(base("RUNNING", "RUNNING"), func(t *types.Task) { t.Attachments = eni }),
			wantState: providers.TaskRunning, wantURL: "http://10.1.2.3:8000"},
		{name: "running, launched with a nonce override (before tokens bound to ARNs)", task: with(base("RUNNING", "RUNNING"), func(t *types.Task) {
			t.Attachments = eni
			t.Overrides = &types.TaskOverride{ContainerOverrides: []types.ContainerOverride{{
				Name: aws.String("sandbox"), Environment: []types.KeyValuePair{{Name: aws.String("QUARRY_AGENT_TOKEN_NONCE"), Value: aws.String("n1")}},
			}}}
		}), wantState: providers.TaskRunning, wantURL: "http://10.1.2.3:8000", wantNonce: "n1"},
		{name: "spot interruption notice (still running)", task: with(base("RUNNING", "STOPPED"), func(t *types.Task) {
			t.Attachments, t.StopCode, t.StoppedReason = eni, types.TaskStopCodeSpotInterruption, aws.String("Your Spot Task was interrupted.")
		}), wantState: providers.TaskStopped, wantReason: "spot interruption: Your Spot Task was interrupted."},
		{name: "failed to start", task: with(base("STOPPED", "STOPPED"), func(t *types.Task) {
			t.StopCode, t.StoppedReason = types.TaskStopCodeTaskFailedToStart, aws.String("CannotPullContainerError: not found")
		}), wantState: providers.TaskStopped, wantReason: "the task failed to start: CannotPullContainerError: not found"},
		{name: "sandbox exited", task: with(base("STOPPED", "STOPPED"), func(t *types.Task) {
			t.StopCode, t.StoppedReason = types.TaskStopCodeEssentialContainerExited, aws.String("Essential container in task exited")
			t.Containers = []types.Container{{Name: aws.String("quarry-agent-init"), ExitCode: aws.Int32(0)}, {Name: aws.String("sandbox"), ExitCode: aws.Int32(137), Reason: aws.String("OutOfMemoryError: Container killed due to memory usage")}}
		}), wantState: providers.TaskStopped, wantReason: "the sandbox container exited: Essential container in task exited; sandbox exit code 137; OutOfMemoryError: Container killed due to memory usage"},
		{name: "stopped by us", task: with(base("STOPPED", "STOPPED"), func(t *types.Task) {
			t.StopCode, t.StoppedReason = types.TaskStopCodeUserInitiated, aws.String("lease released")
		}), wantState: providers.TaskStopped, wantReason: "stopped through the API: lease released"},
		{name: "stopping without a code", task: base("DEACTIVATING", "STOPPED"), wantState: providers.TaskStopped, wantReason: "stopped"},
		{name: "host terminated", task: with(base("STOPPED", "STOPPED"), func(t *types.Task) { t.StopCode = types.TaskStopCodeTerminationNotice }),
			wantState: providers.TaskStopped, wantReason: "the task's host is being terminated"},
	}
	p := newTestProvider(t, testConfig(), newFake())
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := p.toTask(viewOf(tt.task))
			assert.Equal(t, arn, got.ID)
			assert.Equal(t, "t1", got.Name)
			assert.Equal(t, "py", got.Pool)
			assert.Equal(t, created, got.CreatedAt)
			assert.Equal(t, tt.wantState, got.State)
			assert.Equal(t, tt.wantURL, got.AgentURL)
			assert.Equal(t, tt.wantReason, got.Reason)
			if tt.wantURL != "" {
				nonce := cmp.Or(tt.wantNonce, arn)
				assert.Equal(t, agentapi.DeriveToken(testConfig().TokenKey, nonce), got.AgentToken)
			} else {
				assert.Empty(t, got.AgentToken)
			}
		})
	}
}

func TestViewOf_CreatedFromTagWhenBackendHasNone(t *testing.T) {
	v := viewOf(types.Task{Tags: []types.Tag{{Key: aws.String("quarry.created"), Value: aws.String("1700000000")}}})
	require.False(t, v.created.IsZero())
	assert.Equal(t, int64(1700000000), v.created.Unix())
}

func TestErrorClassifiers(t *testing.T) {
	tests := []struct {
		name                         string
		err                          error
		throttled, notFound, invalid bool
	}{
		{name: "throttling", err: apiErr("ThrottlingException", "Rate exceeded"), throttled: true},
		{name: "rate exceeded as invalid parameter", err: apiErr("InvalidParameterException", "Rate exceeded"), throttled: true},
		{name: "task not found", err: apiErr("InvalidParameterException", "The referenced task was not found."), notFound: true, invalid: true},
		{name: "no task definition", err: apiErr("ClientException", "Unable to describe task definition."), notFound: true, invalid: true},
		{name: "bad size", err: apiErr("ClientException", "No Fargate configuration exists for given values."), invalid: true},
		{name: "access denied", err: apiErr("AccessDeniedException", "not authorized to perform iam:PassRole"), invalid: true},
		{name: "plain error", err: assert.AnError},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.throttled, isThrottled(tt.err), "throttled")
			assert.Equal(t, tt.notFound, isNotFound(tt.err), "not found")
			assert.Equal(t, tt.invalid, isInvalid(tt.err), "invalid")
		})
	}
}
