package scalebench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quarryhq/quarry/api"
	"github.com/quarryhq/quarry/bench/ddbsim"
	"github.com/quarryhq/quarry/bench/ecssim"
	"github.com/quarryhq/quarry/internal/stats"
)

// httpError is a non-2xx answer of a gateway.
type httpError struct {
	status int
	body   string
}

func (e *httpError) Error() string { return fmt.Sprintf("%d %s", e.status, e.body) }

// call sends one request to g with the API key and decodes a 2xx answer
// into out.
func (w *world) call(ctx context.Context, g *replica, method, path string, in, out any) error {
	return w.callWith(ctx, w.http, g, method, path, in, out)
}

// callWith is call on the client hc.
func (w *world) callWith(ctx context.Context, hc *http.Client, g *replica, method, path string, in, out any) error {
	return w.callHeader(ctx, hc, g, method, path, nil, in, out)
}

// callHeader is callWith with more request headers.
func (w *world) callHeader(ctx context.Context, hc *http.Client, g *replica, method, path string, hdr map[string]string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, g.base+path, body)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+apiKey)
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return &httpError{status: resp.StatusCode, body: strings.TrimSpace(string(data))}
	}
	if out != nil {
		return json.Unmarshal(data, out)
	}
	return nil
}

// errKey names an error for the counts by kind: the status and the
// error code of the gateway's answer, or the transport's failure.
func errKey(err error) string {
	var he *httpError
	if errors.As(err, &he) {
		var e struct {
			Error struct {
				Code string `json:"code"`
			} `json:"error"`
		}
		_ = json.Unmarshal([]byte(he.body), &e)
		return strconv.Itoa(he.status) + " " + e.Error.Code
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return "client deadline"
	}
	return "transport"
}

// pool returns a pool's counts as one replica reports them.
func (w *world) pool(ctx context.Context, name string) (api.Pool, error) {
	var pl api.PoolList
	if err := w.call(ctx, w.gws[0], http.MethodGet, "/v1/pools", nil, &pl); err != nil {
		return api.Pool{}, err
	}
	for _, p := range pl.Pools {
		if p.Name == name {
			return p, nil
		}
	}
	return api.Pool{}, fmt.Errorf("GET /v1/pools: no pool %s", name)
}

// Fill is the time from the gateways' start to n ready.
type Fill struct {
	Ready int `json:"ready"`
	// SimulatedSeconds is the fill's simulated time (wall / s); Complete
	// whether all n were ready by the limit.
	SimulatedSeconds float64 `json:"simulated_seconds"`
	Complete         bool    `json:"complete"`
	FloorSeconds     float64 `json:"floor_seconds"`
	RatioToFloor     float64 `json:"ratio_to_floor"`
	// LastError is the last failed poll of GET /v1/pools, if any.
	LastError string `json:"last_error,omitempty"`
}

// waitReady polls GET /v1/pools until want tasks of pool are ready or
// limit (wall) has passed, and returns the ready count and the wall time it
// took.
func (w *world) waitReady(ctx context.Context, pool string, want int, limit time.Duration, progress func(time.Duration, api.Pool)) (int, time.Duration, string) {
	start := time.Now()
	poll := min(max(w.cfg.wall(2*time.Second), 100*time.Millisecond), time.Second)
	ready, lastErr, lastShown := 0, "", time.Time{}
	for {
		p, err := w.pool(ctx, pool)
		if err != nil {
			lastErr = err.Error()
		} else {
			ready = p.Ready
			if progress != nil && time.Since(lastShown) >= 10*time.Second {
				progress(time.Since(start), p)
				lastShown = time.Now()
			}
		}
		if ready >= want {
			return ready, time.Since(start), lastErr
		}
		if time.Since(start) > limit || ctx.Err() != nil {
			return ready, time.Since(start), lastErr
		}
		time.Sleep(poll)
	}
}

// Latencies are p50/p99 of some calls (wall clock, ms) and their errors by
// kind.
type Latencies struct {
	Count  int            `json:"count"`
	OK     int            `json:"ok"`
	P50ms  float64        `json:"p50_ms"`
	P99ms  float64        `json:"p99_ms"`
	Max    float64        `json:"max_ms"`
	Errors map[string]int `json:"errors,omitempty"`
}

func latencies(ds []time.Duration, errs map[string]int) Latencies {
	l := Latencies{Count: len(ds), OK: len(ds), Errors: errs}
	for _, n := range errs {
		l.Count += n
	}
	if len(ds) > 0 {
		l.P50ms = ms(stats.Percentile(ds, 50))
		l.P99ms = ms(stats.Percentile(ds, 99))
		l.Max = ms(stats.Percentile(ds, 100))
	}
	return l
}

func ms(d time.Duration) float64 { return math.Round(float64(d)/1e4) / 100 }

// lease is one trainer's sandbox.
type lease struct {
	id string
	g  *replica
}

// acquireAll runs n trainers at once, each acquiring a sandbox from the
// replica its index picks and running one exec in it (create → alive),
// and returns the leases and the latencies of acquire and create → alive.
func (w *world) acquireAll(ctx context.Context, n int) ([]lease, Latencies, Latencies) {
	var (
		mu             sync.Mutex
		leases         []lease
		acq, alive     []time.Duration
		acqErr, alvErr = map[string]int{}, map[string]int{}
		wg             sync.WaitGroup
		startLine      = make(chan struct{})
	)
	cctx, cancel := context.WithTimeout(ctx, w.cfg.wall(2*time.Minute)+time.Minute)
	defer cancel()
	for i := range n {
		g := w.gws[i%len(w.gws)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-startLine
			begin := time.Now()
			var sb api.Sandbox
			err := w.call(cctx, g, http.MethodPost, "/v1/sandboxes",
				api.CreateSandboxRequest{Pool: poolName, LeaseSeconds: w.cfg.wallSeconds(w.cfg.LeaseSeconds)}, &sb)
			took := time.Since(begin)
			mu.Lock()
			if err != nil {
				acqErr[errKey(err)]++
				mu.Unlock()
				return
			}
			acq = append(acq, took)
			leases = append(leases, lease{id: sb.ID, g: g})
			mu.Unlock()
			// The exec has a deadline of its own: a slow acquire must not
			// leave it none.
			ectx, ecancel := context.WithTimeout(ctx, time.Minute)
			err = w.callWith(ectx, w.execHTTP, g, http.MethodPost, "/v1/sandboxes/"+sb.ID+"/exec", map[string]any{"command": "true"}, nil)
			ecancel()
			took = time.Since(begin)
			mu.Lock()
			if err != nil {
				alvErr[errKey(err)]++
			} else {
				alive = append(alive, took)
			}
			mu.Unlock()
		}()
	}
	close(startLine)
	wg.Wait()
	return leases, latencies(acq, acqErr), latencies(alive, alvErr)
}

// heartbeats keeps every lease renewed every period (wall), spread evenly,
// until ctx ends; it returns the heartbeats sent and failed.
func (w *world) heartbeats(ctx context.Context, leases []lease, period time.Duration) (sent, failed *atomic.Int64, wait func()) {
	sent, failed = &atomic.Int64{}, &atomic.Int64{}
	workers := min(len(leases), w.cfg.Clients)
	var wg sync.WaitGroup
	for k := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mine := leases[k:]
			var own []lease
			for i := 0; i < len(mine); i += workers {
				own = append(own, mine[i])
			}
			if len(own) == 0 {
				return
			}
			gap := period / time.Duration(len(own))
			// Offset each worker within its gap so the heartbeats spread.
			next := time.Now().Add(gap * time.Duration(k) / time.Duration(workers))
			for i := 0; ; i++ {
				select {
				case <-ctx.Done():
					return
				case <-time.After(time.Until(next)):
				}
				l := own[i%len(own)]
				if err := w.call(ctx, l.g, http.MethodPost, "/v1/sandboxes/"+l.id+"/heartbeat", nil, nil); err != nil && ctx.Err() == nil {
					failed.Add(1)
				} else if err == nil {
					sent.Add(1)
				}
				next = next.Add(gap)
			}
		}()
	}
	return sent, failed, wg.Wait
}

// probes acquires n sandboxes of the probe pool one at a time (with the
// fleet leased) and returns the acquire latencies.
func (w *world) probes(ctx context.Context, n int) Latencies {
	var ds []time.Duration
	errs := map[string]int{}
	for i := range n {
		g := w.gws[i%len(w.gws)]
		begin := time.Now()
		var sb api.Sandbox
		err := w.call(ctx, g, http.MethodPost, "/v1/sandboxes",
			api.CreateSandboxRequest{Pool: probePool, LeaseSeconds: w.cfg.wallSeconds(w.cfg.LeaseSeconds)}, &sb)
		if err != nil {
			errs[errKey(err)]++
			continue
		}
		ds = append(ds, time.Since(begin))
	}
	return latencies(ds, errs)
}

// ddbStats and ecsStats read the simulators' counters.
func (w *world) ddbStats(ctx context.Context) (ddbsim.Stats, error) {
	var st ddbsim.Stats
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, w.ddbURL+"/ddbsim/stats", nil)
	if err != nil {
		return st, err
	}
	resp, err := w.http.Do(req)
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	return st, json.NewDecoder(resp.Body).Decode(&st)
}

func (w *world) ecsStats() ecssim.Stats { return w.ecs.Stats() }

// Memory is one replica's memory (KiB): VmRSS now and its peak VmHWM.
type Memory struct {
	RSSKiB  int64 `json:"rss_kib"`
	PeakKiB int64 `json:"peak_kib"`
}

func memoryOf(pid int) Memory {
	var m Memory
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return m
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		k, v, ok := strings.Cut(s.Text(), ":")
		if !ok {
			continue
		}
		n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		switch k {
		case "VmRSS":
			m.RSSKiB = n
		case "VmHWM":
			m.PeakKiB = n
		}
	}
	return m
}

// Histogram is a Prometheus histogram summed over the replicas: count,
// mean and quantiles estimated from its buckets (seconds, wall clock).
type Histogram struct {
	Metric string  `json:"metric"`
	Found  bool    `json:"found"`
	Count  float64 `json:"count"`
	MeanS  float64 `json:"mean_s"`
	P50S   float64 `json:"p50_s"`
	P99S   float64 `json:"p99_s"`
}

// histogram scrapes metric (a histogram) from every replica's /metrics.
func (w *world) histogram(ctx context.Context, metric string) Histogram {
	h := Histogram{Metric: metric}
	buckets := map[float64]float64{}
	var sum float64
	w.scrape(ctx, metric, func(name string, v float64) {
		switch {
		case strings.HasPrefix(name, metric+"_bucket"):
			le := labelValue(name, "le")
			b, err := strconv.ParseFloat(le, 64)
			if le == "+Inf" {
				b, err = math.Inf(1), nil
			}
			if err == nil {
				buckets[b] += v
				h.Found = true
			}
		case strings.HasPrefix(name, metric+"_sum"):
			sum += v
		case strings.HasPrefix(name, metric+"_count"):
			h.Count += v
		}
	})
	if h.Count > 0 {
		h.MeanS = sum / h.Count
		h.P50S = quantile(buckets, h.Count, 0.5)
		h.P99S = quantile(buckets, h.Count, 0.99)
	}
	return h
}

// scrape calls f with every sample of metric on every replica's
// /metrics (a replica that does not answer is skipped).
func (w *world) scrape(ctx context.Context, metric string, f func(name string, v float64)) {
	for _, g := range w.gws {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, g.base+"/metrics", nil)
		if err != nil {
			continue
		}
		req.Header.Set("Authorization", "Bearer "+apiKey)
		resp, err := w.http.Do(req)
		if err != nil {
			continue
		}
		scanMetric(resp.Body, metric, f)
		resp.Body.Close()
	}
}

// scanMetric calls f with the name (labels included) and value of every
// sample of metric (and its _bucket, _sum and _count series) in a
// Prometheus text exposition.
func scanMetric(r io.Reader, metric string, f func(name string, v float64)) {
	s := bufio.NewScanner(r)
	s.Buffer(make([]byte, 1<<20), 1<<20)
	for s.Scan() {
		line := s.Text()
		if !strings.HasPrefix(line, metric) || strings.HasPrefix(line, "#") {
			continue
		}
		rest := line[len(metric):]
		if rest == "" || (rest[0] != '{' && rest[0] != ' ' && rest[0] != '_') {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		f(line[:i], v)
	}
}

// quantile is the upper bound of the first bucket holding q of count.
func quantile(buckets map[float64]float64, count, q float64) float64 {
	les := make([]float64, 0, len(buckets))
	for le := range buckets {
		les = append(les, le)
	}
	sort.Float64s(les)
	for _, le := range les {
		if buckets[le] >= q*count {
			return le
		}
	}
	return math.Inf(1)
}

// labelValue returns the value of label key in a metric line's labels.
func labelValue(name, key string) string {
	_, rest, ok := strings.Cut(name, key+`="`)
	if !ok {
		return ""
	}
	v, _, _ := strings.Cut(rest, `"`)
	return v
}

// cpuSample is the machine's CPU time (all cores) from /proc/stat.
type cpuSample struct{ busy, total float64 }

func readCPU() cpuSample {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return cpuSample{}
	}
	line, _, _ := strings.Cut(string(data), "\n")
	f := strings.Fields(line)
	var s cpuSample
	for i, v := range f[1:] {
		x, _ := strconv.ParseFloat(v, 64)
		s.total += x
		if i != 3 && i != 4 { // idle, iowait
			s.busy += x
		}
	}
	return s
}

// busyPercent is the machine's CPU use between a and b (100 = every core
// busy).
func busyPercent(a, b cpuSample) float64 {
	if b.total <= a.total {
		return 0
	}
	return math.Round(1000*(b.busy-a.busy)/(b.total-a.total)) / 10
}
