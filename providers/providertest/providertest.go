package providertest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/providers"
)

// DefaultTimeout bounds each wait of the suite (an agent becoming healthy, a
// task reaching a state) when Harness.Timeout is 0. It is generous: waits
// poll and end as soon as the condition holds.
const DefaultTimeout = 2 * time.Minute

// pollEvery is how often the suite re-checks a condition it waits for.
const pollEvery = 50 * time.Millisecond

// concurrentLaunches is how many goroutines launch at once in the
// concurrency test.
const concurrentLaunches = 8

// Harness is what the suite needs from one provider.
type Harness struct {
	// Open prepares a fresh, empty backend state for one test (a directory,
	// a label namespace, ...) and returns a function that opens a Provider on
	// it. Every call of that function returns a new instance on the same
	// state, as a restarted gateway would get. The harness releases
	// instances and state with t.Cleanup; Close (if the provider is a
	// providers.Closer) may already have been called by the suite. Required.
	Open func(t *testing.T) func(t *testing.T) providers.Provider
	// Spec is launched by the suite; the suite sets Pool (unique per test)
	// and adds a label.
	Spec providers.Spec
	// BadSpec must make Launch fail with a *providers.LaunchError wrapping
	// providers.ErrInvalidSpec (e.g. an image the provider cannot run). Its
	// Pool is set by the suite.
	BadSpec providers.Spec
	// KillTask kills a running task from outside the provider, as a crash
	// or an operator would (kill -9 of the process, docker kill, ECS
	// StopTask through the API). Required.
	KillTask func(t *testing.T, task providers.Task)
	// HTTPClient calls the agents; nil means a client with a 10s timeout.
	HTTPClient *http.Client
	// Timeout bounds each wait; 0 means DefaultTimeout.
	Timeout time.Duration
	// NoAgents, when not "", says why the backend's tasks run no exec
	// agent: an emulator whose tasks exist only as API records (moto's
	// ECS starts no containers, and gives each task a made-up private
	// IP). The suite then runs every check of the contract on the
	// records — launch, names, ids, tokens, labels, states, list by pool,
	// a second instance, stop, unknown ids, a task killed from outside —
	// and skips each check that talks to an agent (its health with its
	// own token, a wrong or another task's token refused, a stopped agent
	// no longer answering), naming this reason in the skip. Those checks
	// are subtests named Agent_*, so the output lists them as SKIP. A
	// backend whose tasks run leaves it "": a provider is done when the
	// whole suite passes against tasks that run. Where NoAgents is set,
	// what the agent does in the backend's task must be shown elsewhere
	// (for ECS: tests/ecs_layout_test.go runs the task definition on
	// Docker).
	NoAgents string
}

// Run runs the conformance suite against the provider of h, one subtest per
// behaviour of the providers.Provider contract. Every task it launches is
// stopped when its subtest ends.
func Run(t *testing.T, h Harness) {
	t.Helper()
	require.NotNil(t, h.Open, "Harness.Open is required")
	require.NotNil(t, h.KillTask, "Harness.KillTask is required")
	if h.HTTPClient == nil {
		h.HTTPClient = &http.Client{Timeout: 10 * time.Second}
	}
	if h.Timeout == 0 {
		h.Timeout = DefaultTimeout
	}
	tests := []struct {
		name string
		run  func(t *testing.T, s *suite)
	}{
		{"Launch_SeveralTasksServeTheirOwnToken", testLaunchSeveral},
		{"Launch_NoNamesLaunchesNothing", testLaunchNone},
		{"Launch_BadSpecFailsWithLaunchError", testBadSpec},
		{"Launch_ConcurrentCallsAllSucceed", testConcurrentLaunch},
		{"List_FiltersByPool", testListByPool},
		{"Reopen_SecondInstanceFindsTasks", testReopen},
		{"Stop_StopsTaskAndIsIdempotent", testStop},
		{"UnknownIDs_DescribeStoppedAndStopNil", testUnknown},
		{"KilledFromOutside_ShowsStopped", testKilled},
		{"Watch_ReportsATaskKilledFromOutside", testWatch},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.run(t, newSuite(t, h))
		})
	}
}

// suite is the state of one subtest: a fresh backend state, a unique pool
// and task-name prefix.
type suite struct {
	h      Harness
	open   func(t *testing.T) providers.Provider
	prefix string
	pool   string
	ctx    context.Context
}

func newSuite(t *testing.T, h Harness) *suite {
	open := h.Open(t)
	require.NotNil(t, open, "Harness.Open returned nil")
	prefix := "pt-" + randomHex(t, 4)
	ctx, cancel := context.WithTimeout(t.Context(), 10*h.Timeout)
	t.Cleanup(cancel)
	return &suite{h: h, open: open, prefix: prefix, pool: prefix + "-pool", ctx: ctx}
}

func randomHex(t *testing.T, n int) string {
	b := make([]byte, n)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return hex.EncodeToString(b)
}

// names returns n task names unique to this subtest, starting at index from.
func (s *suite) names(from, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-t%d", s.prefix, from+i)
	}
	return out
}

// spec returns the harness's spec for pool with the suite's label added.
func (s *suite) spec(pool string) providers.Spec {
	spec := s.h.Spec
	spec.Pool = pool
	spec.Labels = map[string]string{"providertest": s.prefix}
	for k, v := range s.h.Spec.Labels {
		spec.Labels[k] = v
	}
	return spec
}

// launch launches names in pool, requires success and stops the tasks when
// the test ends.
func (s *suite) launch(t *testing.T, p providers.Provider, pool string, names []string) []providers.Task {
	t.Helper()
	tasks, err := p.Launch(s.ctx, s.spec(pool), names)
	s.stopAtEnd(t, p, tasks)
	require.NoError(t, err, "launch %v", names)
	require.Len(t, tasks, len(names))
	return tasks
}

// stopAtEnd stops tasks when the test ends, with a fresh context.
func (s *suite) stopAtEnd(t *testing.T, p providers.Provider, tasks []providers.Task) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), s.h.Timeout)
		defer cancel()
		for _, task := range tasks {
			assert.NoError(t, p.Stop(ctx, task.ID, "providertest cleanup"), "stop %s at cleanup", task.ID)
		}
	})
}

// eventually polls cond until it returns true, failing the test with the
// last message after the harness timeout.
func (s *suite) eventually(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(s.h.Timeout)
	for {
		ok, msg := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached within %s: %s", what, s.h.Timeout, msg)
		}
		select {
		case <-s.ctx.Done():
			t.Fatalf("%s: %v (last: %s)", what, s.ctx.Err(), msg)
		case <-time.After(pollEvery):
		}
	}
}

func (s *suite) agent(task providers.Task, token string) *agentapi.Client {
	return agentapi.New(task.AgentURL, token, s.h.HTTPClient)
}

// agentCheck runs check as the subtest Agent_<name>: the checks that talk to
// a task's exec agent. On a backend whose tasks run no agent
// (Harness.NoAgents) the subtest is skipped with that reason.
func (s *suite) agentCheck(t *testing.T, name string, check func(t *testing.T)) {
	t.Helper()
	t.Run("Agent_"+name, func(t *testing.T) {
		if s.h.NoAgents != "" {
			t.Skip("the backend's tasks run no exec agent: " + s.h.NoAgents)
		}
		check(t)
	})
}

// waitHealthy waits until the task's agent answers /healthz with its token.
func (s *suite) waitHealthy(t *testing.T, p providers.Provider, task providers.Task) {
	t.Helper()
	s.eventually(t, "agent of "+task.Name+" healthy", func() (bool, string) {
		if task.AgentURL == "" { // backends that assign the address after launch
			got, err := p.Describe(s.ctx, []string{task.ID})
			if err != nil || len(got) != 1 {
				return false, fmt.Sprintf("describe: %v", err)
			}
			task.AgentURL = got[0].AgentURL
			if task.AgentURL == "" {
				return false, "no agent URL yet"
			}
		}
		ctx, cancel := context.WithTimeout(s.ctx, 5*time.Second)
		defer cancel()
		h, err := s.agent(task, task.AgentToken).Health(ctx)
		if err != nil {
			return false, err.Error()
		}
		return h.Status == "ok", fmt.Sprintf("status %q", h.Status)
	})
}

// waitState waits until Describe reports state for id and returns the task.
func (s *suite) waitState(t *testing.T, p providers.Provider, id string, state providers.TaskState) providers.Task {
	t.Helper()
	var last providers.Task
	s.eventually(t, fmt.Sprintf("task %s %s", id, state), func() (bool, string) {
		got, err := p.Describe(s.ctx, []string{id})
		if err != nil {
			return false, err.Error()
		}
		if len(got) != 1 {
			return false, fmt.Sprintf("describe returned %d tasks", len(got))
		}
		last = got[0]
		return last.State == state, fmt.Sprintf("state %s (%s)", last.State, last.Reason)
	})
	return last
}

// listNames returns the names of pool's tasks (all states) and of its tasks
// that are not stopped.
func (s *suite) listNames(t *testing.T, p providers.Provider, pool string) (all, live []string) {
	t.Helper()
	tasks, err := p.List(s.ctx, pool)
	require.NoError(t, err, "list pool %q", pool)
	for _, task := range tasks {
		if pool != "" {
			assert.Equal(t, pool, task.Pool, "List(%q) returned a task of another pool", pool)
		}
		all = append(all, task.Name)
		if task.State != providers.TaskStopped {
			live = append(live, task.Name)
		}
	}
	return all, live
}

func taskNames(tasks []providers.Task) []string {
	out := make([]string, len(tasks))
	for i, task := range tasks {
		out[i] = task.Name
	}
	return out
}

func testLaunchSeveral(t *testing.T, s *suite) {
	p := s.open(t)
	names := s.names(0, 3)
	tasks := s.launch(t, p, s.pool, names)

	assert.ElementsMatch(t, names, taskNames(tasks), "names are kept")
	ids := map[string]bool{}
	tokens := map[string]bool{}
	for _, task := range tasks {
		assert.NotEmpty(t, task.ID, "id of %s", task.Name)
		assert.False(t, ids[task.ID], "id %s repeated", task.ID)
		ids[task.ID] = true
		assert.Equal(t, s.pool, task.Pool)
		assert.Contains(t, []providers.TaskState{providers.TaskPending, providers.TaskRunning}, task.State)
		assert.NotEmpty(t, task.AgentToken, "token of %s", task.Name)
		assert.False(t, tokens[task.AgentToken], "token of %s repeated", task.Name)
		tokens[task.AgentToken] = true
		assert.False(t, task.CreatedAt.IsZero(), "created_at of %s", task.Name)
		assert.Equal(t, "true", task.Labels[providers.LabelManaged])
		assert.Equal(t, s.pool, task.Labels[providers.LabelPool])
		assert.Equal(t, task.Name, task.Labels[providers.LabelTask])
		assert.NotEmpty(t, task.Labels[providers.LabelGateway])
		assert.Equal(t, s.prefix, task.Labels["providertest"], "spec labels are attached")
	}

	running := make([]providers.Task, len(tasks))
	for i, task := range tasks {
		running[i] = s.waitState(t, p, task.ID, providers.TaskRunning)
		require.NotEmpty(t, running[i].AgentURL, "running task %s has an agent URL", task.Name)
		assert.Equal(t, task.AgentToken, running[i].AgentToken)
		assert.Equal(t, task.Name, running[i].Name)
	}

	s.agentCheck(t, "AnswersOnlyItsOwnToken", func(t *testing.T) {
		for i, task := range tasks {
			s.waitHealthy(t, p, task)
			for _, bad := range []struct{ name, token string }{
				{name: "wrong token", token: "not-" + task.AgentToken},
				{name: "no token", token: ""},
			} {
				_, err := s.agent(running[i], bad.token).Health(s.ctx)
				var aerr *agentapi.Error
				if assert.ErrorAs(t, err, &aerr, "%s: /healthz of %s", bad.name, task.Name) {
					assert.Equal(t, http.StatusUnauthorized, aerr.Status, "%s: /healthz of %s", bad.name, task.Name)
				}
			}
		}

		// Another task's token does not open this agent.
		other := s.waitState(t, p, tasks[1].ID, providers.TaskRunning)
		_, err := s.agent(other, tasks[0].AgentToken).Health(s.ctx)
		var aerr *agentapi.Error
		if assert.ErrorAs(t, err, &aerr) {
			assert.Equal(t, http.StatusUnauthorized, aerr.Status)
		}
	})
}

func testLaunchNone(t *testing.T, s *suite) {
	p := s.open(t)
	tasks, err := p.Launch(s.ctx, s.spec(s.pool), nil)
	s.stopAtEnd(t, p, tasks)
	require.NoError(t, err)
	assert.Empty(t, tasks)
	all, _ := s.listNames(t, p, s.pool)
	assert.Empty(t, all)
}

func testBadSpec(t *testing.T, s *suite) {
	p := s.open(t)
	spec := s.h.BadSpec
	spec.Pool = s.pool
	tasks, err := p.Launch(s.ctx, spec, s.names(0, 2))
	s.stopAtEnd(t, p, tasks)
	assert.Empty(t, tasks)
	var lerr *providers.LaunchError
	require.ErrorAs(t, err, &lerr)
	assert.ErrorIs(t, err, providers.ErrInvalidSpec)
	assert.Equal(t, s.pool, lerr.Pool)
	assert.NotEmpty(t, lerr.Reason)
	all, _ := s.listNames(t, p, s.pool)
	assert.Empty(t, all, "a refused spec leaves nothing behind")
}

func testConcurrentLaunch(t *testing.T, s *suite) {
	p := s.open(t)
	names := s.names(0, concurrentLaunches)
	results := make([][]providers.Task, len(names))
	errs := make([]error, len(names))
	var wg sync.WaitGroup
	for i, name := range names {
		wg.Go(func() {
			results[i], errs[i] = p.Launch(s.ctx, s.spec(s.pool), []string{name})
		})
	}
	wg.Wait()
	var tasks []providers.Task
	for i := range names {
		s.stopAtEnd(t, p, results[i])
		require.NoError(t, errs[i], "launch %s", names[i])
		require.Len(t, results[i], 1, "launch %s", names[i])
		tasks = append(tasks, results[i][0])
	}
	tokens := map[string]bool{}
	for _, task := range tasks {
		assert.False(t, tokens[task.AgentToken], "token repeated")
		tokens[task.AgentToken] = true
		s.waitState(t, p, task.ID, providers.TaskRunning)
	}
	s.agentCheck(t, "EachAnswers", func(t *testing.T) {
		for _, task := range tasks {
			s.waitHealthy(t, p, task)
		}
	})
	all, _ := s.listNames(t, p, s.pool)
	assert.ElementsMatch(t, names, all)

	stopErrs := make([]error, len(tasks))
	for i, task := range tasks {
		wg.Go(func() { stopErrs[i] = p.Stop(s.ctx, task.ID, "providertest concurrent stop") })
	}
	wg.Wait()
	for i, err := range stopErrs {
		assert.NoError(t, err, "stop %s", tasks[i].Name)
	}
	_, live := s.listNames(t, p, s.pool)
	assert.Empty(t, live, "no task runs after stopping all")
}

func testListByPool(t *testing.T, s *suite) {
	p := s.open(t)
	otherPool := s.pool + "-other"
	names := s.names(0, 2)
	tasks := s.launch(t, p, s.pool, names)
	otherTasks := s.launch(t, p, otherPool, s.names(2, 1))

	all, _ := s.listNames(t, p, s.pool)
	assert.ElementsMatch(t, names, all, "List(pool) finds exactly the pool's tasks")
	all, _ = s.listNames(t, p, otherPool)
	assert.ElementsMatch(t, taskNames(otherTasks), all)
	all, _ = s.listNames(t, p, s.pool+"-none")
	assert.Empty(t, all, "a pool without tasks lists none")
	all, _ = s.listNames(t, p, "")
	assert.Subset(t, all, append(taskNames(tasks), taskNames(otherTasks)...), "List(\"\") lists every pool")

	listed, err := p.List(s.ctx, s.pool)
	require.NoError(t, err)
	for _, task := range listed {
		assert.Equal(t, "true", task.Labels[providers.LabelManaged])
		assert.Equal(t, task.Name, task.Labels[providers.LabelTask])
	}
}

func testReopen(t *testing.T, s *suite) {
	first := s.open(t)
	names := s.names(0, 2)
	tasks := s.launch(t, first, s.pool, names)
	for _, task := range tasks {
		s.waitState(t, first, task.ID, providers.TaskRunning)
	}
	s.agentCheck(t, "AnswersBeforeClose", func(t *testing.T) {
		for _, task := range tasks {
			s.waitHealthy(t, first, task)
		}
	})
	if c, ok := first.(providers.Closer); ok {
		require.NoError(t, c.Close(s.ctx), "close the first instance")
	}

	second := s.open(t)
	all, live := s.listNames(t, second, s.pool)
	assert.ElementsMatch(t, names, all, "a second instance lists the tasks")
	assert.ElementsMatch(t, names, live, "closing a provider does not stop its tasks")
	ids := []string{tasks[0].ID, tasks[1].ID}
	got, err := second.Describe(s.ctx, ids)
	require.NoError(t, err)
	require.Len(t, got, 2)
	for i, task := range got {
		assert.Equal(t, providers.TaskRunning, task.State, "task %s", task.Name)
		assert.Equal(t, tasks[i].ID, task.ID)
		assert.Equal(t, tasks[i].Name, task.Name)
		assert.Equal(t, tasks[i].AgentToken, task.AgentToken)
	}
	s.agentCheck(t, "AnswersThroughSecondInstance", func(t *testing.T) {
		for _, task := range got {
			s.waitHealthy(t, second, task)
		}
	})

	require.NoError(t, second.Stop(s.ctx, tasks[0].ID, "providertest stop from second instance"))
	s.waitState(t, second, tasks[0].ID, providers.TaskStopped)
	s.waitState(t, s.open(t), tasks[0].ID, providers.TaskStopped)
}

// launchPair launches two tasks and waits until the first, the victim, is
// running (returned as launched and as described) and its agent healthy.
func (s *suite) launchPair(t *testing.T, p providers.Provider) (victim, running, bystander providers.Task) {
	t.Helper()
	tasks := s.launch(t, p, s.pool, s.names(0, 2))
	running = s.waitState(t, p, tasks[0].ID, providers.TaskRunning)
	s.agentCheck(t, "VictimAnswers", func(t *testing.T) { s.waitHealthy(t, p, tasks[0]) })
	return tasks[0], running, tasks[1]
}

func testStop(t *testing.T, s *suite) {
	p := s.open(t)
	victim, running, bystander := s.launchPair(t, p)

	require.NoError(t, p.Stop(s.ctx, victim.ID, "providertest stop"))
	got := s.waitState(t, p, victim.ID, providers.TaskStopped)
	assert.Equal(t, victim.ID, got.ID)
	_, live := s.listNames(t, p, s.pool)
	assert.NotContains(t, live, victim.Name, "a stopped task is not listed as live")
	assert.Contains(t, live, bystander.Name, "stopping one task leaves the others")

	s.agentCheck(t, "StoppedStopsAnswering", func(t *testing.T) {
		s.eventually(t, "stopped agent stops answering", func() (bool, string) {
			ctx, cancel := context.WithTimeout(s.ctx, 5*time.Second)
			defer cancel()
			_, err := s.agent(running, running.AgentToken).Health(ctx)
			var aerr *agentapi.Error
			if err == nil || errors.As(err, &aerr) && aerr.Status < 500 {
				return false, fmt.Sprintf("agent still answers: %v", err)
			}
			return true, ""
		})
	})

	for _, inst := range []struct {
		name string
		p    providers.Provider
	}{
		{name: "same instance", p: p},
		{name: "second instance", p: s.open(t)},
	} {
		assert.NoError(t, inst.p.Stop(s.ctx, victim.ID, "again"), "%s: stop is idempotent", inst.name)
	}
	s.waitState(t, p, victim.ID, providers.TaskStopped)
	s.waitState(t, p, bystander.ID, providers.TaskRunning)
	s.agentCheck(t, "BystanderAnswers", func(t *testing.T) { s.waitHealthy(t, p, bystander) })
}

func testUnknown(t *testing.T, s *suite) {
	p := s.open(t)
	tasks := s.launch(t, p, s.pool, s.names(0, 1))
	unknown := s.prefix + "-never-launched"

	got, err := p.Describe(s.ctx, []string{unknown, tasks[0].ID})
	require.NoError(t, err, "unknown ids never fail a batch")
	require.Len(t, got, 2)
	assert.Equal(t, unknown, got[0].ID)
	assert.Equal(t, providers.TaskStopped, got[0].State)
	assert.Equal(t, "not found", got[0].Reason)
	assert.Equal(t, tasks[0].ID, got[1].ID)
	assert.NotEqual(t, providers.TaskStopped, got[1].State)

	got, err = p.Describe(s.ctx, nil)
	require.NoError(t, err)
	assert.Empty(t, got)

	assert.NoError(t, p.Stop(s.ctx, unknown, "providertest unknown"), "stopping an unknown task returns nil")
	all, _ := s.listNames(t, p, s.pool)
	assert.Equal(t, []string{tasks[0].Name}, all)
}

func testKilled(t *testing.T, s *suite) {
	p := s.open(t)
	victim, running, bystander := s.launchPair(t, p)

	s.h.KillTask(t, running)

	got := s.waitState(t, p, victim.ID, providers.TaskStopped)
	assert.NotEmpty(t, got.Reason, "a dead task says why it stopped")
	got = s.waitState(t, s.open(t), victim.ID, providers.TaskStopped)
	assert.NotEmpty(t, got.Reason)
	s.waitState(t, p, bystander.ID, providers.TaskRunning)

	require.NoError(t, p.Stop(s.ctx, victim.ID, "providertest stop dead task"))
	s.waitState(t, p, victim.ID, providers.TaskStopped)
}

// testWatch checks the optional providers.Watcher: a task killed from
// outside is reported stopped, with its id, name, pool and a reason, and
// Watch returns nil once its ctx ends. A provider that is no Watcher skips
// it (the capability is optional).
func testWatch(t *testing.T, s *suite) {
	p := s.open(t)
	w, ok := p.(providers.Watcher)
	if !ok {
		t.Skipf("%T is no providers.Watcher (an optional capability)", p)
	}
	events, returned := StartWatch(t, w, s.h.Timeout)
	victim, running, bystander := s.launchPair(t, p)

	s.h.KillTask(t, running)

	deadline := time.After(s.h.Timeout)
	for {
		select {
		case <-returned:
			t.Fatal("Watch returned before its ctx ended")
		case <-deadline:
			t.Fatalf("no stopped event for %s within %s", victim.Name, s.h.Timeout)
		case e := <-events:
			if e.ID == bystander.ID {
				assert.NotEqual(t, providers.TaskStopped, e.State, "the bystander was not stopped: %+v", e)
			}
			if e.ID != victim.ID || e.State != providers.TaskStopped {
				continue
			}
			if e.Name != "" {
				assert.Equal(t, victim.Name, e.Name)
				assert.Equal(t, s.pool, e.Pool)
			}
			assert.NotEmpty(t, e.Reason, "a stopped event says why")
			assert.False(t, e.At.IsZero(), "a stopped event says when")
			return
		}
	}
}

// StartWatch runs w.Watch until t ends and returns its events (buffered)
// and a channel closed when Watch returns. When t ends it cancels Watch's
// ctx and checks that Watch returns nil within timeout.
func StartWatch(t *testing.T, w providers.Watcher, timeout time.Duration) (events <-chan providers.TaskEvent, returned <-chan struct{}) {
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan providers.TaskEvent, 64)
	done := make(chan struct{})
	var err error
	go func() {
		defer close(done)
		err = w.Watch(ctx, ch)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
			assert.NoError(t, err, "Watch returns nil when its ctx ends")
		case <-time.After(timeout):
			t.Error("Watch did not return after its ctx ended")
		}
	})
	return ch, done
}
