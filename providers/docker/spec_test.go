package docker

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/mount"
	"github.com/docker/go-connections/nat"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/providers"
)

func testConfig() Config {
	return Config{AgentBinary: "/opt/quarry/execagent", TokenKeyFile: "/k", GatewayID: "gw"}.WithDefaults()
}

func TestResolve_OptionsOverrideTheConfig(t *testing.T) {
	tests := []struct {
		name    string
		options map[string]string
		want    settings
	}{
		{name: "defaults", want: settings{uid: 65534, gid: 65534, workdir: DefaultWorkdir, network: NetworkBridge, pidsLimit: DefaultPidsLimit, cow: cowAuto}},
		{name: "uid only", options: map[string]string{OptionUser: "1000"},
			want: settings{uid: 1000, gid: 1000, workdir: DefaultWorkdir, network: NetworkBridge, pidsLimit: DefaultPidsLimit, cow: cowAuto}},
		{name: "every option", options: map[string]string{OptionUser: "0:10", OptionWorkdir: "/w", OptionWorkdirSize: "64",
			OptionNetwork: "host", OptionPidsLimit: "100"},
			want: settings{uid: 0, gid: 10, workdir: "/w", workdirSizeMB: 64, network: NetworkHost, pidsLimit: 100, cow: cowAuto}},
		{name: "named network", options: map[string]string{OptionNetwork: "sandboxes"},
			want: settings{uid: 65534, gid: 65534, workdir: DefaultWorkdir, network: "sandboxes", pidsLimit: DefaultPidsLimit, cow: cowAuto}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := resolve(testConfig(), providers.Spec{Pool: "p", Image: "img", Options: tt.options})
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestResolve_BadSpecIsALaunchErrorNamingTheField(t *testing.T) {
	tests := []struct {
		name   string
		modify func(*providers.Spec)
		want   string
	}{
		{name: "no pool", modify: func(s *providers.Spec) { s.Pool = "" }, want: "pool: must be set"},
		{name: "no image", modify: func(s *providers.Spec) { s.Image = " " }, want: "image: must name a Docker image"},
		{name: "negative cpu", modify: func(s *providers.Spec) { s.CPU = -1 }, want: "cpu: must not be negative"},
		{name: "tiny memory", modify: func(s *providers.Spec) { s.MemoryMB = 4 }, want: "memory: Docker needs at least 6 MiB"},
		{name: "reserved env", modify: func(s *providers.Spec) { s.Env = map[string]string{"QUARRY_AGENT_TOKEN": "x"} },
			want: `env "QUARRY_AGENT_TOKEN": variables QUARRY_AGENT_* are reserved`},
		{name: "bad env name", modify: func(s *providers.Spec) { s.Env = map[string]string{"A=B": "x"} }, want: `env "A=B": not a valid variable name`},
		{name: "reserved label", modify: func(s *providers.Spec) { s.Labels = map[string]string{"quarry.docker.nonce": "x"} },
			want: `labels "quarry.docker.nonce": labels quarry.* are reserved`},
		{name: "unknown option", modify: func(s *providers.Spec) { s.Options = map[string]string{"privileged": "true"} },
			want: `options "privileged": unknown option of the docker provider (known: user, workdir, workdir_size_mb, network, pids_limit, cow)`},
		{name: "user name", modify: func(s *providers.Spec) { s.Options = map[string]string{OptionUser: "root"} },
			want: `options "user": want a numeric uid or uid:gid, got "root"`},
		{name: "workdir", modify: func(s *providers.Spec) { s.Options = map[string]string{OptionWorkdir: "/proc/x"} },
			want: `options "workdir": must not be in /proc`},
		{name: "workdir size", modify: func(s *providers.Spec) { s.Options = map[string]string{OptionWorkdirSize: "big"} },
			want: `options "workdir_size_mb": want an integer, got "big"`},
		{name: "network none", modify: func(s *providers.Spec) { s.Options = map[string]string{OptionNetwork: "none"} },
			want: `options "network": "none" leaves the agent unreachable`},
		{name: "pids limit", modify: func(s *providers.Spec) { s.Options = map[string]string{OptionPidsLimit: "1"} },
			want: `options "pids_limit": must be between 16`},
		{name: "disk and workdir size", modify: func(s *providers.Spec) {
			s.DiskMB, s.Options = 64, map[string]string{OptionWorkdirSize: "64"}
		}, want: `options "workdir_size_mb": the pool sets disk, which is the work directory's size; set one of the two`},
		{name: "disk too large", modify: func(s *providers.Spec) { s.DiskMB = 1<<20 + 1 }, want: "disk: must be between 1 and 1048576 MiB"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := providers.Spec{Pool: "p", Image: "img"}
			tt.modify(&s)
			_, err := resolve(testConfig(), s)
			var lerr *providers.LaunchError
			require.ErrorAs(t, err, &lerr)
			assert.ErrorIs(t, err, providers.ErrInvalidSpec)
			assert.Equal(t, s.Pool, lerr.Pool)
			assert.Equal(t, s.Image, lerr.Image)
			assert.Contains(t, lerr.Reason, tt.want)
		})
	}
}

func TestValidateName_DockerContainerNames(t *testing.T) {
	tests := []struct {
		name string
		ok   bool
	}{
		{name: "tsk-abc234", ok: true},
		{name: "A.b_c-1", ok: true},
		{name: "x"},
		{name: "-x"},
		{name: ".x"},
		{name: "a/b"},
		{name: "a b"},
		{name: strings.Repeat("a", maxNameLen+1)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.ok, validateName(tt.name) == nil)
		})
	}
}

func TestBuildContainer_IsolatedByDefault(t *testing.T) {
	cfg := testConfig()
	s := providers.Spec{Pool: "p", Image: "python:3.12", CPU: 1.5, MemoryMB: 512,
		Env: map[string]string{"A": "1", "HOME": "/root"}, Labels: map[string]string{"team": "rl"}}
	set, err := resolve(cfg, s)
	require.NoError(t, err)
	created := time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)
	cc, hc := buildContainer(cfg, s, set, launchPlan{name: "tsk-1", nonce: "n1", created: created})

	assert.Equal(t, "python:3.12", cc.Image)
	assert.Equal(t, "65534:65534", cc.User)
	assert.Equal(t, []string{agentPath}, []string(cc.Entrypoint))
	assert.Empty(t, cc.Cmd, "the image's command is not run")
	assert.Equal(t, DefaultWorkdir, cc.WorkingDir)
	assert.True(t, cc.OpenStdin && cc.StdinOnce && cc.AttachStdin, "the token arrives once on stdin")
	assert.Equal(t, []string{
		"A=1", "HOME=/root", "QUARRY_AGENT_ADDR=0.0.0.0:8000", "QUARRY_AGENT_TOKEN_FILE=/dev/stdin",
		"QUARRY_AGENT_WORKDIR=" + DefaultWorkdir,
	}, cc.Env, "sorted; the spec may set HOME; no token")
	assert.Equal(t, map[string]string{
		providers.LabelManaged: "true", providers.LabelPool: "p", providers.LabelTask: "tsk-1",
		providers.LabelGateway: "gw", labelNonce: "n1", labelCreated: "2026-01-02T03:04:05.000000006Z", "team": "rl",
	}, cc.Labels)
	assert.Equal(t, nat.PortSet{"8000/tcp": {}}, cc.ExposedPorts)

	assert.False(t, hc.Privileged)
	assert.Equal(t, []string{"ALL"}, []string(hc.CapDrop))
	assert.Equal(t, keptCapabilities(), []string(hc.CapAdd))
	assert.Equal(t, []string{"no-new-privileges"}, hc.SecurityOpt)
	assert.Equal(t, int64(1.5e9), hc.NanoCPUs)
	// memory + the work directory (as large as memory without a disk): its
	// tmpfs is charged to the same cgroup, and a limit of memory alone let
	// a full work directory OOM-kill the sandbox.
	assert.Equal(t, int64(512+512)<<20, hc.Memory)
	assert.Equal(t, hc.Memory, hc.MemorySwap)
	require.NotNil(t, hc.PidsLimit)
	assert.Equal(t, int64(DefaultPidsLimit), *hc.PidsLimit)
	assert.Equal(t, []mount.Mount{{Type: mount.TypeBind, Source: cfg.AgentBinary, Target: agentPath, ReadOnly: true}}, hc.Mounts)
	assert.Equal(t, map[string]string{DefaultWorkdir: "rw,exec,nosuid,nodev,size=512m,uid=65534,gid=65534"}, hc.Tmpfs)
	assert.Equal(t, nat.PortMap{"8000/tcp": {{HostIP: "127.0.0.1"}}}, hc.PortBindings, "published on loopback only")
	assert.Equal(t, container.NetworkMode("bridge"), hc.NetworkMode)
	assert.Equal(t, container.RestartPolicyDisabled, hc.RestartPolicy.Name)
	assert.Equal(t, "json-file", hc.LogConfig.Type)
	assert.Equal(t, logMaxSize, hc.LogConfig.Config["max-size"], "the log is bounded")
}

func TestBuildContainer_HostNetworkAndLimits(t *testing.T) {
	cfg := testConfig()
	tests := []struct {
		name  string
		spec  providers.Spec
		check func(t *testing.T, cc *container.Config, hc *container.HostConfig)
	}{
		{
			name: "host network: the agent binds the picked loopback port, nothing is published",
			spec: providers.Spec{Pool: "p", Image: "img", Options: map[string]string{OptionNetwork: NetworkHost}},
			check: func(t *testing.T, cc *container.Config, hc *container.HostConfig) {
				assert.Equal(t, container.NetworkMode("host"), hc.NetworkMode)
				assert.Empty(t, hc.PortBindings)
				assert.Empty(t, cc.ExposedPorts)
				assert.Contains(t, cc.Env, "QUARRY_AGENT_ADDR=127.0.0.1:41000")
				assert.Equal(t, "41000", cc.Labels[labelAgentPort])
			},
		},
		{
			name: "no cpu or memory: no limits, a default-sized work directory",
			spec: providers.Spec{Pool: "p", Image: "img"},
			check: func(t *testing.T, cc *container.Config, hc *container.HostConfig) {
				assert.Zero(t, hc.NanoCPUs)
				assert.Zero(t, hc.Memory)
				assert.Zero(t, hc.MemorySwap)
				assert.Equal(t, "rw,exec,nosuid,nodev,size=1024m,uid=65534,gid=65534", hc.Tmpfs[DefaultWorkdir])
			},
		},
		{
			name: "disk sizes the work directory and raises the memory limit by as much",
			spec: providers.Spec{Pool: "p", Image: "img", MemoryMB: 64, DiskMB: 16},
			check: func(t *testing.T, cc *container.Config, hc *container.HostConfig) {
				assert.Equal(t, "rw,exec,nosuid,nodev,size=16m,uid=65534,gid=65534", hc.Tmpfs[DefaultWorkdir])
				assert.Equal(t, int64(64+16)<<20, hc.Memory)
				assert.Equal(t, hc.Memory, hc.MemorySwap, "no swap")
			},
		},
		{
			name: "disk without memory: a bounded work directory, no memory limit",
			spec: providers.Spec{Pool: "p", Image: "img", DiskMB: 300},
			check: func(t *testing.T, cc *container.Config, hc *container.HostConfig) {
				assert.Equal(t, "rw,exec,nosuid,nodev,size=300m,uid=65534,gid=65534", hc.Tmpfs[DefaultWorkdir])
				assert.Zero(t, hc.Memory)
			},
		},
		{
			name: "work directory size option raises the memory limit by its size",
			spec: providers.Spec{Pool: "p", Image: "img", MemoryMB: 256, Options: map[string]string{OptionWorkdirSize: "32"}},
			check: func(t *testing.T, cc *container.Config, hc *container.HostConfig) {
				assert.Equal(t, int64(256+32)<<20, hc.Memory)
			},
		},
		{
			name: "work directory size option",
			spec: providers.Spec{Pool: "p", Image: "img", MemoryMB: 256, Options: map[string]string{OptionWorkdirSize: "32", OptionUser: "1000"}},
			check: func(t *testing.T, cc *container.Config, hc *container.HostConfig) {
				assert.Equal(t, "rw,exec,nosuid,nodev,size=32m,uid=1000,gid=1000", hc.Tmpfs[DefaultWorkdir])
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			set, err := resolve(cfg, tt.spec)
			require.NoError(t, err)
			plan := launchPlan{name: "t", nonce: "n"}
			if set.hostNetwork() {
				plan.hostPort = 41000
			}
			cc, hc := buildContainer(cfg, tt.spec, set, plan)
			tt.check(t, cc, hc)
		})
	}
}

func TestInvalidSpec_WrapsErrInvalidSpec(t *testing.T) {
	err := providers.InvalidSpec(providers.Spec{Pool: "p", Image: "img"}, "why")
	assert.True(t, errors.Is(err, providers.ErrInvalidSpec))
	assert.Equal(t, `launch pool "p" image "img": why`, err.Error())
}

// With the gateway's relay socket (Config.RelayDir), a container on a
// bridge gets its directory mounted read-only and its agent forwards the
// relay there; on the host's network the gateway's own address works, so
// nothing is mounted. SandboxRelayURL says which.
func TestBuildContainer_RelaySocket(t *testing.T) {
	cfg := testConfig()
	cfg.RelayDir = "/var/lib/quarry/relay"
	p := &Provider{cfg: cfg}
	tests := []struct {
		name     string
		spec     providers.Spec
		mounted  bool
		relayURL string
	}{
		{name: "bridge", spec: providers.Spec{Pool: "p", Image: "img"}, mounted: true, relayURL: "http://127.0.0.1:8000"},
		{name: "own network", spec: providers.Spec{Pool: "p", Image: "img", Options: map[string]string{OptionNetwork: "mine"}}, mounted: true, relayURL: "http://127.0.0.1:8000"},
		{name: "host network", spec: providers.Spec{Pool: "p", Image: "img", Options: map[string]string{OptionNetwork: NetworkHost}}},
		{name: "invalid spec", spec: providers.Spec{Pool: "p", Image: "img", Options: map[string]string{"nope": "1"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.relayURL, p.SandboxRelayURL(tt.spec))
			set, err := resolve(cfg, tt.spec)
			if err != nil {
				require.False(t, tt.mounted)
				return
			}
			cc, hc := buildContainer(cfg, tt.spec, set, launchPlan{name: "t", nonce: "n", hostPort: 41000})
			relayMount := mount.Mount{Type: mount.TypeBind, Source: cfg.RelayDir, Target: relayDir, ReadOnly: true}
			if tt.mounted {
				assert.Contains(t, hc.Mounts, relayMount)
				assert.Contains(t, cc.Env, "QUARRY_AGENT_RELAY_SOCKET=/run/quarry-relay/relay.sock")
			} else {
				assert.NotContains(t, hc.Mounts, relayMount)
				assert.NotContains(t, cc.Env, "QUARRY_AGENT_RELAY_SOCKET=/run/quarry-relay/relay.sock")
			}
		})
	}
	without := &Provider{cfg: testConfig()}
	assert.Empty(t, without.SandboxRelayURL(providers.Spec{Pool: "p", Image: "img"}), "no socket: the gateway's own address")
}
