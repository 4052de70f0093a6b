package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/quarryhq/quarry/internal/stats"
	"github.com/quarryhq/quarry/warmpool/dynamostore"
)

// replicaOptions tune the replicas suite: gateways on DynamoDB (the AWS
// emulator, or whatever AWS_ENDPOINT_URL names).
type replicaOptions struct {
	endpoint   string
	serialize  bool
	region     string
	putItems   int
	execs      int
	burst      int
	clients    int
	sustain    time.Duration
	sustainers int
}

func (r *replicaOptions) flags() {
	flag.StringVar(&r.endpoint, "dynamodb-endpoint", cmp.Or(os.Getenv("AWS_ENDPOINT_URL"), "http://127.0.0.1:4566"),
		"DynamoDB endpoint of the replicas suite (env AWS_ENDPOINT_URL; default the emulator of localstack/emulator.sh)")
	flag.BoolVar(&r.serialize, "dynamodb-serialize", true,
		"pass requests to the endpoint one at a time, through a proxy: the moto emulator does not isolate concurrent conditional writes "+
			"(DynamoDB does), so without it two replicas may claim one task, or a pool's capacity counter drift past max_total; "+
			"set it false against LocalStack or DynamoDB")
	flag.StringVar(&r.region, "dynamodb-region", cmp.Or(os.Getenv("AWS_REGION"), "us-east-1"), "AWS region of the replicas suite")
	flag.IntVar(&r.putItems, "put-items", 500, "raw conditional PutItem calls timed as the DynamoDB floor")
	flag.IntVar(&r.execs, "lookup-execs", 200, "execs through a DynamoDB gateway whose lease lookups are counted")
	flag.IntVar(&r.burst, "burst", 48, "ready tasks the three replicas hand out as fast as they can")
	flag.IntVar(&r.clients, "burst-clients", 24, "concurrent trainers of the burst")
	flag.DurationVar(&r.sustain, "sustain", 10*time.Second, "length of the sustained acquire+release measurement")
	flag.IntVar(&r.sustainers, "sustain-clients", 8, "concurrent trainers of the sustained measurement")
}

// awsEnv is the AWS SDK's settings for the gateways (and this process):
// the endpoint and region, and the emulator's fake credentials unless real
// ones are set.
func (r replicaOptions) awsEnv() []string {
	return []string{"AWS_ENDPOINT_URL=" + r.endpoint, "AWS_REGION=" + r.region,
		"AWS_ACCESS_KEY_ID=" + cmp.Or(os.Getenv("AWS_ACCESS_KEY_ID"), "test"),
		"AWS_SECRET_ACCESS_KEY=" + cmp.Or(os.Getenv("AWS_SECRET_ACCESS_KEY"), "test"),
		"AWS_EC2_METADATA_DISABLED=true"}
}

func (r replicaOptions) client(ctx context.Context) (*dynamodb.Client, error) {
	awsCfg, err := config.LoadDefaultConfig(ctx, config.WithRegion(r.region), config.WithCredentialsProvider(
		credentials.NewStaticCredentialsProvider(cmp.Or(os.Getenv("AWS_ACCESS_KEY_ID"), "test"),
			cmp.Or(os.Getenv("AWS_SECRET_ACCESS_KEY"), "test"), "")))
	if err != nil {
		return nil, fmt.Errorf("load AWS configuration: %w", err)
	}
	return dynamodb.NewFromConfig(awsCfg, func(o *dynamodb.Options) { o.BaseEndpoint = aws.String(r.endpoint) }), nil
}

// warmPool is the pool of warm acquires: max_total == min_warm, so nothing
// launches during a round (the acquire path alone).
func (b *bench) warmPool() string {
	return fmt.Sprintf(`pools:
  - name: warm
    image: host
    min_warm: %d
    max_total: %d
`, b.o.acquires, b.o.acquires)
}

// replicaPools are the pools of the DynamoDB gateways: warm, burst (handed
// out by three replicas at once) and cycle (acquired and released over and
// over while the pool refills).
func (b *bench) replicaPools() string {
	r := b.o.replicas
	return b.warmPool() + fmt.Sprintf(`  - name: burst
    image: host
    min_warm: %d
    max_total: %d
  - name: cycle
    image: host
    min_warm: %d
    max_total: %d
`, r.burst, r.burst, r.sustainers, 3*r.sustainers)
}

// replicaSuite measures the gateway on DynamoDB beside the embedded store,
// in one run: the latency of one raw conditional PutItem (the floor), warm
// acquires on the embedded store and on DynamoDB, DynamoDB calls per
// acquire, release and exec, and acquires per second across three
// replicas (a burst from a warm pool, and acquire+release cycles sustained
// while the pool refills).
func (b *bench) replicaSuite(ctx context.Context, gatewayBin, agentBin string) error {
	r := b.o.replicas
	if r.serialize {
		proxyURL, stop, err := serializingProxy(r.endpoint)
		if err != nil {
			return err
		}
		defer stop()
		r.endpoint = proxyURL
	}
	api, err := r.client(ctx)
	if err != nil {
		return err
	}
	if _, err := api.ListTables(ctx, &dynamodb.ListTablesInput{Limit: aws.Int32(1)}); err != nil {
		return fmt.Errorf("the DynamoDB endpoint %s does not answer (start the emulator: localstack/emulator.sh start): %w", r.endpoint, err)
	}
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	prefix := "quarrybench-" + hex.EncodeToString(suffix)
	tables := dynamostore.Config{TasksTable: prefix + "-tasks", LeasesTable: prefix + "-leases"}
	if err := dynamostore.CreateTables(ctx, api, tables); err != nil {
		return fmt.Errorf("create tables: %w", err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
		defer cancel()
		if err := dynamostore.DeleteTables(dctx, api, tables); err != nil {
			fmt.Fprintln(os.Stderr, "quarrybench: delete tables:", err)
		}
	}()

	put, err := rawPutItems(ctx, api, prefix+"-raw", r.putItems)
	if err != nil {
		return err
	}
	b.record("raw conditional PutItem (DynamoDB floor)", "one SDK call, attribute_not_exists condition, same endpoint",
		"p50_us", stats.Percentile(put, 50), "p99_us", stats.Percentile(put, 99), "samples", len(put))

	// Warm acquires on the embedded store, the same pool shape, this run.
	emb, err := b.launchGateway(gatewaySpec{bin: gatewayBin, agentBin: agentBin, name: "embedded",
		dataDir: filepath.Join(b.tmp, "embedded"), pools: b.warmPool()})
	if err != nil {
		return err
	}
	acq, err := emb.acquireRounds(ctx, b.http, "warm", b.o.acquires, b.o.warmRounds)
	if err != nil {
		return fmt.Errorf("embedded warm acquires: %w", err)
	}
	b.record("warm acquire, embedded store", "one gateway; the same warm pool as the DynamoDB gateways",
		"p50_us", stats.Percentile(acq, 50), "p99_us", stats.Percentile(acq, 99), "samples", len(acq))
	b.stopGateway(emb, filepath.Join(b.tmp, "embedded")) // its agents would share the cores

	// One replica on DynamoDB: warm acquires and the calls they make.
	shared := filepath.Join(b.tmp, "replicas")
	env := append(r.awsEnv(), "QUARRY_STORE=dynamodb",
		"QUARRY_DYNAMODB_TASKS_TABLE="+tables.TasksTable, "QUARRY_DYNAMODB_LEASES_TABLE="+tables.LeasesTable)
	var replicas []*gateway
	defer func() { // before the tables go (deferred calls run last in, first out)
		for _, g := range replicas {
			b.stopGateway(g, shared)
		}
	}()
	for i := range 3 {
		g, err := b.launchGateway(gatewaySpec{bin: gatewayBin, agentBin: agentBin, name: fmt.Sprintf("replica-%d", i),
			dataDir: shared, pools: b.replicaPools(), env: append(env, fmt.Sprintf("QUARRY_REPLICA_ID=replica-%d", i))})
		if err != nil {
			return err
		}
		replicas = append(replicas, g)
		if i == 0 {
			if err := b.oneReplica(ctx, g); err != nil {
				return err
			}
		}
	}
	return b.threeReplicas(ctx, replicas)
}

// oneReplica measures warm acquires through one DynamoDB gateway and the
// DynamoDB requests that acquires, releases and execs make. It starts once
// every pool is ready, so that no launch shares the cores with the
// measurement.
func (b *bench) oneReplica(ctx context.Context, g *gateway) error {
	r := b.o.replicas
	for _, p := range []struct {
		name string
		n    int
	}{{"warm", b.o.acquires}, {"burst", r.burst}, {"cycle", r.sustainers}} {
		if err := g.waitReady(ctx, b.http, p.name, p.n); err != nil {
			return err
		}
	}
	before, err := g.dynamoRequests(ctx, b.http)
	if err != nil {
		return err
	}
	acq, err := g.acquireRounds(ctx, b.http, "warm", b.o.acquires, b.o.warmRounds)
	if err != nil {
		return fmt.Errorf("DynamoDB warm acquires: %w", err)
	}
	after, err := g.dynamoRequests(ctx, b.http)
	if err != nil {
		return err
	}
	n := len(acq)
	b.record("warm acquire, DynamoDB store", "one replica; acquire path alone",
		"p50_us", stats.Percentile(acq, 50), "p99_us", stats.Percentile(acq, 99), "samples", n)
	perAcquire := after.delta(before, "acquire")
	b.record("DynamoDB requests per warm acquire", "goal <= 3 on the happy path; SDK retries included",
		append([]any{"total", perAcquire.total() / float64(n)}, perAcquire.per(n)...)...)
	perRelease := after.delta(before, "release")
	b.record("DynamoDB requests per release", "lease read (cached after the acquire), end lease, task record, delete",
		append([]any{"total", perRelease.total() / float64(n)}, perRelease.per(n)...)...)

	if err := g.waitReady(ctx, b.http, "warm", 1); err != nil {
		return err
	}
	sbx, err := g.createSandboxIn(ctx, b.http, "warm")
	if err != nil {
		return err
	}
	before, err = g.dynamoRequests(ctx, b.http)
	if err != nil {
		return err
	}
	lat, err := timeN(ctx, b.o.replicas.execs, func() error {
		return g.call(ctx, b.http, http.MethodPost, "/v1/sandboxes/"+sbx+"/exec", map[string]any{"command": "true"}, nil)
	})
	if err != nil {
		return fmt.Errorf("exec through a DynamoDB gateway: %w", err)
	}
	after, err = g.dynamoRequests(ctx, b.http)
	if err != nil {
		return err
	}
	b.record("DynamoDB requests per exec (lease lookup)", "lease cache: at most one read per lease per QUARRY_LEASE_CACHE_TTL",
		"total", after.delta(before, "get").total()/float64(len(lat)), "exec_p50_us", stats.Percentile(lat, 50), "exec_p99_us", stats.Percentile(lat, 99))
	return g.release(ctx, b.http, sbx)
}

// threeReplicas measures acquires per second with trainers spread over
// three replicas: a burst that drains a warm pool, then acquire+release
// cycles sustained while the reconciler (on one replica) refills.
func (b *bench) threeReplicas(ctx context.Context, gws []*gateway) error {
	r := b.o.replicas
	if err := gws[0].waitReady(ctx, b.http, "burst", r.burst); err != nil {
		return err
	}
	before, err := allRequests(ctx, b.http, gws)
	if err != nil {
		return err
	}
	var (
		mu          sync.Mutex
		ids         []string
		lat         []time.Duration
		errs        []error
		unavailable atomic.Int64 // 503 unavailable answers, retried as a trainer would
	)
	start := time.Now()
	var wg sync.WaitGroup
	for range r.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				g := gws[mrand.IntN(len(gws))]
				t0 := time.Now()
				id, err := g.createSandboxIn(ctx, b.http, "burst")
				d := time.Since(t0)
				if isUnavailable(err) {
					unavailable.Add(1)
					time.Sleep(100 * time.Millisecond)
					continue
				}
				mu.Lock()
				switch {
				case err == nil:
					ids, lat = append(ids, id), append(lat, d)
				case !strings.Contains(err.Error(), "no_capacity"):
					errs = append(errs, err)
				}
				mu.Unlock()
				if err != nil {
					return
				}
			}
		}()
	}
	wg.Wait()
	took := time.Since(start)
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("burst acquires: %w", err)
	}
	after, err := allRequests(ctx, b.http, gws)
	if err != nil {
		return err
	}
	b.record(fmt.Sprintf("acquires/s, 3 replicas, %d clients, burst from %d ready", r.clients, r.burst),
		"until the pool is empty; trainers pick a replica at random",
		"acquires_per_s", float64(len(ids))/took.Seconds(), "acquires", len(ids), "p50_us", stats.Percentile(lat, 50), "p99_us", stats.Percentile(lat, 99),
		"unavailable_503", unavailable.Load(),
		"dynamodb_requests_per_acquire", after.delta(before, "acquire").total()/float64(max(len(ids), 1)),
		"dynamodb_other_requests_per_s", after.others(before, "acquire")/took.Seconds())
	start = time.Now()
	if err := forEach(ctx, ids, r.clients, func(i int, id string) error { return gws[i%len(gws)].releaseAny(ctx, b.http, id) }); err != nil {
		return fmt.Errorf("release the burst: %w", err)
	}
	b.record("releases/s, 3 replicas", "", "releases_per_s", float64(len(ids))/time.Since(start).Seconds())

	// Sustained: acquire and release over and over; the pool refills on
	// the replica that holds its lock, launching agents on these cores.
	if err := gws[0].waitReady(ctx, b.http, "cycle", r.sustainers); err != nil {
		return err
	}
	var done atomic.Int64
	lat = lat[:0]
	unavailable.Store(0)
	deadline := time.Now().Add(r.sustain)
	for range r.sustainers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) && ctx.Err() == nil {
				g := gws[mrand.IntN(len(gws))]
				t0 := time.Now()
				id, err := g.createSandboxIn(ctx, b.http, "cycle")
				if isUnavailable(err) {
					unavailable.Add(1)
					time.Sleep(100 * time.Millisecond)
					continue
				}
				if err != nil {
					if !strings.Contains(err.Error(), "no_capacity") {
						mu.Lock()
						errs = append(errs, err)
						mu.Unlock()
						return
					}
					continue
				}
				d := time.Since(t0)
				if err := gws[mrand.IntN(len(gws))].releaseAny(ctx, b.http, id); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					return
				}
				done.Add(1)
				mu.Lock()
				lat = append(lat, d)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("sustained acquires: %w", err)
	}
	outcomes := map[string]float64{}
	for _, g := range gws {
		m, err := g.metricSums(ctx, b.http, "quarry_acquires_total", "outcome", `pool="cycle"`)
		if err != nil {
			return err
		}
		for k, v := range m {
			outcomes[k] += v
		}
	}
	b.record(fmt.Sprintf("acquire+release cycles/s, 3 replicas, %d clients, %s", r.sustainers, r.sustain),
		"sustained: every release stops its task and the pool launches another on these 2 cores",
		"cycles_per_s", float64(done.Load())/r.sustain.Seconds(), "acquire_p50_us", stats.Percentile(lat, 50), "acquire_p99_us", stats.Percentile(lat, 99),
		"warm", outcomes["warm"], "cold", outcomes["cold"], "unavailable_503", unavailable.Load())
	return nil
}

// serializingProxy starts a loopback reverse proxy to endpoint that passes
// one request at a time. The moto emulator runs concurrent requests on
// threads without isolation, so two conditional transactions on one item
// can both succeed there; DynamoDB decides them one at a time. It returns
// the proxy's URL and a function that stops it.
func serializingProxy(endpoint string) (string, func(), error) {
	target, err := url.Parse(endpoint)
	if err != nil {
		return "", nil, fmt.Errorf("-dynamodb-endpoint: %w", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	var mu sync.Mutex
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		rp.ServeHTTP(w, r)
	})}
	done := make(chan struct{})
	go func() { _ = srv.Serve(ln); close(done) }()
	return "http://" + ln.Addr().String(), func() { _ = srv.Close(); <-done }, nil
}

// isUnavailable reports a 503 "unavailable" answer: the lease store did
// not answer in time (the emulator is busy); nothing happened, and a
// trainer retries.
func isUnavailable(err error) bool {
	return err != nil && strings.Contains(err.Error(), ": 503 ") && strings.Contains(err.Error(), `"unavailable"`)
}

// releaseAny releases a sandbox; one that had ended already (410) counts as
// released: on the emulator, a claim that lost an unisolated race ends its
// lease as lost (see -dynamodb-serialize).
// A 503 unavailable is retried for up to a minute.
func (g *gateway) releaseAny(ctx context.Context, hc *http.Client, id string) error {
	deadline := time.Now().Add(time.Minute)
	for {
		err := g.release(ctx, hc, id)
		switch {
		case err != nil && strings.Contains(err.Error(), ": 410 "):
			return nil
		case isUnavailable(err) && time.Now().Before(deadline):
			time.Sleep(100 * time.Millisecond)
		default:
			return err
		}
	}
}

// forEach runs f over items with at most n at a time; the first error wins.
func forEach(ctx context.Context, items []string, n int, f func(i int, s string) error) error {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	sem := make(chan struct{}, n)
	for i, s := range items {
		if ctx.Err() != nil {
			break
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			if err := f(i, s); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// rawPutItems times n conditional PutItem calls (a new key each, condition
// attribute_not_exists) on a scratch table it creates and deletes.
func rawPutItems(ctx context.Context, api *dynamodb.Client, table string, n int) ([]time.Duration, error) {
	_, err := api.CreateTable(ctx, &dynamodb.CreateTableInput{
		TableName:            aws.String(table),
		AttributeDefinitions: []types.AttributeDefinition{{AttributeName: aws.String("pk"), AttributeType: types.ScalarAttributeTypeS}},
		KeySchema:            []types.KeySchemaElement{{AttributeName: aws.String("pk"), KeyType: types.KeyTypeHash}},
		BillingMode:          types.BillingModePayPerRequest,
	})
	if err != nil {
		return nil, fmt.Errorf("create scratch table: %w", err)
	}
	defer func() {
		_, _ = api.DeleteTable(context.WithoutCancel(ctx), &dynamodb.DeleteTableInput{TableName: aws.String(table)})
	}()
	if err := dynamodb.NewTableExistsWaiter(api).Wait(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(table)}, 2*time.Minute); err != nil {
		return nil, fmt.Errorf("wait for the scratch table: %w", err)
	}
	i := 0
	return timeN(ctx, n, func() error {
		i++
		_, err := api.PutItem(ctx, &dynamodb.PutItemInput{
			TableName: aws.String(table),
			Item: map[string]types.AttributeValue{
				"pk": &types.AttributeValueMemberS{Value: "item-" + strconv.Itoa(i)}, "version": &types.AttributeValueMemberN{Value: "1"},
			},
			ConditionExpression: aws.String("attribute_not_exists(pk)"),
		})
		return err
	})
}

// stopGateway stops a gateway and the sandboxes of its data directory.
func (b *bench) stopGateway(g *gateway, dataDir string) {
	_ = g.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = g.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = g.cmd.Process.Kill()
		<-done
	}
	files, _ := filepath.Glob(filepath.Join(dataDir, "process", "*", "task.json"))
	for _, f := range files {
		if pid := recordedPID(f); pid > 0 {
			killSession(pid)
		}
	}
}

// requestCounts are DynamoDB requests by caller and operation, from a
// gateway's quarry_dynamodb_requests_total.
type requestCounts map[string]map[string]float64

// opCounts are requests by operation.
type opCounts map[string]float64

// others sums the requests of every caller but caller since before.
func (c requestCounts) others(before requestCounts, caller string) float64 {
	var t float64
	for k := range c {
		if k != caller {
			t += c.delta(before, k).total()
		}
	}
	return t
}

// allRequests sums the DynamoDB request counters of several gateways.
func allRequests(ctx context.Context, hc *http.Client, gws []*gateway) (requestCounts, error) {
	out := requestCounts{}
	for _, g := range gws {
		c, err := g.dynamoRequests(ctx, hc)
		if err != nil {
			return nil, err
		}
		for caller, ops := range c {
			if out[caller] == nil {
				out[caller] = map[string]float64{}
			}
			for op, v := range ops {
				out[caller][op] += v
			}
		}
	}
	return out, nil
}

func (c requestCounts) delta(before requestCounts, caller string) opCounts {
	out := opCounts{}
	for op, v := range c[caller] {
		if d := v - before[caller][op]; d > 0 {
			out[op] = d
		}
	}
	return out
}

func (o opCounts) total() float64 {
	var t float64
	for _, v := range o {
		t += v
	}
	return t
}

// per returns the operations' counts divided by n, as record's key/value
// pairs.
func (o opCounts) per(n int) []any {
	var kv []any
	for op, v := range o {
		kv = append(kv, op, v/float64(n))
	}
	return kv
}

// dynamoRequests reads the gateway's DynamoDB request counters.
func (g *gateway) dynamoRequests(ctx context.Context, hc *http.Client) (requestCounts, error) {
	out := requestCounts{}
	err := g.scanMetric(ctx, hc, "quarry_dynamodb_requests_total", func(labels string, v float64) {
		caller, op := labelValue(labels, "caller"), labelValue(labels, "operation")
		if out[caller] == nil {
			out[caller] = map[string]float64{}
		}
		out[caller][op] += v
	})
	return out, err
}

// metricSums sums metric name by the value of label key over the series
// whose labels contain filter.
func (g *gateway) metricSums(ctx context.Context, hc *http.Client, name, key, filter string) (map[string]float64, error) {
	out := map[string]float64{}
	err := g.scanMetric(ctx, hc, name, func(labels string, v float64) {
		if strings.Contains(labels, filter) {
			out[labelValue(labels, key)] += v
		}
	})
	return out, err
}

// scanMetric calls f with the labels and value of every series of metric
// name on the gateway's /metrics.
func (g *gateway) scanMetric(ctx context.Context, hc *http.Client, name string, f func(labels string, v float64)) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, g.base+"/metrics", nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+g.token)
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET /metrics: %d", resp.StatusCode)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		rest, ok := bytes.CutPrefix(line, []byte(name+"{"))
		if !ok {
			continue
		}
		labels, value, ok := bytes.Cut(rest, []byte("} "))
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(string(value), 64)
		if err != nil {
			continue
		}
		f(string(labels), v)
	}
	return sc.Err()
}

// labelValue returns the value of label key in a Prometheus label list
// (`a="x",b="y"`).
func labelValue(labels, key string) string {
	_, rest, ok := strings.Cut(","+labels, ","+key+`="`)
	if !ok {
		return ""
	}
	v, _, _ := strings.Cut(rest, `"`)
	return v
}
