package ecs

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	ddbtypes "github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"

	"github.com/quarryhq/quarry/internal/testenv"
	"github.com/quarryhq/quarry/providers/ecs/ddbrate"
)

var _ RateLimiter = (*ddbrate.Limiter)(nil)

// emulatorTable creates a table keyed like the leases table (string "pk")
// on the emulator, deleted when t ends.
func emulatorTable(t *testing.T) (*dynamodb.Client, string) {
	t.Helper()
	c := dynamodb.NewFromConfig(emulatorConfig(t))
	name := fmt.Sprintf("quarry-ecs-rate-%s-%d", runID, clusterSeq.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := c.CreateTable(ctx, &dynamodb.CreateTableInput{
		TableName:            aws.String(name),
		AttributeDefinitions: []ddbtypes.AttributeDefinition{{AttributeName: aws.String("pk"), AttributeType: ddbtypes.ScalarAttributeTypeS}},
		KeySchema:            []ddbtypes.KeySchemaElement{{AttributeName: aws.String("pk"), KeyType: ddbtypes.KeyTypeHash}},
		BillingMode:          ddbtypes.BillingModePayPerRequest,
	})
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := c.DeleteTable(ctx, &dynamodb.DeleteTableInput{TableName: aws.String(name)}); err != nil {
			t.Errorf("delete test table: %v", err)
		}
	})
	return c, name
}

// Two gateway replicas, each with its own provider and its own DynamoDB
// limiter on one item of the emulator, launch at once against one ECS
// account (the fake, which enforces its rates: RunTask calls and task
// launches beyond them are refused, as ECS refuses them). Together they
// stay within the rates: no call is throttled, and no window of RunTask
// calls exceeds burst + rate × its length. (With a bucket per replica they
// would send twice the rate.)
func TestProvider_SharedRate_TwoReplicasStayWithinTheAccountsRate(t *testing.T) {
	testenv.AWS(t)
	db, table := emulatorTable(t)
	shared := ddbrate.Config{Table: table, CallRate: 10, CallBurst: 2, TaskRate: 20, TaskBurst: 10}
	// slack is what timers and scheduling on a loaded machine add: a call
	// reserved for t may leave a little late and the next one on time, so two
	// arrive closer than the limiter spaced them. Buckets per replica would
	// send twice the rate (40 calls too many here), far beyond it.
	const slack = 2
	f := newFake()
	f.calls = rate.NewLimiter(rate.Limit(shared.CallRate), shared.CallBurst+slack) // ECS's limits
	f.launches = rate.NewLimiter(rate.Limit(shared.TaskRate), shared.TaskBurst+slack)

	const replicas, each = 2, 40
	provs := make([]*Provider, replicas)
	for i := range provs {
		l, err := ddbrate.New(db, shared)
		require.NoError(t, err)
		provs[i], err = New(testConfig(), f, Deps{Rate: l})
		require.NoError(t, err)
		p := provs[i]
		t.Cleanup(func() { assert.NoError(t, p.Close(context.Background())) })
	}
	start := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, replicas)
	for i, p := range provs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			spec := testSpec()
			spec.Pool = fmt.Sprintf("replica-%d", i)
			tasks, err := p.Launch(testCtx(t), spec, names(spec.Pool, each))
			if err == nil && len(tasks) != each {
				err = fmt.Errorf("%d tasks", len(tasks))
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	for i, err := range errs {
		require.NoError(t, err, "replica %d", i)
	}
	runCalls, tasksRun, throttled, _, _, _, _ := f.stats()
	times, counts := f.runLog()
	t.Logf("%d tasks in %d RunTask calls by %d replicas in %s, %d throttled", tasksRun, len(times), replicas, elapsed.Round(time.Millisecond), throttled)
	assert.Equal(t, replicas*each, tasksRun)
	assert.Zero(t, throttled, "ECS refused no call: the replicas shared its rate")
	assert.Equal(t, len(times), runCalls)
	for i := range times { // every window of one second from a call
		calls, tasks := 0, 0
		for j := i; j < len(times) && times[j].Sub(times[i]) < time.Second; j++ {
			calls++
			tasks += counts[j]
		}
		assert.LessOrEqual(t, float64(calls), float64(shared.CallBurst)+shared.CallRate+slack, "RunTask calls in the second from call %d", i)
		assert.LessOrEqual(t, float64(tasks), float64(shared.TaskBurst)+shared.TaskRate+slack, "tasks in the second from call %d", i)
	}
	assert.GreaterOrEqual(t, elapsed.Seconds(), float64(replicas*each-shared.TaskBurst)/shared.TaskRate*0.9, "the shared launch rate bounds both together")
}

// Two replicas, each with its own DynamoDB limiter on the register rate's
// item of the emulator, prepare new images at once against one ECS account
// (the fake, which refuses registrations beyond its bucket). Together they
// stay within the rate: ECS refuses none, and the admissions of both,
// counted on the limiters' clocks, keep one bucket.
func TestProvider_SharedRegisterRate_TwoReplicasStayWithinTheAccountsRate(t *testing.T) {
	testenv.AWS(t)
	db, table := emulatorTable(t)
	shared := ddbrate.Config{Table: table, Key: ddbrate.RegisterKey, CallRate: 20, CallBurst: 3}
	const slack = 2 // calls that arrive later than their admission may bunch (see above)
	f := newFake()
	f.registers = rate.NewLimiter(rate.Limit(shared.CallRate), shared.CallBurst+slack)

	const replicas, each = 2, 10
	recs := make([]*admissions, replicas)
	var wg sync.WaitGroup
	for i := range replicas {
		l, err := ddbrate.New(db, shared)
		require.NoError(t, err)
		recs[i] = &admissions{l: l}
		p, err := New(testConfig(), f, Deps{Register: recs[i]})
		require.NoError(t, err)
		t.Cleanup(func() { assert.NoError(t, p.Close(context.Background())) })
		for j := range each {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := p.PrepareImage(testCtx(t), onDemandSpec("default", fmt.Sprintf("registry.example/r%d/task-%d:1", i, j)))
				assert.NoError(t, err)
			}()
		}
	}
	wg.Wait()
	registered, _, refused := f.registerStats()
	assert.Equal(t, replicas*each, registered)
	assert.Zero(t, refused, "ECS refused no registration: the replicas shared its rate")
	var at []time.Time
	for _, r := range recs {
		at = append(at, r.times()...)
	}
	slices.SortFunc(at, time.Time.Compare)
	checkAdmissions(t, at, shared.CallRate, shared.CallBurst)
}
