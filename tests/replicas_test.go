//go:build integration

package tests

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/client"
	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/internal/testenv"
	"github.com/quarryhq/quarry/warmpool"
	"github.com/quarryhq/quarry/warmpool/dynamostore"
)

// These tests run several gateway processes on one DynamoDB (the emulator
// of make test, or whatever AWS_ENDPOINT_URL names) and one data directory
// (the process provider's task state). Each test makes its own tables with
// `quarry tables create` and deletes them at the end. Each needs the AWS
// emulator and asks testenv.AWS first.

// awsSettings say where the AWS API is: AWS_* when set, else the emulator
// of localstack/emulator.sh with its fake credentials.
type awsSettings struct{ endpoint, region, keyID, secret string }

func awsFromEnv() awsSettings {
	return awsSettings{
		endpoint: cmp.Or(os.Getenv("AWS_ENDPOINT_URL"), "http://127.0.0.1:4566"),
		region:   cmp.Or(os.Getenv("AWS_REGION"), os.Getenv("AWS_DEFAULT_REGION"), "us-east-1"),
		keyID:    cmp.Or(os.Getenv("AWS_ACCESS_KEY_ID"), "test"),
		secret:   cmp.Or(os.Getenv("AWS_SECRET_ACCESS_KEY"), "test"),
	}
}

// env is the settings as a process's environment, with endpoint as the
// DynamoDB endpoint (the emulator's, or a fault proxy in front of it).
func (a awsSettings) env(endpoint string) []string {
	return []string{"AWS_ENDPOINT_URL=" + endpoint, "AWS_REGION=" + a.region, "AWS_ACCESS_KEY_ID=" + a.keyID,
		"AWS_SECRET_ACCESS_KEY=" + a.secret, "AWS_EC2_METADATA_DISABLED=true"}
}

// awsTables are one test's tables, and a store on them for the test's own
// checks (what the gateways wrote, read straight from DynamoDB).
type awsTables struct {
	aws           awsSettings
	tasks, leases string
	// relay and checkpoints: the model relay's and the S3 checkpoint
	// store's tables, made with the others (named by the test, so that no
	// test makes or deletes another's, nor the defaults).
	relay, checkpoints string
	store              *dynamostore.Store
}

// newTables creates fresh tables with `quarry tables create` and deletes
// them when the test ends. It fails when the endpoint does not answer.
func newTables(t *testing.T) *awsTables {
	t.Helper()
	a := awsFromEnv()
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get(a.endpoint)
	require.NoError(t, err, "QUARRY_TEST_AWS=1, but the AWS endpoint %s does not answer (start the emulator: localstack/emulator.sh start)", a.endpoint)
	resp.Body.Close()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	prefix := "e2e-" + hex.EncodeToString(b)
	tb := &awsTables{aws: a, tasks: prefix + "-tasks", leases: prefix + "-leases", relay: prefix + "-relay", checkpoints: prefix + "-checkpoints"}
	tb.quarry(t, "create")
	t.Cleanup(func() { tb.quarry(t, "delete") })

	awsCfg, err := config.LoadDefaultConfig(context.Background(), config.WithRegion(a.region),
		config.WithCredentialsProvider(credentials.NewStaticCredentialsProvider(a.keyID, a.secret, "")))
	require.NoError(t, err)
	api := dynamodb.NewFromConfig(awsCfg, func(o *dynamodb.Options) { o.BaseEndpoint = aws.String(a.endpoint) })
	tb.store, err = dynamostore.New(api, dynamostore.Config{TasksTable: tb.tasks, LeasesTable: tb.leases})
	require.NoError(t, err)
	return tb
}

// quarry runs `quarry tables <verb>` on the test's tables.
func (tb *awsTables) quarry(t *testing.T, verb string) {
	t.Helper()
	cmd := exec.Command(bins.quarry, "tables", verb, "--tasks-table", tb.tasks, "--leases-table", tb.leases,
		"--relay-table", tb.relay, "--checkpoint-table", tb.checkpoints, "--timeout", "2m")
	cmd.Env = append(os.Environ(), tb.aws.env(tb.aws.endpoint)...)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "quarry tables %s: %s", verb, out)
}

// gatewayEnv configures a gateway for the tables, reaching DynamoDB at
// endpoint.
func (tb *awsTables) gatewayEnv(endpoint string) []string {
	return append(tb.aws.env(endpoint), "QUARRY_STORE=dynamodb",
		"QUARRY_DYNAMODB_TASKS_TABLE="+tb.tasks, "QUARRY_DYNAMODB_LEASES_TABLE="+tb.leases)
}

// cluster is n gateway replicas on one set of tables and one data
// directory.
type cluster struct {
	t        *testing.T
	tables   *awsTables
	dataDir  string
	maxTotal int
	gws      []*gatewayProc
}

const replicaPools = `pools:
  - name: default
    image: host
    min_warm: 3
    max_total: 10
    startup_timeout_seconds: 20
`

// startCluster starts n replicas, which reach DynamoDB through a
// storeProxy. Locks expire after 2 s, so that a dead replica's work moves
// quickly.
func startCluster(t *testing.T, n int) *cluster {
	t.Helper()
	tb := newTables(t)
	c := &cluster{t: t, tables: tb, dataDir: t.TempDir(), maxTotal: 10}
	proxy := startStoreProxy(t, tb.aws.endpoint)
	for i := range n {
		// The process provider launches at once, so a reservation needs no
		// allowance for a queue in front of it: a replica killed between
		// reserving a task and recording its launch leaves a record that is
		// given up after 5 s + the startup timeout, not the default 5 min.
		env := append(tb.gatewayEnv(proxy.url), fmt.Sprintf("QUARRY_REPLICA_ID=replica-%d", i),
			"QUARRY_LOCK_TTL=2s", "QUARRY_ORPHAN_INTERVAL=1s", "QUARRY_ORPHAN_GRACE=10s", "QUARRY_LAUNCH_QUEUE_TIMEOUT=5s",
			// One process holds an embedded checkpoint store: each replica
			// its own (these tests take no checkpoints).
			"QUARRY_CHECKPOINT_DIR="+t.TempDir())
		c.gws = append(c.gws, startGateway(t, replicaPools, withDataDir(c.dataDir), withEnv(env...)))
	}
	return c
}

// longCtx bounds a test that runs traffic through several replicas.
func longCtx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	return c
}

// storePoll is how often these tests poll what reads DynamoDB (GET
// /v1/pools lists every task of the pool; reconciled lists everything): the
// emulator is slow, and a busy poll would slow down what it waits for.
const storePoll = 500 * time.Millisecond

// eventuallyStore is eventually, polling every storePoll.
func eventuallyStore(t *testing.T, d time.Duration, what string, f func() error) {
	t.Helper()
	eventuallyEvery(t, d, storePoll, what, f)
}

// waitReadyOn waits until pool has n ready tasks, asking replica g.
func waitReadyOn(t *testing.T, g *gatewayProc, pool string, n int) {
	t.Helper()
	eventuallyStore(t, 60*time.Second, fmt.Sprintf("pool %s has %d ready tasks", pool, n), func() error {
		ps, err := g.client().Pools(context.Background())
		if err != nil {
			return err
		}
		for _, p := range ps {
			if p.Name == pool && p.Ready >= n {
				return nil
			}
		}
		return fmt.Errorf("pools %+v", ps)
	})
}

// liveAgents returns the tasks whose exec agent runs under dataDir, found in
// /proc by the agent's work directory: every agent, recorded by the
// provider or not (a gateway killed mid-launch may not have recorded it).
func liveAgents(dataDir string) map[string]int {
	prefix := []byte("\x00QUARRY_AGENT_WORKDIR=" + filepath.Join(dataDir, "process") + "/")
	out := map[string]int{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || !isAgent(pid) {
			continue
		}
		env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		if err != nil {
			continue
		}
		_, rest, ok := bytes.Cut(append([]byte{0}, env...), prefix)
		if !ok {
			continue
		}
		name, _, _ := bytes.Cut(rest, []byte("/"))
		out[string(name)] = pid
	}
	return out
}

// reconciled returns nil when the cluster's books balance: every live agent
// is accounted for by a task record, every record by a live agent or a
// launch in flight (before its deadline), no task is held by two active
// leases, every active lease's task is leased to it and alive, and the pool
// stays within max_total.
func (c *cluster) reconciled(ctx context.Context) error {
	recs, err := c.tables.store.ListTasks(ctx, "")
	if err != nil {
		return err
	}
	agents := liveAgents(c.dataDir)
	byID := map[string]warmpool.TaskRecord{}
	for _, r := range recs {
		byID[r.ID] = r
		_, alive := agents[r.ID]
		if !alive && !(r.State == warmpool.TaskLaunching && time.Now().Before(r.LaunchDeadline)) {
			return fmt.Errorf("task record %s (%s) has no live agent and no launch in flight", r.ID, r.State)
		}
	}
	for name := range agents {
		if _, ok := byID[name]; !ok {
			return fmt.Errorf("the agent of task %s runs, but no task record accounts for it", name)
		}
	}
	if len(recs) > c.maxTotal || len(agents) > c.maxTotal {
		return fmt.Errorf("%d task records and %d agents: over max_total %d", len(recs), len(agents), c.maxTotal)
	}
	leases, err := c.tables.store.ListLeases(ctx, warmpool.LeaseFilter{State: warmpool.LeaseActive})
	if err != nil {
		return err
	}
	holder := map[string]string{}
	for _, l := range leases {
		if other, dup := holder[l.TaskID]; dup {
			return fmt.Errorf("task %s is held by two active leases, %s and %s", l.TaskID, other, l.ID)
		}
		holder[l.TaskID] = l.ID
		r, ok := byID[l.TaskID]
		if !ok || r.State != warmpool.TaskLeased || r.LeaseID != l.ID {
			return fmt.Errorf("active lease %s: its task %s is not leased to it (record %+v)", l.ID, l.TaskID, r)
		}
	}
	return nil
}

// lockHolders returns the replicas whose metrics say they hold lock.
func (c *cluster) lockHolders(ctx context.Context, lock string) []int {
	var out []int
	want := `quarry_lock_held{lock="` + lock + `"} 1`
	for i, g := range c.gws {
		if g.cmd == nil {
			continue
		}
		m, err := g.client().Metrics(ctx)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(bytes.NewReader(m))
		for sc.Scan() {
			if sc.Text() == want {
				out = append(out, i)
			}
		}
	}
	return out
}

// replicaSet is the trainers' view of the replicas: each request goes to a
// random replica, and moves on to another when its replica does not answer
// at all (an HTTP answer, even an error, is final).
type replicaSet struct {
	clients []*client.Client
	mu      sync.Mutex
	dead    map[int]bool
}

func newReplicaSet(gws []*gatewayProc) *replicaSet {
	rs := &replicaSet{dead: map[int]bool{}}
	for _, g := range gws {
		rs.clients = append(rs.clients, g.client())
	}
	return rs
}

func (rs *replicaSet) markDead(i int) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	rs.dead[i] = true
}

// do runs f on a random live replica. Like a trainer, it retries, for up
// to a minute, when the answer is 503 unavailable (the operation did not
// happen: a busy emulator may answer a call late), and moves on to another
// replica when one does not answer at all.
func (rs *replicaSet) do(f func(c *client.Client) error) error {
	deadline := time.Now().Add(time.Minute)
	for {
		err := rs.once(f)
		if !client.HasCode(err, agentapi.CodeUnavailable) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func (rs *replicaSet) once(f func(c *client.Client) error) error {
	var last error
	for _, i := range mrand.Perm(len(rs.clients)) {
		rs.mu.Lock()
		dead := rs.dead[i]
		rs.mu.Unlock()
		if dead {
			continue
		}
		err := f(rs.clients[i])
		var ce *client.Error
		if err == nil || errors.As(err, &ce) {
			return err
		}
		last = err
	}
	return fmt.Errorf("no replica answered: %w", last)
}

// grants records which task each lease got, failing on a task granted to
// two leases (the task's work directory names it).
type grants struct {
	mu      sync.Mutex
	taskOf  map[string]string // lease → task work directory
	leaseOf map[string]string
}

func (g *grants) record(lease, task string) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if prev, ok := g.taskOf[lease]; ok {
		if prev != task {
			return fmt.Errorf("lease %s moved from task %s to %s", lease, prev, task)
		}
		return nil
	}
	if other, ok := g.leaseOf[task]; ok {
		return fmt.Errorf("task %s granted twice: to %s and to %s", task, other, lease)
	}
	g.taskOf[lease], g.leaseOf[task] = task, lease
	return nil
}

// trainerRound is one episode of a trainer: create (idempotent, so that a
// retry on another replica cannot make a second sandbox), exec through
// random replicas, heartbeat, release unless keep. It returns the lease.
func trainerRound(ctx context.Context, rs *replicaSet, g *grants, trainer, round int, keep bool) (string, error) {
	key := fmt.Sprintf("trainer-%d-round-%d", trainer, round)
	var sbx client.Sandbox
	deadline := time.Now().Add(90 * time.Second)
	for {
		err := rs.do(func(c *client.Client) (err error) {
			sbx, err = c.CreateSandbox(ctx, client.CreateSandboxRequest{IdempotencyKey: key, LeaseSeconds: 300})
			return err
		})
		if err == nil {
			break
		}
		if !client.IsNoCapacity(err) || time.Now().After(deadline) {
			return "", fmt.Errorf("create: %w", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	var res agentapi.ExecResult
	if err := rs.do(func(c *client.Client) (err error) {
		res, err = c.Exec(ctx, sbx.ID, agentapi.ExecRequest{Command: "pwd"})
		return err
	}); err != nil {
		return sbx.ID, fmt.Errorf("exec pwd in %s: %w", sbx.ID, err)
	}
	if err := g.record(sbx.ID, res.Stdout); err != nil {
		return sbx.ID, err
	}
	for k := range 3 {
		want := fmt.Sprintf("%d-%d-%d\n", trainer, round, k)
		if err := rs.do(func(c *client.Client) (err error) {
			res, err = c.Exec(ctx, sbx.ID, agentapi.ExecRequest{Command: "echo " + strings.TrimSpace(want)})
			return err
		}); err != nil {
			return sbx.ID, fmt.Errorf("exec in %s: %w", sbx.ID, err)
		}
		if res.Stdout != want {
			return sbx.ID, fmt.Errorf("exec in %s: stdout %q, want %q", sbx.ID, res.Stdout, want)
		}
	}
	if err := rs.do(func(c *client.Client) error { _, err := c.Heartbeat(ctx, sbx.ID); return err }); err != nil {
		return sbx.ID, fmt.Errorf("heartbeat %s: %w", sbx.ID, err)
	}
	if keep {
		return sbx.ID, nil
	}
	released := false
	err := rs.do(func(c *client.Client) error {
		_, err := c.DeleteSandbox(ctx, sbx.ID)
		if client.IsGone(err) && released { // a retry after a replica died answering
			return nil
		}
		released = true
		return err
	})
	if err != nil {
		return sbx.ID, fmt.Errorf("release %s: %w", sbx.ID, err)
	}
	return sbx.ID, nil
}

// Three replicas share one DynamoDB: trainers spread their requests over
// random replicas, and the replica that reconciles the pool is killed with
// SIGKILL mid-traffic. Every lease stays usable through the others, no task
// is granted twice, another replica takes the pool's lock over, and after
// reconciliation every agent and every record is accounted for. Before the
// traffic: a replica releasing a sandbox that another replica launched
// stops its agent.
func TestReplicas_KillOneReplicaMidTraffic(t *testing.T) {
	testenv.AWS(t)
	c := startCluster(t, 3)
	ctx := longCtx(t)
	waitReadyOn(t, c.gws[0], "default", 3)

	t.Run("release on another replica stops the agent", func(t *testing.T) {
		sbx, err := c.gws[0].client().CreateSandbox(ctx, client.CreateSandboxRequest{})
		require.NoError(t, err)
		res, err := c.gws[0].client().Exec(ctx, sbx.ID, agentapi.ExecRequest{Command: `read -r -a f < /proc/$$/stat; echo ${f[5]}`})
		require.NoError(t, err)
		agent, err := strconv.Atoi(strings.TrimSpace(res.Stdout))
		require.NoError(t, err, res.Stdout)
		require.True(t, isAgent(agent), "pid %d is the sandbox's agent", agent)
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", agent))
		require.NoError(t, err)
		fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		parent, err := strconv.Atoi(fields[1])
		require.NoError(t, err)
		launcher := -1
		for i, g := range c.gws {
			if g.cmd.Process.Pid == parent {
				launcher = i
			}
		}
		require.GreaterOrEqual(t, launcher, 0, "one of the replicas launched the agent (its parent is %d)", parent)
		releaser := (launcher + 1) % len(c.gws)
		_, err = c.gws[releaser].client().DeleteSandbox(ctx, sbx.ID)
		require.NoError(t, err)
		eventually(t, 30*time.Second, "the agent stops", func() error {
			if isAgent(agent) {
				return fmt.Errorf("agent %d (launched by replica %d, released through replica %d) still runs", agent, launcher, releaser)
			}
			return nil
		})
	})

	var victim int
	eventuallyStore(t, 30*time.Second, "one replica holds the pool's lock", func() error {
		holders := c.lockHolders(ctx, "pool/default")
		if len(holders) != 1 {
			return fmt.Errorf("holders %v", holders)
		}
		victim = holders[0]
		return nil
	})

	rs := newReplicaSet(c.gws)
	g := &grants{taskOf: map[string]string{}, leaseOf: map[string]string{}}
	const trainers, rounds = 6, 5
	var (
		wg         sync.WaitGroup
		roundsDone atomic.Int32
		mu         sync.Mutex
		kept       []string
		errs       []error
	)
	killNow, allDone := make(chan struct{}), make(chan struct{})
	for i := range trainers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range rounds {
				id, err := trainerRound(ctx, rs, g, i, r, r == rounds-1)
				mu.Lock()
				if err != nil {
					errs = append(errs, fmt.Errorf("trainer %d round %d: %w", i, r, err))
				} else if r == rounds-1 {
					kept = append(kept, id)
				}
				mu.Unlock()
				if err != nil {
					return
				}
				if roundsDone.Add(1) == trainers*rounds/3 {
					close(killNow)
				}
			}
		}()
	}
	go func() { wg.Wait(); close(allDone) }()
	select {
	case <-killNow:
	case <-allDone:
	}
	c.gws[victim].kill()
	rs.markDead(victim)
	atKill := roundsDone.Load()
	t.Logf("killed replica %d (the pool's reconciler) after %d of %d rounds", victim, atKill, trainers*rounds)
	<-allDone
	require.Empty(t, errs)
	require.Len(t, kept, trainers)
	assert.Less(t, int(atKill), trainers*rounds, "the kill came mid-traffic")

	for _, id := range kept {
		for i, gw := range c.gws {
			if i == victim {
				continue
			}
			res, err := gw.client().Exec(ctx, id, agentapi.ExecRequest{Command: "pwd"})
			require.NoError(t, err, "lease %s through replica %d", id, i)
			assert.Equal(t, g.taskOf[id], res.Stdout, "lease %s keeps its task", id)
		}
	}
	eventuallyStore(t, 30*time.Second, "a surviving replica took the pool's lock over", func() error {
		holders := c.lockHolders(ctx, "pool/default")
		if len(holders) != 1 || holders[0] == victim {
			return fmt.Errorf("holders %v (killed %d)", holders, victim)
		}
		return nil
	})
	eventuallyStore(t, 90*time.Second, "every agent and every task record is accounted for", func() error { return c.reconciled(ctx) })
	for _, id := range kept {
		_, err := c.gws[(victim+1)%3].client().DeleteSandbox(ctx, id)
		require.NoError(t, err)
	}
	eventuallyStore(t, 90*time.Second, "released tasks stopped, the books balance", func() error { return c.reconciled(ctx) })
}

// Every replica restarts (two crash, one stops gracefully): every live
// lease, its sandbox's state, and the pools' counts come back from
// DynamoDB, through every replica.
func TestReplicas_RestartEveryReplica(t *testing.T) {
	testenv.AWS(t)
	c := startCluster(t, 3)
	ctx := longCtx(t)
	waitReadyOn(t, c.gws[0], "default", 3)
	type held struct{ id, session string }
	var leases []held
	for i, g := range c.gws {
		sbx, err := g.client().CreateSandbox(ctx, client.CreateSandboxRequest{Labels: map[string]string{"n": strconv.Itoa(i)}})
		require.NoError(t, err)
		ses, err := g.client().CreateSession(ctx, sbx.ID, agentapi.SessionCreateRequest{})
		require.NoError(t, err)
		_, err = g.client().RunSession(ctx, sbx.ID, ses.ID, agentapi.SessionRunRequest{Command: fmt.Sprintf("export KEEP=%d; cd /tmp", i)})
		require.NoError(t, err)
		leases = append(leases, held{sbx.ID, ses.ID})
	}

	c.gws[0].kill()
	c.gws[1].stop()
	c.gws[2].kill()
	for _, g := range c.gws {
		g.start()
	}

	for i, l := range leases {
		for j, g := range c.gws {
			got, err := g.client().GetSandbox(ctx, l.id)
			require.NoError(t, err, "lease %s through replica %d", l.id, j)
			assert.Equal(t, client.StateActive, got.State)
			assert.Equal(t, strconv.Itoa(i), got.Labels["n"])
			r, err := g.client().RunSession(ctx, l.id, l.session, agentapi.SessionRunRequest{Command: "echo $KEEP $PWD"})
			require.NoError(t, err)
			assert.Equal(t, fmt.Sprintf("%d /tmp\n", i), r.Output)
		}
	}
	for j, g := range c.gws {
		ps, err := g.client().Pools(ctx)
		require.NoError(t, err)
		require.Len(t, ps, 1)
		assert.Equal(t, 3, ps[0].Leased, "replica %d counts the leased tasks from DynamoDB", j)
		listed, err := g.client().ListSandboxes(ctx, client.ListSandboxesRequest{State: client.StateActive})
		require.NoError(t, err)
		assert.Len(t, listed, 3, "replica %d lists every live lease", j)
	}
	waitReadyOn(t, c.gws[1], "default", 3)
	eventuallyStore(t, 90*time.Second, "every agent and every task record is accounted for", func() error { return c.reconciled(ctx) })
}

// storeProxy stands between the gateways and the DynamoDB endpoint. It
// passes requests on one at a time, or answers them the way DynamoDB does
// when it throttles or fails (mode).
//
// One at a time, because the emulator (moto) runs requests on concurrent
// threads without isolating them: two conditional TransactWriteItems on one
// item can both succeed (8 racing transactions with the same condition had
// more than one winner in 4 of 30 rounds), which would let two replicas
// claim one task. DynamoDB decides conditional writes on an item one at a
// time; serializing the requests gives the emulator that property.
type storeProxy struct {
	url    string
	mode   atomic.Value // faultPass, faultThrottle or faultError
	faults atomic.Int64 // requests answered with a fault
	mu     sync.Mutex   // one request at a time reaches the endpoint
}

const (
	faultPass     = "pass"
	faultThrottle = "throttle"
	faultError    = "error"
)

// DynamoDB's own error answers (JSON 1.0 protocol).
var faultAnswers = map[string]struct {
	status int
	body   string
}{
	faultThrottle: {http.StatusBadRequest, `{"__type":"com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException",` +
		`"message":"The level of configured provisioned throughput for the table was exceeded. Consider increasing your provisioning level with the UpdateTable API."}`},
	faultError: {http.StatusInternalServerError, `{"__type":"com.amazonaws.dynamodb.v20120810#InternalServerError","message":"Internal server error"}`},
}

func startStoreProxy(t *testing.T, upstream string) *storeProxy {
	t.Helper()
	target, err := url.Parse(upstream)
	require.NoError(t, err)
	p := &storeProxy{}
	p.mode.Store(faultPass)
	rp := httputil.NewSingleHostReverseProxy(target)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a, fault := faultAnswers[p.mode.Load().(string)]
		if !fault {
			p.mu.Lock()
			defer p.mu.Unlock()
			rp.ServeHTTP(w, r)
			return
		}
		p.faults.Add(1)
		_, _ = io.Copy(io.Discard, io.LimitReader(r.Body, 1<<20))
		w.Header().Set("Content-Type", "application/x-amz-json-1.0")
		w.Header().Set("X-Amzn-Requestid", "fault-proxy")
		w.Header().Set("X-Amz-Crc32", strconv.FormatUint(uint64(crc32.ChecksumIEEE([]byte(a.body))), 10))
		w.WriteHeader(a.status)
		_, _ = io.WriteString(w, a.body)
	}))
	t.Cleanup(srv.Close)
	p.url = srv.URL
	return p
}

// A throttled or failing DynamoDB answers every request that needs the
// store with a clear 503 (Retry-After, "the lease store is unavailable"),
// never a silent success; nothing changes meanwhile, and the gateway
// serves again once DynamoDB does.
func TestReplicas_StoreFaultsAnswer503(t *testing.T) {
	testenv.AWS(t)
	tb := newTables(t)
	proxy := startStoreProxy(t, tb.aws.endpoint)
	env := append(tb.gatewayEnv(proxy.url), "QUARRY_DYNAMODB_MAX_ATTEMPTS=2", "QUARRY_LEASE_CACHE_TTL=-1s", "QUARRY_RETRY_AFTER=3s")
	g := startGateway(t, `pools:
  - name: default
    image: host
    min_warm: 1
    max_total: 4
`, withEnv(env...))
	ctx := longCtx(t)
	c := g.client()
	waitReadyOn(t, g, "default", 1)
	sbx, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{})
	require.NoError(t, err)

	requests := []struct {
		name string
		call func() error
	}{
		{"create", func() error { _, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{}); return err }},
		{"exec", func() error { _, err := c.Exec(ctx, sbx.ID, agentapi.ExecRequest{Command: "true"}); return err }},
		{"get", func() error { _, err := c.GetSandbox(ctx, sbx.ID); return err }},
		{"heartbeat", func() error { _, err := c.Heartbeat(ctx, sbx.ID); return err }},
		{"release", func() error { _, err := c.DeleteSandbox(ctx, sbx.ID); return err }},
		{"list", func() error { _, err := c.ListSandboxes(ctx, client.ListSandboxesRequest{}); return err }},
		{"pools", func() error { _, err := c.Pools(ctx); return err }},
		{"readyz", func() error { return c.Ready(ctx) }},
	}
	for _, mode := range []string{faultThrottle, faultError} {
		t.Run(mode, func(t *testing.T) {
			proxy.mode.Store(mode)
			defer proxy.mode.Store(faultPass)
			for _, rq := range requests {
				before := proxy.faults.Load()
				err := rq.call()
				var ce *client.Error
				require.ErrorAs(t, err, &ce, "%s: an answer, not a success", rq.name)
				assert.Equal(t, http.StatusServiceUnavailable, ce.Status, "%s: %v", rq.name, err)
				assert.Equal(t, agentapi.CodeUnavailable, ce.Code, rq.name)
				assert.Contains(t, ce.Message, "lease store", rq.name)
				assert.Equal(t, 3*time.Second, ce.RetryAfter, "%s: Retry-After", rq.name)
				assert.Greater(t, proxy.faults.Load(), before, "%s reached DynamoDB", rq.name)
			}
		})
	}

	// DynamoDB is back: nothing happened meanwhile.
	got, err := c.GetSandbox(ctx, sbx.ID)
	require.NoError(t, err)
	assert.Equal(t, client.StateActive, got.State, "the release under faults did not happen")
	res, err := c.Exec(ctx, sbx.ID, agentapi.ExecRequest{Command: "echo back"})
	require.NoError(t, err)
	assert.Equal(t, "back\n", res.Stdout)
	require.NoError(t, c.Ready(ctx))
	_, err = c.DeleteSandbox(ctx, sbx.ID)
	require.NoError(t, err)
}

// A lease whose ExpiresAt passed is refused with 410 at once, by exec and
// heartbeat, even while the store still says active (the reaper has not
// ended it yet).
func TestReplicas_ExpiredLeaseRefusedBeforeTheReaper(t *testing.T) {
	testenv.AWS(t)
	tb := newTables(t)
	g := startGateway(t, `pools:
  - name: short
    image: host
    min_warm: 1
    max_total: 2
    default_lease_seconds: 2
    max_lease_seconds: 5
`, withEnv(append(tb.gatewayEnv(tb.aws.endpoint), "QUARRY_REAP_INTERVAL=1h")...))
	ctx := longCtx(t)
	c := g.client()
	sbx, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Pool: "short"})
	require.NoError(t, err)
	_, err = c.Exec(ctx, sbx.ID, agentapi.ExecRequest{Command: "true"})
	require.NoError(t, err)
	eventually(t, 30*time.Second, "the lease's expiry passes", func() error {
		if time.Now().Before(sbx.ExpiresAt.Add(100 * time.Millisecond)) {
			return errors.New("not yet")
		}
		return nil
	})
	_, err = c.Exec(ctx, sbx.ID, agentapi.ExecRequest{Command: "true"})
	assert.True(t, client.IsGone(err), "exec after expiry: %v", err)
	_, err = c.Heartbeat(ctx, sbx.ID)
	assert.True(t, client.IsGone(err), "heartbeat after expiry: %v", err)
	stored, err := tb.store.GetLease(ctx, sbx.ID)
	require.NoError(t, err)
	assert.Equal(t, warmpool.LeaseActive, stored.State, "the reaper has not ended it: the refusal came from ExpiresAt")
}

// ROCK's routes keep nothing in the gateway: a sandbox started on one
// replica is driven through the other, a chosen sandbox_id started on both
// at once is one sandbox, and a session's state is found from any replica.
func TestReplicas_RockRoutesAcrossReplicas(t *testing.T) {
	testenv.AWS(t)
	c := startCluster(t, 2)
	a, b := c.gws[0], c.gws[1]
	waitReadyOn(t, a, "default", 1)
	key := map[string]string{"X-Key": a.key}
	const id = "rock-across"

	envs := make([]rockEnvelope, 2)
	var wg sync.WaitGroup
	for i, g := range []*gatewayProc{a, b} {
		wg.Go(func() {
			_, envs[i] = rockCall(t, g, http.MethodPost, "start", key, map[string]any{"sandbox_id": id})
		})
	}
	wg.Wait()
	for _, env := range envs {
		require.Equal(t, "Success", env.Status, env.errMsg())
	}
	sbs, err := b.client().ListSandboxes(longCtx(t), client.ListSandboxesRequest{Labels: map[string]string{"rock.sandbox_id": id}})
	require.NoError(t, err)
	require.Len(t, sbs, 1, "one sandbox for one sandbox_id, whichever replica answered")

	_, env := rockCall(t, a, http.MethodPost, "create_session", key, map[string]any{"sandbox_id": id, "session": "s"})
	require.Equal(t, "Success", env.Status, env.errMsg())
	_, env = rockCall(t, b, http.MethodPost, "create_session", key, map[string]any{"sandbox_id": id, "session": "s"})
	assert.Contains(t, env.errMsg(), "already exists", "the name is taken on every replica")
	_, env = rockCall(t, b, http.MethodPost, "run_in_session", key,
		map[string]any{"sandbox_id": id, "session": "s", "command": "cd /tmp && export ACROSS=yes"})
	require.Equal(t, "Success", env.Status, env.errMsg())
	_, env = rockCall(t, a, http.MethodPost, "run_in_session", key,
		map[string]any{"sandbox_id": id, "session": "s", "command": `echo "$(pwd) $ACROSS"`})
	require.Equal(t, "Success", env.Status, env.errMsg())
	assert.Equal(t, "/tmp yes", env.res()["output"])

	path := "/tmp/quarry-rock-across-" + sbs[0].ID
	t.Cleanup(func() { _ = os.Remove(path) }) // the process provider's sandboxes share the host's /tmp
	_, env = rockCall(t, a, http.MethodPost, "write_file", key, map[string]any{"sandbox_id": id, "path": path, "content": "written on A"})
	require.Equal(t, "Success", env.Status, env.errMsg())
	_, env = rockCall(t, b, http.MethodPost, "read_file", key, map[string]any{"sandbox_id": id, "path": path})
	require.Equal(t, "Success", env.Status, env.errMsg())
	assert.Equal(t, "written on A", env.res()["content"])

	_, env = rockCall(t, b, http.MethodPost, "stop", key, map[string]any{"sandbox_id": id})
	require.Equal(t, "Success", env.Status, env.errMsg())
	_, env = rockCall(t, a, http.MethodGet, "is_alive?sandbox_id="+id, key, nil)
	require.Equal(t, "Success", env.Status, env.errMsg())
	assert.Equal(t, false, env.res()["is_alive"], "stopped on B, dead on A")
}
