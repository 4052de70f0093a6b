package docker

import (
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/go-connections/nat"
	"github.com/stretchr/testify/assert"

	"github.com/quarryhq/quarry/providers"
)

func TestToTask_StateReasonAndAddress(t *testing.T) {
	p := &Provider{cfg: testConfig(), key: tokenKey("0123456789abcdef0123456789abcdef")}
	labels := map[string]string{
		providers.LabelManaged: "true", providers.LabelPool: "p", providers.LabelTask: "tsk-1",
		providers.LabelGateway: "gw", labelNonce: "n1",
	}
	now := time.Now().UTC().Truncate(time.Second)
	// The engine's list has seconds; its inspection nanoseconds.
	summary := func(state, status string, ports ...container.Port) container.Summary {
		return container.Summary{ID: "c1", Labels: labels, State: state, Status: status, Created: now.Unix(), Ports: ports}
	}
	published := container.Port{IP: "127.0.0.1", PrivatePort: 8000, PublicPort: 32770, Type: "tcp"}
	inspect := func(st container.State) container.InspectResponse {
		return container.InspectResponse{
			ContainerJSONBase: &container.ContainerJSONBase{ID: "c1", Created: now.Format(time.RFC3339Nano), State: &st},
			Config:            &container.Config{Labels: labels},
			NetworkSettings: &container.NetworkSettings{NetworkSettingsBase: container.NetworkSettingsBase{
				Ports: nat.PortMap{"8000/tcp": {{HostIP: "127.0.0.1", HostPort: "32771"}}},
			}},
		}
	}
	hostLabels := withLabel(labels, labelAgentPort, "41000")
	tests := []struct {
		name       string
		view       view
		wantState  providers.TaskState
		wantReason string
		wantURL    string
		// wantCreated is the view's engine time unless set.
		wantCreated time.Time
	}{
		{name: "running, published", view: fromSummary(summary("running", "Up 1 second", published)),
			wantState: providers.TaskRunning, wantURL: "http://127.0.0.1:32770"},
		{name: "running, published on another address only",
			view:      fromSummary(summary("running", "Up", container.Port{IP: "0.0.0.0", PrivatePort: 8000, PublicPort: 1, Type: "tcp"})),
			wantState: providers.TaskPending},
		{name: "running, inspected", view: fromInspect(inspect(container.State{Status: "running", Running: true})),
			wantState: providers.TaskRunning, wantURL: "http://127.0.0.1:32771"},
		{name: "running on the host network",
			view:      view{id: "c1", labels: hostLabels, state: "running", created: now},
			wantState: providers.TaskRunning, wantURL: "http://127.0.0.1:41000"},
		{name: "creation time from the label", view: view{id: "c1", state: "running", created: now, port: 1, labels: withLabel(labels, labelCreated, "2026-01-02T03:04:05.000000006Z")},
			wantState: providers.TaskRunning, wantURL: "http://127.0.0.1:1", wantCreated: time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)},
		{name: "created recently", view: fromSummary(summary("created", "Created")), wantState: providers.TaskPending},
		{name: "created long ago", view: view{id: "c1", labels: labels, state: "created", created: now.Add(-time.Hour)},
			wantState: providers.TaskStopped, wantReason: reasonIncomplete},
		{name: "restarting", view: fromSummary(summary("restarting", "Restarting")), wantState: providers.TaskPending},
		{name: "exited, listed", view: fromSummary(summary("exited", "Exited (137) 2 seconds ago", published)),
			wantState: providers.TaskStopped, wantReason: "container exited: Exited (137) 2 seconds ago"},
		{name: "killed", view: fromInspect(inspect(container.State{Status: "exited", ExitCode: 137})),
			wantState: providers.TaskStopped, wantReason: "the container exited with code 137 (SIGKILL, e.g. docker kill)"},
		{name: "out of memory", view: fromInspect(inspect(container.State{Status: "exited", ExitCode: 137, OOMKilled: true})),
			wantState: providers.TaskStopped, wantReason: "the container exited with code 137 (killed for running out of memory)"},
		{name: "runtime error", view: fromInspect(inspect(container.State{Status: "exited", ExitCode: 1, Error: "exec format error"})),
			wantState: providers.TaskStopped, wantReason: "the container exited with code 1: exec format error"},
		{name: "removing", view: fromSummary(summary("removing", "Removal In Progress")),
			wantState: providers.TaskStopped, wantReason: "the container is being removed"},
		{name: "dead", view: fromSummary(summary("dead", "Dead")),
			wantState: providers.TaskStopped, wantReason: "the container is dead (the engine failed to remove it)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := p.toTask(tt.view)
			assert.Equal(t, tt.wantState, got.State)
			assert.Equal(t, tt.wantReason, got.Reason)
			assert.Equal(t, tt.wantURL, got.AgentURL)
			assert.Equal(t, "c1", got.ID)
			assert.Equal(t, "tsk-1", got.Name)
			assert.Equal(t, "p", got.Pool)
			assert.Equal(t, p.key.token("gw", "tsk-1", "n1"), got.AgentToken)
			want := tt.wantCreated
			if want.IsZero() {
				want = tt.view.created
			}
			assert.Equal(t, want, got.CreatedAt)
		})
	}
}

func TestIsContainerID(t *testing.T) {
	assert.True(t, isContainerID("7cd67fa316510e9e2cfa3ad6a8e36f0f7b0db1ab1b61b4bb2bbef0e0e92ae3c1"))
	assert.False(t, isContainerID("7cd67fa31651"), "short ids are not accepted")
	assert.False(t, isContainerID("pt-1234-never-launched"))
	assert.False(t, isContainerID("7CD67FA316510E9E2CFA3AD6A8E36F0F7B0DB1AB1B61B4BB2BBEF0E0E92AE3C1"))
}

// withLabel returns a copy of labels with k set to v.
func withLabel(labels map[string]string, k, v string) map[string]string {
	out := map[string]string{k: v}
	for lk, lv := range labels {
		if lk != k {
			out[lk] = lv
		}
	}
	return out
}
