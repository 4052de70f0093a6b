package ecs

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/ecs"
	"github.com/aws/aws-sdk-go-v2/service/ecs/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/internal/testenv"
	"github.com/quarryhq/quarry/providers"
)

// runID and clusterSeq make this run's cluster names unique.
var (
	runID      = fmt.Sprintf("%x", time.Now().UnixNano()&0xffffffffff)
	clusterSeq atomic.Int64
)

// emulator is one test's cluster on the emulator.
type emulator struct {
	client  *ecs.Client
	cluster string
	subnet  string
}

// newEmulator checks that the ECS API at endpoint (AWS_ENDPOINT_URL, which
// testenv.AWS returns; the SDK's default chain reads it too) answers,
// creates a cluster that it deletes when t ends, keeps moto's tasks in the
// status they are put in (moto otherwise moves a task one status on per
// describe), and finds a subnet of moto's default VPC (awsvpc tasks need an
// existing subnet). The tests that call it need the emulator: they ask
// testenv.AWS first.
func newEmulator(t *testing.T, endpoint string) *emulator {
	t.Helper()
	require.NotEmpty(t, endpoint, "the emulator tests need AWS_ENDPOINT_URL (moto): its state manager and EC2 API are not AWS's")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := emulatorClient(t)
	_, err := c.ListClusters(ctx, &ecs.ListClustersInput{MaxResults: aws.Int32(1)})
	require.NoError(t, err, "%s=1 but the ECS endpoint (AWS_ENDPOINT_URL=%q) does not answer", testenv.EnvAWS, endpoint)

	postEmulator(t, endpoint+"/moto-api/state-manager/set-transition", "application/json", "",
		`{"model_name": "ecs::task", "transition": {"progression": "manual", "times": 1000000}}`)
	body := postEmulator(t, endpoint+"/", "application/x-www-form-urlencoded", "ec2",
		"Action=DescribeSubnets&Version=2016-11-15&Filter.1.Name=default-for-az&Filter.1.Value.1=true")
	m := regexp.MustCompile(`<subnetId>(subnet-[0-9a-f]+)</subnetId>`).FindStringSubmatch(body)
	require.NotNil(t, m, "no default subnet in the emulator's answer: %.500s", body)

	e := &emulator{client: c, cluster: fmt.Sprintf("quarry-ecs-test-%s-%d", runID, clusterSeq.Add(1)), subnet: m[1]}
	_, err = c.CreateCluster(ctx, &ecs.CreateClusterInput{ClusterName: aws.String(e.cluster)})
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for _, status := range []string{"RUNNING", "STOPPED"} {
			out, err := c.ListTasks(ctx, &ecs.ListTasksInput{Cluster: aws.String(e.cluster), DesiredStatus: types.DesiredStatus(status)})
			if err != nil {
				t.Errorf("list %s tasks for clean-up: %v", status, err)
				break
			}
			for _, arn := range out.TaskArns {
				_, _ = c.StopTask(ctx, &ecs.StopTaskInput{Cluster: aws.String(e.cluster), Task: aws.String(arn), Reason: aws.String("test clean-up")})
			}
		}
		if _, err := c.DeleteCluster(ctx, &ecs.DeleteClusterInput{Cluster: aws.String(e.cluster)}); err != nil {
			t.Errorf("delete test cluster: %v", err)
		}
	})
	return e
}

// emulatorClient returns an ECS client from the SDK's default chain
// (emulatorConfig).
func emulatorClient(t *testing.T) *ecs.Client {
	t.Helper()
	return ecs.NewFromConfig(emulatorConfig(t))
}

// emulatorConfig is the SDK's default configuration (AWS_ENDPOINT_URL,
// credentials; region us-east-1 when none is set).
func emulatorConfig(t *testing.T) aws.Config {
	t.Helper()
	cfg, err := config.LoadDefaultConfig(t.Context())
	require.NoError(t, err, "load the AWS SDK config")
	if cfg.Region == "" {
		cfg.Region = "us-east-1"
	}
	return cfg
}

// postEmulator posts body to one of the emulator's endpoints (service, when
// set, routes an unsigned query API call) and returns the answer.
func postEmulator(t *testing.T, url, contentType, service, body string) string {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", contentType)
	if service != "" {
		req.Header.Set("Authorization", "AWS4-HMAC-SHA256 Credential=test/20260101/us-east-1/"+service+"/aws4_request, SignedHeaders=host, Signature=0")
	}
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var b bytes.Buffer
	_, err = io.Copy(&b, io.LimitReader(resp.Body, 1<<20))
	require.NoError(t, err)
	require.True(t, resp.StatusCode/100 == 2, "%s: %d %.500s", url, resp.StatusCode, b.String())
	return b.String()
}

// config returns a provider config for the emulator's cluster.
func (e *emulator) config() Config {
	cfg := testConfig()
	cfg.Cluster, cfg.Subnets = e.cluster, []string{e.subnet}
	cfg.PollInterval, cfg.RetryBase, cfg.RetryMax = 100*time.Millisecond, 50*time.Millisecond, time.Second
	cfg.RunTaskRate, cfg.RunTaskBurst, cfg.LaunchRate, cfg.LaunchBurst = 20, 20, 20, 100
	return cfg
}

func TestProvider_Emulator_RoundTrip(t *testing.T) {
	e := newEmulator(t, testenv.AWS(t))
	ctx := testCtx(t)
	spec := testSpec()
	spec.Pool = "emu-" + runID
	spec.Options = map[string]string{"capacity_provider": "FARGATE_SPOT:3,FARGATE:1"}
	first := newTestProvider(t, e.config(), e.client)

	tasks, err := first.Launch(ctx, spec, []string{"e-0", "e-1", "e-2"})
	require.NoError(t, err)
	require.Len(t, tasks, 3)
	tokens := map[string]bool{}
	for _, task := range tasks {
		assert.Equal(t, providers.TaskRunning, task.State)
		assert.Regexp(t, `^http://\d+\.\d+\.\d+\.\d+:8000$`, task.AgentURL, "the private IP of the task's network attachment")
		tokens[task.AgentToken] = true
	}
	assert.Len(t, tokens, 3)

	// One RunTask call (count 3) started them, then TagResource named each.
	described, err := e.client.DescribeTasks(ctx, &ecs.DescribeTasksInput{Cluster: aws.String(e.cluster),
		Tasks: []string{tasks[0].ID, tasks[1].ID, tasks[2].ID}, Include: []types.TaskField{types.TaskFieldTags}})
	require.NoError(t, err)
	require.Len(t, described.Tasks, 3)
	batches := map[string]bool{}
	for _, et := range described.Tasks {
		tags := tagMap(et.Tags)
		batches[tags[tagBatch]] = true
		assert.Regexp(t, `^e-[0-2]$`, tags[providers.LabelTask], "named after RunTask")
	}
	assert.Len(t, batches, 1, "one RunTask call")
	for _, task := range tasks {
		assert.Equal(t, agentapi.DeriveToken(e.config().TokenKey, task.ID), task.AgentToken, "the token is bound to the task ARN")
	}

	// The task definition was registered once, with the shape the docs give.
	out, err := e.client.DescribeTasks(ctx, &ecs.DescribeTasksInput{Cluster: aws.String(e.cluster), Tasks: []string{tasks[0].ID}})
	require.NoError(t, err)
	require.Len(t, out.Tasks, 1)
	tdArn := aws.ToString(out.Tasks[0].TaskDefinitionArn)
	assert.Regexp(t, `task-definition/quarry-emu-[0-9a-f]+-[0-9a-f]{16}:1$`, tdArn, "one revision")
	def, err := e.client.DescribeTaskDefinition(ctx, &ecs.DescribeTaskDefinitionInput{TaskDefinition: aws.String(tdArn)})
	require.NoError(t, err)
	require.Len(t, def.TaskDefinition.ContainerDefinitions, 2)
	assert.Equal(t, "QUARRY_AGENT_TOKEN_KEY", aws.ToString(def.TaskDefinition.ContainerDefinitions[1].Secrets[0].Name))

	// A restarted gateway finds the tasks, with the same tokens, and
	// launches from the same task definition.
	second := newTestProvider(t, e.config(), e.client)
	list, err := second.List(ctx, spec.Pool)
	require.NoError(t, err)
	require.Len(t, list, 3)
	byName := map[string]providers.Task{}
	for _, task := range list {
		byName[task.Name] = task
		assert.False(t, task.CreatedAt.IsZero(), "creation time (for the orphan sweep's grace period)")
	}
	for _, task := range tasks {
		assert.Equal(t, task.ID, byName[task.Name].ID)
		assert.Equal(t, task.AgentToken, byName[task.Name].AgentToken)
	}
	more, err := second.Launch(ctx, spec, []string{"e-3"})
	require.NoError(t, err)
	require.Len(t, more, 1)
	out, err = e.client.DescribeTasks(ctx, &ecs.DescribeTasksInput{Cluster: aws.String(e.cluster), Tasks: []string{more[0].ID}})
	require.NoError(t, err)
	assert.Equal(t, tdArn, aws.ToString(out.Tasks[0].TaskDefinitionArn), "looked up, not registered again")

	// Killed from outside, stopped by the provider, unknown ids.
	_, err = e.client.StopTask(ctx, &ecs.StopTaskInput{Cluster: aws.String(e.cluster), Task: aws.String(tasks[0].ID), Reason: aws.String("killed by an operator")})
	require.NoError(t, err)
	require.NoError(t, second.Stop(ctx, tasks[1].ID, "lease released"))
	require.NoError(t, second.Stop(ctx, tasks[1].ID, "again"), "idempotent")
	unknown := strings.TrimSuffix(tasks[2].ID, tasks[2].ID[len(tasks[2].ID)-8:]) + "00000000"
	require.NoError(t, second.Stop(ctx, unknown, "unknown"))
	got, err := second.Describe(ctx, []string{tasks[0].ID, tasks[1].ID, tasks[2].ID, unknown})
	require.NoError(t, err)
	require.Len(t, got, 4)
	assert.Equal(t, providers.TaskStopped, got[0].State)
	assert.Contains(t, got[0].Reason, "killed by an operator")
	assert.Equal(t, providers.TaskStopped, got[1].State)
	assert.Contains(t, got[1].Reason, "lease released")
	assert.Equal(t, providers.TaskRunning, got[2].State)
	assert.Equal(t, providers.Task{ID: unknown, State: providers.TaskStopped, Reason: "not found"}, got[3])

	all, err := first.List(ctx, "")
	require.NoError(t, err)
	assert.Len(t, all, 4, "stopped tasks are listed while ECS reports them")
	other := e.config()
	other.GatewayID = "another-gateway"
	foreign, err := newTestProvider(t, other, e.client).List(ctx, "")
	require.NoError(t, err)
	assert.Empty(t, foreign, "another gateway sees none of them")
}

func TestProvider_Emulator_BadSpecFailsWithLaunchError(t *testing.T) {
	e := newEmulator(t, testenv.AWS(t))
	tests := []struct {
		name   string
		mutate func(*providers.Spec)
		want   string
	}{
		{"size fargate does not have", func(s *providers.Spec) { s.CPU = 32 }, "cpu:"},
		{"task definition ECS does not have", func(s *providers.Spec) {
			s.Options = map[string]string{"task_definition": "quarry-no-such-definition"}
		}, "run task:"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec := testSpec()
			spec.Pool = "bad-" + runID
			tt.mutate(&spec)
			tasks, err := newTestProvider(t, e.config(), e.client).Launch(testCtx(t), spec, []string{"b-0"})
			var le *providers.LaunchError
			require.ErrorAs(t, err, &le, "%v", err)
			assert.ErrorIs(t, err, providers.ErrInvalidSpec)
			assert.Contains(t, le.Reason, tt.want)
			assert.Empty(t, tasks)
		})
	}
}

// A pool's disk becomes the registered task definition's ephemeral storage.
func TestProvider_Emulator_DiskIsEphemeralStorage(t *testing.T) {
	e := newEmulator(t, testenv.AWS(t))
	ctx := testCtx(t)
	spec := testSpec()
	spec.Pool = "emu-disk-" + runID
	spec.DiskMB = 30 * 1024
	p := newTestProvider(t, e.config(), e.client)
	tasks, err := p.Launch(ctx, spec, []string{"d-0"})
	require.NoError(t, err)
	require.Len(t, tasks, 1)
	out, err := e.client.DescribeTasks(ctx, &ecs.DescribeTasksInput{Cluster: aws.String(e.cluster), Tasks: []string{tasks[0].ID}})
	require.NoError(t, err)
	require.Len(t, out.Tasks, 1)
	def, err := e.client.DescribeTaskDefinition(ctx, &ecs.DescribeTaskDefinitionInput{TaskDefinition: out.Tasks[0].TaskDefinitionArn})
	require.NoError(t, err)
	require.NotNil(t, def.TaskDefinition.EphemeralStorage, "the definition has ephemeral storage")
	assert.Equal(t, int32(30), def.TaskDefinition.EphemeralStorage.SizeInGiB)
	require.NoError(t, p.Stop(ctx, tasks[0].ID, "done"))
}
