package ecs

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ecs"
	"github.com/aws/aws-sdk-go-v2/service/ecs/types"

	"github.com/quarryhq/quarry/providers"
)

// Names inside the task definitions this provider registers.
const (
	// SandboxContainer is the container that runs the pool's image with the
	// agent as its entry point; a task definition supplied by a pool must
	// name its sandbox container so.
	SandboxContainer = "sandbox"
	// initContainer copies the agent into the shared volume.
	initContainer = "quarry-agent-init"
	// agentVolume is the volume shared by the two containers, mounted at agentDir.
	agentVolume = "quarry-agent"
	agentDir    = "/.quarry"
	agentPath   = agentDir + "/execagent"
	// agentSource is where the agent sits in Config.AgentImage.
	agentSource = "/execagent"
	// initReservationMB is the init container's memory reservation (ECS
	// needs one per container on EC2 and in the emulator; on Fargate it
	// only counts against the task size).
	initReservationMB = 16
	// Variables of the agent: its token key (a secret), and where its
	// nonce comes from: the task's ARN, which the agent reads from the ECS
	// task metadata endpoint (envTokenNonceFrom=nonceFromTaskARN, in the
	// task definition). envTokenNonce is the override of tasks launched
	// before the provider batched RunTask; their tokens still derive from it.
	envTokenKey       = "QUARRY_AGENT_TOKEN_KEY"
	envTokenNonce     = "QUARRY_AGENT_TOKEN_NONCE"
	envTokenNonceFrom = "QUARRY_AGENT_TOKEN_NONCE_FROM"
	nonceFromTaskARN  = "ecs-task-arn"
	envAgentAddr      = "QUARRY_AGENT_ADDR"
	envAgentWork      = "QUARRY_AGENT_WORKDIR"
	// tagCreated records the launch time (Unix seconds) in case the backend
	// reports no createdAt.
	tagCreated = "quarry.created"
	// tagBatch is the random id of the RunTask call that started a task
	// (also the call's clientToken).
	tagBatch = "quarry.batch"
)

// Sandboxes run unprivileged by default: as nobody, without the
// capabilities a root user would need to change the container, in a work
// directory the agent creates (/tmp is writable for every user in
// practically every image).
const (
	// DefaultUser is the sandbox container's user unless the pool's
	// options.user names another ("0" runs as root).
	DefaultUser = "65534:65534"
	// sandboxWorkdir is the agent's work directory in the sandbox.
	sandboxWorkdir = "/tmp/quarry-work"
)

// droppedCapabilities are dropped from every sandbox container: Docker's
// default set minus those a root user needs to install software (chown,
// file permissions, setuid for package scripts, kill). With DefaultUser
// no capability is effective anyway.
func droppedCapabilities() []string {
	return []string{"AUDIT_WRITE", "MKNOD", "NET_RAW", "SETFCAP", "SETPCAP", "SYS_CHROOT"}
}

// Pool options (providers.Spec.Options) this provider reads.
const (
	optCapacityProvider = "capacity_provider"
	optSubnets          = "subnets"
	optSecurityGroups   = "security_groups"
	optAssignPublicIP   = "assign_public_ip"
	optTaskDefinition   = "task_definition"
	optArch             = "arch"
	optUser             = "user"
)

func knownOptions() []string {
	return []string{optArch, optAssignPublicIP, optCapacityProvider, optSecurityGroups, optSubnets, optTaskDefinition, optUser}
}

// settings are a pool's launch settings: the config with the pool's options applied.
type settings struct {
	strategy []types.CapacityProviderStrategyItem
	subnets  []string
	sgs      []string
	publicIP bool
	// taskDef is a task definition supplied by the pool ("" = render one).
	taskDef string
	arch    types.CPUArchitecture
	cpu     int // CPU units
	memory  int // MiB
	// user is the sandbox container's user (DefaultUser unless the pool
	// names one).
	user string
	// diskGiB is the task's ephemeral storage (0: Fargate's default).
	diskGiB int
}

// Fargate's ephemeral storage (the task's writable layers, the work
// directory among them): 20 GiB without a setting, 21 to 200 GiB with one.
const (
	fargateDefaultDiskGiB  = 20
	minDiskGiB, maxDiskGiB = 21, 200
)

// fargateDisk maps a pool's disk (MiB; 0: Fargate's default) to the task's
// ephemeral storage in GiB. Fargate sets it in whole GiB from 21 to 200 and
// gives 20 GiB without one, so a size it cannot give exactly is an error
// naming disk rather than a bound the task does not have.
func fargateDisk(diskMB int) (int, error) {
	switch {
	case diskMB == 0:
		return 0, nil
	case diskMB%1024 != 0 || diskMB/1024 < minDiskGiB || diskMB/1024 > maxDiskGiB:
		return 0, fmt.Errorf("disk: Fargate's ephemeral storage is a whole number of GiB from %d to %d (a task without disk gets %d GiB), got %d MiB",
			minDiskGiB, maxDiskGiB, fargateDefaultDiskGiB, diskMB)
	}
	return diskMB / 1024, nil
}

// resolve checks spec against cfg and returns the pool's settings, or a
// LaunchError (ErrInvalidSpec) naming the bad field.
func resolve(cfg Config, spec providers.Spec) (settings, error) {
	s := settings{subnets: cfg.Subnets, sgs: cfg.SecurityGroups, publicIP: cfg.AssignPublicIP, arch: types.CPUArchitectureX8664, user: DefaultUser}
	for k := range spec.Options {
		if !slices.Contains(knownOptions(), k) {
			return s, providers.InvalidSpec(spec, fmt.Sprintf("options.%s: unknown option (known: %s)", k, strings.Join(knownOptions(), ", ")))
		}
	}
	strategy := cfg.CapacityProvider
	if v, ok := spec.Options[optCapacityProvider]; ok {
		strategy = v
	}
	var err error
	if s.strategy, err = parseStrategy(strategy); err != nil {
		return s, providers.InvalidSpec(spec, "options."+optCapacityProvider+": "+err.Error())
	}
	if v, ok := spec.Options[optSubnets]; ok {
		s.subnets = splitList(v)
		if len(s.subnets) == 0 {
			return s, providers.InvalidSpec(spec, "options.subnets: empty")
		}
		if err := checkIDs(s.subnets, subnetPattern); err != nil {
			return s, providers.InvalidSpec(spec, "options.subnets"+err.Error())
		}
	}
	if v, ok := spec.Options[optSecurityGroups]; ok {
		s.sgs = splitList(v)
		if err := checkIDs(s.sgs, sgPattern); err != nil {
			return s, providers.InvalidSpec(spec, "options.security_groups"+err.Error())
		}
	}
	if v, ok := spec.Options[optAssignPublicIP]; ok {
		if s.publicIP, err = strconv.ParseBool(v); err != nil {
			return s, providers.InvalidSpec(spec, fmt.Sprintf("options.assign_public_ip: want true or false, got %q", v))
		}
	}
	if v, ok := spec.Options[optArch]; ok {
		switch a := types.CPUArchitecture(strings.ToUpper(v)); a {
		case types.CPUArchitectureX8664, types.CPUArchitectureArm64:
			s.arch = a
		default:
			return s, providers.InvalidSpec(spec, fmt.Sprintf("options.arch: want X86_64 or ARM64, got %q", v))
		}
	}
	if v, ok := spec.Options[optUser]; ok {
		if !userPattern.MatchString(v) {
			return s, providers.InvalidSpec(spec, fmt.Sprintf("options.user: want uid, uid:gid, user or user:group, got %q", v))
		}
		s.user = v
	}
	if v, ok := spec.Options[optTaskDefinition]; ok {
		if v == "" {
			return s, providers.InvalidSpec(spec, "options.task_definition: empty")
		}
		if spec.DiskMB != 0 {
			return s, providers.InvalidSpec(spec, "disk: the pool supplies its own task definition (options.task_definition); set its ephemeralStorage there and leave disk unset")
		}
		s.taskDef = v
		return s, nil // the supplied definition has its own image, size and secrets
	}
	if spec.Image == "" {
		return s, providers.InvalidSpec(spec, "image: must be set (an image the task execution role can pull)")
	}
	if s.cpu, s.memory, err = fargateSize(spec.CPU, spec.MemoryMB); err != nil {
		return s, providers.InvalidSpec(spec, err.Error())
	}
	if s.diskGiB, err = fargateDisk(spec.DiskMB); err != nil {
		return s, providers.InvalidSpec(spec, err.Error())
	}
	if k, problem := providers.CheckEnv(spec.Env); problem != "" {
		return s, providers.InvalidSpec(spec, fmt.Sprintf("env.%s: %s", k, problem))
	}
	if cfg.ExecutionRoleARN == "" || cfg.AgentImage == "" {
		return s, providers.InvalidSpec(spec, "options.task_definition: required when the gateway has no QUARRY_ECS_EXECUTION_ROLE_ARN and QUARRY_ECS_AGENT_IMAGE to register task definitions with")
	}
	return s, nil
}

// userPattern matches the forms of a container's user ECS accepts.
var userPattern = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,63})?$`)

// strategyPart is one "name[:weight[:base]]" of a capacity provider strategy.
var strategyName = regexp.MustCompile(`^[A-Za-z0-9_-]{1,255}$`)

// parseStrategy parses "FARGATE", "FARGATE_SPOT" or a weighted list
// "FARGATE_SPOT:3,FARGATE:1:2" (name:weight:base).
func parseStrategy(s string) ([]types.CapacityProviderStrategyItem, error) {
	parts := splitList(s)
	if len(parts) == 0 {
		return nil, fmt.Errorf("want a capacity provider such as FARGATE or FARGATE_SPOT:3,FARGATE:1, got %q", s)
	}
	var out []types.CapacityProviderStrategyItem
	for _, p := range parts {
		f := strings.Split(p, ":")
		if len(f) > 3 || !strategyName.MatchString(f[0]) {
			return nil, fmt.Errorf("want name[:weight[:base]], got %q", p)
		}
		item := types.CapacityProviderStrategyItem{CapacityProvider: aws.String(f[0]), Weight: 1}
		if len(f) > 1 {
			w, err := strconv.Atoi(f[1])
			if err != nil || w < 0 || w > 1000 {
				return nil, fmt.Errorf("%q: weight must be 0..1000", p)
			}
			item.Weight = int32(w)
		}
		if len(f) > 2 {
			b, err := strconv.Atoi(f[2])
			if err != nil || b < 0 || b > 100000 {
				return nil, fmt.Errorf("%q: base must be 0..100000", p)
			}
			item.Base = int32(b)
		}
		out = append(out, item)
	}
	return out, nil
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// fargateSizes lists Fargate's task sizes: CPU units and the memory (MiB)
// each allows, from min to max in steps.
func fargateSizes() []struct{ cpu, minMem, maxMem, step int } {
	return []struct{ cpu, minMem, maxMem, step int }{
		{256, 512, 512, 512}, // 512, then 1024, 2048 (below)
		{256, 1024, 2048, 1024},
		{512, 1024, 4096, 1024},
		{1024, 2048, 8192, 1024},
		{2048, 4096, 16384, 1024},
		{4096, 8192, 30720, 1024},
		{8192, 16384, 61440, 4096},
		{16384, 32768, 122880, 8192},
	}
}

// fargateSize maps a pool's CPU (vCPUs; 0 = the smallest) and memory (MiB;
// 0 = the least its CPU allows) to the smallest Fargate task size that
// gives at least both. It fails, naming the field, when none does.
func fargateSize(cpu float64, memMB int) (units, mem int, err error) {
	if math.IsNaN(cpu) || cpu < 0 || cpu > 16 {
		return 0, 0, fmt.Errorf("cpu: Fargate tasks have 0.25 to 16 vCPUs, got %g", cpu)
	}
	if memMB < 0 || memMB > 122880 {
		return 0, 0, fmt.Errorf("memory_mb: Fargate tasks have 512 to 122880 MiB, got %d", memMB)
	}
	want := int(math.Ceil(cpu * 1024))
	for _, s := range fargateSizes() {
		if s.cpu < want || memMB > s.maxMem {
			continue
		}
		m := max(memMB, s.minMem)
		m = s.minMem + (m-s.minMem+s.step-1)/s.step*s.step
		return s.cpu, m, nil
	}
	return 0, 0, fmt.Errorf("memory_mb: %d MiB does not fit a Fargate task of %g vCPUs (16 vCPUs allow at most 122880 MiB)", memMB, cpu)
}

// renderTaskDef returns the task definition of a pool: the init container
// copies the agent from cfg.AgentImage into a volume that the sandbox
// container (the pool's image) mounts read-only and runs as its entry
// point; the agent's token key comes from the secret, and the agent derives
// its token from the key and its task's ARN. Its family is named
// by a hash of everything else, so equal pools share one definition and a
// changed pool gets a new one; its tags name the pool, the gateway and an
// on-demand pool's class.
func renderTaskDef(cfg Config, spec providers.Spec, s settings) *ecs.RegisterTaskDefinitionInput {
	env := []types.KeyValuePair{
		{Name: aws.String(envAgentAddr), Value: aws.String(fmt.Sprintf("0.0.0.0:%d", cfg.AgentPort))},
		{Name: aws.String(envAgentWork), Value: aws.String(sandboxWorkdir)},
		{Name: aws.String(envTokenNonceFrom), Value: aws.String(nonceFromTaskARN)},
	}
	for _, k := range slices.Sorted(maps.Keys(spec.Env)) {
		env = append(env, types.KeyValuePair{Name: aws.String(k), Value: aws.String(spec.Env[k])})
	}
	mount := func(readOnly bool) []types.MountPoint {
		return []types.MountPoint{{SourceVolume: aws.String(agentVolume), ContainerPath: aws.String(agentDir), ReadOnly: aws.Bool(readOnly)}}
	}
	var logs func(prefix string) *types.LogConfiguration
	logs = func(string) *types.LogConfiguration { return nil }
	if cfg.LogGroup != "" {
		logs = func(prefix string) *types.LogConfiguration {
			return &types.LogConfiguration{LogDriver: types.LogDriverAwslogs, Options: map[string]string{
				"awslogs-group": cfg.LogGroup, "awslogs-region": cfg.LogRegion, "awslogs-stream-prefix": prefix,
			}}
		}
	}
	in := &ecs.RegisterTaskDefinitionInput{
		RequiresCompatibilities: []types.Compatibility{types.CompatibilityFargate},
		NetworkMode:             types.NetworkModeAwsvpc,
		Cpu:                     aws.String(strconv.Itoa(s.cpu)),
		Memory:                  aws.String(strconv.Itoa(s.memory)),
		ExecutionRoleArn:        aws.String(cfg.ExecutionRoleARN),
		RuntimePlatform:         &types.RuntimePlatform{CpuArchitecture: s.arch, OperatingSystemFamily: types.OSFamilyLinux},
		Volumes:                 []types.Volume{{Name: aws.String(agentVolume)}},
		ContainerDefinitions: []types.ContainerDefinition{
			{
				Name:              aws.String(initContainer),
				Image:             aws.String(cfg.AgentImage),
				Essential:         aws.Bool(false),
				EntryPoint:        []string{"cp", agentSource, agentPath},
				MountPoints:       mount(false),
				MemoryReservation: aws.Int32(initReservationMB),
				LogConfiguration:  logs("init"),
			},
			{
				Name:              aws.String(SandboxContainer),
				Image:             aws.String(spec.Image),
				Essential:         aws.Bool(true),
				EntryPoint:        []string{agentPath},
				Command:           []string{},
				DependsOn:         []types.ContainerDependency{{ContainerName: aws.String(initContainer), Condition: types.ContainerConditionSuccess}},
				MountPoints:       mount(true),
				PortMappings:      []types.PortMapping{{ContainerPort: aws.Int32(int32(cfg.AgentPort)), Protocol: types.TransportProtocolTcp}},
				Environment:       env,
				Secrets:           []types.Secret{{Name: aws.String(envTokenKey), ValueFrom: aws.String(cfg.TokenKeySecretARN)}},
				MemoryReservation: aws.Int32(int32(s.memory - initReservationMB)),
				LogConfiguration:  logs("sandbox"),
				User:              aws.String(s.user),
				LinuxParameters:   &types.LinuxParameters{Capabilities: &types.KernelCapabilities{Drop: droppedCapabilities()}},
			},
		},
	}
	if cfg.TaskRoleARN != "" {
		in.TaskRoleArn = aws.String(cfg.TaskRoleARN)
	}
	if s.diskGiB > 0 {
		in.EphemeralStorage = &types.EphemeralStorage{SizeInGiB: int32(s.diskGiB)}
	}
	b, _ := json.Marshal(in) // plain data: cannot fail
	sum := sha256.Sum256(b)
	in.Family = aws.String(family(cfg.FamilyPrefix, spec.Pool, hex.EncodeToString(sum[:8])))
	in.Tags = []types.Tag{
		{Key: aws.String(providers.LabelManaged), Value: aws.String("true")},
		{Key: aws.String(providers.LabelPool), Value: aws.String(spec.Pool)},
		{Key: aws.String(providers.LabelGateway), Value: aws.String(cfg.GatewayID)},
	}
	if spec.Class != "" {
		in.Tags = append(in.Tags, types.Tag{Key: aws.String(providers.LabelClass), Value: aws.String(spec.Class)})
	}
	return in
}

// familyUnsafe matches what a family name may not contain.
var familyUnsafe = regexp.MustCompile(`[^A-Za-z0-9_-]`)

// family names a pool's task definition: "<prefix><pool>-<hash>"
// ("quarry-<pool>-<hash>" by default), at most 255 characters of letters,
// digits, '-' and '_' (the pool cut to 200, or less with a long prefix).
func family(prefix, pool, hash string) string {
	p := familyUnsafe.ReplaceAllString(pool, "_")
	return prefix + p[:min(len(p), 200, 255-len(prefix)-1-len(hash))] + "-" + hash
}
