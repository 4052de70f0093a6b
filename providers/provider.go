package providers

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"
	"unicode/utf8"
)

// Label keys that every provider attaches to the resources it creates, so that
// a reconciler can find them again (and remove the ones nothing accounts for).
const (
	LabelManaged = "quarry.managed" // always "true"
	LabelPool    = "quarry.pool"    // pool name
	LabelTask    = "quarry.task"    // task id
	LabelGateway = "quarry.gateway" // deployment id of the gateway fleet that launched it
	LabelClass   = "quarry.class"   // pool class of an on-demand pool (Spec.Class), when set
)

// Sentinel errors. Providers translate backend errors to these at the edge.
var (
	// ErrNotFound: the task does not exist (or no longer exists) in the backend.
	ErrNotFound = errors.New("task not found")
	// ErrNoCapacity: the backend cannot launch more tasks right now (limits, quota).
	ErrNoCapacity = errors.New("provider has no capacity")
	// ErrThrottled: the backend asked us to slow down; the call may be retried later.
	ErrThrottled = errors.New("provider throttled the request")
	// ErrInvalidSpec: the pool spec cannot be served by this provider (bad image, bad size).
	ErrInvalidSpec = errors.New("invalid pool spec")
)

// TaskState is the provider-level lifecycle of one sandbox task.
type TaskState string

const (
	// TaskPending: accepted by the backend, not yet running (image pull, placement).
	TaskPending TaskState = "pending"
	// TaskRunning: the task's process/container runs. Its agent may not answer yet:
	// readiness is decided by the warm pool with an agent health check.
	TaskRunning TaskState = "running"
	// TaskStopped: the task has ended, for any reason (see Task.Reason).
	TaskStopped TaskState = "stopped"
)

// Spec is what a provider needs to launch tasks for one pool. It is derived
// from the pool configuration and is the same for every task of the pool.
type Spec struct {
	// Pool is the pool name; providers attach it as LabelPool.
	Pool string
	// Image names the sandbox image. Its meaning is provider specific: a Docker
	// or ECR image for docker/ecs; the process provider accepts "" or "host".
	Image string
	// CPU in vCPUs (0.25 .. 16) and memory in MiB; providers enforce them where
	// the backend can (cgroups for docker, task size for ECS).
	CPU      float64
	MemoryMB int
	// DiskMB bounds the sandbox's work directory, in MiB; 0 leaves its size
	// to the provider. A provider that cannot enforce a size refuses a spec
	// that sets one (InvalidSpec naming disk), never ignores it.
	DiskMB int
	// Env is set in the environment of the agent (and so of every command)
	// for every task of the pool. Per-lease variables are applied later
	// through the agent's /v1/init, never here.
	Env map[string]string
	// Labels are extra labels/tags attached to every task of the pool.
	Labels map[string]string
	// Options holds provider-specific settings from the pool file
	// (e.g. "network": "host" for docker, "capacity_provider" for ecs).
	Options map[string]string
	// Class is the pool class of an on-demand pool (a pool made for an
	// image a request named), "" for a configured pool. Providers attach it
	// as LabelClass and may treat the images of on-demand pools as a cache
	// (ImageCache), never those of configured pools.
	Class string
}

// Task is one sandbox as the provider sees it.
type Task struct {
	ID     string    // provider-unique id (container id, ECS task ARN, "proc-…")
	Name   string    // the caller's name for the task (LabelTask), chosen before launch
	Pool   string    // LabelPool of the task
	State  TaskState // provider-level state
	Reason string    // why the task stopped, when State == TaskStopped
	// AgentURL is the base URL of the task's exec agent, e.g. "http://127.0.0.1:41234".
	// Empty until the backend has assigned an address (ECS: after RUNNING).
	AgentURL string
	// AgentToken is the bearer token the agent accepts. Providers generate it per
	// task; it is a secret and must not be logged.
	AgentToken string
	Labels     map[string]string
	CreatedAt  time.Time
}

// LaunchError reports a launch that failed for a reason the caller can show
// to a person (a missing image, an image without a shell). It wraps the
// sentinel that classifies it.
type LaunchError struct {
	Pool   string
	Image  string
	Reason string
	Err    error // ErrInvalidSpec, ErrNoCapacity, ErrThrottled or a backend error
}

func (e *LaunchError) Error() string {
	return fmt.Sprintf("launch pool %q image %q: %s", e.Pool, e.Image, e.Reason)
}

func (e *LaunchError) Unwrap() error { return e.Err }

// InvalidSpec returns the *LaunchError (wrapping ErrInvalidSpec) of a spec
// a provider cannot serve; reason names the offending field.
func InvalidSpec(spec Spec, reason string) error {
	return &LaunchError{Pool: spec.Pool, Image: spec.Image, Reason: reason, Err: ErrInvalidSpec}
}

// AgentEnvPrefix starts the names of the agent's own variables, which a
// pool's env may not set.
const AgentEnvPrefix = "QUARRY_AGENT_"

// CheckEnv checks a spec's env: names must be non-empty without '=' or
// NUL, must not start with AgentEnvPrefix, and values must not hold NUL.
// It returns the first bad name (in sorted order) and what is wrong with
// it, or "", "" when all are fine.
func CheckEnv(env map[string]string) (name, problem string) {
	for _, k := range slices.Sorted(maps.Keys(env)) {
		switch {
		case k == "" || strings.ContainsAny(k, "=\x00"):
			return k, "not a valid variable name"
		case strings.HasPrefix(k, AgentEnvPrefix):
			return k, fmt.Sprintf("variables %s* are reserved for the agent", AgentEnvPrefix)
		case strings.ContainsRune(env[k], 0):
			return k, "value contains a NUL byte"
		}
	}
	return "", ""
}

// CheckNames checks the task names of a Launch: each must pass valid (the
// provider's own rules) and none may repeat. The error is InvalidSpec
// naming the first bad name and its index.
func CheckNames(spec Spec, names []string, valid func(string) error) error {
	seen := make(map[string]bool, len(names))
	for i, name := range names {
		if err := valid(name); err != nil {
			return InvalidSpec(spec, fmt.Sprintf("names[%d] %q: %s", i, name, err))
		}
		if seen[name] {
			return InvalidSpec(spec, fmt.Sprintf("names[%d] %q: repeated", i, name))
		}
		seen[name] = true
	}
	return nil
}

// Bounds of AgentLogTail.
const (
	logTailLines = 6
	logTailBytes = 1 << 10
)

// AgentLogTail returns how an agent's log (its last part, as a provider
// can read it) ends, for the Reason of a task that stopped: "; its log
// ends: " and its last lines (at most 6 and 1 KiB, oldest first) joined by
// " | ", or "" for an empty log. A Go crash's stack dump is left out (from
// the "runtime stack:" or "goroutine N [...]" line after a "fatal error:"
// or "panic:" line on), so what the runtime said before it shows: e.g.
// "runtime: failed to create new OS thread (have 7 already; errno=11) |
// ... | fatal error: newosproc".
func AgentLogTail(log string) string {
	lines := strings.Split(log, "\n")
	for i, l := range lines {
		if !strings.HasPrefix(l, "fatal error: ") && !strings.HasPrefix(l, "panic: ") {
			continue
		}
		for j := i + 1; j < len(lines); j++ {
			if lines[j] == "runtime stack:" || strings.HasPrefix(lines[j], "goroutine ") {
				lines = lines[:j]
				break
			}
		}
		break
	}
	var kept []string
	for _, l := range lines {
		if l = strings.TrimSpace(l); l != "" {
			kept = append(kept, l)
		}
	}
	kept = kept[max(0, len(kept)-logTailLines):]
	tail := strings.Join(kept, " | ")
	if len(tail) > logTailBytes {
		cut := len(tail) - logTailBytes
		for cut < len(tail) && !utf8.RuneStart(tail[cut]) {
			cut++
		}
		tail = "…" + tail[cut:]
	}
	if tail == "" {
		return ""
	}
	return "; its log ends: " + tail
}

// Provider is the contract every sandbox backend implements. Implementations
// must be safe for concurrent use. A provider keeps no state that matters in
// memory: after a restart of the gateway, List and Describe find the tasks
// launched before it.
type Provider interface {
	// Launch starts one task per name for spec and returns those it started,
	// in the pending or running state, each with Name set to its name (and the
	// name attached as LabelTask). It may return fewer tasks than names
	// together with an error (a partial launch); the returned tasks are real
	// and must be accounted for by the caller.
	Launch(ctx context.Context, spec Spec, names []string) ([]Task, error)
	// Describe returns the current state of the given tasks. Unknown ids are
	// returned as tasks in the stopped state with Reason "not found", never as
	// an error, so a batch is never failed by one missing task.
	Describe(ctx context.Context, ids []string) ([]Task, error)
	// Stop stops a task and releases its resources. It is idempotent: stopping
	// a stopped or unknown task returns nil.
	Stop(ctx context.Context, id string, reason string) error
	// List returns the tasks this provider launched for the pool ("" for every
	// pool), including stopped tasks the backend still reports. It is what a
	// reconciler uses to find tasks that no lease or pool accounts for.
	List(ctx context.Context, pool string) ([]Task, error)
}

// SandboxRelay is implemented by providers whose sandboxes may not share
// the gateway's network (a Docker bridge: a container's 127.0.0.1 is its
// own). SandboxRelayURL returns the base URL at which the sandboxes of spec
// reach the gateway's model relay from inside, usually their agent's relay
// forwarder on 127.0.0.1, or "" when they reach the gateway's own address.
// The gateway names it in each lease's OPENAI_BASE_URL.
type SandboxRelay interface {
	SandboxRelayURL(spec Spec) string
}

// Pauser is implemented by providers that can really pause a task: freeze
// every process of it, keeping its memory and its files, so that it uses
// no CPU until Resume (Docker: the cgroup freezer, `docker pause`). Both
// take the provider's task id and are idempotent: pausing a paused task or
// resuming a running one returns nil. A paused task still counts as
// running (Describe), and Stop ends it paused or not.
type Pauser interface {
	Pause(ctx context.Context, id string) error
	Resume(ctx context.Context, id string) error
}

// StartSlots is implemented by providers that take a launched task some
// time to start and bound how many start at once (ECS: Fargate's 30–90 s
// starts, QUARRY_ECS_MAX_STARTING). The warm pool keeps enough Launch
// calls in flight to fill them, so its own concurrency never holds launches
// below the provider's rate.
type StartSlots interface {
	StartSlots() int
}

// RelaySocketName is the name of the gateway's model relay socket in the
// directory a provider mounts into its sandboxes (docker.Config.RelayDir).
const RelaySocketName = "relay.sock"

// Closer is implemented by providers that hold resources (clients,
// background goroutines) to release when the gateway shuts down. Closing a
// provider never stops its tasks: leases outlive a gateway process.
type Closer interface {
	Close(ctx context.Context) error
}

// Watcher is implemented by providers that learn of task state changes from the backend's
// events (ECS task-state-change events through EventBridge and SQS, Docker's event stream).
type Watcher interface {
	// Watch delivers events until ctx ends; it returns when ctx ends or the event source
	// fails for good (the caller falls back to Describe). Events may repeat and arrive out
	// of order; a consumer treats them as hints and checks the store's record.
	Watch(ctx context.Context, events chan<- TaskEvent) error
}

// TaskEvent is one task state change a Watcher delivers: a hint that the
// consumer checks against the store's record, never a decision on its own.
type TaskEvent struct {
	ID     string // provider task id (Task.ID)
	Name   string // Quarry's task name (LabelTask), when the event carries it
	Pool   string
	State  TaskState // TaskRunning or TaskStopped
	Reason string    // why it stopped
	At     time.Time
}

// ImageState is where an image stands on a provider (ImageInfo.State).
type ImageState string

const (
	// ImagePulling: the provider is making the image launchable (a pull,
	// a task definition's registration).
	ImagePulling ImageState = "pulling"
	// ImageReady: tasks of the image can launch without waiting for it.
	ImageReady ImageState = "ready"
	// ImageFailed: the last preparation failed (ImageInfo.Reason says why).
	ImageFailed ImageState = "failed"
)

// ImageInfo is one image as a provider reports it.
type ImageInfo struct {
	// Image is the reference as it was asked for (Spec.Image).
	Image string
	// Digest is the image's content digest ("sha256:…": the registry's
	// manifest digest where known, else the engine's image id), "" when
	// the provider cannot tell (ECS resolves tags when a task starts).
	Digest string
	State  ImageState
	// Reason says why the image failed (State ImageFailed).
	Reason string
	// BytesDone and BytesTotal are a pull's progress while State is
	// ImagePulling (0 when the provider cannot tell).
	BytesDone, BytesTotal int64
	// SizeBytes is the image's size where it is stored (0: unknown).
	SizeBytes int64
	// Ref is the provider's own handle on what it made for the image (ECS:
	// the task definition's ARN), "" when it made nothing.
	Ref string
	// LastUsed is when a task of the image last launched (zero: never).
	LastUsed time.Time
	// InUse says a task of the image exists now; Pinned that a configured
	// pool uses it: the provider never removes either from its cache.
	InUse, Pinned bool
}

// ImageErrorKind says why an image cannot be prepared (ImageError.Kind).
type ImageErrorKind string

const (
	// ImageNotFound: the registry has no such repository, tag or digest.
	ImageNotFound ImageErrorKind = "not_found"
	// ImageDenied: the registry refused the provider's credentials (or
	// asked for some it has none of): 401 or 403.
	ImageDenied ImageErrorKind = "denied"
	// ImageUnreachable: the registry did not answer (down, refused the
	// connection, timed out); a later try may succeed.
	ImageUnreachable ImageErrorKind = "unreachable"
	// ImageInvalid: the image exists but cannot be a sandbox (another
	// platform, no shell) or its reference is malformed.
	ImageInvalid ImageErrorKind = "invalid"
)

// ImageError is a preparation that failed because of the image or its
// registry, with what the registry answered. It wraps ErrInvalidSpec
// (not_found, denied, invalid) or ErrThrottled (unreachable).
type ImageError struct {
	Image    string
	Kind     ImageErrorKind
	Registry string // the registry's host ("docker.io", "127.0.0.1:5000")
	Answer   string // what the registry (or the engine) said, for people
}

func (e *ImageError) Error() string {
	what := map[ImageErrorKind]string{
		ImageNotFound:    "does not exist in its registry",
		ImageDenied:      "was refused by its registry (credentials)",
		ImageUnreachable: "could not be fetched: its registry did not answer",
		ImageInvalid:     "cannot run as a sandbox",
	}[e.Kind]
	if what == "" {
		what = "cannot be prepared"
	}
	msg := fmt.Sprintf("image %q %s", e.Image, what)
	if e.Registry != "" {
		msg += " (registry " + e.Registry + ")"
	}
	if e.Answer != "" {
		msg += ": " + e.Answer
	}
	return msg
}

// Unwrap classifies the error: ErrThrottled (retry later) for an
// unreachable registry, ErrInvalidSpec for the rest.
func (e *ImageError) Unwrap() error {
	if e.Kind == ImageUnreachable {
		return ErrThrottled
	}
	return ErrInvalidSpec
}

// ImagePreparer is implemented by providers that make an image launchable
// before its tasks launch (Docker pulls it, ECS registers its task
// definition). The warm pool calls PrepareImage before every Launch of a
// pool with an image, so it must be cheap when the image is ready (one
// lookup). Concurrent calls for one image share one preparation. A
// failure that is the image's or its registry's is an *ImageError; ctx
// bounds the wait of this caller, not a shared preparation that others
// still wait for.
type ImagePreparer interface {
	PrepareImage(ctx context.Context, spec Spec) (ImageInfo, error)
}

// ImageCache is implemented by providers that keep images (or what they
// made for them) between tasks.
type ImageCache interface {
	// Images reports the images the provider prepared, is preparing or
	// failed to prepare, for on-demand pools and configured ones, with a
	// preparation's progress. Its work grows with those images, not with
	// tasks.
	Images(ctx context.Context) ([]ImageInfo, error)
	// ForgetImage releases what the provider made for spec's image (ref
	// as its ImageInfo.Ref said): ECS deregisters the task definition;
	// Docker may remove the image once no container uses it. It is
	// idempotent, and never touches an image a configured pool uses.
	ForgetImage(ctx context.Context, spec Spec, ref string) error
}

// BuildRequest is a build of an image from a context (ImageBuilder).
type BuildRequest struct {
	// Context is a tar stream of the build context; it is read once.
	Context io.Reader
	// Dockerfile is its path inside the context ("" = "Dockerfile").
	Dockerfile string
	// Tag names the image built; the caller has checked it.
	Tag string
	// Labels are attached to the image.
	Labels map[string]string
}

// ImageBuilder is implemented by providers that build images themselves
// (Docker, with its engine). BuildImage writes the build's log to log as
// it comes and returns the image built; a build that fails is a
// *BuildError carrying the step's message.
type ImageBuilder interface {
	BuildImage(ctx context.Context, req BuildRequest, log io.Writer) (ImageInfo, error)
}

// BuildError is a build that ran and failed (a step's command, a bad
// Dockerfile): the caller's to fix. It wraps ErrInvalidSpec.
type BuildError struct {
	Tag     string
	Message string
}

func (e *BuildError) Error() string { return fmt.Sprintf("build %s: %s", e.Tag, e.Message) }
func (e *BuildError) Unwrap() error { return ErrInvalidSpec }

// OptionLayer is the Spec option that starts a task on a layer
// (Layers.PrepareLayer): its value is the layer's key. The warm pool sets
// it for a task it starts from a checkpoint; a pool's options may not
// (every option under "quarry." is reserved).
const OptionLayer = "quarry.layer"

// ErrNoLayer: the provider cannot start tasks of this spec on a layer of
// this archive (Layers.PrepareLayer); the caller copies the archive into
// a sandbox instead. It says why.
var ErrNoLayer = errors.New("no copy-on-write layer for this spec")

// LayerRequest asks for a layer: an archive the agent wrote (a checkpoint:
// a tar, gzip-compressed or not, whose entries are absolute paths without
// the leading "/", docs/ARCHITECTURE.md "Checkpoints: the agent's side"),
// unpacked once so that tasks of Spec start with it in place.
type LayerRequest struct {
	Spec Spec
	// Key names the layer: the archive's SHA-256 (64 hex characters).
	Key string
	// Roots are the absolute paths the archive holds.
	Roots []string
	// Open returns the archive. It is called only when the layer is not
	// made yet, at most once; its reader fails before its end when the
	// bytes are not the archive's (the checkpoint store's Open).
	Open func(ctx context.Context) (io.ReadCloser, error)
}

// Layers is implemented by providers that can start a task whose work
// directory is a copy-on-write view of an archive unpacked once (docs/
// ARCHITECTURE.md, "Copy-on-write forks on Docker"): the tasks share the
// unpacked files and each writes only its own changes.
type Layers interface {
	// PrepareLayer makes layer req.Key for tasks of req.Spec, once:
	// concurrent and later calls for one key share it. Tasks launched with
	// Options[OptionLayer] = req.Key then start with the archive's roots
	// in place. An error wrapping ErrNoLayer says that this spec or this
	// archive cannot have one (the caller copies instead).
	PrepareLayer(ctx context.Context, req LayerRequest) error
	// DropLayer removes layer key once no task uses it (now, or when the
	// last that does stops). Idempotent.
	DropLayer(ctx context.Context, key string) error
}
