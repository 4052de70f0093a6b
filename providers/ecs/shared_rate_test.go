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
// launches beyond them are refused, as ECS refuses them, and retried).
// Together they stay within the rates: the calls and tasks of both,
// admitted on the limiters' clocks, keep one call bucket and one launch
// bucket. (With a bucket per replica they would admit twice the rate.)
// The fake's refusals are logged, not asserted: a call leaves when its
// goroutine runs, after its admission, so on a loaded machine (the
// emulator busy with other suites) two calls admitted apart may arrive
// together; admissions are what the limiters decide.
func TestProvider_SharedRate_TwoReplicasStayWithinTheAccountsRate(t *testing.T) {
	testenv.AWS(t)
	db, table := emulatorTable(t)
	shared := ddbrate.Config{Table: table, CallRate: 10, CallBurst: 2, TaskRate: 20, TaskBurst: 10}
	const slack = 2 // ECS's buckets hold that much more: a refused call is retried, and counted below
	f := newFake()
	f.calls = rate.NewLimiter(rate.Limit(shared.CallRate), shared.CallBurst+slack) // ECS's limits
	f.launches = rate.NewLimiter(rate.Limit(shared.TaskRate), shared.TaskBurst+slack)

	const replicas, each = 2, 40
	provs := make([]*Provider, replicas)
	recs := make([]*admissions, replicas)
	for i := range provs {
		l, err := ddbrate.New(db, shared)
		require.NoError(t, err)
		recs[i] = &admissions{l: l}
		provs[i], err = New(testConfig(), f, Deps{Rate: recs[i]})
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
	_, tasksRun, throttled, _, _, _, _ := f.stats()
	var adm []admission
	for _, r := range recs {
		adm = append(adm, r.all()...)
	}
	slices.SortFunc(adm, func(x, y admission) int { return x.at.Compare(y.at) })
	t.Logf("%d tasks in %d admitted RunTask calls by %d replicas in %s; the fake refused %d (arrivals bunched by scheduling)",
		tasksRun, len(adm), replicas, elapsed.Round(time.Millisecond), throttled)
	assert.Equal(t, replicas*each, tasksRun)
	checkBucket(t, adm, func(admission) int { return 1 }, shared.CallRate, shared.CallBurst)
	checkBucket(t, adm, func(a admission) int { return a.n }, shared.TaskRate, shared.TaskBurst)
	assert.GreaterOrEqual(t, elapsed.Seconds(), float64(replicas*each-shared.TaskBurst)/shared.TaskRate*0.9, "the shared launch rate bounds both together")
}

// Two replicas, each with its own DynamoDB limiter on the register rate's
// item of the emulator, prepare new images at once against one ECS account
// (the fake, which refuses registrations beyond its bucket; they are
// retried). Together they stay within the rate: the admissions of both,
// counted on the limiters' clocks, keep one bucket, and every image is
// registered once. (The fake's refusals are logged: see above.)
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
	t.Logf("%d registrations by %d replicas; the fake refused %d (arrivals bunched by scheduling)", registered, replicas, refused)
	var at []time.Time
	for _, r := range recs {
		at = append(at, r.times()...)
	}
	slices.SortFunc(at, time.Time.Compare)
	checkAdmissions(t, at, shared.CallRate, shared.CallBurst)
}
