// Command relaybench measures the model relay's overhead on loopback: the
// time an agent's call takes to reach a trainer's claim and a trainer's
// answer to reach the agent, on the memory broker and (with -dynamodb) on
// the DynamoDB broker against the AWS emulator, with the call and the
// answer on one replica and on two; the time to first byte that the
// passthrough adds in front of an OpenAI-compatible upstream; 1,000
// sandboxes with one call in flight each, served by one trainer poller;
// and, with -dynamodb, what one trainer key's calls cost the relay's table
// per partition key (a fan-in with calls on one replica and answers on
// another, every DynamoDB call accounted by a meter: meter.go), hence the
// call rate one trainer key sustains under DynamoDB's per-partition
// limits.
//
// The gateway runs in this process (gateway.New over a lease table in
// memory): the relay is gateway-side, so no sandbox needs to run; agents
// and the trainer are HTTP clients on 127.0.0.1. `make bench` runs it;
// docs/MODELSERVICE.md explains the numbers.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/signal"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/quarryhq/quarry/gateway"
	"github.com/quarryhq/quarry/internal/stats"
	"github.com/quarryhq/quarry/modelservice"
	"github.com/quarryhq/quarry/modelservice/dynamobroker"
	"github.com/quarryhq/quarry/modelservice/membroker"
	"github.com/quarryhq/quarry/modelservice/modeltest"
	"github.com/quarryhq/quarry/warmpool"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "relaybench:", err)
		os.Exit(1)
	}
}

type options struct {
	calls      int
	sandboxes  int
	memory     bool
	dynamo     bool
	dynamoCall int
	dynamoFan  int
	capFan     int
	capBody    int
	out        string
}

// result is one measured line.
type result struct {
	Name   string             `json:"name"`
	Values map[string]float64 `json:"values"`
	Note   string             `json:"note,omitempty"`
}

func run(ctx context.Context) error {
	var o options
	flag.IntVar(&o.calls, "calls", 2000, "sequential calls per latency measurement")
	flag.IntVar(&o.sandboxes, "sandboxes", 1000, "sandboxes with one call in flight each")
	flag.BoolVar(&o.memory, "memory", true, "measure the memory broker and the passthrough")
	flag.BoolVar(&o.dynamo, "dynamodb", false, "also measure the DynamoDB broker (AWS_ENDPOINT_URL, AWS_REGION, credentials from the environment)")
	flag.IntVar(&o.dynamoCall, "dynamodb-calls", 300, "sequential calls per DynamoDB latency measurement (0: skip the latency rows and their fan-in)")
	flag.IntVar(&o.dynamoFan, "dynamodb-sandboxes", 100, "sandboxes of the DynamoDB fan-in")
	flag.IntVar(&o.capFan, "capacity-sandboxes", 200, "sandboxes of the DynamoDB capacity fan-in (0: skip it)")
	flag.IntVar(&o.capBody, "capacity-body", 5000, "bytes of each request body in the capacity fan-in")
	flag.StringVar(&o.out, "json", "", "write results as JSON to this file")
	flag.Parse()

	var results []result
	add := func(r result) {
		results = append(results, r)
		fmt.Println(format(r))
	}

	mem := func() (modelservice.Broker, func(), error) {
		b := membroker.New(membroker.Config{})
		return b, func() { _ = b.Close(context.Background()) }, nil
	}
	if o.memory {
		r, err := measureRelay(ctx, "memory broker", mem, nil, o.calls)
		if err != nil {
			return err
		}
		add(r)
		if r, err = measurePassthrough(ctx, o.calls); err != nil {
			return err
		}
		add(r)
		if r, err = measureFanIn(ctx, "memory broker", mem, nil, o.sandboxes, nil); err != nil {
			return err
		}
		add(r)
	}

	if o.dynamo {
		api, table, cleanup, err := dynamoTable(ctx)
		if err != nil {
			return err
		}
		defer cleanup()
		dyn := func() (modelservice.Broker, func(), error) {
			// The emulator serves one call at a time: under the fan-in a call
			// may queue for seconds, so each call gets longer than on AWS.
			b := dynamobroker.New(dynamobroker.Config{Table: table, CallTimeout: 30 * time.Second}, api, nil)
			return b, func() { _ = b.Close(context.Background()) }, nil
		}
		if o.dynamoCall > 0 {
			r, err := measureRelay(ctx, "DynamoDB broker, one replica", dyn, nil, o.dynamoCall)
			if err != nil {
				return err
			}
			add(r)
			r, err = measureRelay(ctx, "DynamoDB broker, call on A, answer on B", dyn, dyn, o.dynamoCall)
			if err != nil {
				return err
			}
			add(r)
			r, err = measureFanIn(ctx, "DynamoDB broker", dyn, nil, min(o.sandboxes, o.dynamoFan), nil)
			if err != nil {
				return err
			}
			add(r)
		}
		if o.capFan > 0 {
			rs, err := measureCapacity(ctx, api, o.capFan, o.capBody)
			if err != nil {
				return err
			}
			for _, r := range rs {
				add(r)
			}
		}
	}
	if o.out != "" {
		b, _ := json.MarshalIndent(results, "", "  ")
		if err := os.WriteFile(o.out, b, 0o644); err != nil {
			return fmt.Errorf("write %s: %w", o.out, err)
		}
	}
	return nil
}

func format(r result) string {
	keys := make([]string, 0, len(r.Values))
	for k := range r.Values {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%.3f", k, r.Values[k]))
	}
	s := fmt.Sprintf("%-58s %s", r.Name, strings.Join(parts, " "))
	if r.Note != "" {
		s += "\n    " + r.Note
	}
	return s
}

// leases is the gateway's lease table in memory: every lease is active
// and owned by benchKey. It serves as the gateway's Manager (only Get is
// used by the relay routes) and as the relay's LeaseReader.
type leases struct {
	mu sync.Mutex
	m  map[string]warmpool.Lease
}

const benchKey = "relaybench-key-0123456789"

func (l *leases) add(id, pool string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	l.m[id] = warmpool.Lease{ID: id, Pool: pool, Owner: gateway.OwnerOf(benchKey), State: warmpool.LeaseActive,
		CreatedAt: now, ExpiresAt: now.Add(24 * time.Hour), Duration: 24 * time.Hour}
}

func (l *leases) GetLease(_ context.Context, id string) (warmpool.Lease, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if x, ok := l.m[id]; ok {
		return x, nil
	}
	return warmpool.Lease{}, warmpool.ErrNotFound
}

func (l *leases) Get(ctx context.Context, id, owner string) (warmpool.Lease, error) {
	x, err := l.GetLease(ctx, id)
	if err == nil && x.Owner != owner {
		return warmpool.Lease{}, warmpool.ErrNotFound
	}
	return x, err
}

var errUnused = errors.New("not used by the relay benchmark")

func (l *leases) Acquire(context.Context, warmpool.AcquireRequest) (warmpool.Lease, bool, error) {
	return warmpool.Lease{}, false, errUnused
}
func (l *leases) Heartbeat(context.Context, string, string) (warmpool.Lease, error) {
	return warmpool.Lease{}, errUnused
}
func (l *leases) Release(context.Context, string, string) (warmpool.Lease, error) {
	return warmpool.Lease{}, errUnused
}
func (l *leases) List(context.Context, warmpool.LeaseFilter) ([]warmpool.Lease, error) {
	return nil, errUnused
}
func (l *leases) Pools(context.Context) ([]warmpool.PoolStatus, error) { return nil, nil }
func (l *leases) CheckTask(_ context.Context, x warmpool.Lease) (warmpool.Lease, error) {
	return x, nil
}

// replica is one in-process gateway with a relay on its own broker handle.
type replica struct {
	url   string
	svc   *modelservice.Service
	close func()
}

var benchSecret = []byte("relaybench-secret-0123456789abcdef")

// startReplica serves a gateway whose relay uses broker, on 127.0.0.1.
func startReplica(ls *leases, broker modelservice.Broker, pools []warmpool.PoolConfig) (*replica, error) {
	tokens, err := modelservice.NewTokens(benchSecret)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	url := "http://" + ln.Addr().String()
	svc, err := modelservice.New(modelservice.Config{SandboxURL: url}, modelservice.Deps{Broker: broker, Leases: ls, Tokens: tokens, Pools: pools})
	if err != nil {
		return nil, err
	}
	gw, err := gateway.New(gateway.Config{APIKeys: []string{benchKey}}, gateway.Deps{Manager: ls, Model: svc, Metrics: prometheus.NewRegistry()})
	if err != nil {
		return nil, err
	}
	done := make(chan error, 1)
	go func() { done <- gw.Serve(ln) }()
	return &replica{url: url, svc: svc, close: func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = gw.Shutdown(ctx)
		<-done
	}}, nil
}

// startReplicas serves replica a on a broker from open and, with other
// set, replica b on a broker from other (else b is a); closeAll stops both
// and closes their brokers.
func startReplicas(ls *leases, pools []warmpool.PoolConfig, open, other func() (modelservice.Broker, func(), error)) (a, b *replica, closeAll func(), err error) {
	var closers []func()
	closeAll = func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	start := func(open func() (modelservice.Broker, func(), error)) (*replica, error) {
		br, closeBr, err := open()
		if err != nil {
			return nil, err
		}
		closers = append(closers, closeBr)
		rep, err := startReplica(ls, br, pools)
		if err != nil {
			return nil, err
		}
		closers = append(closers, rep.close)
		return rep, nil
	}
	if a, err = start(open); err != nil {
		closeAll()
		return nil, nil, nil, err
	}
	b = a
	if other != nil {
		if b, err = start(other); err != nil {
			closeAll()
			return nil, nil, nil, err
		}
	}
	return a, b, closeAll, nil
}

// httpClient is shared by agents and trainers: keep-alive, enough idle
// connections for the fan-in.
var httpClient = &http.Client{Timeout: 5 * time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: 2048, MaxConnsPerHost: 0}}

// agentCall posts body to the sandbox's relay and returns when the answer
// is read.
func agentCall(url, token string, body []byte) error {
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := httpClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("agent call: status %d", resp.StatusCode)
	}
	return nil
}

// measureRelay times sequential calls: the agent's send to the trainer's
// receipt of the claim (a trainer long-polls all the time), and the
// trainer's send of the answer to the agent's receipt. With other set, the
// trainer uses a second replica on its own broker handle.
func measureRelay(ctx context.Context, name string, open, other func() (modelservice.Broker, func(), error), n int) (result, error) {
	ls := &leases{m: map[string]warmpool.Lease{}}
	ls.add("sbx-bench", "default")
	a, b, closeAll, err := startReplicas(ls, []warmpool.PoolConfig{{Name: "default"}}, open, other)
	if err != nil {
		return result{}, err
	}
	defer closeAll()
	env := a.svc.LeaseEnv("sbx-bench", "")
	url, token := env["OPENAI_BASE_URL"]+"/chat/completions", env["OPENAI_API_KEY"]
	tr := &modeltest.Trainer{URL: b.url, Key: benchKey, HTTP: httpClient}
	answer := modeltest.ChatCompletion("chatcmpl-bench", "policy", "ok")
	body := []byte(`{"model":"policy","messages":[{"role":"user","content":"benchmark"}]}`)

	toTrainer := make([]time.Duration, 0, n)
	toAgent := make([]time.Duration, 0, n)
	for i := 0; i < n+n/10; i++ { // the first tenth warms up
		if ctx.Err() != nil {
			return result{}, ctx.Err()
		}
		sent := make(chan time.Time, 1)
		done := make(chan error, 1)
		var received time.Time
		go func() {
			sent <- time.Now()
			err := agentCall(url, token, body)
			received = time.Now()
			done <- err
		}()
		reqs, err := tr.Claim(30*time.Second, 1, "")
		claimed := time.Now()
		if err != nil || len(reqs) != 1 {
			return result{}, fmt.Errorf("%s: claim: %v (%d requests)", name, err, len(reqs))
		}
		answered := time.Now()
		if code, b, err := tr.Respond(reqs[0].ID, 0, answer); err != nil || code != http.StatusOK {
			return result{}, fmt.Errorf("%s: answer: %d %s %v", name, code, b, err)
		}
		if err := <-done; err != nil {
			return result{}, fmt.Errorf("%s: %w", name, err)
		}
		if i >= n/10 {
			toTrainer = append(toTrainer, claimed.Sub(<-sent))
			toAgent = append(toAgent, received.Sub(answered))
		}
	}
	total := make([]time.Duration, len(toTrainer))
	for i := range total {
		total[i] = toTrainer[i] + toAgent[i]
	}
	return result{
		Name: "relay overhead, " + name,
		Values: map[string]float64{
			"to_trainer_p50_ms": ms(stats.Percentile(toTrainer, 50)), "to_trainer_p99_ms": ms(stats.Percentile(toTrainer, 99)),
			"to_agent_p50_ms": ms(stats.Percentile(toAgent, 50)), "to_agent_p99_ms": ms(stats.Percentile(toAgent, 99)),
			"total_p50_ms": ms(stats.Percentile(total, 50)), "total_p99_ms": ms(stats.Percentile(total, 99)), "calls": float64(len(total)),
		},
		Note: "to_trainer: agent sends -> trainer holds the claimed request; to_agent: trainer sends the answer -> agent has read it (both legs include their HTTP round trips on loopback)",
	}, nil
}

// measurePassthrough times the first byte of a streamed completion from a
// local OpenAI-compatible upstream, directly and through the relay, in
// alternation; added is the difference of the quantiles.
func measurePassthrough(ctx context.Context, n int) (result, error) {
	up := httptest.NewServer(&modeltest.Upstream{})
	defer up.Close()
	ls := &leases{m: map[string]warmpool.Lease{}}
	ls.add("sbx-pass", "eval")
	pools := []warmpool.PoolConfig{{Name: "eval", Options: map[string]string{modelservice.OptionUpstreamURL: up.URL + "/v1"}}}
	b := membroker.New(membroker.Config{})
	defer b.Close(context.Background())
	rep, err := startReplica(ls, b, pools)
	if err != nil {
		return result{}, err
	}
	defer rep.close()
	env := rep.svc.LeaseEnv("sbx-pass", "")
	body := []byte(`{"model":"m","stream":true,"messages":[{"role":"user","content":"one two three"}]}`)
	ttfb := func(url, token string) (time.Duration, error) {
		req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
		if err != nil {
			return 0, err
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		req.Header.Set("Content-Type", "application/json")
		start := time.Now()
		resp, err := httpClient.Do(req)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		var one [1]byte
		if _, err := io.ReadFull(resp.Body, one[:]); err != nil {
			return 0, err
		}
		d := time.Since(start)
		_, err = io.Copy(io.Discard, resp.Body)
		return d, err
	}
	var direct, relayed []time.Duration
	for i := 0; i < n+n/10; i++ {
		if ctx.Err() != nil {
			return result{}, ctx.Err()
		}
		d1, err := ttfb(up.URL+"/v1/chat/completions", "")
		if err != nil {
			return result{}, fmt.Errorf("direct: %w", err)
		}
		d2, err := ttfb(env["OPENAI_BASE_URL"]+"/chat/completions", env["OPENAI_API_KEY"])
		if err != nil {
			return result{}, fmt.Errorf("through the relay: %w", err)
		}
		if i >= n/10 {
			direct, relayed = append(direct, d1), append(relayed, d2)
		}
	}
	return result{
		Name: "passthrough time to first byte",
		Values: map[string]float64{
			"direct_p50_ms": ms(stats.Percentile(direct, 50)), "direct_p99_ms": ms(stats.Percentile(direct, 99)),
			"relayed_p50_ms": ms(stats.Percentile(relayed, 50)), "relayed_p99_ms": ms(stats.Percentile(relayed, 99)),
			"added_p50_ms": ms(stats.Percentile(relayed, 50) - stats.Percentile(direct, 50)), "added_p99_ms": ms(stats.Percentile(relayed, 99) - stats.Percentile(direct, 99)),
			"calls": float64(len(direct)),
		},
		Note: "streamed chat completion from a local upstream; added = relayed - direct quantile",
	}, nil
}

// measureFanIn starts one call in each of n sandboxes at once and serves
// them with one trainer poller (claims of up to 1000, answers sent by 16
// workers); it reports the calls' latencies and the throughput. With
// other set, the trainer uses a second replica on its own broker handle.
// body is each agent's request body (nil: a short one).
func measureFanIn(ctx context.Context, name string, open, other func() (modelservice.Broker, func(), error), n int, body []byte) (result, error) {
	ls := &leases{m: map[string]warmpool.Lease{}}
	rep, trep, closeAll, err := startReplicas(ls, []warmpool.PoolConfig{{Name: "default"}}, open, other)
	if err != nil {
		return result{}, err
	}
	defer closeAll()
	trainerURL := trep.url
	type agent struct{ url, token string }
	agents := make([]agent, n)
	for i := range agents {
		id := fmt.Sprintf("sbx-%05d", i)
		ls.add(id, "default")
		env := rep.svc.LeaseEnv(id, "")
		agents[i] = agent{env["OPENAI_BASE_URL"] + "/chat/completions", env["OPENAI_API_KEY"]}
	}
	if body == nil {
		body = []byte(`{"model":"policy","messages":[{"role":"user","content":"fan in"}]}`)
	}
	answer := modeltest.ChatCompletion("chatcmpl-fan", "policy", "ok")
	tr := &modeltest.Trainer{URL: trainerURL, Key: benchKey, HTTP: httpClient}

	lat := make([]time.Duration, n)
	errs := make(chan error, n+1)
	var wg sync.WaitGroup
	start := time.Now()
	for i, a := range agents {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t0 := time.Now()
			if err := agentCall(a.url, a.token, body); err != nil {
				errs <- err
			}
			lat[i] = time.Since(t0)
		}()
	}
	work := make(chan string, n)
	var workers sync.WaitGroup
	for range 16 {
		workers.Add(1)
		go func() {
			defer workers.Done()
			for rid := range work {
				if code, b, err := tr.Respond(rid, 0, answer); err != nil || code != http.StatusOK {
					errs <- fmt.Errorf("answer: %d %s %v", code, b, err)
				}
			}
		}()
	}
	claims, served, retries := 0, 0, 0
	deadline := time.Now().Add(5 * time.Minute)
	for served < n && time.Now().Before(deadline) && ctx.Err() == nil {
		reqs, err := tr.Claim(5*time.Second, 1000, "")
		if err != nil && strings.Contains(err.Error(), "status 503") {
			retries++ // the broker was busy (the emulator serves one call at a time): claim again
			continue
		}
		if err != nil {
			close(work)
			return result{}, err
		}
		claims++
		for _, r := range reqs {
			work <- r.ID
		}
		served += len(reqs)
	}
	close(work)
	workers.Wait()
	wg.Wait()
	elapsed := time.Since(start)
	close(errs)
	if err := <-errs; err != nil {
		return result{}, fmt.Errorf("%s fan-in: %w", name, err)
	}
	if served < n {
		return result{}, fmt.Errorf("%s fan-in: served %d of %d calls", name, served, n)
	}
	return result{
		Name: fmt.Sprintf("%d sandboxes, one call each, one poller, %s", n, name),
		Values: map[string]float64{
			"call_p50_ms": ms(stats.Percentile(lat, 50)), "call_p99_ms": ms(stats.Percentile(lat, 99)), "wall_ms": ms(elapsed),
			"calls_per_s": float64(n) / elapsed.Seconds(), "claims": float64(claims), "claim_retries": float64(retries),
		},
		Note: "call: the agent's whole call (queue, claim, answer); claims: long-polls the poller needed",
	}, nil
}

// measureCapacity runs the fan-in of n sandboxes of one trainer key with
// bodies of bodySize bytes, calls on replica A and answers on replica B,
// both brokers on one meter over a fresh table, and reports what the calls
// cost the table per partition key.
func measureCapacity(ctx context.Context, api *dynamodb.Client, n, bodySize int) ([]result, error) {
	table := fmt.Sprintf("relaybench-cap-%d", time.Now().UnixNano())
	cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := dynamobroker.CreateTables(cctx, api, table); err != nil {
		return nil, err
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = dynamobroker.DeleteTables(dctx, api, table)
	}()
	m := newMeter(api, dynamobroker.TableDefinition(table))
	open := func() (modelservice.Broker, func(), error) {
		b := dynamobroker.New(dynamobroker.Config{Table: table, CallTimeout: 30 * time.Second}, m, nil)
		return b, func() { _ = b.Close(context.Background()) }, nil
	}
	content := strings.Repeat("x", max(0, bodySize-70))
	body := []byte(`{"model":"policy","messages":[{"role":"user","content":"` + content + `"}]}`)
	fan, err := measureFanIn(ctx, "DynamoDB broker, calls on A, answers on B, metered", open, open, n, body)
	if err != nil {
		return nil, err
	}
	values, note := m.snapshot().report(n)
	values["body_bytes"] = float64(len(body))
	return []result{fan, {
		Name:   fmt.Sprintf("DynamoDB capacity per call, %d sandboxes of one trainer key", n),
		Values: values, Note: note,
	}}, nil
}

// dynamoTable creates a fresh relay table on the configured endpoint.
func dynamoTable(ctx context.Context) (*dynamodb.Client, string, func(), error) {
	cfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		return nil, "", nil, fmt.Errorf("load AWS configuration: %w", err)
	}
	if cfg.Region == "" {
		cfg.Region = "us-east-1"
	}
	api := dynamodb.NewFromConfig(cfg)
	table := fmt.Sprintf("relaybench-%d", time.Now().UnixNano())
	cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := dynamobroker.CreateTables(cctx, api, table); err != nil {
		return nil, "", nil, err
	}
	return api, table, func() {
		dctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = dynamobroker.DeleteTables(dctx, api, table)
	}, nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
