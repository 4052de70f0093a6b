package ecssim

import (
	"container/heap"
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"
)

// ECS task statuses.
const (
	statusProvisioning   = "PROVISIONING"
	statusPending        = "PENDING"
	statusRunning        = "RUNNING"
	statusDeprovisioning = "DEPROVISIONING"
	statusStopped        = "STOPPED"
)

// Stop codes.
const (
	stopUserInitiated  = "UserInitiated"
	stopFailedToStart  = "TaskFailedToStart"
	stoppedReasonAgent = "the simulated agent could not come up: "
)

// Names of the task's containers when its definition names none.
const sandboxContainer = "sandbox"

// task is one simulated task. Its fields change under Server.mu.
type task struct {
	seq        uint64
	id         string // the ARN's last part
	region     string // "<region>:<account>", for ARNs
	arn        string
	cluster    string // name
	clusterArn string
	def        *taskDef
	startedBy  string
	group      string
	capacity   string // capacity provider name ("" with a launch type)
	launchType string
	platform   string
	overrides  json.RawMessage
	tags       []wireTag

	last, desired   string
	stopCode        string
	stoppedReason   string
	createdAt       time.Time
	pullStartedAt   time.Time
	startedAt       time.Time
	stoppingAt      time.Time
	stoppedAt       time.Time
	version         int64
	startDur        time.Duration // wall clock
	addr            int           // index of its address; -1 once freed
	ip              string
	agentUp         bool // its agent was brought up and not yet taken down
	sandboxExitCode *int32
}

// taskDef is one registered revision of a task definition.
type taskDef struct {
	family     string
	revision   int
	arn        string
	cpu        string
	memory     string
	containers []string
	image      string                     // the sandbox container's (the one a task pulls)
	inactive   bool                       // deregistered
	body       map[string]json.RawMessage // as registered, plus what ECS adds
	tags       []wireTag
}

// Wire shapes of ECS's JSON protocol (the members the simulator reads or
// answers).
type (
	wireTag struct {
		Key   string `json:"key"`
		Value string `json:"value"`
	}
	wireKV struct {
		Name  string `json:"name"`
		Value string `json:"value"`
	}
	wireAttachment struct {
		ID      string   `json:"id"`
		Type    string   `json:"type"`
		Status  string   `json:"status"`
		Details []wireKV `json:"details"`
	}
	wireENI struct {
		AttachmentID       string `json:"attachmentId"`
		PrivateIPv4Address string `json:"privateIpv4Address"`
	}
	wireContainer struct {
		ContainerArn      string    `json:"containerArn"`
		TaskArn           string    `json:"taskArn"`
		Name              string    `json:"name"`
		LastStatus        string    `json:"lastStatus"`
		ExitCode          *int32    `json:"exitCode,omitempty"`
		Reason            string    `json:"reason,omitempty"`
		NetworkInterfaces []wireENI `json:"networkInterfaces,omitempty"`
	}
	wireFailure struct {
		Arn    string `json:"arn,omitempty"`
		Reason string `json:"reason"`
		Detail string `json:"detail,omitempty"`
	}
	// wireTask is a task as DescribeTasks, RunTask and StopTask answer it.
	wireTask struct {
		TaskArn              string           `json:"taskArn"`
		ClusterArn           string           `json:"clusterArn"`
		TaskDefinitionArn    string           `json:"taskDefinitionArn"`
		LastStatus           string           `json:"lastStatus"`
		DesiredStatus        string           `json:"desiredStatus"`
		CreatedAt            float64          `json:"createdAt"`
		PullStartedAt        *float64         `json:"pullStartedAt,omitempty"`
		StartedAt            *float64         `json:"startedAt,omitempty"`
		StoppingAt           *float64         `json:"stoppingAt,omitempty"`
		StoppedAt            *float64         `json:"stoppedAt,omitempty"`
		StartedBy            string           `json:"startedBy,omitempty"`
		Group                string           `json:"group,omitempty"`
		LaunchType           string           `json:"launchType,omitempty"`
		CapacityProviderName string           `json:"capacityProviderName,omitempty"`
		PlatformVersion      string           `json:"platformVersion,omitempty"`
		PlatformFamily       string           `json:"platformFamily"`
		CPU                  string           `json:"cpu,omitempty"`
		Memory               string           `json:"memory,omitempty"`
		AvailabilityZone     string           `json:"availabilityZone"`
		Connectivity         string           `json:"connectivity,omitempty"`
		Attachments          []wireAttachment `json:"attachments"`
		Containers           []wireContainer  `json:"containers"`
		Overrides            json.RawMessage  `json:"overrides"`
		Tags                 []wireTag        `json:"tags,omitempty"`
		StopCode             string           `json:"stopCode,omitempty"`
		StoppedReason        string           `json:"stoppedReason,omitempty"`
		Version              int64            `json:"version"`
	}
)

// noOverrides is the overrides of a task launched without any.
var noOverrides = json.RawMessage(`{"containerOverrides":[],"inferenceAcceleratorOverrides":[]}`)

func epoch(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }

func optEpoch(t time.Time) *float64 {
	if t.IsZero() {
		return nil
	}
	e := epoch(t)
	return &e
}

// wire renders t; its tags only when withTags. Called under Server.mu.
func (t *task) wire(withTags bool) wireTask {
	w := wireTask{
		TaskArn: t.arn, ClusterArn: t.clusterArn, TaskDefinitionArn: t.def.arn,
		LastStatus: t.last, DesiredStatus: t.desired, CreatedAt: epoch(t.createdAt),
		PullStartedAt: optEpoch(t.pullStartedAt), StartedAt: optEpoch(t.startedAt),
		StoppingAt: optEpoch(t.stoppingAt), StoppedAt: optEpoch(t.stoppedAt),
		StartedBy: t.startedBy, Group: t.group, LaunchType: t.launchType, CapacityProviderName: t.capacity,
		PlatformVersion: t.platform, PlatformFamily: "Linux", CPU: t.def.cpu, Memory: t.def.memory,
		AvailabilityZone: "us-east-1a", StopCode: t.stopCode, StoppedReason: t.stoppedReason, Version: t.version,
		Overrides: t.overrides,
	}
	if t.last == statusRunning {
		w.Connectivity = "CONNECTED"
	}
	if withTags && len(t.tags) > 0 {
		w.Tags = append([]wireTag(nil), t.tags...)
	}
	eni := "attachment-" + t.id[:12]
	if t.ip != "" {
		status := "ATTACHED"
		switch t.last {
		case statusProvisioning:
			status = "PRECREATED"
		case statusDeprovisioning:
			status = "DETACHING"
		case statusStopped:
			status = "DELETED"
		}
		w.Attachments = []wireAttachment{{ID: eni, Type: "ElasticNetworkInterface", Status: status, Details: []wireKV{
			{Name: "subnetId", Value: "subnet-0123456789abcdef0"},
			{Name: "networkInterfaceId", Value: "eni-" + t.id[:17]},
			{Name: "macAddress", Value: "02:00:00:00:00:01"},
			{Name: "privateDnsName", Value: "ip-" + t.ip + ".ec2.internal"},
			{Name: "privateIPv4Address", Value: t.ip},
		}}}
	} else {
		w.Attachments = []wireAttachment{}
	}
	w.Containers = make([]wireContainer, 0, len(t.def.containers))
	for _, name := range t.def.containers {
		c := wireContainer{ContainerArn: "arn:aws:ecs:" + t.region + ":container/" + t.cluster + "/" + t.id + "/" + name,
			TaskArn: t.arn, Name: name, LastStatus: t.containerStatus(name)}
		if t.last == statusStopped {
			code := int32(0)
			if name == sandboxContainer && t.sandboxExitCode != nil {
				code = *t.sandboxExitCode
			}
			c.ExitCode = &code
		}
		if t.ip != "" && t.last != statusProvisioning {
			c.NetworkInterfaces = []wireENI{{AttachmentID: eni, PrivateIPv4Address: t.ip}}
		}
		w.Containers = append(w.Containers, c)
	}
	return w
}

// containerStatus is a container's lastStatus: the init container has
// stopped (copied the agent) once the task runs.
func (t *task) containerStatus(name string) string {
	switch {
	case t.last == statusStopped:
		return statusStopped
	case t.last == statusRunning && name != sandboxContainer && len(t.def.containers) > 1:
		return statusStopped
	case t.last == statusRunning:
		return statusRunning
	case t.last == statusDeprovisioning:
		return statusStopped
	}
	return statusPending
}

// tagValue returns t's tag key ("" when it has none).
func (t *task) tagValue(key string) string {
	for _, tg := range t.tags {
		if tg.Key == key {
			return tg.Value
		}
	}
	return ""
}

// Change is one change of a task's status (Config.OnChange): the task as
// DescribeTasks would answer it with its tags, as JSON, and the clock time.
type Change struct {
	TaskArn       string
	LastStatus    string
	DesiredStatus string
	// Task is the task's description (DescribeTasks' shape, tags included).
	Task json.RawMessage
	Time time.Time
}

// event kinds of the lifecycle heap.
type eventKind int

const (
	evPending     eventKind = iota // PROVISIONING → PENDING (ENI attached)
	evRunning                      // PENDING → RUNNING (agent up)
	evDeprovision                  // stopping: → DEPROVISIONING
	evStopped                      // → STOPPED (address freed)
	evForget                       // a stopped task is no longer describable
	evPullFailed                   // PENDING → stopping: the registry does not hold the image
)

type event struct {
	at   time.Time
	seq  uint64 // FIFO among events at the same time
	kind eventKind
	t    *task
}

// eventHeap orders events by time.
type eventHeap []event

func (h eventHeap) Len() int { return len(h) }
func (h eventHeap) Less(i, j int) bool {
	if !h[i].at.Equal(h[j].at) {
		return h[i].at.Before(h[j].at)
	}
	return h[i].seq < h[j].seq
}
func (h eventHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *eventHeap) Push(x any)   { *h = append(*h, x.(event)) }
func (h *eventHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

var _ heap.Interface = (*eventHeap)(nil)

// addrs hands out task addresses: fresh ones first, then the longest free.
type addrs struct {
	base, size int
	next       int   // the next fresh index
	free       []int // freed indexes, oldest first
}

// take returns a free address index, or -1 when none is left.
func (a *addrs) take() int {
	if a.next < a.size {
		a.next++
		return a.next - 1
	}
	if len(a.free) == 0 {
		return -1
	}
	i := a.free[0]
	a.free = a.free[1:]
	return i
}

func (a *addrs) release(i int) { a.free = append(a.free, i) }

// ip returns the address of index i: 127.(base + i/64000).(i%64000/250).(i%250 + 1).
func (a *addrs) ip(i int) string {
	block, rest := i/addrsPerBlock, i%addrsPerBlock
	return net.IPv4(127, byte(a.base+block), byte(rest/250), byte(rest%250+1)).String()
}

// hostPort joins ip and port.
func hostPort(ip string, port int) string { return net.JoinHostPort(ip, strconv.Itoa(port)) }

// clusterName returns the name of a cluster given by name or ARN ("" is
// "default", as in ECS).
func clusterName(c string) string {
	if c == "" {
		return "default"
	}
	if i := strings.LastIndex(c, ":cluster/"); i >= 0 {
		return c[i+len(":cluster/"):]
	}
	return c
}

// taskID returns the task id of an ARN or id.
func taskID(s string) string { return s[strings.LastIndexByte(s, '/')+1:] }

func (t *task) String() string { return fmt.Sprintf("task %s (%s/%s)", t.id, t.last, t.desired) }
