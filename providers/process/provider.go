package process

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/quarryhq/quarry/providers"
)

var (
	_ providers.Provider = (*Provider)(nil)
	_ providers.Closer   = (*Provider)(nil)
)

const (
	// pollInterval is how often waits re-check /proc and the address file.
	pollInterval = 20 * time.Millisecond
	// cleanupTimeout bounds the kill-and-remove after a failed launch and
	// after the grace period of Stop; it runs even when the caller's ctx is done.
	cleanupTimeout = 30 * time.Second
	// logTailBytes is how much of agent.log a launch error quotes.
	logTailBytes = 2 << 10
	// reasonLogBytes is how much of agent.log a stopped task's Reason reads
	// (providers.AgentLogTail): enough to see past a Go crash's stack dump.
	reasonLogBytes = 64 << 10
	// tokenBytes is the size of a generated agent token (hex encoded).
	tokenBytes = 32
)

// Reasons reported for stopped tasks.
const (
	reasonNotFound   = "not found"
	reasonExited     = "process exited"
	reasonIncomplete = "launch did not complete"
)

// Provider runs each sandbox task as a local exec agent process. It is safe
// for concurrent use, and several Providers (in one or several gateway
// processes) may share one Dir: every method reads the state from disk.
type Provider struct {
	cfg    Config
	bin    string // absolute path of the agent
	dir    string // absolute Dir
	bootID string
	logger *slog.Logger
	reaper *reaper
	locks  nameLocks
	// sessions answers which processes a task's session holds, from scans
	// of /proc shared by the stops waiting at once.
	sessions sessionScanner
	once     sync.Once
	closed   atomic.Bool
}

// New returns a Provider for cfg after applying defaults and validating it.
// It creates cfg.Dir (mode 0700) if needed and checks that cfg.AgentBinary
// is an executable. logger may be nil (logs are discarded). The Provider
// reaps the agents it starts until Close.
func New(cfg Config, logger *slog.Logger) (*Provider, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	bin, err := exec.LookPath(cfg.AgentBinary)
	if err != nil {
		return nil, fmt.Errorf("process provider config: AgentBinary: %w", err)
	}
	if bin, err = filepath.Abs(bin); err != nil {
		return nil, fmt.Errorf("process provider config: AgentBinary: %w", err)
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("process provider config: Dir: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("process provider config: Dir: %w", err)
	}
	bootID, err := readBootID()
	if err != nil {
		return nil, fmt.Errorf("start process provider: %w", err)
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	logger = logger.With("provider", "process")
	p := &Provider{cfg: cfg, bin: bin, dir: dir, bootID: bootID, logger: logger, reaper: newReaper(logger)}
	p.reaper.start()
	return p, nil
}

// Close stops reaping. Tasks keep running (leases outlive a gateway
// process); a new Provider on the same Dir finds them. After Close, Launch
// fails; Describe, Stop and List still work. Close is idempotent.
func (p *Provider) Close(context.Context) error {
	p.once.Do(func() {
		p.closed.Store(true)
		p.reaper.close()
	})
	return nil
}

// Launch starts one agent per name, at most Config.LaunchConcurrency at a
// time, and returns the tasks that started, in the order of names, in the
// running state. A task is returned once its agent has bound its address
// (bounded by ctx and Config.StartTimeout); the agent may need a moment
// more to answer /healthz.
//
// A spec this provider cannot serve (Image other than "" or "host", reserved
// env names or labels, options) fails with a *providers.LaunchError wrapping
// providers.ErrInvalidSpec before anything starts; so do invalid or repeated
// names (letters, digits, '.', '_', '-'). A name whose directory already
// exists fails (fs.ErrExist). When some names fail, the others are returned
// with an error joining the failures; the failed ones are cleaned up.
func (p *Provider) Launch(ctx context.Context, spec providers.Spec, names []string) ([]providers.Task, error) {
	if p.closed.Load() {
		return nil, errors.New("launch tasks: provider closed")
	}
	if err := validateSpec(spec); err != nil {
		return nil, err
	}
	if err := providers.CheckNames(spec, names, validateName); err != nil {
		return nil, err
	}

	tasks := make([]*providers.Task, len(names))
	errs := make([]error, len(names))
	var g errgroup.Group
	g.SetLimit(p.cfg.LaunchConcurrency)
	for i, name := range names {
		g.Go(func() error {
			tasks[i], errs[i] = p.launchOne(ctx, spec, name)
			return nil
		})
	}
	_ = g.Wait() // launchOne reports through errs

	out := make([]providers.Task, 0, len(names))
	failed := 0
	for i := range names {
		if errs[i] != nil {
			failed++
			continue
		}
		out = append(out, *tasks[i])
	}
	if failed > 0 {
		return out, fmt.Errorf("launch %d of %d tasks: %w", failed, len(names), errors.Join(errs...))
	}
	return out, nil
}

// launchOne starts the agent of one task and waits for its address. On
// failure it kills what it started and removes the task's directory.
func (p *Provider) launchOne(ctx context.Context, spec providers.Spec, name string) (_ *providers.Task, err error) {
	defer func() {
		if err != nil {
			err = fmt.Errorf("launch task %q: %w", name, err)
		}
	}()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	unlock, err := p.locks.lock(ctx, name)
	if err != nil {
		return nil, err
	}
	defer unlock()

	taskDir := p.taskDir(name)
	if err := os.Mkdir(taskDir, 0o700); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("task already exists: %w", err)
		}
		return nil, fmt.Errorf("create task directory: %w", err)
	}
	token, err := newToken()
	if err != nil {
		_ = os.Remove(taskDir)
		return nil, err
	}
	rec := &record{
		Version:   recordVersion,
		Name:      name,
		Pool:      spec.Pool,
		BootID:    p.bootID,
		Token:     token,
		Labels:    p.labels(spec, name),
		CreatedAt: time.Now().UTC(),
	}
	defer func() {
		if err == nil {
			return
		}
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		if cerr := p.destroy(cctx, name, rec); cerr != nil {
			err = errors.Join(err, fmt.Errorf("clean up: %w", cerr))
		}
	}()

	// The first record (no pid yet) names the pool, so List and Stop find a
	// launch that a crash interrupts from here on.
	if err := writeRecord(taskDir, rec); err != nil {
		return nil, err
	}
	work := filepath.Join(taskDir, workDir)
	if err := os.Mkdir(work, 0o700); err != nil {
		return nil, fmt.Errorf("create work directory: %w", err)
	}
	pid, err := p.startAgent(taskDir, work, token, spec.Env)
	if err != nil {
		return nil, err
	}
	rec.PID = pid
	p.reaper.add(name, pid)
	st, err := readStat(pid)
	if err != nil {
		// An agent that exits at once may be reaped before its stat is
		// read: its exit status and log say why, not the missing stat.
		if _, werr := p.waitAddr(ctx, name, rec); werr != nil {
			return nil, werr
		}
		return nil, fmt.Errorf("read agent start time: %w", err)
	}
	rec.StartTime = st.StartTime
	if err := writeRecord(taskDir, rec); err != nil {
		return nil, err
	}
	url, err := p.waitAddr(ctx, name, rec)
	if err != nil {
		return nil, err
	}
	rec.AgentURL = url
	if err := writeRecord(taskDir, rec); err != nil {
		return nil, err
	}
	p.logger.Info("task launched", "task", name, "pool", spec.Pool, "pid", pid, "agent_url", url)
	t := p.toTask(rec)
	return &t, nil
}

// labels returns the spec's labels plus the four provider labels.
func (p *Provider) labels(spec providers.Spec, name string) map[string]string {
	l := make(map[string]string, len(spec.Labels)+4)
	for k, v := range spec.Labels {
		l[k] = v
	}
	l[providers.LabelManaged] = "true"
	l[providers.LabelPool] = spec.Pool
	l[providers.LabelTask] = name
	l[providers.LabelGateway] = p.cfg.GatewayID
	return l
}

// startAgent starts the agent in its own session (and so its own process
// group, whose id is its pid), with stdin from /dev/null and stdout and
// stderr appended to agent.log: no pipe ties it to the gateway.
func (p *Provider) startAgent(taskDir, work, token string, specEnv map[string]string) (int, error) {
	logf, err := os.OpenFile(filepath.Join(taskDir, logFile), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return 0, fmt.Errorf("open agent log: %w", err)
	}
	defer logf.Close()
	cmd := &exec.Cmd{
		Path:        p.bin,
		Args:        []string{p.bin},
		Dir:         work,
		Env:         agentEnv(p.cfg, taskDir, work, token, specEnv),
		Stdout:      logf,
		Stderr:      logf,
		SysProcAttr: &syscall.SysProcAttr{Setsid: true},
	}
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("start agent: %w", err)
	}
	pid := cmd.Process.Pid
	// The reaper waits for the pid itself (cmd.Wait would need a goroutine
	// per agent that nothing could stop); release the handle.
	_ = cmd.Process.Release()
	return pid, nil
}

// agentEnv is the agent's whole environment: PATH, HOME (the workdir), LANG,
// the spec's variables, then the agent's own settings. The task directory
// is the agent's owner directory: an agent whose directory is gone (its
// gateway's data dir was removed) exits, killing its sandbox's processes.
func agentEnv(cfg Config, taskDir, work, token string, specEnv map[string]string) []string {
	env := map[string]string{"PATH": cfg.Path, "HOME": work, "LANG": cfg.Lang}
	for k, v := range specEnv {
		env[k] = v
	}
	env["QUARRY_AGENT_ADDR"] = "127.0.0.1:0"
	env["QUARRY_AGENT_TOKEN"] = token
	env["QUARRY_AGENT_WORKDIR"] = work
	env["QUARRY_AGENT_ADDR_FILE"] = filepath.Join(taskDir, addrFile)
	env["QUARRY_AGENT_OWNER_DIR"] = taskDir
	out := make([]string, 0, len(env))
	for _, k := range sortedKeys(env) {
		out = append(out, k+"="+env[k])
	}
	return out
}

// waitAddr waits until the agent has written its address, it has exited, or
// ctx or the start timeout ends.
func (p *Provider) waitAddr(ctx context.Context, name string, rec *record) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.StartTimeout)
	defer cancel()
	taskDir := p.taskDir(name)
	for {
		url, err := readAddr(taskDir)
		if err == nil {
			return url, nil
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return "", err
		}
		if alive, status := p.agentAlive(name, rec); !alive {
			return "", fmt.Errorf("agent exited before it was ready (%s); agent log: %q", status,
				strings.TrimSpace(tailFile(filepath.Join(taskDir, logFile), logTailBytes)))
		}
		if err := sleepCtx(ctx, pollInterval); err != nil {
			return "", fmt.Errorf("wait for the agent's address (start timeout %s): %w", p.cfg.StartTimeout, err)
		}
	}
}

// readAddr returns the agent's URL from its address file. A missing or
// empty file matches fs.ErrNotExist; an address that is not a loopback
// host:port is an error.
func readAddr(taskDir string) (string, error) {
	b, err := readBounded(filepath.Join(taskDir, addrFile))
	if err != nil {
		return "", err
	}
	addr := strings.TrimSpace(string(b))
	if addr == "" {
		return "", fmt.Errorf("read agent address: %w", fs.ErrNotExist)
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("read agent address %q: %w", addr, err)
	}
	ip := net.ParseIP(host)
	n, perr := strconv.Atoi(port)
	if ip == nil || !ip.IsLoopback() || perr != nil || n < 1 || n > 65535 {
		return "", fmt.Errorf("read agent address %q: not a loopback host:port", addr)
	}
	return "http://" + addr, nil
}

// Describe returns one task per id, in order. Unknown ids (and ids that
// cannot be task names) come back stopped with Reason "not found". A task
// whose agent has exited, or whose pid now belongs to another process, is
// stopped with Reason "process exited"; a task still binding is pending.
func (p *Provider) Describe(ctx context.Context, ids []string) ([]providers.Task, error) {
	out := make([]providers.Task, 0, len(ids))
	for _, id := range ids {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("describe tasks: %w", err)
		}
		out = append(out, p.describeOne(id))
	}
	return out, nil
}

func (p *Provider) describeOne(id string) providers.Task {
	if validateName(id) != nil {
		return stoppedTask(id, reasonNotFound)
	}
	rec, err := readRecord(p.taskDir(id))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return stoppedTask(id, reasonNotFound)
	case err != nil:
		return stoppedTask(id, "unreadable task record: "+err.Error())
	}
	return p.toTask(rec)
}

func stoppedTask(id, reason string) providers.Task {
	return providers.Task{ID: id, Name: id, State: providers.TaskStopped, Reason: reason}
}

// toTask converts a record to a Task with its current state. AgentURL is
// set only for a running task: a stopped agent's port may already serve
// another task.
func (p *Provider) toTask(rec *record) providers.Task {
	t := providers.Task{
		ID:         rec.Name,
		Name:       rec.Name,
		Pool:       rec.Pool,
		AgentToken: rec.Token,
		Labels:     make(map[string]string, len(rec.Labels)),
		CreatedAt:  rec.CreatedAt,
	}
	for k, v := range rec.Labels {
		t.Labels[k] = v
	}
	if rec.PID == 0 {
		// Launched (by this or another Provider) but not started yet: pending
		// while a launch could still be under way.
		if time.Since(rec.CreatedAt) < p.cfg.StartTimeout+cleanupTimeout {
			t.State = providers.TaskPending
		} else {
			t.State, t.Reason = providers.TaskStopped, reasonIncomplete
		}
		return t
	}
	if alive, status := p.agentAlive(rec.Name, rec); !alive {
		t.State, t.Reason = providers.TaskStopped, reasonExited
		if status != "" {
			t.Reason += " (" + status + ")"
		}
		t.Reason += providers.AgentLogTail(tailFile(filepath.Join(p.taskDir(rec.Name), logFile), reasonLogBytes))
		return t
	}
	t.State, t.AgentURL = providers.TaskRunning, rec.AgentURL
	if t.AgentURL == "" {
		// The launch has not recorded the address (yet, or it was
		// interrupted): the agent may have written it.
		if url, err := readAddr(p.taskDir(rec.Name)); err == nil {
			t.AgentURL = url
		} else {
			t.State = providers.TaskPending
		}
	}
	return t
}

// agentAlive reports whether the recorded agent still runs. For an agent
// this Provider started it also reaps it and says how it ended. Otherwise
// it reads /proc: a missing or zombie process, or one with another start
// time (the pid was reused), or a record from an earlier boot, is dead.
func (p *Provider) agentAlive(name string, rec *record) (bool, string) {
	if rec.PID <= 0 || rec.BootID != p.bootID {
		return false, ""
	}
	if c := p.reaper.get(name, rec.PID); c != nil {
		gone, status := c.tryReap()
		return !gone, status
	}
	st, err := readStat(rec.PID)
	if err != nil {
		return false, ""
	}
	return !st.dead() && st.StartTime == rec.StartTime, ""
}

// sessionIsOurs reports whether the session whose id is the agent's pid is
// still the task's. The agent is a session leader, so the session id is
// its pid. Linux does not reuse a pid while any process still has it as
// session id, so the session is ours unless a process with that pid exists
// now with another start time.
func (p *Provider) sessionIsOurs(name string, rec *record) bool {
	if rec.PID <= 0 || rec.BootID != p.bootID {
		return false
	}
	if c := p.reaper.get(name, rec.PID); c != nil && !c.done() {
		return true // an unreaped child holds its pid
	}
	st, err := readStat(rec.PID)
	if err != nil {
		return errors.Is(err, fs.ErrNotExist)
	}
	return st.StartTime == rec.StartTime
}

// List returns the tasks recorded in Dir for pool ("" for every pool),
// stopped ones included, ordered by creation time. A record that cannot be
// read is listed (for pool "" only) as stopped with the reason.
func (p *Provider) List(ctx context.Context, pool string) ([]providers.Task, error) {
	entries, err := os.ReadDir(p.dir)
	if err != nil {
		return nil, fmt.Errorf("list tasks: %w", err)
	}
	var out []providers.Task
	for _, e := range entries {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("list tasks: %w", err)
		}
		if !e.IsDir() || validateName(e.Name()) != nil {
			continue
		}
		rec, err := readRecord(p.taskDir(e.Name()))
		switch {
		case errors.Is(err, fs.ErrNotExist):
			continue // being created or removed
		case err != nil:
			if pool == "" {
				out = append(out, stoppedTask(e.Name(), "unreadable task record: "+err.Error()))
			}
			continue
		case pool != "" && rec.Pool != pool:
			continue
		}
		out = append(out, p.toTask(rec))
	}
	sort.SliceStable(out, func(i, j int) bool {
		if !out[i].CreatedAt.Equal(out[j].CreatedAt) {
			return out[i].CreatedAt.Before(out[j].CreatedAt)
		}
		return out[i].Name < out[j].Name
	})
	return out, nil
}

func (p *Provider) taskDir(name string) string { return filepath.Join(p.dir, name) }

func newToken() (string, error) {
	b := make([]byte, tokenBytes)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("generate agent token: %w", err)
	}
	return hex.EncodeToString(b), nil
}
