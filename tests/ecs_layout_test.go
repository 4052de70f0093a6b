//go:build integration

package tests

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ecs"
	ecstypes "github.com/aws/aws-sdk-go-v2/service/ecs/types"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/mount"
	"github.com/docker/docker/api/types/volume"
	"github.com/docker/docker/pkg/stdcopy"
	"github.com/docker/go-connections/nat"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/providers"
	ecsprovider "github.com/quarryhq/quarry/providers/ecs"
)

// dockerImageAgent is the ECS provider's agent image, built locally by
// scripts/images/agent.sh (busybox's cp and the static exec agent).
const dockerImageAgent = "quarry/agent:latest"

// labelLayoutTest marks the containers and volumes of TestECSLayout.
const labelLayoutTest = "quarry.test"

// How the ECS provider gives the agent its token nonce (docs/ECS.md,
// "Tokens"): the definition's QUARRY_AGENT_TOKEN_NONCE_FROM=ecs-task-arn
// (the task's ARN from the task metadata endpoint), or, in the layout
// before it, RunTask's override QUARRY_AGENT_TOKEN_NONCE.
const (
	envTokenNonce     = "QUARRY_AGENT_TOKEN_NONCE"
	envTokenNonceFrom = "QUARRY_AGENT_TOKEN_NONCE_FROM"
	nonceFromTaskARN  = "ecs-task-arn"
)

// envValue returns the value of the variable name in def's environment.
func envValue(def ecstypes.ContainerDefinition, name string) string {
	for _, kv := range def.Environment {
		if aws.ToString(kv.Name) == name {
			return aws.ToString(kv.Value)
		}
	}
	return ""
}

// TestECSLayout_RunsOnDocker renders the ECS provider's task definition for
// a pool and runs it on Docker the way ECS would: a volume per task volume,
// the containers in dependsOn order (the init container must exit 0), the
// sandbox container with its entry point, mounts, user, capability drops,
// environment and secrets (a random key standing in for Secrets Manager),
// a task metadata endpoint serving the task's ARN, and the nonce override
// when the definition does not take the nonce from the ARN. The agent must
// answer with the token derived from key and nonce, run commands as the
// unprivileged user in its work directory, no longer hold the key in PID
// 1's environment, lack the dropped capabilities, and see the agent volume
// read-only.
func TestECSLayout_RunsOnDocker(t *testing.T) {
	d := requireDocker(t)
	c := ctx(t)
	_, err := d.cli.ImageInspect(c, dockerImageAgent)
	require.NoError(t, err, "image %s is missing (scripts/images/agent.sh builds it)", dockerImageAgent)

	key := make([]byte, agentapi.MinTokenKeyBytes)
	_, err = rand.Read(key)
	require.NoError(t, err)
	id := make([]byte, 16)
	_, err = rand.Read(id)
	require.NoError(t, err)
	taskARN := "arn:aws:ecs:us-east-1:123456789012:task/quarry-layout/" + hex.EncodeToString(id)

	cfg := ecsprovider.Config{
		Cluster:           "quarry-layout",
		GatewayID:         d.gatewayID,
		Subnets:           []string{"subnet-0123456789abcdef0"},
		ExecutionRoleARN:  "arn:aws:iam::123456789012:role/quarry-exec",
		AgentImage:        dockerImageAgent,
		TokenKey:          key,
		TokenKeySecretARN: "arn:aws:secretsmanager:us-east-1:123456789012:secret:quarry-token-key",
	}
	td, err := ecsprovider.RenderTaskDefinition(cfg, providers.Spec{
		Pool: "layout", Image: dockerImageBash, Env: map[string]string{"POOL_VAR": "from-the-pool"},
	})
	require.NoError(t, err)

	run := &ecsOnDocker{
		d:       d,
		prefix:  "quarry-layout-" + d.gatewayID,
		taskARN: taskARN,
		secrets: map[string]string{cfg.TokenKeySecretARN: hex.EncodeToString(key)},
	}
	// The agent's token nonce: the task's ARN, which the agent reads from
	// the task metadata endpoint when the definition says so; else (the
	// layout before the provider batched RunTask) a random nonce that
	// RunTask's overrides set on the sandbox container.
	nonce := taskARN
	if envValue(run.sandboxDef(td), envTokenNonceFrom) != nonceFromTaskARN {
		nonce = hex.EncodeToString(id[:8])
		run.overrides = map[string][]ecstypes.KeyValuePair{
			ecsprovider.SandboxContainer: {{Name: aws.String(envTokenNonce), Value: aws.String(nonce)}},
		}
	}
	run.start(c, td)
	port := run.hostPort(c, ecsprovider.SandboxContainer, 8000)

	url := "http://127.0.0.1:" + port
	httpc := &http.Client{Timeout: 30 * time.Second}
	agent := agentapi.New(url, agentapi.DeriveToken(key, nonce), httpc)
	eventually(t, dockerWait, "the agent answers /healthz", func() error {
		if err := run.exited(c, ecsprovider.SandboxContainer); err != nil {
			t.Fatalf("%v", err)
		}
		_, err := agent.Health(c)
		return err
	})

	res, err := agent.Exec(c, agentapi.ExecRequest{Command: `id -u; pwd
env1() { tr '\0' '\n' </proc/1/environ; }
env1 | grep -c QUARRY_AGENT_TOKEN_KEY || true
env1 | grep -c QUARRY_AGENT_ADDR || true
env1 | grep -c -e '^QUARRY_AGENT_TOKEN_NONCE=' -e "$QUARRY_LAYOUT_KEY" || true
env1 | grep -c QUARRY_AGENT_TOKEN_FD= || true
echo x > /.quarry/x 2>&1 || echo ro
grep ' /.quarry ' /proc/self/mounts
grep CapBnd /proc/1/status
env | grep -c '^POOL_VAR=from-the-pool$' || true`,
		Env: map[string]string{"QUARRY_LAYOUT_KEY": hex.EncodeToString(key)}})
	require.NoError(t, err)
	t.Logf("exec: %+v", res)
	require.Equal(t, 0, res.ExitCode, "stderr: %s", res.Stderr)
	lines := strings.Split(strings.TrimSpace(res.Stdout), "\n")
	require.Len(t, lines, 10, "stdout: %q", res.Stdout)
	assert.Equal(t, "65534", lines[0], "commands run as the sandbox container's user")
	assert.Equal(t, "/tmp/quarry-work", lines[1], "in the agent's work directory, created by the unprivileged agent")
	assert.Equal(t, "0", lines[2], "the token key is not in PID 1's initial environment (re-exec without it)")
	assert.Equal(t, "1", lines[3], "PID 1's environment was readable (so the 0 above means something)")
	assert.Equal(t, "0", lines[4], "neither the nonce nor the key's value is in PID 1's environment")
	assert.Equal(t, "1", lines[5], "the agent re-executed itself with the token on a pipe")
	assert.Equal(t, "ro", lines[6], "writing to the agent volume fails")
	assert.Contains(t, res.Stderr, "Read-only file system", "because the volume is read-only, not only for lack of permission")
	assert.Regexp(t, `^\S+ /\.quarry \S+ ro[, ]`, lines[7], "the agent volume is mounted read-only")
	assert.Equal(t, "1", lines[9], "the pool's environment reaches commands")

	// The capabilities the definition drops are gone from PID 1's bounding set.
	f := strings.Fields(lines[8])
	require.Len(t, f, 2, "CapBnd line: %q", lines[8])
	bnd, err := strconv.ParseUint(f[1], 16, 64)
	require.NoError(t, err)
	lp := run.sandboxDef(td).LinuxParameters
	require.True(t, lp != nil && lp.Capabilities != nil && len(lp.Capabilities.Drop) > 0, "the sandbox definition drops capabilities")
	for _, name := range lp.Capabilities.Drop {
		bit, ok := capabilityBits()[name]
		require.True(t, ok, "capability %s: add it to capabilityBits", name)
		assert.Zero(t, bnd&(1<<bit), "capability %s is dropped", name)
	}
	assert.NotZero(t, bnd&(1<<unix.CAP_CHOWN), "the capabilities not dropped stay in the bounding set")

	// A wrong token is refused.
	_, err = agentapi.New(url, agentapi.DeriveToken(key, nonce+"0"), httpc).Exec(c, agentapi.ExecRequest{Command: "true"})
	var ae *agentapi.Error
	require.ErrorAs(t, err, &ae)
	assert.Equal(t, http.StatusUnauthorized, ae.Status)
}

// capabilityBits maps ECS's capability names to their bit in the kernel's
// capability sets.
func capabilityBits() map[string]uint {
	return map[string]uint{
		"AUDIT_WRITE": unix.CAP_AUDIT_WRITE, "CHOWN": unix.CAP_CHOWN, "DAC_OVERRIDE": unix.CAP_DAC_OVERRIDE,
		"FOWNER": unix.CAP_FOWNER, "FSETID": unix.CAP_FSETID, "KILL": unix.CAP_KILL, "MKNOD": unix.CAP_MKNOD,
		"NET_BIND_SERVICE": unix.CAP_NET_BIND_SERVICE, "NET_RAW": unix.CAP_NET_RAW, "SETFCAP": unix.CAP_SETFCAP,
		"SETGID": unix.CAP_SETGID, "SETPCAP": unix.CAP_SETPCAP, "SETUID": unix.CAP_SETUID, "SYS_CHROOT": unix.CAP_SYS_CHROOT,
	}
}

// ecsOnDocker runs one ECS task definition on Docker, translating it
// generically: a labelled volume per task volume, a labelled container per
// container definition, on the default bridge, ports published on
// 127.0.0.1 only. It fails the test on a field it does not translate.
type ecsOnDocker struct {
	d       *dockerTest
	prefix  string
	taskARN string
	// secrets maps a secret's valueFrom (ARN) to its value: Secrets Manager.
	secrets map[string]string
	// overrides are RunTask's containerOverrides environment, by container.
	overrides  map[string][]ecstypes.KeyValuePair
	volumes    map[string]string // task volume → Docker volume
	containers map[string]string // container name → Docker container id
	// metadataURI is the task metadata endpoint (v4) every container gets
	// as ECS_CONTAINER_METADATA_URI_V4.
	metadataURI string
}

// metadataContainer is the name of the container serving the task
// metadata endpoint, which ECS's agent serves on Fargate.
const metadataContainer = "ecs-metadata"

func (r *ecsOnDocker) labels() map[string]string {
	return map[string]string{providers.LabelGateway: r.d.gatewayID, labelLayoutTest: "ecs-layout"}
}

// start creates the volumes and starts the containers in dependsOn order,
// waiting for each dependency's condition. Everything is removed when the
// test ends.
func (r *ecsOnDocker) start(ctx context.Context, td *ecs.RegisterTaskDefinitionInput) {
	t := r.d.t
	t.Helper()
	r.volumes, r.containers = map[string]string{}, map[string]string{}
	t.Cleanup(r.cleanup)
	for _, v := range td.Volumes {
		require.Nil(t, v.Host, "volume %s: host paths are not translated", aws.ToString(v.Name))
		require.Nil(t, v.EfsVolumeConfiguration, "volume %s: EFS is not translated", aws.ToString(v.Name))
		name := r.prefix + "-" + aws.ToString(v.Name)
		_, err := r.d.cli.VolumeCreate(ctx, volume.CreateOptions{Name: name, Labels: r.labels()})
		require.NoError(t, err)
		r.volumes[aws.ToString(v.Name)] = name
	}
	r.serveMetadata(ctx, td)
	started := map[string]bool{}
	for len(started) < len(td.ContainerDefinitions) {
		progress := false
		for _, def := range td.ContainerDefinitions {
			name := aws.ToString(def.Name)
			if started[name] || !r.depsStarted(def, started) {
				continue
			}
			for _, dep := range def.DependsOn {
				r.waitCondition(ctx, aws.ToString(dep.ContainerName), dep.Condition)
			}
			r.run(ctx, td, def)
			started[name] = true
			progress = true
		}
		require.True(t, progress, "dependsOn has a cycle or names a missing container")
	}
}

func (r *ecsOnDocker) depsStarted(def ecstypes.ContainerDefinition, started map[string]bool) bool {
	for _, dep := range def.DependsOn {
		if !started[aws.ToString(dep.ContainerName)] {
			return false
		}
	}
	return true
}

// run creates and starts the container of def.
func (r *ecsOnDocker) run(ctx context.Context, td *ecs.RegisterTaskDefinitionInput, def ecstypes.ContainerDefinition) {
	t := r.d.t
	t.Helper()
	name := aws.ToString(def.Name)
	require.False(t, aws.ToBool(def.Privileged), "container %s: privileged", name)
	require.Empty(t, def.Links, "container %s: links", name)
	require.Empty(t, def.VolumesFrom, "container %s: volumesFrom is not translated", name)
	cc := &container.Config{
		Image:      aws.ToString(def.Image),
		Entrypoint: def.EntryPoint,
		Cmd:        def.Command,
		User:       aws.ToString(def.User),
		WorkingDir: aws.ToString(def.WorkingDirectory),
		Labels:     r.labels(),
	}
	for _, kv := range def.Environment {
		cc.Env = append(cc.Env, aws.ToString(kv.Name)+"="+aws.ToString(kv.Value))
	}
	for _, s := range def.Secrets {
		v, ok := r.secrets[aws.ToString(s.ValueFrom)]
		require.True(t, ok, "container %s: secret %s: no value for %s", name, aws.ToString(s.Name), aws.ToString(s.ValueFrom))
		cc.Env = append(cc.Env, aws.ToString(s.Name)+"="+v)
	}
	cc.Env = append(cc.Env, "ECS_CONTAINER_METADATA_URI_V4="+r.metadataURI)
	for _, kv := range r.overrides[name] { // later entries win, as overrides do
		cc.Env = append(cc.Env, aws.ToString(kv.Name)+"="+aws.ToString(kv.Value))
	}
	hc := &container.HostConfig{
		NetworkMode:    "bridge", // what awsvpc stands in for here: the default bridge
		ReadonlyRootfs: aws.ToBool(def.ReadonlyRootFilesystem),
	}
	if m := aws.ToInt32(def.MemoryReservation); m > 0 {
		hc.MemoryReservation = int64(m) << 20
	}
	if m, err := strconv.Atoi(aws.ToString(td.Memory)); err == nil && m > 0 {
		hc.Memory = int64(m) << 20 // the task's size bounds every container
	}
	for _, mp := range def.MountPoints {
		vol, ok := r.volumes[aws.ToString(mp.SourceVolume)]
		require.True(t, ok, "container %s: mount of unknown volume %s", name, aws.ToString(mp.SourceVolume))
		hc.Mounts = append(hc.Mounts, mount.Mount{Type: mount.TypeVolume, Source: vol,
			Target: aws.ToString(mp.ContainerPath), ReadOnly: aws.ToBool(mp.ReadOnly)})
	}
	if lp := def.LinuxParameters; lp != nil {
		require.Empty(t, lp.Devices, "container %s: devices", name)
		if lp.Capabilities != nil {
			hc.CapAdd, hc.CapDrop = lp.Capabilities.Add, lp.Capabilities.Drop
		}
		hc.Init = lp.InitProcessEnabled
	}
	for _, pm := range def.PortMappings {
		proto := strings.ToLower(string(pm.Protocol))
		if proto == "" {
			proto = "tcp"
		}
		port := nat.Port(fmt.Sprintf("%d/%s", aws.ToInt32(pm.ContainerPort), proto))
		if cc.ExposedPorts == nil {
			cc.ExposedPorts, hc.PortBindings = nat.PortSet{}, nat.PortMap{}
		}
		cc.ExposedPorts[port] = struct{}{}
		hc.PortBindings[port] = []nat.PortBinding{{HostIP: "127.0.0.1"}} // any free port, loopback only
	}
	created, err := r.d.cli.ContainerCreate(ctx, cc, hc, nil, nil, r.prefix+"-"+name)
	require.NoError(t, err, "create container %s", name)
	r.containers[name] = created.ID
	require.NoError(t, r.d.cli.ContainerStart(ctx, created.ID, container.StartOptions{}), "start container %s", name)
}

// serveMetadata starts a container (the busybox test image) whose httpd
// answers GET /v4/task/task with the task's metadata as ECS's task
// metadata endpoint v4 would (the fields the agent may read), waits until
// it answers, and sets metadataURI.
func (r *ecsOnDocker) serveMetadata(ctx context.Context, td *ecs.RegisterTaskDefinitionInput) {
	t := r.d.t
	t.Helper()
	meta, err := json.Marshal(map[string]any{
		"Cluster": "quarry-layout", "TaskARN": r.taskARN, "Family": aws.ToString(td.Family), "Revision": "1",
		"DesiredStatus": "RUNNING", "KnownStatus": "RUNNING", "LaunchType": "FARGATE",
	})
	require.NoError(t, err)
	cc := &container.Config{
		Image:      dockerImageBusybox,
		Entrypoint: []string{"/bin/sh", "-c", `mkdir -p /www/v4/task && printf '%s' "$TASK_METADATA" >/www/v4/task/task && exec httpd -f -p 80 -h /www`},
		Env:        []string{"TASK_METADATA=" + string(meta)},
		Labels:     r.labels(),
	}
	created, err := r.d.cli.ContainerCreate(ctx, cc, &container.HostConfig{NetworkMode: "bridge"}, nil, nil, r.prefix+"-"+metadataContainer)
	require.NoError(t, err, "create the task metadata container")
	r.containers[metadataContainer] = created.ID
	require.NoError(t, r.d.cli.ContainerStart(ctx, created.ID, container.StartOptions{}))
	info, err := r.d.cli.ContainerInspect(ctx, created.ID)
	require.NoError(t, err)
	require.NotNil(t, info.NetworkSettings)
	ip := info.NetworkSettings.IPAddress
	require.NotEmpty(t, ip, "the metadata container's address on the default bridge")
	r.metadataURI = "http://" + ip + "/v4/task"
	httpc := &http.Client{Timeout: 10 * time.Second}
	eventually(t, dockerWait, "the task metadata endpoint answers", func() error {
		if err := r.exited(ctx, metadataContainer); err != nil {
			t.Fatalf("%v", err)
		}
		resp, err := httpc.Get(r.metadataURI + "/task")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
		if resp.StatusCode != http.StatusOK || !bytes.Contains(b, []byte(r.taskARN)) {
			return fmt.Errorf("GET %s/task: %d %.200s", r.metadataURI, resp.StatusCode, b)
		}
		return nil
	})
}

// waitCondition waits until container name meets a dependsOn condition.
func (r *ecsOnDocker) waitCondition(ctx context.Context, name string, cond ecstypes.ContainerCondition) {
	t := r.d.t
	t.Helper()
	id := r.containers[name]
	switch cond {
	case ecstypes.ContainerConditionStart:
		return
	case ecstypes.ContainerConditionSuccess, ecstypes.ContainerConditionComplete:
		wctx, cancel := context.WithTimeout(ctx, dockerWait)
		defer cancel()
		waited, errs := r.d.cli.ContainerWait(wctx, id, container.WaitConditionNotRunning)
		select {
		case w := <-waited:
			if cond == ecstypes.ContainerConditionSuccess {
				require.Zero(t, w.StatusCode, "container %s must exit 0 (dependsOn SUCCESS); its output: %s", name, r.logs(name))
			}
		case err := <-errs:
			require.NoError(t, err, "wait for container %s", name)
		}
	default:
		t.Fatalf("dependsOn condition %s of %s is not translated", cond, name)
	}
}

// hostPort returns the host port of container name's published port.
func (r *ecsOnDocker) hostPort(ctx context.Context, name string, port int) string {
	t := r.d.t
	t.Helper()
	info, err := r.d.cli.ContainerInspect(ctx, r.containers[name])
	require.NoError(t, err)
	b := info.NetworkSettings.Ports[nat.Port(fmt.Sprintf("%d/tcp", port))]
	require.Len(t, b, 1, "one binding of %d: %+v", port, info.NetworkSettings.Ports)
	require.Equal(t, "127.0.0.1", b[0].HostIP)
	require.NotEmpty(t, b[0].HostPort)
	return b[0].HostPort
}

// exited returns an error with the container's output when it is no longer running.
func (r *ecsOnDocker) exited(ctx context.Context, name string) error {
	info, err := r.d.cli.ContainerInspect(ctx, r.containers[name])
	if err != nil {
		return fmt.Errorf("inspect container %s: %w", name, err)
	}
	if info.State.Running {
		return nil
	}
	return fmt.Errorf("container %s exited (code %d); its output: %s", name, info.State.ExitCode, r.logs(name))
}

// logs returns the container's output, bounded.
func (r *ecsOnDocker) logs(name string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rc, err := r.d.cli.ContainerLogs(ctx, r.containers[name], container.LogsOptions{ShowStdout: true, ShowStderr: true, Tail: "100"})
	if err != nil {
		return "(logs: " + err.Error() + ")"
	}
	defer rc.Close()
	var out bytes.Buffer
	_, err = stdcopy.StdCopy(&out, &out, io.LimitReader(rc, 64<<10))
	if err != nil && !errors.Is(err, io.EOF) {
		fmt.Fprintf(&out, "(logs: %v)", err)
	}
	return out.String()
}

// sandboxDef returns the sandbox container's definition.
func (r *ecsOnDocker) sandboxDef(td *ecs.RegisterTaskDefinitionInput) ecstypes.ContainerDefinition {
	for _, def := range td.ContainerDefinitions {
		if aws.ToString(def.Name) == ecsprovider.SandboxContainer {
			return def
		}
	}
	r.d.t.Fatalf("no %s container in the task definition", ecsprovider.SandboxContainer)
	return ecstypes.ContainerDefinition{}
}

// cleanup removes the test's containers, then its volumes (found by label,
// so a half-started run leaks nothing).
func (r *ecsOnDocker) cleanup() {
	t := r.d.t
	ctx, cancel := context.WithTimeout(context.Background(), dockerWait)
	defer cancel()
	f := filters.NewArgs(filters.Arg("label", providers.LabelGateway+"="+r.d.gatewayID), filters.Arg("label", labelLayoutTest+"=ecs-layout"))
	list, err := r.d.cli.ContainerList(ctx, container.ListOptions{All: true, Filters: f})
	if err != nil {
		t.Errorf("list containers for clean-up: %v", err)
	}
	for _, c := range list {
		if err := r.d.cli.ContainerRemove(ctx, c.ID, container.RemoveOptions{Force: true}); err != nil {
			t.Errorf("remove container %s: %v", c.ID, err)
		}
	}
	vols, err := r.d.cli.VolumeList(ctx, volume.ListOptions{Filters: f})
	if err != nil {
		t.Errorf("list volumes for clean-up: %v", err)
		return
	}
	for _, v := range vols.Volumes {
		if err := r.d.cli.VolumeRemove(ctx, v.Name, true); err != nil {
			t.Errorf("remove volume %s: %v", v.Name, err)
		}
	}
}
