package docker

import (
	"fmt"
	"maps"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/go-connections/nat"

	"github.com/quarryhq/quarry/providers"
)

// Reasons reported for stopped tasks.
const (
	reasonNotFound   = "not found"
	reasonIncomplete = "launch did not complete: the container was created but never started"
)

// view is what the provider needs of a container, from a list entry or an
// inspection: both map to it, and tasks are made from it in one place.
type view struct {
	id      string
	labels  map[string]string
	state   container.ContainerState
	status  string // the engine's words, e.g. "Exited (137) 2 seconds ago"
	created time.Time
	// port is the agent's port published on 127.0.0.1 (0: none).
	port int
	// detailed is true for an inspection: exitCode, oomKilled and errMsg
	// are known, and the limits the container had (0: none).
	detailed  bool
	exitCode  int
	oomKilled bool
	errMsg    string
	memoryMiB int64
	pidsLimit int64
}

// fromSummary maps a container list entry.
func fromSummary(s container.Summary) view {
	v := view{id: s.ID, labels: s.Labels, state: s.State, status: s.Status, created: time.Unix(s.Created, 0).UTC()}
	for _, pt := range s.Ports {
		if int(pt.PrivatePort) == agentPort && pt.Type == agentProto && pt.IP == "127.0.0.1" && pt.PublicPort != 0 {
			v.port = int(pt.PublicPort)
		}
	}
	return v
}

// fromInspect maps a container inspection.
func fromInspect(info container.InspectResponse) view {
	v := view{detailed: true}
	if info.ContainerJSONBase != nil {
		v.id = info.ID
		v.created, _ = time.Parse(time.RFC3339Nano, info.Created)
		if st := info.State; st != nil {
			v.state, v.exitCode, v.oomKilled, v.errMsg = st.Status, st.ExitCode, st.OOMKilled, st.Error
		}
	}
	if info.ContainerJSONBase != nil && info.HostConfig != nil {
		v.memoryMiB = info.HostConfig.Memory >> 20
		if pl := info.HostConfig.PidsLimit; pl != nil && *pl > 0 {
			v.pidsLimit = *pl
		}
	}
	if info.Config != nil {
		v.labels = info.Config.Labels
	}
	if info.NetworkSettings != nil {
		port := nat.Port(fmt.Sprintf("%d/%s", agentPort, agentProto))
		for _, b := range info.NetworkSettings.Ports[port] {
			if n, err := strconv.Atoi(b.HostPort); err == nil && b.HostIP == "127.0.0.1" {
				v.port = n
			}
		}
	}
	return v
}

// createdAt is when the provider created the container (its label), else
// the engine's time.
func (v view) createdAt() time.Time {
	if t, err := time.Parse(time.RFC3339Nano, v.labels[labelCreated]); err == nil {
		return t
	}
	return v.created
}

// toTask makes the task of a container. AgentURL is set only for a running
// container: a stopped one's port may already serve another.
func (p *Provider) toTask(v view) providers.Task {
	name := v.labels[providers.LabelTask]
	t := providers.Task{
		ID:         v.id,
		Name:       name,
		Pool:       v.labels[providers.LabelPool],
		AgentToken: p.key.token(v.labels[providers.LabelGateway], name, v.labels[labelNonce]),
		Labels:     maps.Clone(v.labels),
		CreatedAt:  v.createdAt(),
	}
	if t.Labels == nil {
		t.Labels = map[string]string{}
	}
	switch v.state {
	case container.StateRunning, container.StatePaused:
		t.State = providers.TaskRunning
	case container.StateRestarting:
		t.State = providers.TaskPending
	case container.StateCreated:
		// Being launched, unless the launch gave up long ago.
		t.State = providers.TaskPending
		if time.Since(v.createdAt()) > p.cfg.StartTimeout+cleanupTimeout {
			t.State, t.Reason = providers.TaskStopped, reasonIncomplete
		}
	default: // exited, dead, removing
		t.State, t.Reason = providers.TaskStopped, stoppedReason(v)
	}
	if t.State == providers.TaskRunning {
		port := v.port
		if hp := v.labels[labelAgentPort]; hp != "" {
			port, _ = strconv.Atoi(hp) // host network: the port the agent was told
		}
		if port > 0 {
			t.AgentURL = "http://127.0.0.1:" + strconv.Itoa(port)
		} else {
			t.State = providers.TaskPending // no address yet
		}
	}
	return t
}

// stoppedReason says why a container is not running, as precisely as the
// view allows.
func stoppedReason(v view) string {
	switch v.state {
	case container.StateRemoving:
		return "the container is being removed"
	case container.StateDead:
		return "the container is dead (the engine failed to remove it)"
	}
	if !v.detailed {
		return strings.TrimSpace("container " + strings.ToLower(string(v.state)) + ": " + v.status)
	}
	r := fmt.Sprintf("the container exited with code %d", v.exitCode)
	switch {
	case v.exitCode == 0:
		r += " (the agent was stopped: docker stop, or the engine shut down)"
	case v.oomKilled && v.memoryMiB > 0:
		r += fmt.Sprintf(" (killed for running out of memory: the kernel's OOM killer, at the container's limit of %d MiB, memory and work directory together)", v.memoryMiB)
	case v.oomKilled:
		r += " (killed for running out of memory)"
	case v.exitCode == 137:
		r += " (SIGKILL, e.g. docker kill)"
	case v.exitCode == 143:
		r += " (SIGTERM)"
	case v.exitCode == 2 && v.pidsLimit > 0:
		// Go's exit code for a runtime failure or a panic: at a pids limit
		// the runtime dies when it cannot create a thread.
		r += fmt.Sprintf(" (the agent died of a Go runtime error or panic, the container's pids limit being %d: see its log)", v.pidsLimit)
	case v.exitCode == 2:
		r += " (the agent died of a Go runtime error or panic: see its log)"
	}
	if v.errMsg != "" {
		r += ": " + v.errMsg
	}
	return r
}

// stoppedTask is the task of an id the engine does not know (for this
// gateway).
func stoppedTask(id, reason string) providers.Task {
	return providers.Task{ID: id, Name: id, State: providers.TaskStopped, Reason: reason}
}

// sortTasks orders tasks oldest first, then by name.
func sortTasks(tasks []providers.Task) {
	sort.SliceStable(tasks, func(i, j int) bool {
		if !tasks[i].CreatedAt.Equal(tasks[j].CreatedAt) {
			return tasks[i].CreatedAt.Before(tasks[j].CreatedAt)
		}
		return tasks[i].Name < tasks[j].Name
	})
}
