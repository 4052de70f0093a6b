package gateway

import (
	"fmt"
	"net"
	"net/url"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

// streamPrefetch is the largest agent answer the stream client reads whole
// before handing it on; larger and chunked answers are streamed.
const streamPrefetch = 64 << 10

// agentClient reaches one agent URL. unary buffers answers (bounded by
// MaxAgentResponse) and reuses keep-alive connections; stream is for calls
// whose body goes through as a stream (SSE, downloads, uploads): its
// connections are closed after each call and every read or write on them is
// bounded by the idle timeout instead of a total deadline.
type agentClient struct {
	base   string // scheme://host[:port], the prefix of request URIs
	unary  *fasthttp.HostClient
	stream *fasthttp.HostClient
}

// agentClients caches one agentClient per agent URL. Entries are dropped
// when the gateway sees their lease end, and the least recently used ones
// when there are more than max. It holds nothing that cannot be rebuilt
// from a lease. Safe for concurrent use.
type agentClients struct {
	cfg Config

	mu sync.RWMutex
	m  map[string]*agentClient
}

func newAgentClients(cfg Config) *agentClients {
	return &agentClients{cfg: cfg, m: make(map[string]*agentClient)}
}

// get returns the client of agentURL, creating it on first use. It fails
// when agentURL is not an absolute http(s) URL without a path.
func (a *agentClients) get(agentURL string) (*agentClient, error) {
	a.mu.RLock()
	ac := a.m[agentURL]
	a.mu.RUnlock()
	if ac != nil {
		return ac, nil
	}
	ac, err := a.newClient(agentURL)
	if err != nil {
		return nil, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if existing := a.m[agentURL]; existing != nil {
		return existing, nil
	}
	if len(a.m) >= a.cfg.MaxAgentClients {
		a.evictOldestLocked()
	}
	a.m[agentURL] = ac
	return ac, nil
}

// evict drops the client of agentURL (its lease ended) and closes its idle
// connections. Calls in flight on it finish normally.
func (a *agentClients) evict(agentURL string) {
	a.mu.Lock()
	ac := a.m[agentURL]
	delete(a.m, agentURL)
	a.mu.Unlock()
	if ac != nil {
		ac.closeIdle()
	}
}

// closeIdle closes the idle connections of every cached client.
func (a *agentClients) closeIdle() {
	a.mu.RLock()
	defer a.mu.RUnlock()
	for _, ac := range a.m {
		ac.closeIdle()
	}
}

// len returns the number of cached clients.
func (a *agentClients) len() int {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return len(a.m)
}

// evictOldestLocked drops the least recently used eighth of the cache (at
// least one entry).
func (a *agentClients) evictOldestLocked() {
	n := len(a.m)/8 + 1
	for range n {
		var (
			oldestURL string
			oldest    time.Time
		)
		for u, ac := range a.m {
			if t := ac.lastUse(); oldestURL == "" || t.Before(oldest) {
				oldestURL, oldest = u, t
			}
		}
		if oldestURL == "" {
			return
		}
		a.m[oldestURL].closeIdle()
		delete(a.m, oldestURL)
	}
}

func (a *agentClients) newClient(agentURL string) (*agentClient, error) {
	u, err := url.Parse(agentURL)
	if err != nil {
		return nil, fmt.Errorf("parse agent URL: %w", err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") ||
		u.RawQuery != "" || u.User != nil {
		return nil, fmt.Errorf("parse agent URL %q: want http(s)://host:port", agentURL)
	}
	tls := u.Scheme == "https"
	addr := fasthttp.AddMissingPort(u.Host, tls)
	dialer := &net.Dialer{Timeout: a.cfg.AgentDialTimeout}
	unary := &fasthttp.HostClient{
		Addr:                     addr,
		IsTLS:                    tls,
		Dial:                     func(addr string) (net.Conn, error) { return dialer.Dial("tcp", addr) },
		MaxConns:                 a.cfg.MaxConnsPerAgent,
		MaxConnWaitTimeout:       a.cfg.AgentDialTimeout,
		MaxResponseBodySize:      int(a.cfg.MaxAgentResponse),
		NoDefaultUserAgentHeader: true,
		DisablePathNormalizing:   true,
	}
	idle := a.cfg.IdleTimeout
	stream := &fasthttp.HostClient{
		Addr:  addr,
		IsTLS: tls,
		Dial: func(addr string) (net.Conn, error) {
			c, err := dialer.Dial("tcp", addr)
			if err != nil {
				return nil, err
			}
			return newIdleConn(c, idle), nil
		},
		MaxConns:                 a.cfg.MaxConnsPerAgent,
		MaxConnWaitTimeout:       a.cfg.AgentDialTimeout,
		MaxResponseBodySize:      streamPrefetch,
		StreamResponseBody:       true,
		NoDefaultUserAgentHeader: true,
		DisablePathNormalizing:   true,
	}
	return &agentClient{base: u.Scheme + "://" + u.Host, unary: unary, stream: stream}, nil
}

func (ac *agentClient) lastUse() time.Time {
	u, s := ac.unary.LastUseTime(), ac.stream.LastUseTime()
	if s.After(u) {
		return s
	}
	return u
}

func (ac *agentClient) closeIdle() {
	ac.unary.CloseIdleConnections()
	ac.stream.CloseIdleConnections()
}
