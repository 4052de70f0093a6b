package ecs

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ecs"
	"github.com/aws/aws-sdk-go-v2/service/ecs/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/internal/testenv"
	"github.com/quarryhq/quarry/providers"
)

// countingAPI counts the RegisterTaskDefinition calls that reach ECS.
type countingAPI struct {
	API
	registers atomic.Int64
}

func (c *countingAPI) RegisterTaskDefinition(ctx context.Context, in *ecs.RegisterTaskDefinitionInput, optFns ...func(*ecs.Options)) (*ecs.RegisterTaskDefinitionOutput, error) {
	c.registers.Add(1)
	return c.API.RegisterTaskDefinition(ctx, in, optFns...)
}

// On-demand task definitions against the emulator's ECS: a burst of new
// images is registered once per image and class within the register rate
// (admissions counted on the limiter's clock), a second provider (another
// replica) reuses them without registering, their tasks carry their class,
// and ForgetImage deregisters (idempotently); the image is then registered
// again.
func TestProvider_Emulator_OnDemandTaskDefinitions(t *testing.T) {
	e := newEmulator(t, testenv.AWS(t))
	ctx := testCtx(t)
	const (
		rateHz = 20.0 // AWS: 1/s; scaled up so that the test is quick
		burst  = 3    // AWS: 20
		images = 10
	)
	cfg := e.config()
	cfg.RegisterRate, cfg.RegisterBurst = rateHz, burst
	api := &countingAPI{API: e.client}
	rec := &admissions{l: newCallRate(rateHz, burst)}
	first, err := New(cfg, api, Deps{Register: rec})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, first.Close(context.Background())) })

	specs := make([]providers.Spec, 0, images+1)
	for i := range images {
		specs = append(specs, onDemandSpec("default", fmt.Sprintf("registry.example/%s/task-%d:1", e.cluster, i)))
	}
	specs = append(specs, onDemandSpec("big", specs[0].Image)) // the same image in another class
	refs := make([]string, len(specs))
	var wg sync.WaitGroup
	for i, spec := range specs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			info, err := first.PrepareImage(ctx, spec)
			if assert.NoError(t, err) {
				assert.Equal(t, providers.ImageReady, info.State)
				refs[i] = info.Ref
			}
		}()
	}
	wg.Wait()
	t.Cleanup(func() { // the emulator's task definitions outlive the test's cluster
		for i, spec := range specs {
			assert.NoError(t, first.ForgetImage(context.Background(), spec, refs[i]))
		}
	})
	assert.Equal(t, int64(len(specs)), api.registers.Load(), "one registration per image and class")
	assert.NotEqual(t, refs[0], refs[images], "another class, another task definition")
	for _, ref := range refs {
		assert.Regexp(t, `task-definition/quarry-i-[a-z]+-[0-9a-f]+-[0-9a-f]{16}:1$`, ref)
	}
	checkAdmissions(t, rec.times(), rateHz, burst)

	replica := &countingAPI{API: e.client}
	second, err := New(cfg, replica, Deps{})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, second.Close(context.Background())) })
	for i, spec := range specs {
		info, err := second.PrepareImage(ctx, spec)
		require.NoError(t, err)
		assert.Equal(t, refs[i], info.Ref, "found, not registered again")
	}
	assert.Zero(t, replica.registers.Load())

	tasks, err := second.Launch(ctx, specs[0], []string{"od-0"})
	require.NoError(t, err)
	require.Len(t, tasks, 1)
	assert.Equal(t, "default", tasks[0].Labels[providers.LabelClass])
	described, err := e.client.DescribeTasks(ctx, &ecs.DescribeTasksInput{Cluster: aws.String(e.cluster), Tasks: []string{tasks[0].ID}, Include: []types.TaskField{types.TaskFieldTags}})
	require.NoError(t, err)
	require.Len(t, described.Tasks, 1)
	assert.Equal(t, refs[0], aws.ToString(described.Tasks[0].TaskDefinitionArn))
	assert.Equal(t, "default", tagMap(described.Tasks[0].Tags)[providers.LabelClass], "an on-demand pool's task carries its class")
	require.NoError(t, second.Stop(ctx, tasks[0].ID, "done"))

	require.NoError(t, first.ForgetImage(ctx, specs[0], refs[0]))
	def, err := e.client.DescribeTaskDefinition(ctx, &ecs.DescribeTaskDefinitionInput{TaskDefinition: aws.String(refs[0])})
	require.NoError(t, err)
	assert.Equal(t, types.TaskDefinitionStatusInactive, def.TaskDefinition.Status, "deregistered")
	require.NoError(t, second.ForgetImage(ctx, specs[0], refs[0]), "idempotent, from any replica")

	again, err := first.PrepareImage(ctx, specs[0])
	require.NoError(t, err)
	assert.Equal(t, strings.TrimSuffix(refs[0], ":1")+":2", again.Ref, "registered again: the family's next revision")
	assert.Equal(t, int64(len(specs)+1), api.registers.Load())
	refs[0] = again.Ref
}
