package ecs

import (
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ecs/types"

	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/providers"
)

// Reasons of stopped tasks that are not ECS's own.
const (
	reasonNotFound = "not found"
	// ReasonSpotInterruption starts the Reason of a task Fargate Spot
	// reclaimed.
	ReasonSpotInterruption = "spot interruption"
)

// ECS task statuses (lastStatus, desiredStatus).
const (
	statusRunning = "RUNNING"
	statusStopped = "STOPPED"
)

// maxReason bounds a stopped task's Reason.
const maxReason = 512

// taskView is what the provider reads from one ECS task.
type taskView struct {
	arn, name, pool string
	labels          map[string]string
	last, desired   string
	stopCode        types.TaskStopCode
	stoppedReason   string
	ip              string
	// nonce is the token nonce in the sandbox container's overrides: only
	// tasks launched before tokens were bound to task ARNs have one.
	nonce         string
	sandboxExit   *int32
	sandboxReason string
	created       time.Time
}

// viewOf extracts the fields the provider uses from an ECS task.
func viewOf(t types.Task) taskView {
	v := taskView{
		arn: aws.ToString(t.TaskArn), last: aws.ToString(t.LastStatus), desired: aws.ToString(t.DesiredStatus),
		stopCode: t.StopCode, stoppedReason: aws.ToString(t.StoppedReason), labels: tagMap(t.Tags),
	}
	v.name, v.pool = v.labels[providers.LabelTask], v.labels[providers.LabelPool]
	for _, a := range t.Attachments {
		if aws.ToString(a.Type) != "ElasticNetworkInterface" && aws.ToString(a.Type) != "eni" {
			continue
		}
		for _, d := range a.Details {
			if aws.ToString(d.Name) == "privateIPv4Address" {
				v.ip = aws.ToString(d.Value)
			}
		}
	}
	if t.Overrides != nil {
		for _, c := range t.Overrides.ContainerOverrides {
			if aws.ToString(c.Name) != SandboxContainer {
				continue
			}
			for _, kv := range c.Environment {
				if aws.ToString(kv.Name) == envTokenNonce {
					v.nonce = aws.ToString(kv.Value)
				}
			}
		}
	}
	for _, c := range t.Containers {
		if aws.ToString(c.Name) == SandboxContainer {
			v.sandboxExit, v.sandboxReason = c.ExitCode, aws.ToString(c.Reason)
		}
	}
	switch {
	case t.CreatedAt != nil:
		v.created = *t.CreatedAt
	case v.labels[tagCreated] != "":
		if s, err := strconv.ParseInt(v.labels[tagCreated], 10, 64); err == nil {
			v.created = time.Unix(s, 0)
		}
	}
	return v
}

// state maps ECS's statuses to the provider's: stopped as soon as ECS
// wants the task stopped (a Spot interruption sets desiredStatus STOPPED two
// minutes before the task ends: the lease is lost from then), running only
// when the task runs and has its private IP, pending otherwise.
func (v taskView) state() providers.TaskState {
	switch {
	case v.last == statusStopped || v.desired == statusStopped:
		return providers.TaskStopped
	case v.last == statusRunning && v.ip != "":
		return providers.TaskRunning
	}
	return providers.TaskPending
}

// reason says why a stopped task stopped, from its stop code, stopped
// reason and the sandbox container's exit.
func (v taskView) reason() string {
	var r string
	switch v.stopCode {
	case types.TaskStopCodeSpotInterruption:
		r = ReasonSpotInterruption
	case types.TaskStopCodeTaskFailedToStart:
		r = "the task failed to start"
	case types.TaskStopCodeEssentialContainerExited:
		r = "the sandbox container exited"
	case types.TaskStopCodeUserInitiated:
		r = "stopped through the API"
	case types.TaskStopCodeServiceSchedulerInitiated:
		r = "stopped by the ECS scheduler"
	case types.TaskStopCodeTerminationNotice:
		r = "the task's host is being terminated"
	case "":
		r = "stopped"
	default:
		r = "stopped (" + string(v.stopCode) + ")"
	}
	var details []string
	if v.stoppedReason != "" {
		details = append(details, v.stoppedReason)
	}
	if v.sandboxExit != nil && v.last == statusStopped {
		details = append(details, fmt.Sprintf("sandbox exit code %d", *v.sandboxExit))
	}
	if v.sandboxReason != "" {
		details = append(details, v.sandboxReason)
	}
	if len(details) > 0 {
		r += ": " + strings.Join(details, "; ")
	}
	if len(r) > maxReason {
		r = r[:maxReason]
	}
	return r
}

// tokenNonce is what the task's agent derives its token from: its task
// ARN (QUARRY_AGENT_TOKEN_NONCE_FROM=ecs-task-arn in the task definition),
// or the nonce override of a task launched before that (a rolling upgrade
// keeps their tokens).
func (v taskView) tokenNonce() string {
	if v.nonce != "" {
		return v.nonce
	}
	return v.arn
}

// toTask returns the provider's view of an ECS task (and remembers its
// name); the agent URL and
// token are set only while it runs. A task without a quarry.task tag (its
// gateway stopped between RunTask and naming it) has Name "": no task
// record matches it, so the warm pool's orphan sweep stops it after its
// grace period.
func (p *Provider) toTask(v taskView) providers.Task {
	p.names.put(v.arn, v.name, v.pool) // for the events, which carry no tags
	t := providers.Task{ID: v.arn, Name: v.name, Pool: v.pool, State: v.state(), Labels: v.labels, CreatedAt: v.created}
	switch t.State {
	case providers.TaskStopped:
		t.Reason = v.reason()
	case providers.TaskRunning:
		t.AgentURL = "http://" + net.JoinHostPort(v.ip, strconv.Itoa(p.cfg.AgentPort))
		t.AgentToken = agentapi.DeriveToken(p.cfg.TokenKey, v.tokenNonce())
	}
	return t
}

// stoppedTask is the answer for an id no task of this gateway has.
func stoppedTask(id, reason string) providers.Task {
	return providers.Task{ID: id, State: providers.TaskStopped, Reason: reason}
}

// sortTasks orders tasks oldest first, then by id.
func sortTasks(ts []providers.Task) {
	sort.Slice(ts, func(i, j int) bool {
		if !ts[i].CreatedAt.Equal(ts[j].CreatedAt) {
			return ts[i].CreatedAt.Before(ts[j].CreatedAt)
		}
		return ts[i].ID < ts[j].ID
	})
}
