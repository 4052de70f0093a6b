package docker

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/mount"
	"github.com/docker/go-connections/nat"

	"github.com/quarryhq/quarry/providers"
)

// Where the provider puts the agent in every container, where the agent
// reads its token (its stdin, written once by the provider at start), and
// the agent's port.
const (
	agentDir   = "/.quarry"
	agentPath  = agentDir + "/execagent"
	tokenPath  = "/dev/stdin"
	agentPort  = 8000
	agentProto = "tcp"
)

// Labels of the provider's own, besides the providers.Label* ones.
const (
	// labelNonce is the random input of the container's token derivation.
	labelNonce = "quarry.docker.nonce"
	// labelCreated is when the provider created the container (RFC 3339,
	// nanoseconds): the engine's list gives whole seconds only, which would
	// make a container look up to a second older than it is.
	labelCreated = "quarry.docker.created"
	// labelAgentPort is the agent's port on 127.0.0.1 in host-network mode
	// (on a bridge the published port is read from the engine).
	labelAgentPort = "quarry.docker.agent-port"
	// reservedLabelPrefix is the prefix of the labels a spec may not set.
	reservedLabelPrefix = "quarry."
)

// Pool options (providers.Spec.Options) the provider understands.
const (
	OptionUser      = "user"       // numeric uid or uid:gid; overrides Config.User
	OptionWorkdir   = "workdir"    // absolute path; overrides Config.Workdir
	OptionNetwork   = "network"    // "bridge", "host" or a network name; overrides Config.Network
	OptionPidsLimit = "pids_limit" // overrides Config.PidsLimit
	// OptionWorkdirSize is the size in MiB of the work directory's tmpfs;
	// overrides Config.WorkdirSizeMB. A pool's disk (Spec.DiskMB) is the
	// same size spelled the portable way; a pool may set one of the two.
	OptionWorkdirSize = "workdir_size_mb"
)

// Bounds of one container's log (the agent logs a few lines per start).
const (
	logMaxSize  = "1m"
	logMaxFiles = "1"
)

// maxNameLen bounds a task (container) name.
const maxNameLen = 128

// namePattern is what Docker accepts as a container name.
var namePattern = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]+$`)

// keptCapabilities is the small set of capabilities a container keeps; every
// other one is dropped. An unprivileged user (the default) holds none of them
// (no-new-privileges also stops setuid binaries from gaining them); they let a
// root user (pool option user "0") install packages and change file owners.
// Docker's defaults that are not kept: AUDIT_WRITE, MKNOD, NET_RAW, SETFCAP,
// SETPCAP, SYS_CHROOT.
func keptCapabilities() []string {
	return []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL", "CAP_NET_BIND_SERVICE", "CAP_SETGID", "CAP_SETUID"}
}

// settings are the effective settings of one spec: the Config's, overridden
// by the pool's options.
type settings struct {
	uid, gid      int
	workdir       string
	workdirSizeMB int64 // the pool's disk or workdir_size_mb, else Config's; 0: as large as memory
	network       string
	pidsLimit     int64
	layer         string // the key of the layer tasks start on (providers.OptionLayer), or ""
	cow           string // OptionCow: cowAuto, cowAlways, cowNever
}

// hostNetwork reports whether containers share the host's network.
func (s settings) hostNetwork() bool { return s.network == NetworkHost }

// relayDir is where a container finds the gateway's relay socket
// (Config.RelayDir, mounted read-only).
const relayDir = "/run/quarry-relay"

// relaySocket reports whether containers of set get the relay socket: the
// gateway has one, and they do not share the host's network (where the
// gateway's own address works).
func relaySocket(cfg Config, set settings) bool { return cfg.RelayDir != "" && !set.hostNetwork() }

// resolve returns the settings of spec, or a *providers.LaunchError wrapping
// providers.ErrInvalidSpec whose reason names the offending field.
func resolve(cfg Config, spec providers.Spec) (settings, error) {
	set, reason := resolveSettings(cfg, spec)
	if reason != "" {
		return settings{}, providers.InvalidSpec(spec, reason)
	}
	return set, nil
}

func resolveSettings(cfg Config, spec providers.Spec) (settings, string) {
	if reason := specProblem(spec); reason != "" {
		return settings{}, reason
	}
	set := settings{workdir: cfg.Workdir, workdirSizeMB: cfg.WorkdirSizeMB, network: cfg.Network, pidsLimit: cfg.PidsLimit, cow: cowAuto}
	user := cfg.User
	for _, k := range slices.Sorted(maps.Keys(spec.Options)) {
		v := spec.Options[k]
		var err error
		switch k {
		case OptionUser:
			user = v
			_, _, err = parseUser(v)
		case OptionWorkdir:
			set.workdir = v
			err = checkWorkdir(v)
		case OptionNetwork:
			set.network = v
			err = checkNetwork(v)
		case OptionPidsLimit:
			set.pidsLimit, err = parseInt(v, checkPidsLimit)
		case OptionWorkdirSize:
			set.workdirSizeMB, err = parseInt(v, checkWorkdirSize)
		case OptionCow:
			set.cow = v
			if v != cowAuto && v != cowAlways && v != cowNever {
				err = fmt.Errorf("want %q, %q or %q, got %q", cowAuto, cowAlways, cowNever, v)
			}
		case providers.OptionLayer:
			set.layer = v
			if !validKey(v) {
				err = fmt.Errorf("want a layer's key (a SHA-256 in hex), got %q", v)
			}
		default:
			return settings{}, fmt.Sprintf("options %q: unknown option of the docker provider (known: %s)",
				k, strings.Join([]string{OptionUser, OptionWorkdir, OptionWorkdirSize, OptionNetwork, OptionPidsLimit, OptionCow}, ", "))
		}
		if err != nil {
			return settings{}, fmt.Sprintf("options %q: %v", k, err)
		}
	}
	if spec.DiskMB > 0 {
		if _, ok := spec.Options[OptionWorkdirSize]; ok {
			return settings{}, fmt.Sprintf("options %q: the pool sets disk, which is the work directory's size; set one of the two", OptionWorkdirSize)
		}
		if err := checkWorkdirSize(int64(spec.DiskMB)); err != nil {
			return settings{}, fmt.Sprintf("disk: %v", err)
		}
		set.workdirSizeMB = int64(spec.DiskMB)
	}
	set.uid, set.gid, _ = parseUser(user) // checked above or by Config.Validate
	return set, ""
}

// diskMB is the size of the work directory's tmpfs in MiB: the pool's disk
// (or workdir_size_mb, or Config.WorkdirSizeMB), else as large as the
// pool's memory, else defaultWorkdirSizeMB.
func (s settings) diskMB(spec providers.Spec) int64 {
	switch {
	case s.workdirSizeMB > 0:
		return s.workdirSizeMB
	case spec.MemoryMB > 0:
		return int64(spec.MemoryMB)
	}
	return defaultWorkdirSizeMB
}

// parseInt parses a decimal integer and checks it.
func parseInt(s string, check func(int64) error) (int64, error) {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("want an integer, got %q", s)
	}
	return n, check(n)
}

// specProblem checks the parts of spec that do not depend on the options.
func specProblem(spec providers.Spec) string {
	switch {
	case spec.Pool == "":
		return "pool: must be set"
	case strings.TrimSpace(spec.Image) == "":
		return "image: must name a Docker image present on the engine (e.g. \"debian:12\")"
	case spec.CPU < 0:
		return fmt.Sprintf("cpu: must not be negative, got %g", spec.CPU)
	case spec.MemoryMB < 0:
		return fmt.Sprintf("memory: must not be negative, got %d", spec.MemoryMB)
	case spec.MemoryMB > 0 && spec.MemoryMB < 6:
		return fmt.Sprintf("memory: Docker needs at least 6 MiB, got %d", spec.MemoryMB)
	}
	if k, problem := providers.CheckEnv(spec.Env); problem != "" {
		return fmt.Sprintf("env %q: %s", k, problem)
	}
	for _, k := range slices.Sorted(maps.Keys(spec.Labels)) {
		if strings.HasPrefix(k, reservedLabelPrefix) {
			return fmt.Sprintf("labels %q: labels %s* are reserved for the provider", k, reservedLabelPrefix)
		}
	}
	return ""
}

// validateName checks that name can be a container name.
func validateName(name string) error {
	switch {
	case len(name) > maxNameLen:
		return fmt.Errorf("must be at most %d bytes, got %d", maxNameLen, len(name))
	case !namePattern.MatchString(name):
		return fmt.Errorf("must be 2 or more letters, digits, '.', '_' or '-', starting with a letter or digit")
	}
	return nil
}

// launchPlan is everything one container is created from.
type launchPlan struct {
	name     string
	nonce    string
	created  time.Time
	hostPort int    // the agent's port in host-network mode; 0 on a bridge
	overlay  string // the overlay volume mounted at the work dir's parent (makeOverlay), or ""
}

// containerLabels returns the spec's labels plus the provider's.
func containerLabels(cfg Config, spec providers.Spec, plan launchPlan) map[string]string {
	l := make(map[string]string, len(spec.Labels)+8)
	maps.Copy(l, spec.Labels)
	l[providers.LabelManaged] = "true"
	l[providers.LabelPool] = spec.Pool
	l[providers.LabelTask] = plan.name
	l[providers.LabelGateway] = cfg.GatewayID
	if spec.Class != "" {
		l[providers.LabelClass] = spec.Class
	}
	l[labelNonce] = plan.nonce
	l[labelCreated] = plan.created.UTC().Format(time.RFC3339Nano)
	if plan.hostPort != 0 {
		l[labelAgentPort] = strconv.Itoa(plan.hostPort)
	}
	if layer := spec.Options[providers.OptionLayer]; layer != "" {
		l[labelLayer] = layer
	}
	return l
}

// containerEnv is the container's environment: HOME (the work directory),
// the spec's variables, then the agent's own settings. Nothing of a lease is
// here: per-lease variables arrive later through the agent's /v1/init.
func containerEnv(cfg Config, spec providers.Spec, set settings, plan launchPlan) []string {
	env := map[string]string{"HOME": set.workdir}
	maps.Copy(env, spec.Env)
	env["QUARRY_AGENT_ADDR"] = fmt.Sprintf("0.0.0.0:%d", agentPort)
	if set.hostNetwork() {
		env["QUARRY_AGENT_ADDR"] = fmt.Sprintf("127.0.0.1:%d", plan.hostPort)
	}
	env["QUARRY_AGENT_TOKEN_FILE"] = tokenPath
	if relaySocket(cfg, set) {
		env["QUARRY_AGENT_RELAY_SOCKET"] = relayDir + "/" + providers.RelaySocketName
	}
	env["QUARRY_AGENT_WORKDIR"] = set.workdir
	out := make([]string, 0, len(env))
	for _, k := range slices.Sorted(maps.Keys(env)) {
		out = append(out, k+"="+env[k])
	}
	return out
}

// buildContainer returns the create request of one container. It is a pure
// function of its arguments.
func buildContainer(cfg Config, spec providers.Spec, set settings, plan launchPlan) (*container.Config, *container.HostConfig) {
	port := nat.Port(fmt.Sprintf("%d/%s", agentPort, agentProto))
	cc := &container.Config{
		Image:      spec.Image,
		User:       fmt.Sprintf("%d:%d", set.uid, set.gid),
		Env:        containerEnv(cfg, spec, set, plan),
		Entrypoint: []string{agentPath},
		Cmd:        []string{},
		WorkingDir: set.workdir,
		Labels:     containerLabels(cfg, spec, plan),
		// The token arrives on stdin, written once at start; StdinOnce
		// closes it after that, so the agent reads it to EOF.
		OpenStdin:   true,
		StdinOnce:   true,
		AttachStdin: true,
	}
	pids := set.pidsLimit
	hc := &container.HostConfig{
		Mounts: []mount.Mount{{
			Type: mount.TypeBind, Source: cfg.AgentBinary, Target: agentPath, ReadOnly: true,
		}},
		NetworkMode:   container.NetworkMode(set.network),
		RestartPolicy: container.RestartPolicy{Name: container.RestartPolicyDisabled},
		LogConfig: container.LogConfig{Type: "json-file", Config: map[string]string{
			"max-size": logMaxSize, "max-file": logMaxFiles,
		}},
		Tmpfs:       map[string]string{set.workdir: workdirMountOptions(spec, set)},
		CapDrop:     []string{"ALL"},
		CapAdd:      keptCapabilities(),
		SecurityOpt: []string{"no-new-privileges"},
		Privileged:  false,
		Resources: container.Resources{
			NanoCPUs:  int64(spec.CPU * 1e9),
			PidsLimit: &pids,
		},
	}
	if relaySocket(cfg, set) {
		hc.Mounts = append(hc.Mounts, mount.Mount{Type: mount.TypeBind, Source: cfg.RelayDir, Target: relayDir, ReadOnly: true})
	}
	if plan.overlay != "" {
		// A copy-on-write work directory: the overlay's lower layer holds
		// the work directory (the sandbox user's), mounted at its parent;
		// no tmpfs, so no size bound (OptionCow) and none in memory.
		parent, _ := layerParent(set.workdir) // resolveSettings' layer check
		hc.Tmpfs = nil
		hc.Mounts = append(hc.Mounts, mount.Mount{Type: mount.TypeVolume, Source: plan.overlay, Target: parent,
			VolumeOptions: &mount.VolumeOptions{NoCopy: true}})
	}
	if spec.MemoryMB > 0 {
		// The work directory's tmpfs pages are charged to the container's
		// memory cgroup, and the kernel cannot reclaim them (no swap): with
		// a limit of memory alone, a full work directory made the cgroup
		// OOM-kill the sandbox's processes, the agent among them. With
		// memory + disk the tmpfs fills first and a write fails with
		// ENOSPC; what the work directory does not use, processes may.
		hc.Memory = (int64(spec.MemoryMB) + set.diskMB(spec)) << 20
		if plan.overlay != "" {
			hc.Memory = int64(spec.MemoryMB) << 20
		}
		hc.MemorySwap = hc.Memory // no swap
	}
	if !set.hostNetwork() {
		cc.ExposedPorts = nat.PortSet{port: {}}
		hc.PortBindings = nat.PortMap{port: {{HostIP: "127.0.0.1", HostPort: ""}}}
	}
	return cc, hc
}

// workdirMountOptions are the options of the work directory's tmpfs: owned
// by the container's user, executable, and bounded by settings.diskMB. Its
// pages count against the container's memory limit, which buildContainer
// raises by the same size.
func workdirMountOptions(spec providers.Spec, set settings) string {
	return fmt.Sprintf("rw,exec,nosuid,nodev,size=%dm,uid=%d,gid=%d", set.diskMB(spec), set.uid, set.gid)
}
