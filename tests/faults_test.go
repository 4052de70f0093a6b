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
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/docker/docker/api/types/container"

	"github.com/quarryhq/quarry/client"
	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/internal/faults"
	"github.com/quarryhq/quarry/internal/testenv"
	"github.com/quarryhq/quarry/modelservice/modeltest"
	"github.com/quarryhq/quarry/providers"
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
	runFaults(t, nil, 45*time.Second, []faults.FaultKind{faults.KillReplica, faults.PauseReplica,
		faults.StoreLatency, faults.StoreReset, faults.StoreBlackhole, faults.KillAgent, faults.DiskFull})
}

// TestFaults_Docker is TestFaults on the Docker provider: the nemesis also
// kills containers from outside (docker kill) and, with
// QUARRY_FAULTS_RESTART_ENGINE=1 (make faults), restarts the Docker engine
// (not in make test's short run: a restart takes the engine from every
// suite for its duration). A sandbox's identity is its hostname; commands leave no marker
// (a released sandbox's container, and its files, are gone), so the two
// marker rules are the process provider's run's to check. make test runs
// it for 30 s (QUARRY_FAULTS_DURATION sets both runs).
func TestFaults_Docker(t *testing.T) {
	testenv.AWS(t)
	d := requireDocker(t)
	kinds := []faults.FaultKind{faults.KillReplica, faults.PauseReplica,
		faults.StoreLatency, faults.StoreReset, faults.StoreBlackhole, faults.KillAgent}
	if os.Getenv("QUARRY_FAULTS_RESTART_ENGINE") == "1" { // make faults
		kinds = append(kinds, faults.RestartEngine)
	}
	runFaults(t, d, 30*time.Second, kinds)
}

// runFaults is one fault run: on the process provider when d is nil, else
// on Docker.
func runFaults(t *testing.T, d *dockerTest, duration time.Duration, kinds []faults.FaultKind) {
	cfg := faultsConfigFromEnv(t, duration, kinds)
	t.Logf("faults: seed %d, %s of traffic, %d clients, faults %v (replay: QUARRY_FAULTS_SEED=%d)",
		cfg.seed, cfg.duration, cfg.clients, cfg.kinds, cfg.seed)

	fc := startFaultCluster(t, d)
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
	trainerCtx, stopTrainer := context.WithCancel(ctx)
	defer stopTrainer()
	trainerDone := make(chan struct{})
	go func() { defer close(trainerDone); load.trainer(trainerCtx) }()

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

	stopTrainer()
	<-trainerDone
	ops := rec.Ops()
	histFile := filepath.Join(cmpDir(os.Getenv("QUARRY_FAULTS_OUT"), t), fmt.Sprintf("faults-%d.jsonl", cfg.seed))
	f, err := os.Create(histFile)
	require.NoError(t, err)
	require.NoError(t, faults.WriteJSON(f, ops))
	require.NoError(t, f.Close())

	ops = append(ops, fc.engineLosses(ops, injected)...)
	var ran func(int64) bool
	if fc.d == nil {
		ran = load.ran
	}
	violations := faults.Check(ops, ran, 30*time.Second)
	for _, v := range violations {
		t.Errorf("seed %d: %s\n  faults around it:\n%s", cfg.seed, v, faultsAround(injected, v.Ops))
	}

	// What is left behind, once the replicas have reconciled.
	released := load.releasedTasks(ops)
	eventuallyStore(t, 2*time.Minute, "every agent and record accounted for, no active lease or relay request, every released sandbox stopped", func() error {
		if err := fc.books(ctx); err != nil {
			return err
		}
		active, err := fc.tables.store.ListLeases(ctx, warmpool.LeaseFilter{State: warmpool.LeaseActive})
		if err != nil {
			return err
		}
		if len(active) > 0 {
			return fmt.Errorf("%d leases still active, e.g. %s", len(active), active[0].ID)
		}
		tr := &modeltest.Trainer{URL: fc.gws[0].url(), Key: fc.gws[0].key, HTTP: &http.Client{Timeout: 10 * time.Second}}
		if left, err := tr.Claim(0, 8, ""); err != nil || len(left) > 0 {
			return fmt.Errorf("relay requests left behind: %d (%v)", len(left), err)
		}
		live := fc.liveSandboxes()
		for task, lease := range released {
			if _, ok := live[task]; ok {
				return fmt.Errorf("lease %s was released, and its sandbox %s still runs", lease, task)
			}
		}
		return fc.countersMatch(ctx)
	})

	// Every acknowledged checkpoint is there, through any replica.
	for _, o := range ops {
		if o.Kind != faults.Checkpoint || o.Outcome != faults.OK {
			continue
		}
		g := fc.gws[int(o.ID)%len(fc.gws)]
		_, err := g.client().GetCheckpoint(ctx, o.Checkpoint)
		assert.NoError(t, err, "checkpoint %s, acknowledged to %s, read through replica %d", o.Checkpoint, o, int(o.ID)%len(fc.gws))
	}

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

func faultsConfigFromEnv(t *testing.T, duration time.Duration, kinds []faults.FaultKind) faultsConfig {
	c := faultsConfig{seed: mrand.Uint64() >> 1, duration: duration, clients: 4, kinds: kinds}
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
			if slices.Contains(kinds, faults.FaultKind(k)) {
				c.kinds = append(c.kinds, faults.FaultKind(k))
			}
		}
		if len(c.kinds) == 0 {
			t.Skipf("QUARRY_FAULTS_KINDS=%s names none of this run's faults %v", s, kinds)
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
	d    *dockerTest // the Docker provider's run; nil: the process provider's
	nets []*faults.Proxy
	// smallDisk: the data directory is a file system of its own (a
	// tmpfs), which disk-full fills; "" when it could not be mounted (not
	// root), and disk-full is skipped.
	smallDisk string
}

// mountSmallDisk mounts a tmpfs of size bytes on dir, unmounted at the end
// (lazily: the last agents may still be leaving it). It returns why it
// could not ("" when mounted).
func mountSmallDisk(t *testing.T, dir string, size int) string {
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, fmt.Sprintf("size=%d,mode=0755", size)); err != nil {
		return fmt.Sprintf("mount a tmpfs on the data directory: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(dir, syscall.MNT_DETACH) })
	return ""
}

// fillDisk writes one file into dir until its file system is full, and
// returns a function that removes it.
func fillDisk(dir string) (func(), error) {
	path := filepath.Join(dir, "faults-filler")
	f, err := os.Create(path)
	if err != nil {
		return func() {}, err
	}
	buf := make([]byte, 1<<20)
	for {
		if _, err = f.Write(buf); err != nil {
			break
		}
	}
	_ = f.Close()
	remove := func() { _ = os.Remove(path) }
	if !errors.Is(err, syscall.ENOSPC) {
		return remove, fmt.Errorf("fill %s: %w", dir, err)
	}
	return remove, nil
}

func startFaultCluster(t *testing.T, d *dockerTest) *faultCluster {
	t.Helper()
	tb := newTables(t)
	fc := &faultCluster{cluster: &cluster{t: t, tables: tb, dataDir: t.TempDir(), maxTotal: 10}, d: d}
	if d == nil {
		fc.smallDisk = mountSmallDisk(t, fc.dataDir, 256<<20)
	}
	bucket := newBucket(t, tb.aws)
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
			// One checkpoint store for every replica: S3 (the emulator's) and
			// its DynamoDB table, reached through the replica's fault proxy.
			"QUARRY_CHECKPOINT_STORE=s3", "QUARRY_CHECKPOINT_BUCKET="+bucket, "QUARRY_CHECKPOINT_TABLE="+tb.checkpoints,
			// One model relay for every replica: a sandbox calls the replica
			// that launched it, the trainer claims and answers on any.
			"QUARRY_RELAY_BROKER=dynamodb", "QUARRY_RELAY_DYNAMODB_TABLE="+tb.relay,
			"QUARRY_RELAY_SECRET=relay-secret-shared-by-the-replicas-0123456789")
		if d != nil {
			fc.gws = append(fc.gws, d.startGateway(dockerFaultPools, withEnv(env...)))
			continue
		}
		fc.gws = append(fc.gws, startGateway(t, replicaPools, withDataDir(fc.dataDir), withEnv(env...)))
	}
	return fc
}

// newBucket makes an S3 bucket on the test's AWS endpoint for the replicas'
// checkpoint store, and empties and deletes it at the end.
func newBucket(t *testing.T, a awsSettings) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg, err := config.LoadDefaultConfig(ctx, config.WithRegion(a.region),
		config.WithCredentialsProvider(credentials.NewStaticCredentialsProvider(a.keyID, a.secret, "")))
	require.NoError(t, err)
	s3c := s3.NewFromConfig(cfg, func(o *s3.Options) { o.BaseEndpoint, o.UsePathStyle = aws.String(a.endpoint), true })
	bucket := fmt.Sprintf("quarry-faults-%x", time.Now().UnixNano()&0xffffffffff)
	_, err = s3c.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(bucket)})
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		p := s3.NewListObjectsV2Paginator(s3c, &s3.ListObjectsV2Input{Bucket: aws.String(bucket)})
		for p.HasMorePages() {
			page, err := p.NextPage(ctx)
			if err != nil {
				t.Logf("list bucket %s: %v", bucket, err)
				return
			}
			for _, o := range page.Contents {
				_, _ = s3c.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String(bucket), Key: o.Key})
			}
		}
		_, err := s3c.DeleteBucket(ctx, &s3.DeleteBucketInput{Bucket: aws.String(bucket)})
		assert.NoError(t, err, "delete bucket %s", bucket)
	})
	return bucket
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
			in.note = fc.killSandbox(rec, load, f.Pick)
		case faults.RestartEngine:
			fc.d.restartEngine() // the fault lasts as long as the restart does
		case faults.DiskFull:
			if fc.smallDisk != "" {
				in.note = "skipped: " + fc.smallDisk
				break
			}
			remove, err := fillDisk(fc.dataDir)
			heal = remove
			if err != nil {
				in.note = "skipped: " + err.Error()
			}
		}
		select { // the fault lasts its scheduled time
		case <-time.After(f.For):
		case <-ctx.Done():
		}
		heal()
		in.end = rec.Now()
		out = append(out, in)
	}
	return out
}

// killSandbox kills one leased sandbox whose task is known from outside
// (the process provider's agent with SIGKILL, a Docker container with
// docker kill), and records the loss in the history.
func (fc *faultCluster) killSandbox(rec *faults.Recorder, load *faultLoad, pick uint64) string {
	lease, task := load.pickHeld(pick)
	if lease == "" {
		return "skipped: no leased sandbox with a known task"
	}
	handle, ok := fc.liveSandboxes()[task]
	if !ok {
		return fmt.Sprintf("skipped: sandbox %s (lease %s) is gone already", task, lease)
	}
	op := rec.Begin(-1, -1, faults.Lose, lease)
	op.Task, op.Outcome = task, faults.Unknown
	var err error
	if fc.d != nil {
		ctx, cancel := context.WithTimeout(context.Background(), dockerWait)
		err = fc.d.cli.ContainerKill(ctx, handle, "KILL")
		cancel()
	} else {
		pid, _ := strconv.Atoi(handle)
		err = syscall.Kill(pid, syscall.SIGKILL)
	}
	if err != nil {
		op.Err = err.Error()
	}
	rec.End(op)
	return fmt.Sprintf("killed sandbox %s (lease %s, %s)", task, lease, handle)
}

// liveSandboxes maps each running sandbox's task, as its commands name it
// (taskOf), to a handle to kill it by: the agent's pid (process provider)
// or the container's id (Docker).
func (fc *faultCluster) liveSandboxes() map[string]string {
	out := map[string]string{}
	if fc.d == nil {
		for task, pid := range liveAgents(fc.dataDir) {
			out[task] = strconv.Itoa(pid)
		}
		return out
	}
	for id := range fc.d.running("") {
		out[id[:12]] = id // a container's hostname is its short id
	}
	return out
}

// books is cluster.reconciled for the run's provider.
func (fc *faultCluster) books(ctx context.Context) error {
	if fc.d == nil {
		return fc.reconciled(ctx)
	}
	recs, err := fc.tables.store.ListTasks(ctx, "")
	if err != nil {
		return err
	}
	byID := map[string]warmpool.TaskRecord{}
	for _, r := range recs {
		byID[r.ID] = r
	}
	running := map[string]bool{}
	for _, c := range fc.d.containers("") {
		if c.State != container.StateRunning {
			continue
		}
		task := c.Labels[providers.LabelTask]
		running[task] = true
		if _, ok := byID[task]; !ok {
			return fmt.Errorf("container %s (task %s) runs, but no task record accounts for it", c.ID[:12], task)
		}
	}
	for _, r := range recs {
		if !running[r.ID] && !(r.State == warmpool.TaskLaunching && time.Now().Before(r.LaunchDeadline)) {
			return fmt.Errorf("task record %s (%s) has no running container and no launch in flight", r.ID, r.State)
		}
	}
	if len(recs) > fc.maxTotal {
		return fmt.Errorf("%d task records: over max_total %d", len(recs), fc.maxTotal)
	}
	return nil
}

// engineLosses are the losses an engine restart may cause: every lease
// that may have had a container during the restart (its acquire began
// before the restart ended, and its release was not acknowledged before
// the restart began) may have lost it, at any time after the restart
// began.
func (fc *faultCluster) engineLosses(ops []faults.Op, injected []injectedFault) []faults.Op {
	var out []faults.Op
	for _, f := range injected {
		if f.Kind != faults.RestartEngine {
			continue
		}
		began, ended := map[string]bool{}, map[string]bool{}
		for _, o := range ops {
			switch {
			case o.Kind == faults.Acquire && o.Lease != "" && o.Call <= f.end:
				began[o.Lease] = true
			case o.Kind == faults.Release && o.Outcome == faults.OK && o.Return < f.start:
				ended[o.Lease] = true
			}
		}
		for lease := range began {
			if !ended[lease] {
				out = append(out, faults.Op{ID: -1, Client: -1, Replica: -1, Kind: faults.Lose, Lease: lease,
					Call: f.start, Return: f.end, Outcome: faults.Unknown, Err: "the engine restarted"})
			}
		}
	}
	return out
}

// dockerFaultPools is TestFaults_Docker's pool: small containers of the
// bash test image.
const dockerFaultPools = `pools:
  - name: default
    image: quarry-test/bash:latest
    cpu: 0.25
    memory: 128Mi
    min_warm: 3
    max_total: 10
    startup_timeout_seconds: 60
`

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
		if !lost && r.IntN(3) == 0 {
			lost = l.checkpointAndRestore(hard, r, id, lease)
		}
		if !lost && l.fc.d == nil && r.IntN(3) == 0 {
			lost = l.relay(hard, r, id, lease).Outcome == faults.Refused
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

// checkpointAndRestore takes a checkpoint of the sandbox and, half the
// time, restores it; it reports whether the lease was refused as ended.
func (l *faultLoad) checkpointAndRestore(ctx context.Context, r *mrand.Rand, id int, lease string) bool {
	op := l.call(ctx, r, id, faults.Checkpoint, lease, func(ctx context.Context, c *client.Client, op *faults.Op) error {
		ck, err := c.CreateCheckpoint(ctx, lease, client.CreateCheckpointRequest{})
		op.Checkpoint = ck.ID
		return err
	})
	if op.Outcome != faults.OK || r.IntN(2) == 0 {
		return op.Outcome == faults.Refused
	}
	ck := op.Checkpoint
	op = l.call(ctx, r, id, faults.Restore, lease, func(ctx context.Context, c *client.Client, op *faults.Op) error {
		op.Checkpoint = ck
		_, err := c.RestoreSandbox(ctx, lease, ck)
		return err
	})
	return op.Outcome == faults.Refused
}

// errRelay is a relayed model call that failed inside the sandbox (curl's
// error): the command ran, the call did not get its answer.
var errRelay = errors.New("the relayed call failed")

// relay makes a model call from inside the sandbox, through the relay of
// the replica that launched it (the sandbox's OPENAI_BASE_URL), and checks
// that the answer is its own.
func (l *faultLoad) relay(ctx context.Context, r *mrand.Rand, id int, lease string) faults.Op {
	return l.call(ctx, r, id, faults.Relay, lease, func(ctx context.Context, c *client.Client, op *faults.Op) error {
		want := fmt.Sprintf("relay-%d", op.ID)
		cmd := fmt.Sprintf(`curl -sS -m 25 -H "Authorization: Bearer $OPENAI_API_KEY" -H 'Content-Type: application/json' `+
			`-d '{"model":"policy","messages":[{"role":"user","content":"%s"}]}' "$OPENAI_BASE_URL/chat/completions"`, want)
		res, err := c.Exec(ctx, lease, agentapi.ExecRequest{Command: cmd})
		if err != nil {
			return err
		}
		if got := answerTo.FindString(res.Stdout); got != "" && got != "answer to: "+want {
			op.Wrong = got
			return nil
		}
		if res.ExitCode != 0 || !strings.Contains(res.Stdout, "answer to: "+want) {
			return fmt.Errorf("%w: exit %d: %s%s", errRelay, res.ExitCode, res.Stdout, res.Stderr)
		}
		return nil
	})
}

// answerTo finds the trainer's answer in a relayed call's output.
var answerTo = regexp.MustCompile(`answer to: relay-[0-9]+`)

// trainer claims the relayed calls on a random replica and answers each
// with its own content, until ctx ends. A replica that does not answer
// (killed, paused) costs it one claim's wait.
func (l *faultLoad) trainer(ctx context.Context) {
	r := mrand.New(mrand.NewPCG(l.seed, 1<<32))
	hc := &http.Client{Timeout: 10 * time.Second}
	for ctx.Err() == nil {
		g := l.fc.gws[r.IntN(len(l.fc.gws))]
		tr := &modeltest.Trainer{URL: g.url(), Key: g.key, HTTP: hc}
		reqs, err := tr.Claim(time.Second, 8, "")
		if err != nil {
			sleepCtx(ctx, 100*time.Millisecond)
			continue
		}
		for _, q := range reqs {
			_, _, _ = tr.Respond(q.ID, 0, modeltest.ChatCompletion("chatcmpl-"+q.ID, "policy", "answer to: "+q.LastUserMessage()))
		}
	}
}

// exec runs a command that leaves a marker named by the operation and
// prints the sandbox's working directory (which names its task).
func (l *faultLoad) exec(ctx context.Context, r *mrand.Rand, id int, lease string) faults.Op {
	return l.call(ctx, r, id, faults.Exec, lease, func(ctx context.Context, c *client.Client, op *faults.Op) error {
		cmd := fmt.Sprintf("touch %s/%d && pwd", l.markers, op.ID)
		if l.fc.d != nil {
			cmd, op.Marked = "hostname", false
		}
		res, err := c.Exec(ctx, lease, agentapi.ExecRequest{Command: cmd})
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
	case errors.Is(err, errRelay):
		op.Outcome, op.Code = faults.Unknown, "relay"
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

// taskOf names the task of a sandbox from what its command printed: the
// working directory under the process provider (<data dir>/process/<task>/...),
// the hostname (the container's short id) on Docker.
func (l *faultLoad) taskOf(dir string) string {
	if l.fc.d != nil {
		return dir
	}
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
