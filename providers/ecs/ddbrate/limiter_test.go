package ddbrate

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// admitted is one call a schedule or a Limiter let through.
type admitted struct {
	at    int64 // ns
	tasks int
}

// checkWindows asserts that in every window of length w (anchored at an
// admitted call) the calls and tasks stay within burst + rate × w, plus
// slack tokens (for timers that fire late in real time).
func checkWindows(t *testing.T, calls []admitted, cfg Config, w time.Duration, slack float64) {
	t.Helper()
	slices.SortFunc(calls, func(a, b admitted) int { return int(a.at - b.at) })
	for i := range calls {
		n, tasks := 0, 0
		for j := i; j < len(calls) && calls[j].at-calls[i].at < int64(w); j++ {
			n++
			tasks += calls[j].tasks
		}
		maxCalls := float64(cfg.CallBurst) + cfg.CallRate*w.Seconds() + slack
		maxTasks := float64(cfg.TaskBurst) + cfg.TaskRate*w.Seconds() + slack
		require.LessOrEqual(t, float64(n), maxCalls, "%d calls in %s from call %d", n, w, i)
		require.LessOrEqual(t, float64(tasks), maxTasks, "%d tasks in %s from call %d", tasks, w, i)
	}
}

func TestSchedule_BurstThenRate(t *testing.T) {
	cfg := Config{CallRate: 20, CallBurst: 20, TaskRate: 20, TaskBurst: 100}
	var s state
	now := int64(time.Hour)
	var ats []int64
	for range 12 { // 12 calls of 10 tasks at once: 10 in the task burst, then one each 500 ms
		var at int64
		at, s = schedule(s, now, 10, cfg)
		ats = append(ats, at-now)
	}
	want := []int64{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, int64(500 * time.Millisecond), int64(time.Second)}
	assert.Equal(t, want, ats)
	assert.Equal(t, int64(12), s.version)

	// Single-task calls are bound by the call bucket: 20 at once, then 20/s.
	cfg = Config{CallRate: 20, CallBurst: 20, TaskRate: 1000, TaskBurst: 1000}
	s = state{}
	var last int64
	for range 30 {
		last, s = schedule(s, now, 1, cfg)
	}
	assert.Equal(t, int64(10*50*time.Millisecond), last-now, "the 30th call waits 10 intervals of 50 ms")

	// An idle bucket fills up again: a burst after a long pause goes at once.
	at, _ := schedule(s, now+int64(time.Minute), 1, cfg)
	assert.Equal(t, now+int64(time.Minute), at)
}

// Many writers, whose requests arrive at random times and are written in
// an order that is not their arrival order (as replicas' writes are),
// never exceed the rates in any window.
func TestSchedule_AnyWriteOrderKeepsEveryWindow(t *testing.T) {
	cfg := Config{CallRate: 20, CallBurst: 5, TaskRate: 30, TaskBurst: 40}
	r := rand.New(rand.NewPCG(1, 2))
	for round := range 50 {
		var s state
		var calls []admitted
		now := int64(0)
		for range 300 {
			now += int64(r.IntN(int(40 * time.Millisecond)))
			arrival := now - int64(r.IntN(int(30*time.Millisecond))) // a replica whose request is older
			n := 1 + r.IntN(10)
			var at int64
			at, s = schedule(s, arrival, n, cfg)
			calls = append(calls, admitted{at: at, tasks: n})
		}
		for _, w := range []time.Duration{time.Millisecond, 100 * time.Millisecond, time.Second, 5 * time.Second} {
			t.Run(fmt.Sprintf("round%d/%s", round, w), func(t *testing.T) { checkWindows(t, calls, cfg, w, 0) })
		}
	}
}

// fakeTable is an in-memory table of items with UpdateItem's conditions
// (attribute_not_exists(#pk) and #v = :v) and ALL_OLD on failure.
type fakeTable struct {
	mu     sync.Mutex
	items  map[string]map[string]types.AttributeValue
	writes int
	lost   int
	err    error
}

func newFakeTable() *fakeTable {
	return &fakeTable{items: map[string]map[string]types.AttributeValue{}}
}

func (f *fakeTable) UpdateItem(_ context.Context, in *dynamodb.UpdateItemInput, _ ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return nil, f.err
	}
	for name := range in.ExpressionAttributeNames { // DynamoDB refuses names no expression uses
		if !strings.Contains(*in.UpdateExpression+" "+*in.ConditionExpression, name) {
			return nil, fmt.Errorf("fake: ValidationException: Value provided in ExpressionAttributeNames unused in expressions: keys: {%s}", name)
		}
	}
	f.writes++
	pk := in.Key["pk"].(*types.AttributeValueMemberS).Value
	old, exists := f.items[pk]
	ok := false
	switch *in.ConditionExpression {
	case "attribute_not_exists(#pk)":
		ok = !exists
	case "#v = :v":
		ok = exists && old["v"].(*types.AttributeValueMemberN).Value == in.ExpressionAttributeValues[":v"].(*types.AttributeValueMemberN).Value
	default:
		return nil, fmt.Errorf("fake: condition %q", *in.ConditionExpression)
	}
	if !ok {
		f.lost++
		return nil, &types.ConditionalCheckFailedException{Message: ptr("The conditional request failed"), Item: old}
	}
	f.items[pk] = map[string]types.AttributeValue{
		"pk": in.Key["pk"], "call_tat": in.ExpressionAttributeValues[":c"], "task_tat": in.ExpressionAttributeValues[":t"], "v": in.ExpressionAttributeValues[":nv"],
	}
	return &dynamodb.UpdateItemOutput{}, nil
}

func ptr[T any](v T) *T { return &v }

// runReplicas runs replicas Limiters on api, each making calls Waits of
// random sizes from workers goroutines, and returns when each Wait ended.
func runReplicas(t *testing.T, api API, cfg Config, replicas, workers, calls int) []admitted {
	t.Helper()
	var mu sync.Mutex
	var out []admitted
	var wg sync.WaitGroup
	for r := range replicas {
		l, err := New(api, cfg)
		require.NoError(t, err)
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rnd := rand.New(rand.NewPCG(uint64(r), uint64(w)))
				for range calls {
					n := 1 + rnd.IntN(min(10, max(cfg.TaskBurst, 1)))
					ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
					// The admission's time is its reservation's: a goroutine
					// that a loaded machine runs late would record a later
					// time, bunching the admissions it saw (127 tasks in a
					// 500 ms window where the rate allows 122, in make test).
					at, err := l.wait(ctx, n)
					cancel()
					if !assert.NoError(t, err) {
						return
					}
					mu.Lock()
					out = append(out, admitted{at: at.UnixNano(), tasks: n})
					mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	return out
}

func TestLimiter_ReplicasShareTheRate(t *testing.T) {
	table := newFakeTable()
	cfg := Config{Table: "leases", CallRate: 100, CallBurst: 5, TaskRate: 200, TaskBurst: 20}
	start := time.Now()
	calls := runReplicas(t, table, cfg, 3, 4, 15) // 180 calls, ~990 tasks: about 5 s at 200 tasks/s
	elapsed := time.Since(start)
	require.Len(t, calls, 180)
	checkWindows(t, calls, cfg, 500*time.Millisecond, 2)
	checkWindows(t, calls, cfg, time.Second, 2)
	tasks := 0
	for _, c := range calls {
		tasks += c.tasks
	}
	t.Logf("%d calls, %d tasks in %s by 3 replicas; %d writes, %d lost races", len(calls), tasks, elapsed.Round(time.Millisecond), table.writes, table.lost)
	assert.GreaterOrEqual(t, elapsed.Seconds(), float64(tasks-cfg.TaskBurst)/cfg.TaskRate*0.95, "the shared rate holds them back")
	assert.Less(t, elapsed.Seconds(), float64(tasks)/cfg.TaskRate*1.5+2, "and lets them through at the rate")
	assert.Equal(t, 180, table.writes-table.lost, "one write per admitted call")
}

func TestLimiter_Wait_FailsWithoutReservingPastTheDeadline(t *testing.T) {
	table := newFakeTable()
	l, err := New(table, Config{Table: "leases", CallRate: 1, CallBurst: 1, TaskRate: 100, TaskBurst: 100})
	require.NoError(t, err)
	require.NoError(t, l.Wait(context.Background(), 1))
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	err = l.Wait(ctx, 1) // the next call may start in 1 s
	require.Error(t, err)
	assert.Contains(t, err.Error(), "after the context's deadline")
	assert.Equal(t, 1, table.writes, "nothing reserved")

	assert.ErrorContains(t, l.Wait(context.Background(), 101), "want 1..100")
	table.err = &types.ProvisionedThroughputExceededException{Message: ptr("slow down")}
	err = l.Wait(context.Background(), 1)
	var pte *types.ProvisionedThroughputExceededException
	assert.ErrorAs(t, err, &pte, "DynamoDB's error, after the SDK's retries")
}

func TestLimiter_Wait_ReadsTheItemFromALostRace(t *testing.T) {
	table := newFakeTable()
	cfg := Config{Table: "leases", CallRate: 1, CallBurst: 2, TaskRate: 100, TaskBurst: 100}
	a, err := New(table, cfg)
	require.NoError(t, err)
	b, err := New(table, cfg)
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, a.Wait(ctx, 1))
	require.NoError(t, b.Wait(ctx, 1), "b loses its first write (it did not know the item), learns it, takes the second token")
	assert.Equal(t, 3, table.writes)
	assert.Equal(t, 1, table.lost)
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	assert.ErrorContains(t, a.Wait(short, 1), "deadline", "the burst of 2 is spent by both replicas together")
	v, err := strconv.Atoi(table.items["rate#ecs-run-task"]["v"].(*types.AttributeValueMemberN).Value)
	require.NoError(t, err)
	assert.Equal(t, 2, v)
}

func TestNew_ValidatesConfig(t *testing.T) {
	for _, tt := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"no table", Config{CallRate: 1, CallBurst: 1, TaskRate: 1, TaskBurst: 1}, "Table"},
		{"no call rate", Config{Table: "t", CallBurst: 1, TaskRate: 1, TaskBurst: 1}, "CallRate"},
		{"no task burst", Config{Table: "t", CallRate: 1, CallBurst: 1, TaskRate: 1}, "TaskRate"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(newFakeTable(), tt.cfg)
			assert.ErrorContains(t, err, tt.want)
		})
	}
	_, err := New(nil, Config{Table: "t", CallRate: 1, CallBurst: 1, TaskRate: 1, TaskBurst: 1})
	assert.Error(t, err)
}

// A limiter without a task bucket (RegisterTaskDefinition's rate) admits
// calls at its call rate alone, whatever n, shared by every replica.
func TestLimiter_CallsOnly_ReplicasShareTheCallRate(t *testing.T) {
	cfg := Config{Table: "leases", Key: RegisterKey, CallRate: 50, CallBurst: 4}
	var s state
	now := int64(time.Hour)
	var ats []int64
	for range 6 {
		var at int64
		at, s = schedule(s, now, 1, cfg)
		ats = append(ats, at-now)
	}
	assert.Equal(t, []int64{0, 0, 0, 0, int64(20 * time.Millisecond), int64(40 * time.Millisecond)}, ats, "a burst of 4, then one each 20 ms")

	table := newFakeTable()
	calls := runReplicas(t, table, cfg, 2, 3, 8) // 48 calls: about 0.9 s at 50/s after the burst
	require.Len(t, calls, 48)
	for i := range calls {
		calls[i].tasks = 0 // no task bucket: checkWindows counts calls
	}
	checkWindows(t, calls, Config{CallRate: cfg.CallRate, CallBurst: cfg.CallBurst}, 200*time.Millisecond, 0)
	slices.SortFunc(calls, func(a, b admitted) int { return int(a.at - b.at) })
	span := time.Duration(calls[len(calls)-1].at - calls[0].at)
	assert.GreaterOrEqual(t, span, time.Duration(float64(len(calls)-cfg.CallBurst)/cfg.CallRate*float64(time.Second))-time.Millisecond,
		"the admissions (on the limiter's clock) take at least (calls − burst) / rate")
	assert.Contains(t, table.items, "rate#"+RegisterKey)
}

func TestNew_CallsOnlyConfig(t *testing.T) {
	l, err := New(newFakeTable(), Config{Table: "t", Key: RegisterKey, CallRate: 1, CallBurst: 20})
	require.NoError(t, err)
	_, err = l.Admit(context.Background(), 3)
	assert.NoError(t, err, "n is not bounded without a task bucket")
	_, err = New(newFakeTable(), Config{Table: "t", CallRate: 1, CallBurst: 20, TaskRate: 1})
	assert.ErrorContains(t, err, "TaskRate", "a task rate without a burst is not calls-only")
}
