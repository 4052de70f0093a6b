//go:build integration

package tests

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/client"
	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/providers"
	"github.com/quarryhq/quarry/providers/docker"
)

// dockerTwoPools are two pools of different images: busybox only, and bash.
const dockerTwoPools = `pools:
  - name: plain
    image: quarry-test/busybox:latest
    cpu: 0.5
    memory: 256Mi
    min_warm: 1
    max_total: 4
  - name: bash
    image: quarry-test/bash:latest
    cpu: 0.5
    memory: 256Mi
    min_warm: 1
    max_total: 4
`

// Two pools with different images in one gateway: each sandbox runs its
// pool's image, and lease settings reach the sandbox through the agent only.
func TestDocker_TwoPoolsServeTheirOwnImages(t *testing.T) {
	d := requireDocker(t)
	g, c, ctx := d.startTwoPools()
	g.waitReady("bash", 1)

	tests := []struct {
		pool     string
		image    string
		bashCode int
	}{
		{pool: "plain", image: dockerImageBusybox, bashCode: 127},
		{pool: "bash", image: dockerImageBash, bashCode: 0},
	}
	for _, tt := range tests {
		t.Run(tt.pool, func(t *testing.T) {
			sbx, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Pool: tt.pool, Env: map[string]string{"LEASE_VAR": "lease-" + tt.pool}})
			require.NoError(t, err)
			res, err := c.Exec(ctx, sbx.ID, agentapi.ExecRequest{Command: "bash --version"})
			require.NoError(t, err)
			assert.Equal(t, tt.bashCode, res.ExitCode, "bash --version in pool %s: %s%s", tt.pool, res.Stdout, res.Stderr)

			res, err = c.Exec(ctx, sbx.ID, agentapi.ExecRequest{Command: "echo $LEASE_VAR; id -u; hostname"})
			require.NoError(t, err)
			lines := strings.Split(strings.TrimSpace(res.Stdout), "\n")
			require.Len(t, lines, 3, res.Stdout)
			assert.Equal(t, "lease-"+tt.pool, lines[0], "the lease's env reaches commands")
			assert.Equal(t, "65534", lines[1])

			info, err := d.cli.ContainerInspect(ctx, d.containerOf(lines[2]))
			require.NoError(t, err)
			assert.Equal(t, tt.image, info.Config.Image)
			assert.Equal(t, tt.pool, info.Config.Labels[providers.LabelPool])
			for _, kv := range info.Config.Env {
				assert.NotContains(t, kv, "LEASE_VAR", "nothing of the lease is baked into the container")
			}
		})
	}
}

// A container killed from outside: the next call on its sandbox is a clear
// error, not a hang; the lease is lost and the pool refills.
func TestDocker_KilledContainerLosesItsLeaseAndPoolRefills(t *testing.T) {
	d := requireDocker(t)
	g, c, ctx := d.startTwoPools()

	sbx, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Pool: "plain"})
	require.NoError(t, err)
	res, err := c.Exec(ctx, sbx.ID, agentapi.ExecRequest{Command: "hostname"})
	require.NoError(t, err)
	victim := d.containerOf(res.Stdout)
	require.NoError(t, d.cli.ContainerKill(ctx, victim, "KILL"))

	callCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	_, err = c.Exec(callCtx, sbx.ID, agentapi.ExecRequest{Command: "echo still here"})
	require.Error(t, err, "a call on a killed sandbox fails")
	require.NoError(t, callCtx.Err(), "the call returned instead of hanging")
	var cerr *client.Error
	require.ErrorAs(t, err, &cerr)
	assert.Contains(t, []int{502, 410}, cerr.Status, "agent unreachable or lease gone: %v", err)

	eventually(t, dockerWait, "the lease is lost", func() error {
		got, err := c.GetSandbox(ctx, sbx.ID)
		if err != nil {
			return err
		}
		if got.State != client.StateLost {
			return fmt.Errorf("state %s", got.State)
		}
		assert.Contains(t, got.Reason, "exited with code 137")
		return nil
	})
	_, err = c.Exec(ctx, sbx.ID, agentapi.ExecRequest{Command: "true"})
	require.ErrorAs(t, err, &cerr)
	assert.Equal(t, 410, cerr.Status, "a lost sandbox answers 410: %v", err)

	g.waitReady("plain", 1)
	eventually(t, dockerWait, "the killed container is removed", func() error {
		for _, ct := range d.containers("plain") {
			if ct.ID == victim {
				return fmt.Errorf("container %s is still there (%s)", victim[:12], ct.Status)
			}
		}
		return nil
	})
	fresh, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Pool: "plain"})
	require.NoError(t, err)
	res, err = c.Exec(ctx, fresh.ID, agentapi.ExecRequest{Command: "echo fresh"})
	require.NoError(t, err)
	assert.Equal(t, "fresh\n", res.Stdout)
}

// A restart of dockerd: the gateway recovers without a restart of its own.
// With live-restore off (Debian's default) the containers stop, their
// leases are lost and the pools refill; with it on, they survive.
func TestDocker_EngineRestartGatewayRecovers(t *testing.T) {
	d := requireDocker(t)
	g, c, ctx := d.startTwoPools()
	sbx, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Pool: "plain"})
	require.NoError(t, err)
	gatewayPID := g.cmd.Process.Pid

	d.restartEngine()

	eventually(t, dockerWait, "the sandbox is lost or answers again", func() error {
		got, err := c.GetSandbox(ctx, sbx.ID)
		if err != nil {
			return err
		}
		if got.State == client.StateLost {
			return nil
		}
		_, err = c.Exec(ctx, sbx.ID, agentapi.ExecRequest{Command: "true"})
		return err
	})
	g.waitReady("plain", 1)
	g.waitReady("bash", 1)
	fresh, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Pool: "bash"})
	require.NoError(t, err)
	res, err := c.Exec(ctx, fresh.ID, agentapi.ExecRequest{Command: "bash -c 'echo recovered'"})
	require.NoError(t, err)
	assert.Equal(t, "recovered\n", res.Stdout)
	require.NotNil(t, g.cmd, "the gateway was not restarted")
	assert.Equal(t, gatewayPID, g.cmd.Process.Pid, "the gateway was not restarted")
	select {
	case <-g.exited:
		t.Fatal("the gateway exited during the engine's restart")
	default:
	}
}

// Labelled containers that no task record accounts for are removed once
// older than the grace period, and only logged in dry-run mode.
func TestDocker_OrphanContainersRemovedAfterGrace(t *testing.T) {
	needDocker(t)
	tests := []struct {
		name   string
		dryRun bool
	}{
		{name: "removed", dryRun: false},
		{name: "dry run leaves them", dryRun: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := requireDocker(t)
			const grace = 3 * time.Second
			// An orphan: launched by a provider with this gateway's id and
			// labels, never recorded in the gateway's store.
			prov, err := docker.New(docker.Config{
				AgentBinary: bins.agent, GatewayID: d.gatewayID,
				TokenKeyFile: filepath.Join(t.TempDir(), "token.key"),
			}, slog.New(slog.DiscardHandler))
			require.NoError(t, err)
			t.Cleanup(func() { _ = prov.Close(context.Background()) })
			orphans, err := prov.Launch(ctx(t), providers.Spec{Pool: "plain", Image: dockerImageBusybox}, []string{"orphan-" + d.gatewayID})
			require.NoError(t, err)
			require.Len(t, orphans, 1)
			orphan := orphans[0]

			g, _, _ := d.startTwoPools(withEnv(
				"QUARRY_ORPHAN_INTERVAL=200ms", "QUARRY_ORPHAN_GRACE="+grace.String(),
				fmt.Sprintf("QUARRY_ORPHAN_DRY_RUN=%t", tt.dryRun),
			))
			if tt.dryRun {
				eventually(t, dockerWait, "the dry run logs the orphan", func() error {
					if !strings.Contains(g.logs(), "orphan task (dry run: left running)") || !strings.Contains(g.logs(), orphan.ID) {
						return errors.New("not logged yet")
					}
					return nil
				})
				assert.True(t, d.running("plain")[orphan.ID], "a dry run leaves the orphan running")
				return
			}
			eventually(t, dockerWait, "the orphan is removed", func() error {
				for _, ct := range d.containers("plain") {
					if ct.ID == orphan.ID {
						return fmt.Errorf("still there (%s)", ct.Status)
					}
				}
				return nil
			})
			assert.GreaterOrEqual(t, time.Since(orphan.CreatedAt), grace, "not removed before the grace period")
			assert.NotEmpty(t, d.running("plain"), "the pool's own containers stay")
		})
	}
}
