package scalebench

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/quarryhq/quarry/bench/agentsim"
	"github.com/quarryhq/quarry/bench/ddbsim"
	"github.com/quarryhq/quarry/bench/ecssim"
	"github.com/quarryhq/quarry/modelservice/dynamobroker"
	"github.com/quarryhq/quarry/warmpool/dynamostore"
)

// apiKey is the gateways' API key; poolName the one pool.
const (
	apiKey   = "scalebench-api-key-0123456789"
	poolName = "fleet"
	// probePool holds the probe tasks (a pool's max_total is at most
	// 10,000, so they cannot join the fleet's pool at 10k).
	probePool = "probe"
	// relayTable is the relay broker's table (the gateway's default).
	relayTable = "quarry-model-relay"
)

// world is one size's simulated world and the gateways on it.
type world struct {
	cfg      Config
	n        int
	dir      string
	procs    []*proc // ddbsim and the gateways, stopped by close
	ddbURL   string
	ecs      *ecssim.Server
	ecsURL   string
	agents   *agentsim.Procs
	gws      []*replica
	tokenKey string
	// imgs is the images scenario's batch (nil in the fleet scenario).
	imgs *imageSet
	http *http.Client
	// execHTTP carries the trainers' first execs (the same bound).
	execHTTP *http.Client
}

// replica is one gateway process.
type replica struct {
	base string
	pid  int
	log  string
	p    *proc
}

// proc is a started process and its end.
type proc struct {
	cmd     *exec.Cmd
	gateway bool
	done    chan struct{} // closed when it has exited
}

// start starts cmd and watches for its end.
func (w *world) start(cmd *exec.Cmd, gateway bool) (*proc, error) {
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", filepath.Base(cmd.Path), err)
	}
	p := &proc{cmd: cmd, gateway: gateway, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	w.procs = append(w.procs, p)
	return p, nil
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// newWorld starts the simulators and the agents for size n (not the
// gateways: startGateways); with imgs, ecssim's registry holds the batch's
// images (and only those) and its tasks pull them at cfg.ImagePullRate.
func newWorld(ctx context.Context, cfg Config, n int, dir string, imgs *imageSet) (w *world, err error) {
	client := func() *http.Client {
		return &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{
			MaxIdleConns: 4 * cfg.Clients, MaxIdleConnsPerHost: cfg.Clients, MaxConnsPerHost: cfg.Clients, IdleConnTimeout: time.Minute,
		}}
	}
	// The trainers' first execs have connections of their own: behind the
	// acquires' (held for as long as a cold acquire waits) they would
	// measure the client's queue, not the gateway.
	w = &world{cfg: cfg, n: n, dir: dir, imgs: imgs, http: client(), execHTTP: client()}
	defer func() {
		if err != nil {
			w.close()
			w = nil
		}
	}()
	if w.ddbURL, err = w.startDDBSim(ctx); err != nil {
		return w, err
	}
	ddb := ddbsim.Client(w.ddbURL, 0)
	if err := dynamostore.CreateTables(ctx, ddb, dynamostore.Config{}); err != nil {
		return w, fmt.Errorf("create the lease store's tables in ddbsim: %w", err)
	}
	if err := dynamobroker.CreateTables(ctx, ddb, relayTable); err != nil {
		return w, fmt.Errorf("create the relay's table in ddbsim: %w", err)
	}
	procs := (n+cfg.Probes)/cfg.AgentsPerProc + 1
	alog, err := os.Create(filepath.Join(dir, "agentsim.log"))
	if err != nil {
		return w, err
	}
	if w.agents, err = agentsim.StartProcs(ctx, agentsim.ProcsConfig{
		Command: []string{filepath.Join(cfg.Bin, "agentsim")}, Procs: procs, Stderr: alog,
	}); err != nil {
		return w, fmt.Errorf("start %d agentsim processes: %w", procs, err)
	}
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return w, err
	}
	ecfg := ecssim.Config{TimeScale: cfg.TimeScale, Agents: w.agents, TokenKey: key, AddrBlocks: 1}
	if imgs != nil {
		ecfg.Images, ecfg.StrictRegistry, ecfg.PullRate = imgs.sizes, true, cfg.ImagePullRate
	}
	if w.ecs, err = ecssim.New(ecfg); err != nil {
		return w, err
	}
	if w.ecsURL, err = w.ecs.Start("127.0.0.1:0"); err != nil {
		return w, err
	}
	w.tokenKey = hex.EncodeToString(key)
	return w, nil
}

// openWorld is newWorld and startGateways: a world whose gateways answer,
// or none (what was started is closed).
func openWorld(ctx context.Context, cfg Config, n int, dir string, imgs *imageSet) (*world, error) {
	w, err := newWorld(ctx, cfg, n, dir, imgs)
	if err != nil {
		return nil, err
	}
	if err := w.startGateways(ctx); err != nil {
		w.close()
		return nil, err
	}
	return w, nil
}

// startDDBSim starts the DynamoDB simulator's command and returns its
// endpoint (the first line it prints).
func (w *world) startDDBSim(ctx context.Context) (string, error) {
	cmd := exec.Command(filepath.Join(w.cfg.Bin, "ddbsim"), w.cfg.ddbsimArgs()...)
	logf, err := os.Create(filepath.Join(w.dir, "ddbsim.log"))
	if err != nil {
		return "", err
	}
	cmd.Stderr = logf
	out, err := cmd.StdoutPipe()
	if err != nil {
		return "", err
	}
	if _, err := w.start(cmd, false); err != nil {
		return "", err
	}
	line := make(chan string, 1)
	go func() {
		s := bufio.NewScanner(out)
		if s.Scan() {
			line <- strings.TrimSpace(s.Text())
		}
		close(line)
		for s.Scan() { // drain
		}
	}()
	select {
	case u, ok := <-line:
		if !ok || !strings.HasPrefix(u, "http://") {
			return "", fmt.Errorf("ddbsim printed no endpoint (log: %s)", logf.Name())
		}
		return u, nil
	case <-time.After(30 * time.Second):
		return "", errors.New("ddbsim did not print its endpoint within 30 s")
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// pools are the fleet's pool (min_warm = max_total = N) and the probes'
// (min_warm = max_total = probes), with the same task definition; in the
// images scenario, its class (imagePools).
func (w *world) pools() string {
	if w.imgs != nil {
		return w.cfg.imagePools(w.n)
	}
	pool := func(name string, n int) string {
		return fmt.Sprintf(`  - name: %s
    provider: ecs
    image: public.ecr.aws/docker/library/python:3.12-slim
    cpu: 0.25
    memory: 512Mi
    min_warm: %d
    max_total: %d
    startup_timeout_seconds: %d
`, name, n, n, w.cfg.wallSeconds(w.cfg.StartupSeconds))
	}
	return "pools:\n" + pool(poolName, w.n) + pool(probePool, w.cfg.Probes)
}

// baseEnv is os.Environ without the AWS and QUARRY settings of the
// caller's environment (a run must not reach a real account or another
// gateway's configuration).
func baseEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "AWS_") || strings.HasPrefix(kv, "QUARRY_") {
			continue
		}
		out = append(out, kv)
	}
	return out
}

// startGateways starts the replicas, all at once, and waits until each
// answers /healthz. The fill clock starts when this returns.
func (w *world) startGateways(ctx context.Context) error {
	poolsFile := filepath.Join(w.dir, "pools.yaml")
	if err := os.WriteFile(poolsFile, []byte(w.pools()), 0o644); err != nil {
		return err
	}
	for i := range w.cfg.Replicas {
		addr, err := freeAddr()
		if err != nil {
			return err
		}
		data := filepath.Join(w.dir, fmt.Sprintf("gateway-%d", i))
		if err := os.MkdirAll(data, 0o700); err != nil {
			return err
		}
		cmd := exec.Command(filepath.Join(w.cfg.Bin, "gateway"))
		cmd.Env = append(baseEnv(),
			"QUARRY_ADDR="+addr, "QUARRY_API_KEYS="+apiKey, "QUARRY_DATA_DIR="+data, "QUARRY_POOLS_FILE="+poolsFile,
			"QUARRY_LOG_LEVEL=warn", fmt.Sprintf("QUARRY_REPLICA_ID=scalebench-%d", i),
			"QUARRY_PROVIDER=ecs", "QUARRY_STORE=dynamodb", "QUARRY_RELAY_BROKER=dynamodb",
			"AWS_REGION=us-east-1", "AWS_ACCESS_KEY_ID=scalebench", "AWS_SECRET_ACCESS_KEY=scalebench",
			"AWS_ENDPOINT_URL_DYNAMODB="+w.ddbURL, "AWS_ENDPOINT_URL_ECS="+w.ecsURL,
			"QUARRY_ECS_CLUSTER=quarry", "QUARRY_ECS_SUBNETS=subnet-0123456789abcdef0",
			"QUARRY_ECS_SECURITY_GROUPS=sg-0123456789abcdef0",
			"QUARRY_ECS_EXECUTION_ROLE_ARN=arn:aws:iam::123456789012:role/quarry-exec",
			"QUARRY_ECS_AGENT_IMAGE=123456789012.dkr.ecr.us-east-1.amazonaws.com/quarry-agent:1",
			"QUARRY_ECS_TOKEN_KEY_SECRET_ARN=arn:aws:secretsmanager:us-east-1:123456789012:secret:quarry-key",
			"QUARRY_ECS_TOKEN_KEY="+w.tokenKey, "QUARRY_RELAY_SECRET="+w.tokenKey,
		)
		cmd.Env = append(cmd.Env, w.cfg.gatewayEnv()...)
		if w.imgs != nil {
			cmd.Env = append(cmd.Env, w.cfg.imagesEnv()...)
		}
		cmd.Env = append(cmd.Env, w.cfg.GatewayEnv...)
		logName := filepath.Join(w.dir, fmt.Sprintf("gateway-%d.log", i))
		logf, err := os.Create(logName)
		if err != nil {
			return err
		}
		cmd.Stdout, cmd.Stderr = logf, logf
		p, err := w.start(cmd, true)
		if err != nil {
			return err
		}
		w.gws = append(w.gws, &replica{base: "http://" + addr, pid: cmd.Process.Pid, log: logName, p: p})
	}
	deadline := time.Now().Add(60 * time.Second)
	for _, g := range w.gws {
		for {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			resp, err := w.http.Get(g.base + "/healthz")
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					break
				}
			}
			if g.p.exited() {
				return fmt.Errorf("gateway %s exited at start-up: %s (log: %s)", g.base, lastLine(g.log), g.log)
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("gateway %s did not answer /healthz within 60 s (log: %s)", g.base, g.log)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return nil
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// close stops the gateways, the ECS simulator (which takes the agents
// down), the agent processes and ddbsim; nothing outlives it.
func (w *world) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stop := func(ps []*proc) {
		for _, p := range ps {
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
		}
		for _, p := range ps {
			select {
			case <-p.done:
			case <-time.After(15 * time.Second):
				_ = p.cmd.Process.Kill()
				<-p.done
			}
		}
	}
	// The gateways first (they would otherwise stop tasks on a world going
	// away), ddbsim last.
	var gws, rest []*proc
	for _, p := range w.procs {
		if p.gateway {
			gws = append(gws, p)
		} else {
			rest = append(rest, p)
		}
	}
	stop(gws)
	if w.ecs != nil {
		_ = w.ecs.Close(ctx)
	}
	if w.agents != nil {
		_ = w.agents.Close(ctx)
	}
	stop(rest)
	w.http.CloseIdleConnections()
	w.execHTTP.CloseIdleConnections()
}

// lastLine returns the last non-empty line of a log file.
func lastLine(file string) string {
	data, _ := os.ReadFile(file)
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	return lines[len(lines)-1]
}
