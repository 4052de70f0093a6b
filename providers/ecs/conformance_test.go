package ecs

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ecs"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/internal/testenv"
	"github.com/quarryhq/quarry/providers"
	"github.com/quarryhq/quarry/providers/providertest"
)

// Why the conformance runs of this package skip the suite's agent checks
// (providertest.Harness.NoAgents): neither backend here runs a task. What
// the agent does in an ECS task (the init container's copy, the token
// derived from key and task ARN, the user, the read-only agent volume) is
// checked by tests/ecs_layout_test.go, which runs the task definition the
// provider renders on Docker.
const (
	noAgentsEmulator = "moto's ECS keeps tasks as API records: it starts no container, and each task's private IP is made up " +
		"(tests/ecs_layout_test.go runs the task definition's agent on Docker)"
	noAgentsFake = "the fake ECS API keeps tasks as records in memory " +
		"(tests/ecs_layout_test.go runs the task definition's agent on Docker)"
)

// conformanceSpecs are the spec the suite launches and one the provider
// refuses before any call (no Fargate size has 32 vCPU and 1 GiB).
func conformanceSpecs() (spec, bad providers.Spec) {
	spec = testSpec()
	bad = testSpec()
	bad.CPU = 32
	return spec, bad
}

// clusterOf returns the cluster in a task ARN
// (arn:aws:ecs:region:account:task/cluster/id).
func clusterOf(t *testing.T, arn string) string {
	t.Helper()
	parts := strings.Split(arn, "/")
	require.Len(t, parts, 3, "task ARN %q", arn)
	return parts[1]
}

// stopFromOutside stops a task through the ECS API itself, as an operator
// or ECS would: the provider is not involved.
func stopFromOutside(t *testing.T, api API, task providers.Task) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := api.StopTask(ctx, &ecs.StopTaskInput{Cluster: aws.String(clusterOf(t, task.ID)),
		Task: aws.String(task.ID), Reason: aws.String("killed from outside by providertest")})
	require.NoError(t, err)
}

// TestProvider_Conformance_Emulator runs the provider conformance suite
// against the emulator's ECS API (moto), on a cluster of its own per
// subtest: every check of the contract that the API's records can show.
// The checks that talk to agents are skipped (noAgentsEmulator).
func TestProvider_Conformance_Emulator(t *testing.T) {
	endpoint := testenv.AWS(t)
	client := emulatorClient(t)
	spec, bad := conformanceSpecs()
	providertest.Run(t, providertest.Harness{
		Open: func(t *testing.T) func(t *testing.T) providers.Provider {
			e := newEmulator(t, endpoint)
			cfg := e.config()
			return func(t *testing.T) providers.Provider { return newTestProvider(t, cfg, e.client) }
		},
		Spec:    spec,
		BadSpec: bad,
		KillTask: func(t *testing.T, task providers.Task) {
			stopFromOutside(t, client, task)
		},
		NoAgents: noAgentsEmulator,
	})
}

// TestProvider_Conformance_Fake runs the same suite against fakeECS (ECS's
// limits, no network), so that plain go test runs it too.
func TestProvider_Conformance_Fake(t *testing.T) {
	f := newFake()
	spec, bad := conformanceSpecs()
	providertest.Run(t, providertest.Harness{
		Open: func(t *testing.T) func(t *testing.T) providers.Provider {
			cfg := testConfig()
			cfg.GatewayID = "gw-" + strings.ReplaceAll(strings.ToLower(t.Name()), "/", "-")
			return func(t *testing.T) providers.Provider { return newTestProvider(t, cfg, f) }
		},
		Spec:    spec,
		BadSpec: bad,
		KillTask: func(t *testing.T, task providers.Task) {
			stopFromOutside(t, f, task)
		},
		NoAgents: noAgentsFake,
	})
}
