package docker

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/providers"
	"github.com/quarryhq/quarry/providers/providertest"
)

func TestProvider_Conformance(t *testing.T) {
	needDocker(t)
	cli := engine(t)
	providertest.Run(t, providertest.Harness{
		Open: func(t *testing.T) func(t *testing.T) providers.Provider {
			e := newTestEnv(t)
			return func(t *testing.T) providers.Provider { return e.open(t) }
		},
		Spec:    providers.Spec{Image: imageBusybox, CPU: 0.5, MemoryMB: 128, Env: map[string]string{"QUARRY_TEST": "1"}},
		BadSpec: providers.Spec{Image: "quarry-test/never-built:latest"},
		KillTask: func(t *testing.T, task providers.Task) {
			require.NoError(t, cli.ContainerKill(context.Background(), task.ID, "KILL"))
		},
	})
}

func TestProvider_Launch_AppliesIsolation(t *testing.T) {
	e, p := dockerProvider(t)
	s := spec("iso", imageBusybox)
	s.Labels = map[string]string{"team": "rl"}
	task := launchOne(t, p, s, "iso-"+randomHex(t, 4))

	info, err := e.cli.ContainerInspect(context.Background(), task.ID)
	require.NoError(t, err)
	hc := info.HostConfig
	assert.False(t, hc.Privileged, "never privileged")
	assert.Equal(t, []string{"ALL"}, []string(hc.CapDrop))
	assert.ElementsMatch(t, keptCapabilities(), []string(hc.CapAdd))
	assert.Contains(t, hc.SecurityOpt, "no-new-privileges")
	require.NotNil(t, hc.PidsLimit)
	assert.Equal(t, int64(DefaultPidsLimit), *hc.PidsLimit)
	assert.Equal(t, int64(256+256)<<20, hc.Memory, "memory + the work directory's tmpfs (as large as memory without a disk)")
	assert.Equal(t, hc.Memory, hc.MemorySwap, "no swap")
	assert.Equal(t, int64(5e8), hc.NanoCPUs)
	assert.Equal(t, "no", string(hc.RestartPolicy.Name))
	assert.Equal(t, DefaultUser, info.Config.User)
	assert.Equal(t, []string{agentPath}, []string(info.Config.Entrypoint))

	// The agent is mounted read-only; nothing else is mounted from the host.
	require.Len(t, info.Mounts, 1)
	assert.Equal(t, agentPath, info.Mounts[0].Destination)
	assert.Equal(t, e.agent, info.Mounts[0].Source)
	assert.False(t, info.Mounts[0].RW, "the agent mount is read-only")

	// The agent's port is published on 127.0.0.1 only.
	bindings := info.NetworkSettings.Ports["8000/tcp"]
	require.NotEmpty(t, bindings)
	for _, b := range bindings {
		assert.Equal(t, "127.0.0.1", b.HostIP)
	}
	assert.Equal(t, "http://127.0.0.1:"+bindings[0].HostPort, task.AgentURL)

	// Labels, and no token in what `docker inspect` shows.
	for k, v := range map[string]string{
		providers.LabelManaged: "true", providers.LabelPool: "iso", providers.LabelTask: task.Name,
		providers.LabelGateway: e.gatewayID, "team": "rl",
	} {
		assert.Equal(t, v, info.Config.Labels[k], "label %s", k)
	}
	for _, kv := range info.Config.Env {
		assert.NotContains(t, kv, task.AgentToken, "the token is not in the container's environment")
		assert.False(t, strings.HasPrefix(kv, "QUARRY_AGENT_TOKEN="), "no token variable: %s", kv)
	}
	for k, v := range info.Config.Labels {
		assert.NotContains(t, v, task.AgentToken, "label %s", k)
	}

	// Inside: an unprivileged user without capabilities, a writable home,
	// a read-only agent, and the token in no file or variable.
	a := agentOf(t, task)
	tests := []struct {
		name, command, want string
	}{
		{name: "user", command: "id -u; id -g", want: "65534\n65534\n"},
		{name: "no effective capabilities", command: "grep CapEff /proc/self/status", want: "CapEff:\t0000000000000000\n"},
		{name: "no new privileges", command: "grep NoNewPrivs /proc/self/status", want: "NoNewPrivs:\t1\n"},
		{name: "home is the work directory", command: "pwd; echo $HOME", want: DefaultWorkdir + "\n" + DefaultWorkdir + "\n"},
		{name: "work directory writable", command: "echo hi > f && cat f && stat -c '%u %g' .", want: "hi\n65534 65534\n"},
		{name: "work directory is a bounded tmpfs", command: "grep ' " + DefaultWorkdir + " ' /proc/mounts | grep -o 'tmpfs.*size=[0-9]*k'",
			want: "tmpfs " + DefaultWorkdir + " tmpfs rw,nosuid,nodev,relatime,size=262144k\n"},
		{name: "agent read-only", command: "echo x >> " + agentPath + " 2>/dev/null && echo writable || echo read-only", want: "read-only\n"},
		{name: "no token file", command: "ls -A " + agentDir, want: "execagent\n"},
		{name: "token not inherited", command: "env | grep -c QUARRY_AGENT_ || true", want: "0\n"},
		{name: "spec env", command: "echo $QUARRY_TEST", want: "1\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := execIn(t, a, tt.command)
			assert.Equal(t, tt.want, res.Stdout, "stderr: %s", res.Stderr)
		})
	}
}

func TestProvider_Launch_PoolOptions(t *testing.T) {
	e, p := dockerProvider(t)
	tests := []struct {
		name    string
		options map[string]string
		check   func(t *testing.T, info container.InspectResponse, task providers.Task)
		command string
		want    string
	}{
		{
			name:    "user, workdir and pids limit",
			options: map[string]string{OptionUser: "1000:1001", OptionWorkdir: "/work/sbx", OptionPidsLimit: "64"},
			check: func(t *testing.T, info container.InspectResponse, _ providers.Task) {
				assert.Equal(t, "1000:1001", info.Config.User)
				assert.Equal(t, int64(64), *info.HostConfig.PidsLimit)
			},
			command: "id -u; id -g; pwd; stat -c '%u %g' .",
			want:    "1000\n1001\n/work/sbx\n1000 1001\n",
		},
		{
			name:    "root user keeps only the documented capabilities",
			options: map[string]string{OptionUser: "0"},
			command: "id -u; grep CapEff /proc/self/status",
			want:    "0\nCapEff:\t00000000000004fb\n",
		},
		{
			name:    "host network",
			options: map[string]string{OptionNetwork: NetworkHost},
			check: func(t *testing.T, info container.InspectResponse, task providers.Task) {
				assert.Equal(t, "host", string(info.HostConfig.NetworkMode))
				assert.Empty(t, info.HostConfig.PortBindings)
				assert.Equal(t, "http://127.0.0.1:"+info.Config.Labels[labelAgentPort], task.AgentURL)
			},
			command: "echo ok",
			want:    "ok\n",
		},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := spec("opts", imageBusybox)
			s.Options = tt.options
			task := launchOne(t, p, s, fmt.Sprintf("opt%d-%s", i, randomHex(t, 4)))
			info, err := e.cli.ContainerInspect(context.Background(), task.ID)
			require.NoError(t, err)
			if tt.check != nil {
				tt.check(t, info, task)
			}
			res := execIn(t, agentOf(t, task), tt.command)
			assert.Equal(t, tt.want, res.Stdout, "stderr: %s", res.Stderr)
		})
	}
}

func TestProvider_Launch_UnusableImageFailsFastNamingIt(t *testing.T) {
	e, p := dockerProvider(t)
	tests := []struct {
		name  string
		image string
		want  string
	}{
		{name: "missing image", image: "quarry-test/never-built:latest", want: "is not on the Docker engine"},
		{name: "image without a shell", image: imageNoShell, want: "has no shell"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tasks, err := p.Launch(context.Background(), spec("bad", tt.image), []string{"bad-" + randomHex(t, 4), "bad-" + randomHex(t, 4)})
			assert.Empty(t, tasks)
			var lerr *providers.LaunchError
			require.ErrorAs(t, err, &lerr)
			assert.ErrorIs(t, err, providers.ErrInvalidSpec)
			assert.Equal(t, tt.image, lerr.Image)
			assert.Contains(t, lerr.Reason, tt.want)
			assert.Contains(t, lerr.Reason, fmt.Sprintf("%q", tt.image), "the reason names the image")
			assert.Empty(t, e.containers(t), "nothing is left behind")
		})
	}
}

func TestProvider_Launch_RetriedNameReturnsItsContainer(t *testing.T) {
	e, p := dockerProvider(t)
	name := "again-" + randomHex(t, 4)
	first := launchOne(t, p, spec("again", imageBusybox), name)

	second := launchOne(t, e.open(t), spec("again", imageBusybox), name)
	assert.Equal(t, first.ID, second.ID)
	assert.Equal(t, first.AgentToken, second.AgentToken)

	_, err := p.Launch(context.Background(), spec("another-pool", imageBusybox), []string{name})
	assert.ErrorContains(t, err, "in use", "a name taken by another pool's task is not adopted")
	assert.Len(t, e.containers(t), 1)
}

func TestProvider_Stop_RemovesContainerAndLeavesOthersAlone(t *testing.T) {
	e, p := dockerProvider(t)
	other := newTestEnv(t)
	mine := launchOne(t, p, spec("stop", imageBusybox), "stop-"+randomHex(t, 4))
	theirs := launchOne(t, other.open(t), spec("stop", imageBusybox), "stop-"+randomHex(t, 4))

	require.NoError(t, p.Stop(context.Background(), mine.ID, "test"))
	assertGone(t, e.cli, mine.ID)
	got, err := p.Describe(context.Background(), []string{mine.ID})
	require.NoError(t, err)
	assert.Equal(t, providers.TaskStopped, got[0].State)
	assert.Equal(t, reasonNotFound, got[0].Reason)

	// Another gateway's container is not this provider's to stop, list or describe.
	require.NoError(t, p.Stop(context.Background(), theirs.ID, "test"))
	info, err := e.cli.ContainerInspect(context.Background(), theirs.ID)
	require.NoError(t, err)
	assert.True(t, info.State.Running, "another gateway's container is left alone")
	listed, err := p.List(context.Background(), "")
	require.NoError(t, err)
	assert.Empty(t, listed)
	got, err = p.Describe(context.Background(), []string{theirs.ID})
	require.NoError(t, err)
	assert.Equal(t, reasonNotFound, got[0].Reason)
}

func TestProvider_List_IncludesExitedContainers(t *testing.T) {
	e, p := dockerProvider(t)
	task := launchOne(t, p, spec("exited", imageBusybox), "exited-"+randomHex(t, 4))
	require.NoError(t, e.cli.ContainerKill(context.Background(), task.ID, "KILL"))

	eventually(t, "killed container listed as stopped", func() error {
		listed, err := e.open(t).List(context.Background(), "exited")
		if err != nil {
			return err
		}
		if len(listed) != 1 || listed[0].State != providers.TaskStopped {
			return fmt.Errorf("listed %+v", listed)
		}
		return nil
	})
	got, err := p.Describe(context.Background(), []string{task.ID})
	require.NoError(t, err)
	assert.Equal(t, providers.TaskStopped, got[0].State)
	assert.Contains(t, got[0].Reason, "exited with code 137")
	assert.Empty(t, got[0].AgentURL)

	require.NoError(t, p.Stop(context.Background(), task.ID, "test"))
	assertGone(t, e.cli, task.ID)
}

func TestProvider_Launch_ConcurrentDifferentImages(t *testing.T) {
	_, p := dockerProvider(t)
	images := []string{imageBusybox, imageBash}
	tasks := make([][]providers.Task, len(images))
	errs := make([]error, len(images))
	var wg sync.WaitGroup
	for i, img := range images {
		wg.Go(func() {
			tasks[i], errs[i] = p.Launch(context.Background(), spec(fmt.Sprintf("img%d", i), img), []string{fmt.Sprintf("img%d-%s", i, randomHex(t, 4))})
		})
	}
	wg.Wait()
	for i := range images {
		require.NoError(t, errs[i], images[i])
		require.Len(t, tasks[i], 1)
	}
	bash := execIn(t, agentOf(t, tasks[1][0]), "bash -c 'echo $BASH_VERSION' | cut -d. -f1")
	assert.Equal(t, 0, bash.ExitCode)
	assert.Equal(t, "5\n", bash.Stdout)
	noBash := execIn(t, agentOf(t, tasks[0][0]), "bash --version")
	assert.Equal(t, 127, noBash.ExitCode, "the busybox image has no bash")
}

// A work directory filled to its disk is ENOSPC for the writer, not an OOM
// kill of the sandbox: the container's memory limit leaves room for the
// tmpfs (memory + disk), and the agent keeps answering.
func TestProvider_Launch_FullWorkdirIsENOSPCNotAnOOMKill(t *testing.T) {
	e, p := dockerProvider(t)
	s := spec("disk", imageBusybox)
	s.MemoryMB, s.DiskMB = 32, 16
	task := launchOne(t, p, s, "disk-"+randomHex(t, 4))
	a := agentOf(t, task)

	res := execIn(t, a, "dd if=/dev/zero of=fill bs=1M count=40 2>/tmp/err; echo rc=$?; wc -c < fill; cat /tmp/err >&2")
	assert.Equal(t, "rc=1\n16777216\n", res.Stdout, "the write stops at the disk: stderr %q", res.Stderr)
	assert.Contains(t, res.Stderr, "No space left on device")
	assert.Equal(t, 0, res.ExitCode)

	res = execIn(t, a, "echo ok")
	assert.Equal(t, "ok\n", res.Stdout, "the agent still answers")
	info, err := e.cli.ContainerInspect(context.Background(), task.ID)
	require.NoError(t, err)
	assert.True(t, info.State.Running, "the container runs")
	assert.False(t, info.State.OOMKilled, "nothing was OOM-killed")
	assert.Equal(t, int64(32+16)<<20, info.HostConfig.Memory)
}

// A container whose agent the OOM killer took is described as such, with
// its limit and the end of the agent's log.
func TestProvider_Describe_OOMReasonWithLimitAndLogTail(t *testing.T) {
	_, p := dockerProvider(t)
	s := spec("oom", imageBusybox)
	s.MemoryMB = 32 // + a 32 MiB work directory: a 64 MiB limit
	task := launchOne(t, p, s, "oom-"+randomHex(t, 4))
	a := agentOf(t, task)
	// /dev/shm (Docker's 64 MiB tmpfs) holds its pages in the container's
	// memory: 48 MiB of them leave the agent room to answer this call (a
	// fill to the limit let the OOM killer take the agent during it, under
	// a loaded make test); then the agent itself needs 40 MiB more for a
	// large output, past the limit.
	execIn(t, a, "dd if=/dev/zero of=/dev/shm/fill bs=1M count=48 2>/dev/null; true")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, _ = a.Exec(ctx, agentapi.ExecRequest{Command: "head -c 40m /dev/zero", MaxOutputBytes: 64 << 20})

	eventually(t, "the container stops", func() error {
		got, err := p.Describe(context.Background(), []string{task.ID})
		if err != nil {
			return err
		}
		if got[0].State != providers.TaskStopped {
			return fmt.Errorf("state %s", got[0].State)
		}
		return nil
	})
	got, err := p.Describe(context.Background(), []string{task.ID})
	require.NoError(t, err)
	r := got[0].Reason
	t.Logf("reason: %s", r)
	assert.Contains(t, r, "the container exited with code 137 (killed for running out of memory: the kernel's OOM killer, at the container's limit of 64 MiB")
	assert.Contains(t, r, "; its log ends: ")
	assert.Contains(t, r, "exec agent listening", "the agent's own log")
}

func TestStoppedReason_NamesTheLimits(t *testing.T) {
	pids := int64(200)
	inspected := func(st container.State) view {
		return fromInspect(container.InspectResponse{
			ContainerJSONBase: &container.ContainerJSONBase{ID: "c1", State: &st,
				HostConfig: &container.HostConfig{Resources: container.Resources{Memory: 576 << 20, PidsLimit: &pids}}},
		})
	}
	assert.Equal(t, "the container exited with code 137 (killed for running out of memory: the kernel's OOM killer, at the container's limit of 576 MiB, memory and work directory together)",
		stoppedReason(inspected(container.State{Status: "exited", ExitCode: 137, OOMKilled: true})))
	assert.Equal(t, "the container exited with code 2 (the agent died of a Go runtime error or panic, the container's pids limit being 200: see its log)",
		stoppedReason(inspected(container.State{Status: "exited", ExitCode: 2})))
	assert.Equal(t, "the container exited with code 137 (SIGKILL, e.g. docker kill)",
		stoppedReason(inspected(container.State{Status: "exited", ExitCode: 137})))
}
