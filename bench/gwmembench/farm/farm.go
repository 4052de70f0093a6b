// Package farm is a sandbox provider for benchmarks: its "tasks" are agent
// endpoints served by an agent farm (bench/gwmembench: a few processes that
// speak the agent protocol for thousands of endpoints on loopback), listed
// in a file, one JSON object a line. Launch hands out free endpoints, Stop
// gives them back. Nothing runs per task, so a gateway can hold 10,000
// leases on a small machine.
//
// It is compiled into the gateway only with the build tag benchfarm
// (cmd/gateway/farm.go); production binaries do not have it. It keeps its
// tasks in memory: a gateway restart forgets them. It must not import
// gateway or warmpool.
package farm

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/quarryhq/quarry/providers"
)

// Endpoint is one agent of the farm: its base URL and bearer token.
type Endpoint struct {
	URL   string `json:"url"`
	Token string `json:"token"`
}

// ReadEndpoints reads an endpoints file: one JSON Endpoint a line.
func ReadEndpoints(path string) ([]Endpoint, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open farm endpoints: %w", err)
	}
	defer f.Close()
	var out []Endpoint
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if len(sc.Bytes()) == 0 {
			continue
		}
		var e Endpoint
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return nil, fmt.Errorf("farm endpoints %s line %d: %w", path, len(out)+1, err)
		}
		if e.URL == "" || e.Token == "" {
			return nil, fmt.Errorf("farm endpoints %s line %d: url and token are required", path, len(out)+1)
		}
		out = append(out, e)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read farm endpoints: %w", err)
	}
	return out, nil
}

// Provider hands out the farm's endpoints as tasks. Safe for concurrent use.
type Provider struct {
	mu    sync.Mutex
	eps   []Endpoint
	free  []int // indexes into eps
	tasks map[string]task
}

type task struct {
	providers.Task
	ep int
}

var _ providers.Provider = (*Provider)(nil)

// New returns a provider over eps; it fails when eps is empty.
func New(eps []Endpoint) (*Provider, error) {
	if len(eps) == 0 {
		return nil, fmt.Errorf("farm provider: no endpoints")
	}
	p := &Provider{eps: eps, tasks: make(map[string]task)}
	for i := len(eps) - 1; i >= 0; i-- {
		p.free = append(p.free, i)
	}
	return p, nil
}

// Launch takes one free endpoint per name; when the farm runs out it
// returns the tasks it could start with providers.ErrNoCapacity.
func (p *Provider) Launch(_ context.Context, spec providers.Spec, names []string) ([]providers.Task, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]providers.Task, 0, len(names))
	for _, name := range names {
		if len(p.free) == 0 {
			return out, &providers.LaunchError{Pool: spec.Pool, Image: spec.Image,
				Reason: fmt.Sprintf("all %d farm endpoints are in use", len(p.eps)), Err: providers.ErrNoCapacity}
		}
		ep := p.free[len(p.free)-1]
		p.free = p.free[:len(p.free)-1]
		t := providers.Task{
			ID: "farm-" + name, Name: name, Pool: spec.Pool, State: providers.TaskRunning,
			AgentURL: p.eps[ep].URL, AgentToken: p.eps[ep].Token,
			Labels:    map[string]string{providers.LabelManaged: "true", providers.LabelPool: spec.Pool, providers.LabelTask: name},
			CreatedAt: time.Now(),
		}
		p.tasks[t.ID] = task{Task: t, ep: ep}
		out = append(out, t)
	}
	return out, nil
}

// Describe returns the tasks of ids; unknown ones are stopped, "not found".
func (p *Provider) Describe(_ context.Context, ids []string) ([]providers.Task, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]providers.Task, 0, len(ids))
	for _, id := range ids {
		if t, ok := p.tasks[id]; ok {
			out = append(out, t.Task)
			continue
		}
		out = append(out, providers.Task{ID: id, State: providers.TaskStopped, Reason: "not found"})
	}
	return out, nil
}

// Stop gives the task's endpoint back; unknown ids are a no-op.
func (p *Provider) Stop(_ context.Context, id, _ string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if t, ok := p.tasks[id]; ok {
		delete(p.tasks, id)
		p.free = append(p.free, t.ep)
	}
	return nil
}

// List returns the tasks of pool ("" for all).
func (p *Provider) List(_ context.Context, pool string) ([]providers.Task, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []providers.Task
	for _, t := range p.tasks {
		if pool == "" || t.Pool == pool {
			out = append(out, t.Task)
		}
	}
	return out, nil
}
