package agentsim

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"
)

// The line protocol of an agentsim process (Serve): one command a line on
// its stdin, one answer a line on its stdout, in order.
const (
	cmdUp    = "up"    // up ADDR TOKEN → ok | err MESSAGE
	cmdDown  = "down"  // down ADDR → ok | err MESSAGE
	cmdStats = "stats" // stats → stats JSON
	ansOK    = "ok"
	ansErr   = "err"
	ansReady = "ready" // the first line a process writes, once it serves
)

// maxLine bounds one protocol line.
const maxLine = 64 << 10

// Serve drives farm with the line protocol: it reads commands from in and
// writes one answer per command to out, until in ends (nil) or ctx does
// (ctx's error). It does not close farm.
func Serve(ctx context.Context, in io.Reader, out io.Writer, farm *Farm) error {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 4096), maxLine)
	w := bufio.NewWriter(out)
	for sc.Scan() {
		if err := ctx.Err(); err != nil {
			return err
		}
		f := strings.Fields(sc.Text())
		var ans string
		switch {
		case len(f) == 3 && f[0] == cmdUp:
			ans = answer(farm.Up(f[1], f[2]))
		case len(f) == 2 && f[0] == cmdDown:
			ans = answer(farm.Down(f[1]))
		case len(f) == 1 && f[0] == cmdStats:
			b, err := json.Marshal(farm.Stats())
			if err != nil {
				ans = answer(err)
			} else {
				ans = cmdStats + " " + string(b)
			}
		default:
			ans = answer(fmt.Errorf("unknown command %q (want up ADDR TOKEN, down ADDR or stats)", sc.Text()))
		}
		if _, err := w.WriteString(ans + "\n"); err != nil {
			return fmt.Errorf("write answer: %w", err)
		}
		if err := w.Flush(); err != nil {
			return fmt.Errorf("write answer: %w", err)
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("read commands: %w", err)
	}
	return nil
}

func answer(err error) string {
	if err != nil {
		return ansErr + " " + strings.ReplaceAll(err.Error(), "\n", " ")
	}
	return ansOK
}

// ProcsConfig configures Procs.
type ProcsConfig struct {
	// Command is the agentsim program and its arguments (e.g.
	// []string{"bin/agentsim"}): a program that answers the line protocol
	// on its stdin and stdout, writing "ready" first (cmd/agentsim).
	Command []string
	// Procs is how many processes to start (at least 1).
	Procs int
	// Stderr receives the processes' standard error (nil: os.Stderr).
	Stderr io.Writer
	// Env is added to the processes' environment.
	Env []string
	// StartTimeout bounds each process's start (default 30 s).
	StartTimeout time.Duration
}

// Procs serves agents in several agentsim processes: each address is
// served by the process its hash picks. Safe for concurrent use; the calls
// of one process are answered in order.
type Procs struct {
	children []*child
}

type child struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	in   io.WriteCloser
	out  *bufio.Reader
	done chan struct{}
	err  error // set before done closes
}

// StartProcs starts cfg.Procs agentsim processes and waits until each
// serves. On an error the ones started are stopped.
func StartProcs(ctx context.Context, cfg ProcsConfig) (*Procs, error) {
	if len(cfg.Command) == 0 {
		return nil, errors.New("agentsim processes: no command")
	}
	if cfg.Procs < 1 {
		return nil, fmt.Errorf("agentsim processes: want at least 1, got %d", cfg.Procs)
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = 30 * time.Second
	}
	if cfg.Stderr == nil {
		cfg.Stderr = os.Stderr
	}
	p := &Procs{}
	for i := range cfg.Procs {
		c, err := startChild(ctx, cfg, i)
		if err != nil {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			_ = p.Close(cctx)
			cancel()
			return nil, err
		}
		p.children = append(p.children, c)
	}
	return p, nil
}

func startChild(ctx context.Context, cfg ProcsConfig, i int) (*child, error) {
	cmd := exec.Command(cfg.Command[0], cfg.Command[1:]...)
	cmd.Env = append(os.Environ(), cfg.Env...)
	cmd.Stderr = cfg.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("agentsim process %d: %w", i, err)
	}
	outPipe, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("agentsim process %d: %w", i, err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start agentsim process %d (%s): %w", i, cfg.Command[0], err)
	}
	c := &child{cmd: cmd, in: in, out: bufio.NewReaderSize(outPipe, 64<<10), done: make(chan struct{})}
	go func() {
		c.err = cmd.Wait()
		close(c.done)
	}()
	ready := make(chan error, 1)
	go func() {
		line, err := c.readLine()
		if err == nil && line != ansReady {
			err = fmt.Errorf("first line %q, want %q", line, ansReady)
		}
		ready <- err
	}()
	t := time.NewTimer(cfg.StartTimeout)
	defer t.Stop()
	select {
	case err := <-ready:
		if err == nil {
			return c, nil
		}
		c.kill()
		return nil, fmt.Errorf("agentsim process %d: %w", i, err)
	case <-t.C:
		c.kill()
		return nil, fmt.Errorf("agentsim process %d: not ready within %s", i, cfg.StartTimeout)
	case <-ctx.Done():
		c.kill()
		return nil, fmt.Errorf("agentsim process %d: %w", i, ctx.Err())
	}
}

func (c *child) readLine() (string, error) {
	line, err := c.out.ReadString('\n')
	if err != nil {
		return "", fmt.Errorf("read answer: %w", err)
	}
	return strings.TrimSuffix(line, "\n"), nil
}

// call sends one command and returns its answer.
func (c *child) call(line string) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, err := io.WriteString(c.in, line+"\n"); err != nil {
		return "", fmt.Errorf("send %q: %w", strings.Fields(line)[0], err)
	}
	return c.readLine()
}

// do sends a command that answers ok or err.
func (c *child) do(line string) error {
	ans, err := c.call(line)
	if err != nil {
		return err
	}
	if ans == ansOK {
		return nil
	}
	if msg, ok := strings.CutPrefix(ans, ansErr+" "); ok {
		return errors.New(msg)
	}
	return fmt.Errorf("unexpected answer %q", ans)
}

func (c *child) kill() {
	_ = c.cmd.Process.Kill()
	<-c.done
}

// pick returns the process that serves addr.
func (p *Procs) pick(addr string) *child {
	h := fnv.New32a()
	_, _ = h.Write([]byte(addr))
	return p.children[int(h.Sum32()%uint32(len(p.children)))]
}

// Up starts serving an agent on addr with token, in the process addr
// belongs to (Farm.Up's errors, as text).
func (p *Procs) Up(addr, token string) error {
	if strings.ContainsAny(addr+token, " \t\n") || addr == "" || token == "" {
		return fmt.Errorf("agent %q: address and token must be non-empty words", addr)
	}
	return p.pick(addr).do(cmdUp + " " + addr + " " + token)
}

// Down stops the agent on addr (Farm.Down's errors, as text).
func (p *Procs) Down(addr string) error {
	if strings.ContainsAny(addr, " \t\n") || addr == "" {
		return fmt.Errorf("agent %q: the address must be a non-empty word", addr)
	}
	return p.pick(addr).do(cmdDown + " " + addr)
}

// Stats sums the processes' counters.
func (p *Procs) Stats() (Stats, error) {
	var sum Stats
	for i, c := range p.children {
		ans, err := c.call(cmdStats)
		if err != nil {
			return sum, fmt.Errorf("agentsim process %d: %w", i, err)
		}
		body, ok := strings.CutPrefix(ans, cmdStats+" ")
		if !ok {
			return sum, fmt.Errorf("agentsim process %d: unexpected answer %q", i, ans)
		}
		var s Stats
		if err := json.Unmarshal([]byte(body), &s); err != nil {
			return sum, fmt.Errorf("agentsim process %d: %w", i, err)
		}
		sum = sum.Add(s)
	}
	return sum, nil
}

// PIDs returns the processes' ids (for their CPU and memory).
func (p *Procs) PIDs() []int {
	out := make([]int, len(p.children))
	for i, c := range p.children {
		out[i] = c.cmd.Process.Pid
	}
	return out
}

// Close closes every process's stdin, which makes it take its agents down
// and exit, and waits for them until ctx ends (then kills them).
// Idempotent.
func (p *Procs) Close(ctx context.Context) error {
	for _, c := range p.children {
		c.mu.Lock()
		_ = c.in.Close()
		c.mu.Unlock()
	}
	var errs []error
	for i, c := range p.children {
		select {
		case <-c.done:
		case <-ctx.Done():
			c.kill()
			errs = append(errs, fmt.Errorf("agentsim process %d: killed: %w", i, ctx.Err()))
			continue
		}
		if c.err != nil {
			errs = append(errs, fmt.Errorf("agentsim process %d: %w", i, c.err))
		}
	}
	return errors.Join(errs...)
}
