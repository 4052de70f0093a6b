package ecssim

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/ecs"
	"github.com/aws/aws-sdk-go-v2/service/ecs/types"
	"github.com/aws/smithy-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/bench/agentsim"
	"github.com/quarryhq/quarry/execagent/agentapi"
)

var testKey = []byte(strings.Repeat("k", 32))

// start serves a simulator with cfg until t ends and returns an SDK client
// of it that never retries (each call is one request).
func start(t *testing.T, cfg Config) (*Server, *ecs.Client) {
	t.Helper()
	if cfg.AddrBase == 0 { // a block of its own per test, away from 127.0.0.1
		cfg.AddrBase, cfg.AddrBlocks = 150+rand.IntN(90), 1
	}
	sim, err := New(cfg)
	require.NoError(t, err)
	url, err := sim.Start("127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		assert.NoError(t, sim.Close(ctx))
	})
	return sim, client(url)
}

func client(url string) *ecs.Client {
	return ecs.New(ecs.Options{
		BaseEndpoint: aws.String(url), Region: "us-east-1", Retryer: aws.NopRetryer{},
		Credentials: credentials.NewStaticCredentialsProvider("test", "test", ""),
		HTTPClient:  &http.Client{Transport: wholeBody{http.DefaultTransport}},
	})
}

// wholeBody reads each answer whole before the SDK decodes it. Under the
// race detector about one RunTask in a hundred failed to decode with "use
// of closed network connection" on the client's side of the connection,
// with the SDK's own transport and with a plain one, while the same
// requests read with io.ReadAll (or a json.Decoder) never failed: the
// answers are whole, and something in the SDK's read path lets the
// connection close under it. One request per call stays one request (no
// retries), as the tests count them.
type wholeBody struct{ next http.RoundTripper }

func (b wholeBody) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := b.next.RoundTrip(r)
	if err != nil {
		return nil, err
	}
	data, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		return nil, err
	}
	resp.Body = io.NopCloser(bytes.NewReader(data))
	return resp, nil
}

// farm is an agent farm closed when t ends.
func farm(t *testing.T) *agentsim.Farm {
	f := agentsim.NewFarm(agentsim.Config{})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		assert.NoError(t, f.Close(ctx))
	})
	return f
}

func register(t *testing.T, c *ecs.Client, family string) string {
	t.Helper()
	return registerImage(t, c, family, "python:3.12")
}

func runInput(def string, count int) *ecs.RunTaskInput {
	return &ecs.RunTaskInput{
		Cluster: aws.String("quarry"), TaskDefinition: aws.String(def), Count: aws.Int32(int32(count)),
		NetworkConfiguration: &types.NetworkConfiguration{AwsvpcConfiguration: &types.AwsVpcConfiguration{
			Subnets: []string{"subnet-0123456789abcdef0"}, AssignPublicIp: types.AssignPublicIpDisabled,
		}},
		StartedBy: aws.String("quarry-test"),
		Tags:      []types.Tag{{Key: aws.String("quarry.managed"), Value: aws.String("true")}},
	}
}

// apiCode returns err's API error code and message.
func apiCode(err error) (string, string) {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return ae.ErrorCode(), ae.ErrorMessage()
	}
	return "", ""
}

func TestRunTask_RefusesCountsOutsideOneToTen(t *testing.T) {
	_, c := start(t, Config{})
	def := register(t, c, "fam")
	for _, n := range []int{0, 11} {
		_, err := c.RunTask(context.Background(), runInput(def, n))
		code, msg := apiCode(err)
		assert.Equal(t, "InvalidParameterException", code, n)
		assert.Contains(t, msg, "between 1 and 10")
	}
}

func TestRunTask_CallBucketThrottles(t *testing.T) {
	// A bucket that refills slowly enough that a slow machine cannot
	// refill a call while the burst is spent.
	sim, c := start(t, Config{LaunchBurst: 1000, LaunchRate: 1000, RunTaskRate: 0.01})
	def := register(t, c, "fam")
	ctx := context.Background()
	for i := range DefaultRunTaskBurst {
		_, err := c.RunTask(ctx, runInput(def, 1))
		require.NoError(t, err, "call %d is within the burst", i)
	}
	_, err := c.RunTask(ctx, runInput(def, 1))
	code, msg := apiCode(err)
	assert.Equal(t, "ThrottlingException", code)
	assert.Equal(t, "Rate exceeded", msg)
	st := sim.Stats()
	assert.Equal(t, int64(1), st.RefusedCallRate)
	assert.Equal(t, int64(1), st.Operations["RunTask"].Throttled)
	assert.Equal(t, int64(DefaultRunTaskBurst), st.Launched)
}

func TestRunTask_LaunchBucket_Burst100Then20PerSecond(t *testing.T) {
	t.Run("a burst of 100", func(t *testing.T) {
		// A refill too slow to matter while the burst is spent.
		sim, c := start(t, Config{RunTaskBurst: 1000, RunTaskRate: 1000, LaunchRate: 0.001})
		def := register(t, c, "fam")
		ctx := context.Background()
		for i := range 10 {
			_, err := c.RunTask(ctx, runInput(def, 10))
			require.NoError(t, err, "call %d is within the burst of 100 tasks", i)
		}
		_, err := c.RunTask(ctx, runInput(def, 10))
		code, msg := apiCode(err)
		assert.Equal(t, "InvalidParameterException", code, "the launch bucket refuses as users report")
		assert.Equal(t, "Rate exceeded", msg)
		assert.Equal(t, int64(1), sim.Stats().RefusedLaunchRate)
		assert.Equal(t, int64(100), sim.Stats().Launched)
	})
	t.Run("refilled at 20 a simulated second", func(t *testing.T) {
		// At time scale 0.5 the bucket refills at 40 tasks a wall second:
		// the 10 tasks a call needs take 250 ms.
		sim, c := start(t, Config{TimeScale: 0.5, RunTaskBurst: 1000, RunTaskRate: 1000, LaunchBurst: 10})
		def := register(t, c, "fam")
		ctx := context.Background()
		_, err := c.RunTask(ctx, runInput(def, 10))
		require.NoError(t, err)
		begin := time.Now()
		_, err = c.RunTask(ctx, runInput(def, 10))
		if time.Since(begin) < 200*time.Millisecond { // a slow machine may have refilled it meanwhile
			code, _ := apiCode(err)
			assert.Equal(t, "InvalidParameterException", code, "the bucket is empty")
		}
		time.Sleep(260 * time.Millisecond) // 0.52 simulated s refills 10 tasks
		_, err = c.RunTask(ctx, runInput(def, 10))
		require.NoError(t, err)
		assert.GreaterOrEqual(t, sim.Stats().Launched, int64(20))
	})
}

func TestRunTask_LaunchRefusalAsFailures(t *testing.T) {
	_, c := start(t, Config{LaunchRefusal: RefuseWithFailures, LaunchBurst: 15, RunTaskBurst: 100})
	def := register(t, c, "fam")
	ctx := context.Background()
	out, err := c.RunTask(ctx, runInput(def, 10))
	require.NoError(t, err)
	assert.Len(t, out.Tasks, 10)
	out, err = c.RunTask(ctx, runInput(def, 10))
	require.NoError(t, err)
	assert.Len(t, out.Tasks, 5, "the bucket covers 5 more")
	require.Len(t, out.Failures, 5)
	assert.Equal(t, "Rate exceeded", aws.ToString(out.Failures[0].Reason))
}

func TestRunTask_FargateSpotHasItsOwnBucket(t *testing.T) {
	_, c := start(t, Config{LaunchBurst: 10, RunTaskBurst: 100})
	def := register(t, c, "fam")
	ctx := context.Background()
	in := runInput(def, 10)
	_, err := c.RunTask(ctx, in)
	require.NoError(t, err)
	// The SDK fills in an idempotency token when the input has none, into
	// the input itself: a new call needs a new token.
	in.ClientToken = nil
	in.CapacityProviderStrategy = []types.CapacityProviderStrategyItem{{CapacityProvider: aws.String("FARGATE_SPOT"), Weight: 1}}
	out, err := c.RunTask(ctx, in)
	require.NoError(t, err, "FARGATE's bucket is empty, FARGATE_SPOT's full")
	require.Len(t, out.Tasks, 10)
	assert.Equal(t, "FARGATE_SPOT", aws.ToString(out.Tasks[0].CapacityProviderName))
	in.ClientToken = nil
	_, err = c.RunTask(ctx, in)
	code, _ := apiCode(err)
	assert.Equal(t, "InvalidParameterException", code)
}

func TestRunTask_ClientTokenIsIdempotent(t *testing.T) {
	sim, c := start(t, Config{})
	def := register(t, c, "fam")
	ctx := context.Background()
	in := runInput(def, 3)
	in.ClientToken = aws.String("0123456789abcdef0123456789abcdef")
	first, err := c.RunTask(ctx, in)
	require.NoError(t, err)
	again, err := c.RunTask(ctx, in)
	require.NoError(t, err)
	require.Len(t, again.Tasks, 3)
	for i := range first.Tasks {
		assert.Equal(t, aws.ToString(first.Tasks[i].TaskArn), aws.ToString(again.Tasks[i].TaskArn))
	}
	assert.Equal(t, int64(3), sim.Stats().Launched, "a replay starts nothing")
}

func TestTask_Lifecycle_AgentUpWhileRunning(t *testing.T) {
	f := farm(t)
	sim, c := start(t, Config{TimeScale: 0.01, Agents: f, TokenKey: testKey})
	def := register(t, c, "fam")
	ctx := context.Background()
	out, err := c.RunTask(ctx, runInput(def, 1))
	require.NoError(t, err)
	require.Len(t, out.Tasks, 1)
	arn := aws.ToString(out.Tasks[0].TaskArn)
	assert.Equal(t, "PROVISIONING", aws.ToString(out.Tasks[0].LastStatus))
	assert.Equal(t, "RUNNING", aws.ToString(out.Tasks[0].DesiredStatus))
	assert.Regexp(t, `^arn:aws:ecs:us-east-1:123456789012:task/quarry/[0-9a-f]{32}$`, arn)

	describe := func() types.Task {
		d, err := c.DescribeTasks(ctx, &ecs.DescribeTasksInput{Cluster: aws.String("quarry"), Tasks: []string{arn}, Include: []types.TaskField{types.TaskFieldTags}})
		require.NoError(t, err)
		require.Len(t, d.Tasks, 1)
		return d.Tasks[0]
	}
	var ip string
	require.Eventually(t, func() bool {
		tk := describe()
		for _, a := range tk.Attachments {
			for _, d := range a.Details {
				if aws.ToString(d.Name) == "privateIPv4Address" {
					ip = aws.ToString(d.Value)
				}
			}
		}
		return aws.ToString(tk.LastStatus) == "RUNNING"
	}, 5*time.Second, 5*time.Millisecond, "a start takes 30-90 simulated s: 0.3-0.9 s at scale 0.01")
	tk := describe()
	assert.Regexp(t, `^127\.\d+\.0\.1$`, ip, "the first task has the block's first address")
	assert.Equal(t, "true", tagMap(tk.Tags)["quarry.managed"])
	require.Len(t, tk.Containers, 2)
	assert.Equal(t, "STOPPED", aws.ToString(tk.Containers[0].LastStatus), "the init container has done its copy")
	assert.Equal(t, "RUNNING", aws.ToString(tk.Containers[1].LastStatus))

	agent := agentapi.New("http://"+ip+":8000", agentapi.DeriveToken(testKey, arn), &http.Client{Timeout: 5 * time.Second})
	h, err := agent.Health(ctx)
	require.NoError(t, err, "the task's agent answers the token derived from its ARN")
	assert.Equal(t, agentapi.Version, h.Version)

	_, err = c.StopTask(ctx, &ecs.StopTaskInput{Cluster: aws.String("quarry"), Task: aws.String(arn), Reason: aws.String("quarry: released")})
	require.NoError(t, err)
	tk = describe()
	assert.Equal(t, "STOPPED", aws.ToString(tk.DesiredStatus), "desiredStatus changes at once")
	_, err = agent.Health(ctx)
	assert.Error(t, err, "the agent goes down at once")
	require.Eventually(t, func() bool { return aws.ToString(describe().LastStatus) == "STOPPED" }, 5*time.Second, 5*time.Millisecond)
	tk = describe()
	assert.Equal(t, types.TaskStopCodeUserInitiated, tk.StopCode)
	assert.Equal(t, "quarry: released", aws.ToString(tk.StoppedReason))
	assert.NotNil(t, tk.StoppedAt)
	st := sim.Stats()
	assert.Equal(t, 1, st.Tasks["STOPPED"])
	assert.Equal(t, 1, st.MaxRunning)
}

func TestTask_StoppedIsForgottenAfterTheRetention(t *testing.T) {
	_, c := start(t, Config{TimeScale: 0.001, StoppedRetention: 10 * time.Second})
	def := register(t, c, "fam")
	ctx := context.Background()
	out, err := c.RunTask(ctx, runInput(def, 1))
	require.NoError(t, err)
	arn := aws.ToString(out.Tasks[0].TaskArn)
	_, err = c.StopTask(ctx, &ecs.StopTaskInput{Cluster: aws.String("quarry"), Task: aws.String(arn)})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		d, err := c.DescribeTasks(ctx, &ecs.DescribeTasksInput{Cluster: aws.String("quarry"), Tasks: []string{arn}})
		require.NoError(t, err)
		return len(d.Failures) == 1 && aws.ToString(d.Failures[0].Reason) == "MISSING"
	}, 5*time.Second, 5*time.Millisecond)
}

func TestDescribeTasks_LimitsAndMissing(t *testing.T) {
	_, c := start(t, Config{})
	def := register(t, c, "fam")
	ctx := context.Background()
	out, err := c.RunTask(ctx, runInput(def, 2))
	require.NoError(t, err)
	arn := aws.ToString(out.Tasks[0].TaskArn)

	ids := make([]string, 101)
	for i := range ids {
		ids[i] = arn
	}
	_, err = c.DescribeTasks(ctx, &ecs.DescribeTasksInput{Cluster: aws.String("quarry"), Tasks: ids})
	code, _ := apiCode(err)
	assert.Equal(t, "InvalidParameterException", code, "at most 100 ids")

	d, err := c.DescribeTasks(ctx, &ecs.DescribeTasksInput{Cluster: aws.String("quarry"), Tasks: []string{arn, taskID(arn), "arn:aws:ecs:us-east-1:123456789012:task/quarry/nope"}})
	require.NoError(t, err)
	assert.Len(t, d.Tasks, 2, "an ARN and a bare id both name the task")
	assert.Empty(t, d.Tasks[0].Tags, "tags only with include TAGS")
	require.Len(t, d.Failures, 1)
	assert.Equal(t, "MISSING", aws.ToString(d.Failures[0].Reason))

	d, err = c.DescribeTasks(ctx, &ecs.DescribeTasksInput{Cluster: aws.String("other"), Tasks: []string{arn}})
	require.NoError(t, err)
	assert.Len(t, d.Failures, 1, "a task of another cluster is missing")
}

func TestTagResource_NamesATask(t *testing.T) {
	_, c := start(t, Config{})
	def := register(t, c, "fam")
	ctx := context.Background()
	out, err := c.RunTask(ctx, runInput(def, 1))
	require.NoError(t, err)
	arn := aws.ToString(out.Tasks[0].TaskArn)
	_, err = c.TagResource(ctx, &ecs.TagResourceInput{ResourceArn: aws.String(arn), Tags: []types.Tag{{Key: aws.String("quarry.task"), Value: aws.String("t-1")}}})
	require.NoError(t, err)
	d, err := c.DescribeTasks(ctx, &ecs.DescribeTasksInput{Cluster: aws.String("quarry"), Tasks: []string{arn}, Include: []types.TaskField{types.TaskFieldTags}})
	require.NoError(t, err)
	tags := tagMap(d.Tasks[0].Tags)
	assert.Equal(t, "t-1", tags["quarry.task"])
	assert.Equal(t, "true", tags["quarry.managed"])

	_, err = c.TagResource(ctx, &ecs.TagResourceInput{ResourceArn: aws.String(arn + "0"), Tags: []types.Tag{{Key: aws.String("k"), Value: aws.String("v")}}})
	code, _ := apiCode(err)
	assert.Equal(t, "ResourceNotFoundException", code)
	many := make([]types.Tag, 50)
	for i := range many {
		many[i] = types.Tag{Key: aws.String(fmt.Sprintf("k%d", i)), Value: aws.String("v")}
	}
	_, err = c.TagResource(ctx, &ecs.TagResourceInput{ResourceArn: aws.String(arn), Tags: many})
	code, _ = apiCode(err)
	assert.Equal(t, "InvalidParameterException", code, "at most 50 tags")
}

func TestListTasks_PagesByStatusAndStartedBy(t *testing.T) {
	_, c := start(t, Config{RunTaskBurst: 100, LaunchBurst: 1000})
	def := register(t, c, "fam")
	ctx := context.Background()
	var all []string
	for range 25 {
		out, err := c.RunTask(ctx, runInput(def, 10))
		require.NoError(t, err)
		for _, tk := range out.Tasks {
			all = append(all, aws.ToString(tk.TaskArn))
		}
	}
	other := runInput(def, 1)
	other.StartedBy = aws.String("someone-else")
	_, err := c.RunTask(ctx, other)
	require.NoError(t, err)
	_, err = c.StopTask(ctx, &ecs.StopTaskInput{Cluster: aws.String("quarry"), Task: aws.String(all[7])})
	require.NoError(t, err)

	list := func(status types.DesiredStatus) []string {
		var arns []string
		p := ecs.NewListTasksPaginator(c, &ecs.ListTasksInput{Cluster: aws.String("quarry"), StartedBy: aws.String("quarry-test"), DesiredStatus: status})
		pages := 0
		for p.HasMorePages() {
			out, err := p.NextPage(ctx)
			require.NoError(t, err)
			assert.LessOrEqual(t, len(out.TaskArns), 100)
			arns = append(arns, out.TaskArns...)
			pages++
		}
		return arns
	}
	running := list(types.DesiredStatusRunning)
	assert.Len(t, running, 249, "pages of at most 100, every task once")
	assert.NotContains(t, running, all[7])
	assert.Equal(t, []string{all[7]}, list(types.DesiredStatusStopped))

	_, err = c.ListTasks(ctx, &ecs.ListTasksInput{Cluster: aws.String("quarry"), MaxResults: aws.Int32(101)})
	code, _ := apiCode(err)
	assert.Equal(t, "InvalidParameterException", code)
}

func TestTaskDefinitions_RevisionsAndLookups(t *testing.T) {
	_, c := start(t, Config{})
	ctx := context.Background()
	first := register(t, c, "quarry-py-0123")
	second := register(t, c, "quarry-py-0123")
	assert.True(t, strings.HasSuffix(first, ":task-definition/quarry-py-0123:1"), first)
	assert.True(t, strings.HasSuffix(second, ":2"), second)

	for ref, want := range map[string]string{"quarry-py-0123": second, "quarry-py-0123:1": first, first: first} {
		out, err := c.DescribeTaskDefinition(ctx, &ecs.DescribeTaskDefinitionInput{TaskDefinition: aws.String(ref), Include: []types.TaskDefinitionField{types.TaskDefinitionFieldTags}})
		require.NoError(t, err, ref)
		assert.Equal(t, want, aws.ToString(out.TaskDefinition.TaskDefinitionArn), ref)
		assert.Equal(t, types.TaskDefinitionStatusActive, out.TaskDefinition.Status)
		assert.Len(t, out.TaskDefinition.ContainerDefinitions, 2)
		assert.Len(t, out.Tags, 1)
	}
	_, err := c.DescribeTaskDefinition(ctx, &ecs.DescribeTaskDefinitionInput{TaskDefinition: aws.String("nope")})
	code, msg := apiCode(err)
	assert.Equal(t, "ClientException", code)
	assert.Equal(t, "Unable to describe task definition.", msg, "the text providers/ecs recognises as not found")

	_, err = c.RunTask(ctx, runInput("nope", 1))
	code, _ = apiCode(err)
	assert.Equal(t, "ClientException", code)
	_, err = c.RegisterTaskDefinition(ctx, &ecs.RegisterTaskDefinitionInput{Family: aws.String("f"), RequiresCompatibilities: []types.Compatibility{types.CompatibilityFargate},
		ContainerDefinitions: []types.ContainerDefinition{{Name: aws.String("a"), Image: aws.String("x")}}})
	code, _ = apiCode(err)
	assert.Equal(t, "ClientException", code, "Fargate needs awsvpc, cpu and memory")
}

func TestServer_RefusesWhatItDoesNotSimulate(t *testing.T) {
	sim, c := start(t, Config{})
	ctx := context.Background()
	_, err := c.ListClusters(ctx, &ecs.ListClustersInput{})
	code, msg := apiCode(err)
	assert.Equal(t, "UnknownOperationException", code)
	assert.Contains(t, msg, "ListClusters")

	def := register(t, c, "fam")
	in := runInput(def, 1)
	in.EnableExecuteCommand = true
	_, err = c.RunTask(ctx, in)
	code, msg = apiCode(err)
	assert.Equal(t, "InvalidParameterException", code)
	assert.Contains(t, msg, `does not simulate the parameter "enableExecuteCommand"`)
	assert.Equal(t, int64(1), sim.Stats().Operations["other"].Requests)
}

func TestServer_StartsOnLoopbackOnly(t *testing.T) {
	sim, err := New(Config{})
	require.NoError(t, err)
	defer func() { _ = sim.Close(context.Background()) }()
	_, err = sim.Start("0.0.0.0:0")
	assert.ErrorContains(t, err, "not a loopback address")
	_, err = New(Config{TimeScale: 2})
	assert.ErrorContains(t, err, "TimeScale")
	_, err = New(Config{Agents: agentsim.NewFarm(agentsim.Config{})})
	assert.ErrorContains(t, err, "TokenKey")
}

func TestServer_ConcurrentLaunchesAndStops(t *testing.T) {
	f := farm(t)
	sim, c := start(t, Config{TimeScale: 0.001, Agents: f, TokenKey: testKey, RunTaskBurst: 1000, LaunchBurst: 1000})
	def := register(t, c, "fam")
	ctx := context.Background()
	var wg sync.WaitGroup
	arns := make(chan string, 200)
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, err := c.RunTask(ctx, runInput(def, 10))
			if assert.NoError(t, err) {
				for _, tk := range out.Tasks {
					arns <- aws.ToString(tk.TaskArn)
				}
			}
		}()
	}
	wg.Wait()
	close(arns)
	var all []string
	for a := range arns {
		all = append(all, a)
	}
	require.Len(t, all, 200)
	require.Eventually(t, func() bool { return sim.Stats().Tasks["RUNNING"] == 200 && f.Stats().Up == 200 }, 10*time.Second, 10*time.Millisecond)
	for _, a := range all {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := c.StopTask(ctx, &ecs.StopTaskInput{Cluster: aws.String("quarry"), Task: aws.String(a)})
			assert.NoError(t, err)
		}()
	}
	wg.Wait()
	assert.Zero(t, f.Stats().Up, "every agent went down with its task")
	require.Eventually(t, func() bool { return sim.Stats().Tasks["STOPPED"] == 200 }, 10*time.Second, 10*time.Millisecond)
}

func tagMap(tags []types.Tag) map[string]string {
	m := map[string]string{}
	for _, t := range tags {
		m[aws.ToString(t.Key)] = aws.ToString(t.Value)
	}
	return m
}

// registerImage registers family with its sandbox container running image.
func registerImage(t *testing.T, c *ecs.Client, family, image string) string {
	t.Helper()
	out, err := c.RegisterTaskDefinition(context.Background(), &ecs.RegisterTaskDefinitionInput{
		Family: aws.String(family), NetworkMode: types.NetworkModeAwsvpc, Cpu: aws.String("256"), Memory: aws.String("512"),
		RequiresCompatibilities: []types.Compatibility{types.CompatibilityFargate},
		ContainerDefinitions: []types.ContainerDefinition{
			{Name: aws.String("quarry-agent-init"), Image: aws.String("busybox"), Essential: aws.Bool(false)},
			{Name: aws.String("sandbox"), Image: aws.String(image)},
		},
		Tags: []types.Tag{{Key: aws.String("quarry.pool"), Value: aws.String(family)}},
	})
	require.NoError(t, err)
	return aws.ToString(out.TaskDefinition.TaskDefinitionArn)
}

// RegisterTaskDefinition and DeregisterTaskDefinition share a bucket of
// AWS's figures (1/s, burst 20); over it ThrottlingException.
func TestTaskDefinitions_RegisterBucketThrottles(t *testing.T) {
	// A refill too slow to matter while the burst is spent.
	sim, c := start(t, Config{RegisterRate: 0.001, RegisterBurst: 3})
	ctx := context.Background()
	arn := register(t, c, "fam-a")
	register(t, c, "fam-b")
	_, err := c.DeregisterTaskDefinition(ctx, &ecs.DeregisterTaskDefinitionInput{TaskDefinition: aws.String(arn)})
	require.NoError(t, err, "the third call of the burst")
	_, err = c.RegisterTaskDefinition(ctx, &ecs.RegisterTaskDefinitionInput{Family: aws.String("fam-c"), NetworkMode: types.NetworkModeAwsvpc,
		Cpu: aws.String("256"), Memory: aws.String("512"), RequiresCompatibilities: []types.Compatibility{types.CompatibilityFargate},
		ContainerDefinitions: []types.ContainerDefinition{{Name: aws.String("sandbox"), Image: aws.String("python:3.12")}}})
	code, msg := apiCode(err)
	assert.Equal(t, "ThrottlingException", code)
	assert.Equal(t, "Rate exceeded", msg)
	_, err = c.DeregisterTaskDefinition(ctx, &ecs.DeregisterTaskDefinitionInput{TaskDefinition: aws.String("fam-b:1")})
	code, _ = apiCode(err)
	assert.Equal(t, "ThrottlingException", code, "deregistrations share the bucket")
	_, err = c.DescribeTaskDefinition(ctx, &ecs.DescribeTaskDefinitionInput{TaskDefinition: aws.String("fam-b")})
	require.NoError(t, err, "look-ups are not in it")
	st := sim.Stats()
	assert.Equal(t, int64(2), st.RefusedRegisterRate)
	assert.Equal(t, int64(1), st.Operations["RegisterTaskDefinition"].Throttled)
	assert.Equal(t, int64(1), st.Operations["DeregisterTaskDefinition"].Throttled)
	assert.Equal(t, 2, st.TaskDefinitions)
	assert.True(t, st.Simulated)
}

// A deregistered revision is INACTIVE: RunTask refuses it, its ARN still
// describes it, its family describes the latest ACTIVE revision, and a
// family with none describes nothing.
func TestTaskDefinitions_Deregister(t *testing.T) {
	_, c := start(t, Config{})
	ctx := context.Background()
	first := register(t, c, "quarry-i-x-0123")
	second := register(t, c, "quarry-i-x-0123")
	out, err := c.DeregisterTaskDefinition(ctx, &ecs.DeregisterTaskDefinitionInput{TaskDefinition: aws.String(second)})
	require.NoError(t, err)
	assert.Equal(t, types.TaskDefinitionStatusInactive, out.TaskDefinition.Status)
	again, err := c.DeregisterTaskDefinition(ctx, &ecs.DeregisterTaskDefinitionInput{TaskDefinition: aws.String("quarry-i-x-0123:2")})
	require.NoError(t, err, "again: answered as it is")
	assert.Equal(t, types.TaskDefinitionStatusInactive, again.TaskDefinition.Status)

	d, err := c.DescribeTaskDefinition(ctx, &ecs.DescribeTaskDefinitionInput{TaskDefinition: aws.String(second)})
	require.NoError(t, err)
	assert.Equal(t, types.TaskDefinitionStatusInactive, d.TaskDefinition.Status)
	d, err = c.DescribeTaskDefinition(ctx, &ecs.DescribeTaskDefinitionInput{TaskDefinition: aws.String("quarry-i-x-0123")})
	require.NoError(t, err)
	assert.Equal(t, first, aws.ToString(d.TaskDefinition.TaskDefinitionArn), "the family's latest ACTIVE revision")
	_, err = c.RunTask(ctx, runInput(second, 1))
	code, msg := apiCode(err)
	assert.Equal(t, "ClientException", code)
	assert.Equal(t, "TaskDefinition is inactive", msg)

	_, err = c.DeregisterTaskDefinition(ctx, &ecs.DeregisterTaskDefinitionInput{TaskDefinition: aws.String(first)})
	require.NoError(t, err)
	_, err = c.DescribeTaskDefinition(ctx, &ecs.DescribeTaskDefinitionInput{TaskDefinition: aws.String("quarry-i-x-0123")})
	code, msg = apiCode(err)
	assert.Equal(t, "ClientException", code)
	assert.Equal(t, "Unable to describe task definition.", msg, "no ACTIVE revision left")

	_, err = c.DeregisterTaskDefinition(ctx, &ecs.DeregisterTaskDefinitionInput{TaskDefinition: aws.String("quarry-i-x-0123")})
	code, _ = apiCode(err)
	assert.Equal(t, "InvalidParameterException", code, "a revision is required")
	_, err = c.DeregisterTaskDefinition(ctx, &ecs.DeregisterTaskDefinitionInput{TaskDefinition: aws.String("nope:1")})
	code, msg = apiCode(err)
	assert.Equal(t, "ClientException", code)
	assert.Contains(t, msg, "does not exist")
}

// A task's start is its placement and drawn start time plus its image's
// pull, size / PullRate: an image of the registry table, or one sized by
// its name. Checked on the simulator's schedule (no wall-clock timing),
// then the task runs.
func TestTask_StartIncludesItsImagesPull(t *testing.T) {
	const (
		startTime = 30 * time.Second
		pullRate  = 100 << 20 // bytes per simulated second
		scale     = 0.001
	)
	sim, c := start(t, Config{TimeScale: scale, StartMin: startTime, StartMax: startTime, PullRate: pullRate,
		Images: map[string]int64{"registry.example/big:1": 3000 << 20}})
	ctx := context.Background()
	for image, size := range map[string]int64{"registry.example/big:1": 3000 << 20, "registry.example/unlisted:1": DefaultImageSize("registry.example/unlisted:1")} {
		def := registerImage(t, c, "fam-"+fmt.Sprint(size), image)
		out, err := c.RunTask(ctx, runInput(def, 1))
		require.NoError(t, err)
		arn := aws.ToString(out.Tasks[0].TaskArn)

		sim.mu.Lock()
		tk := sim.tasks[taskID(arn)]
		var runsAt time.Time
		for _, e := range sim.events {
			if e.t == tk && e.kind == evRunning {
				runsAt = e.at
			}
		}
		created := tk.createdAt
		sim.mu.Unlock()
		require.False(t, runsAt.IsZero(), "its start is scheduled")
		pull := time.Duration(float64(size) / pullRate * float64(time.Second))
		want := time.Duration(float64(startTime+pull) * scale)
		took := runsAt.Sub(created)
		assert.GreaterOrEqual(t, took, want, "%s: start %s + pull of %d MiB %s (simulated)", image, startTime, size>>20, pull)
		assert.Less(t, took, want+50*time.Millisecond, "%s: scheduled when RunTask answered, not later", image)

		require.Eventually(t, func() bool {
			d, err := c.DescribeTasks(ctx, &ecs.DescribeTasksInput{Cluster: aws.String("quarry"), Tasks: []string{arn}})
			require.NoError(t, err)
			return aws.ToString(d.Tasks[0].LastStatus) == "RUNNING"
		}, 10*time.Second, time.Millisecond)
	}
	assert.Equal(t, int64(3000<<20)+DefaultImageSize("registry.example/unlisted:1"), sim.Stats().PulledBytes)
}

func TestDefaultImageSize_IsDeterministicAndBounded(t *testing.T) {
	seen := map[int64]bool{}
	for i := range 1000 {
		image := fmt.Sprintf("registry.example/swe/task-%d:latest", i)
		size := DefaultImageSize(image)
		assert.Equal(t, size, DefaultImageSize(image), "the same image, the same size")
		assert.GreaterOrEqual(t, size, int64(64<<20))
		assert.Less(t, size, int64(2<<30))
		seen[size] = true
	}
	assert.Greater(t, len(seen), 990, "sizes spread over images")
}

// With a strict registry, a task of an image it does not hold stops while
// starting with Fargate's CannotPullContainerError "… not found".
func TestTask_ImageTheRegistryDoesNotHoldFailsToStart(t *testing.T) {
	sim, c := start(t, Config{TimeScale: 0.001, StrictRegistry: true, Images: map[string]int64{"registry.example/there:1": 1 << 20}})
	ctx := context.Background()
	def := registerImage(t, c, "fam", "registry.example/missing:1")
	out, err := c.RunTask(ctx, runInput(def, 1))
	require.NoError(t, err, "ECS cannot tell before the task pulls")
	arn := aws.ToString(out.Tasks[0].TaskArn)
	var tk types.Task
	require.Eventually(t, func() bool {
		d, err := c.DescribeTasks(ctx, &ecs.DescribeTasksInput{Cluster: aws.String("quarry"), Tasks: []string{arn}})
		require.NoError(t, err)
		tk = d.Tasks[0]
		return aws.ToString(tk.LastStatus) == "STOPPED"
	}, 10*time.Second, time.Millisecond)
	assert.Equal(t, types.TaskStopCodeTaskFailedToStart, tk.StopCode)
	assert.Equal(t, "CannotPullContainerError: pull image manifest has been retried 5 time(s): failed to resolve ref registry.example/missing:1: registry.example/missing:1: not found",
		aws.ToString(tk.StoppedReason))
	st := sim.Stats()
	assert.Equal(t, int64(1), st.PullNotFound)
	assert.Zero(t, st.PulledBytes)
}
