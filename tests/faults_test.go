//go:build integration

package tests

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/client"
	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/internal/faults"
	"github.com/quarryhq/quarry/internal/testenv"
	"github.com/quarryhq/quarry/warmpool"
)

// TestFaults runs trainers' traffic against three replicas on DynamoDB
// while a seeded nemesis kills, pauses and cuts them off from the store,
// and kills sandboxes from outside; then it checks the recorded history
// (internal/faults: each lease linearizable against the lease model, one
// holder per task, a refused command never ran, an acknowledged one did,
// every call ended) and what is left behind (after a reconciler cycle:
// every agent and record accounted for, no active lease, every
// acknowledged release's sandbox stopped, the pools' counters equal to the
// records).
//
// make test runs it for QUARRY_FAULTS_DURATION (default 45s) with a random
// seed; make faults runs it longer. A failed run prints its seed
// (QUARRY_FAULTS_SEED replays the nemesis's schedule) and the operations
// that broke a rule, and leaves the whole history as JSON lines.
func TestFaults(t *testing.T) {
	testenv.AWS(t)
	cfg := faultsConfigFromEnv(t)
	t.Logf("faults: seed %d, %s of traffic, %d clients, faults %v (replay: QUARRY_FAULTS_SEED=%d)",
		cfg.seed, cfg.duration, cfg.clients, cfg.kinds, cfg.seed)

	fc := startFaultCluster(t)
	ctx := longCtxFor(t, cfg.duration+6*time.Minute)
	waitReadyOn(t, fc.gws[0], "default", 3)

	rec := faults.NewRecorder()
	schedule := faults.Schedule(cfg.seed, cfg.duration, len(fc.gws), cfg.kinds, 2*time.Second, time.Second, 4*time.Second)
	load := &faultLoad{fc: fc, rec: rec, seed: cfg.seed, markers: t.TempDir(), held: map[string]string{}}
	soft, stopLoad := context.WithCancel(ctx)
	hard, stopHard := context.WithCancel(ctx)
	defer stopHard()
	var wg sync.WaitGroup
	for i := range cfg.clients {
		wg.Add(1)
		go func() { defer wg.Done(); load.client(soft, hard, i) }()
	}

	injected := fc.runNemesis(t, ctx, rec, load, schedule)
	stopLoad()
	clientsDone := make(chan struct{})
	go func() { wg.Wait(); close(clientsDone) }()
	select {
	case <-clientsDone:
	case <-time.After(2 * time.Minute):
		stopHard() // the clients stop retrying; what they left is found below
		<-clientsDone
		t.Errorf("the clients did not finish their rounds within 2 minutes of the end of the faults")
	}

	ops := rec.Ops()
	histFile := filepath.Join(cmpDir(os.Getenv("QUARRY_FAULTS_OUT"), t), fmt.Sprintf("faults-%d.jsonl", cfg.seed))
	f, err := os.Create(histFile)
	require.NoError(t, err)
	require.NoError(t, faults.WriteJSON(f, ops))
	require.NoError(t, f.Close())

	violations := faults.Check(ops, load.ran, 30*time.Second)
	for _, v := range violations {
		t.Errorf("seed %d: %s\n  faults around it:\n%s", cfg.seed, v, faultsAround(injected, v.Ops))
	}

	// What is left behind, once the replicas have reconciled.
	released := load.releasedTasks(ops)
	eventuallyStore(t, 2*time.Minute, "every agent and record accounted for, no active lease, every released sandbox stopped", func() error {
		if err := fc.reconciled(ctx); err != nil {
			return err
		}
		active, err := fc.tables.store.ListLeases(ctx, warmpool.LeaseFilter{State: warmpool.LeaseActive})
		if err != nil {
			return err
		}
		if len(active) > 0 {
			return fmt.Errorf("%d leases still active, e.g. %s", len(active), active[0].ID)
		}
		agents := liveAgents(fc.dataDir)
		for task, lease := range released {
			if pid, ok := agents[task]; ok {
				return fmt.Errorf("lease %s was released, and its sandbox %s still runs (pid %d)", lease, task, pid)
			}
		}
		return fc.countersMatch(ctx)
	})

	summary := summarize(ops, injected, violations)
	t.Logf("faults: seed %d: %s; history: %s", cfg.seed, summary, histFile)
	if t.Failed() {
		t.Logf("faults: replay with QUARRY_FAULTS_SEED=%d QUARRY_FAULTS_DURATION=%s", cfg.seed, cfg.duration)
	}
}

type faultsConfig struct {
	seed     uint64
	duration time.Duration
	clients  int
	kinds    []faults.FaultKind
}

func faultsConfigFromEnv(t *testing.T) faultsConfig {
	c := faultsConfig{seed: mrand.Uint64() >> 1, duration: 45 * time.Second, clients: 4, kinds: faults.AllFaults}
	if s := os.Getenv("QUARRY_FAULTS_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		require.NoError(t, err, "QUARRY_FAULTS_SEED must be a number")
		c.seed = v
	}
	if s := os.Getenv("QUARRY_FAULTS_DURATION"); s != "" {
		v, err := time.ParseDuration(s)
		require.NoError(t, err, "QUARRY_FAULTS_DURATION must be a duration (45s, 10m)")
		require.GreaterOrEqual(t, v, 10*time.Second, "QUARRY_FAULTS_DURATION")
		c.duration = v
	}
	if s := os.Getenv("QUARRY_FAULTS_CLIENTS"); s != "" {
		v, err := strconv.Atoi(s)
		require.NoError(t, err, "QUARRY_FAULTS_CLIENTS must be a number")
		require.True(t, v >= 1 && v <= 32, "QUARRY_FAULTS_CLIENTS must be 1 to 32")
		c.clients = v
	}
	if s := os.Getenv("QUARRY_FAULTS_KINDS"); s != "" {
		c.kinds = nil
		for k := range strings.SplitSeq(s, ",") {
			require.Contains(t, faults.AllFaults, faults.FaultKind(k), "QUARRY_FAULTS_KINDS")
			c.kinds = append(c.kinds, faults.FaultKind(k))
		}
	}
	return c
}

func cmpDir(dir string, t *testing.T) string {
	if dir == "" {
		return t.TempDir()
	}
	require.NoError(t, os.MkdirAll(dir, 0o755))
	return dir
}

func longCtxFor(t *testing.T, d time.Duration) context.Context {
	c, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return c
}

// faultCluster is a cluster whose replicas each reach the store through
// their own fault proxy (in front of the serializing store proxy).
type faultCluster struct {
	*cluster
	nets []*faults.Proxy
}

func startFaultCluster(t *testing.T) *faultCluster {
	t.Helper()
	tb := newTables(t)
	fc := &faultCluster{cluster: &cluster{t: t, tables: tb, dataDir: t.TempDir(), maxTotal: 10}}
	store := startStoreProxy(t, tb.aws.endpoint)
	u, err := url.Parse(store.url)
	require.NoError(t, err)
	for i := range 3 {
		p, err := faults.NewProxy(u.Host, 300*time.Millisecond)
		require.NoError(t, err)
		t.Cleanup(func() { _ = p.Close() })
		fc.nets = append(fc.nets, p)
		env := append(tb.gatewayEnv("http://"+p.Addr()), fmt.Sprintf("QUARRY_REPLICA_ID=replica-%d", i),
			"QUARRY_LOCK_TTL=2s", "QUARRY_ORPHAN_INTERVAL=1s", "QUARRY_ORPHAN_GRACE=10s", "QUARRY_LAUNCH_QUEUE_TIMEOUT=5s",
			"QUARRY_CHECKPOINT_DIR="+t.TempDir())
		fc.gws = append(fc.gws, startGateway(t, replicaPools, withDataDir(fc.dataDir), withEnv(env...)))
	}
	return fc
}

// injectedFault is a fault as the nemesis carried it out.
type injectedFault struct {
	faults.Fault
	start, end time.Duration // on the history's clock
	note       string        // what it hit, or why it was skipped
}

// runNemesis carries the schedule out on the history's clock, one fault at
// a time, and heals each before the next. It runs on the test's goroutine
// (a killed replica is started again with the harness's checks).
func (fc *faultCluster) runNemesis(t *testing.T, ctx context.Context, rec *faults.Recorder, load *faultLoad, schedule []faults.Fault) []injectedFault {
	var out []injectedFault
	for _, f := range schedule {
		if wait := f.At - rec.Now(); wait > 0 {
			select {
			case <-time.After(wait):
			case <-ctx.Done():
				t.Fatalf("the run's deadline passed before the fault at %s", f.At)
			}
		}
		in := injectedFault{Fault: f, start: rec.Now()}
		g := fc.gws[f.Target]
		heal := func() {}
		switch f.Kind {
		case faults.KillReplica:
			g.kill()
			heal = g.start
		case faults.PauseReplica:
			require.NoError(t, g.cmd.Process.Signal(syscall.SIGSTOP))
			heal = func() { require.NoError(t, g.cmd.Process.Signal(syscall.SIGCONT)) }
		case faults.StoreLatency, faults.StoreReset, faults.StoreBlackhole:
			fc.nets[f.Target].Set(faults.NetFault(strings.TrimPrefix(string(f.Kind), "store-")))
			heal = func() { fc.nets[f.Target].Set(faults.Pass) }
		case faults.KillAgent:
			in.note = fc.killAgent(rec, load, f.Pick)
		}
		time.Sleep(f.For)
		heal()
		in.end = rec.Now()
		out = append(out, in)
	}
	return out
}

// killAgent kills the exec agent of one leased sandbox whose task is
// known, and records the loss in the history.
func (fc *faultCluster) killAgent(rec *faults.Recorder, load *faultLoad, pick uint64) string {
	lease, task := load.pickHeld(pick)
	if lease == "" {
		return "skipped: no leased sandbox with a known task"
	}
	pid, ok := liveAgents(fc.dataDir)[task]
	if !ok {
		return fmt.Sprintf("skipped: the agent of %s (lease %s) is gone already", task, lease)
	}
	op := rec.Begin(-1, -1, faults.Lose, lease)
	op.Task, op.Outcome = task, faults.Unknown
	err := syscall.Kill(pid, syscall.SIGKILL)
	if err != nil {
		op.Err = err.Error()
	}
	rec.End(op)
	return fmt.Sprintf("killed the agent of %s (lease %s, pid %d)", task, lease, pid)
}

// countersMatch compares what each replica's /v1/pools counts with the
// task records in the store.
func (fc *faultCluster) countersMatch(ctx context.Context) error {
	recs, err := fc.tables.store.ListTasks(ctx, "")
	if err != nil {
		return err
	}
	ready, leased := 0, 0
	for _, r := range recs {
		switch r.State {
		case warmpool.TaskReady:
			ready++
		case warmpool.TaskLeased:
			leased++
		}
	}
	for i, g := range fc.gws {
		ps, err := g.client().Pools(ctx)
		if err != nil {
			return fmt.Errorf("replica %d: %w", i, err)
		}
		for _, p := range ps {
			if p.Name == "default" && (p.Ready != ready || p.Leased != leased) {
				return fmt.Errorf("replica %d counts %d ready and %d leased; the records say %d and %d", i, p.Ready, p.Leased, ready, leased)
			}
		}
	}
	return nil
}

// faultLoad is the trainers' traffic: each client acquires a sandbox
// (idempotently, under a key of its own), runs marked commands, beats,
// releases, and now and then calls the lease it released.
type faultLoad struct {
	fc      *faultCluster
	rec     *faults.Recorder
	seed    uint64
	markers string

	mu   sync.Mutex
	held map[string]string // lease → task, while its client holds it
}

// opDeadline bounds every call: the longest fault (4 s) and the store's
// retries fit in it many times over.
const opDeadline = 30 * time.Second

func (l *faultLoad) client(soft, hard context.Context, id int) {
	r := mrand.New(mrand.NewPCG(l.seed, uint64(id)))
	for round := 0; soft.Err() == nil; round++ {
		key := fmt.Sprintf("faults-%d-c%d-r%d", l.seed, id, round)
		var lease string
		for lease == "" && hard.Err() == nil {
			op := l.call(hard, r, id, faults.Acquire, "", func(ctx context.Context, c *client.Client, op *faults.Op) error {
				sbx, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{IdempotencyKey: key, LeaseSeconds: 600})
				op.Lease = sbx.ID
				return err
			})
			if op.Outcome == faults.OK {
				lease = op.Lease
			} else {
				sleepCtx(hard, time.Duration(100+r.IntN(300))*time.Millisecond)
			}
		}
		if lease == "" {
			return
		}
		lost := false
		for range 1 + r.IntN(4) {
			sleepCtx(hard, time.Duration(r.IntN(200))*time.Millisecond) // the model thinks
			op := l.exec(hard, r, id, lease)
			if op.Outcome == faults.Refused {
				lost = true
				break
			}
		}
		if !lost {
			l.call(hard, r, id, faults.Heartbeat, lease, func(ctx context.Context, c *client.Client, _ *faults.Op) error {
				_, err := c.Heartbeat(ctx, lease)
				return err
			})
		}
		l.mu.Lock()
		delete(l.held, lease)
		l.mu.Unlock()
		for hard.Err() == nil {
			op := l.call(hard, r, id, faults.Release, lease, func(ctx context.Context, c *client.Client, _ *faults.Op) error {
				_, err := c.DeleteSandbox(ctx, lease)
				return err
			})
			if op.Outcome != faults.Unknown {
				break
			}
			sleepCtx(hard, time.Duration(100+r.IntN(300))*time.Millisecond)
		}
		if r.IntN(5) == 0 { // a stale call: a trainer's late retry on a lease it gave back
			l.exec(hard, r, id, lease)
		}
	}
}

// exec runs a command that leaves a marker named by the operation and
// prints the sandbox's working directory (which names its task).
func (l *faultLoad) exec(ctx context.Context, r *mrand.Rand, id int, lease string) faults.Op {
	return l.call(ctx, r, id, faults.Exec, lease, func(ctx context.Context, c *client.Client, op *faults.Op) error {
		res, err := c.Exec(ctx, lease, agentapi.ExecRequest{Command: fmt.Sprintf("touch %s/%d && pwd", l.markers, op.ID)})
		if err != nil {
			return err
		}
		if res.ExitCode != 0 {
			return fmt.Errorf("exit %d: %s", res.ExitCode, res.Stderr)
		}
		op.Task = l.taskOf(strings.TrimSpace(res.Stdout))
		if op.Task != "" {
			l.mu.Lock()
			l.held[lease] = op.Task
			l.mu.Unlock()
		}
		return nil
	})
}

// call makes one call through a random replica and records it.
func (l *faultLoad) call(ctx context.Context, r *mrand.Rand, id int, kind faults.Kind, lease string,
	f func(context.Context, *client.Client, *faults.Op) error) faults.Op {
	replica := r.IntN(len(l.fc.gws))
	op := l.rec.Begin(id, replica, kind, lease)
	op.Marked = kind == faults.Exec
	cctx, cancel := context.WithTimeout(ctx, opDeadline)
	err := f(cctx, l.fc.gws[replica].client(), &op)
	cancel()
	var ce *client.Error
	switch {
	case err == nil:
		op.Outcome = faults.OK
	case errors.As(err, &ce) && (ce.Status == http.StatusNotFound || ce.Status == http.StatusGone) && lease != "":
		op.Outcome, op.Code = faults.Refused, ce.Code
	case errors.As(err, &ce):
		op.Outcome, op.Code = faults.Unknown, ce.Code
	case errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil:
		op.Outcome, op.Code, op.Late = faults.Unknown, "deadline", true
	default:
		op.Outcome, op.Code = faults.Unknown, "transport"
	}
	if err != nil {
		op.Err = err.Error()
	}
	if kind == faults.Acquire && op.Outcome != faults.OK {
		op.Lease = "" // an acquire names its lease by its answer
	}
	return l.rec.End(op)
}

// taskOf names the task of a sandbox's working directory under the
// process provider (<data dir>/process/<task>/...).
func (l *faultLoad) taskOf(dir string) string {
	rest, ok := strings.CutPrefix(dir, filepath.Join(l.fc.dataDir, "process")+"/")
	if !ok {
		return ""
	}
	task, _, _ := strings.Cut(rest, "/")
	return task
}

// pickHeld returns a held lease with a known task, chosen by pick.
func (l *faultLoad) pickHeld(pick uint64) (lease, task string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	keys := make([]string, 0, len(l.held))
	for k := range l.held {
		keys = append(keys, k)
	}
	if len(keys) == 0 {
		return "", ""
	}
	sort.Strings(keys)
	lease = keys[pick%uint64(len(keys))]
	return lease, l.held[lease]
}

// ran says whether the command of operation id left its marker.
func (l *faultLoad) ran(id int64) bool {
	_, err := os.Stat(filepath.Join(l.markers, strconv.FormatInt(id, 10)))
	return err == nil
}

// releasedTasks maps the task of every lease whose release was
// acknowledged to the lease.
func (l *faultLoad) releasedTasks(ops []faults.Op) map[string]string {
	taskOf := map[string]string{}
	for _, o := range ops {
		if o.Task != "" {
			taskOf[o.Lease] = o.Task
		}
	}
	out := map[string]string{}
	for _, o := range ops {
		if o.Kind == faults.Release && o.Outcome == faults.OK && taskOf[o.Lease] != "" {
			out[taskOf[o.Lease]] = o.Lease
		}
	}
	return out
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-time.After(d):
	case <-ctx.Done():
	}
}

// faultsAround lists the faults that overlap the operations' span.
func faultsAround(in []injectedFault, ops []faults.Op) string {
	if len(ops) == 0 {
		return ""
	}
	from, to := ops[0].Call, ops[0].Return
	for _, o := range ops {
		from, to = min(from, o.Call), max(to, o.Return)
	}
	var b strings.Builder
	for _, f := range in {
		if f.end >= from && f.start <= to {
			fmt.Fprintf(&b, "    [%.3fs, %.3fs] %s r%d %s\n", f.start.Seconds(), f.end.Seconds(), f.Kind, f.Target, f.note)
		}
	}
	return b.String()
}

// summarize is the run in one line: operations by kind and outcome,
// faults by kind, violations.
func summarize(ops []faults.Op, in []injectedFault, vs []faults.Violation) string {
	byKind := map[string]int{}
	for _, o := range ops {
		byKind[string(o.Kind)+" "+string(o.Outcome)]++
	}
	faultsBy := map[string]int{}
	for _, f := range in {
		k := string(f.Kind)
		if strings.HasPrefix(f.note, "skipped") {
			k += " (skipped)"
		}
		faultsBy[k]++
	}
	return fmt.Sprintf("%d operations %s; %d faults %s; %d violations", len(ops), sortedCounts(byKind), len(in), sortedCounts(faultsBy), len(vs))
}

func sortedCounts(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s: %d", k, m[k])
	}
	return "{" + strings.Join(parts, ", ") + "}"
}
