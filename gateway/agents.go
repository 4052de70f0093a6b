package gateway

import (
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/quarryhq/quarry/internal/parkconn"
	"github.com/valyala/fasthttp"
)

// streamPrefetch is the largest agent answer the stream client reads whole
// before handing it on; larger and chunked answers are streamed.
const streamPrefetch = 64 << 10

// agentClient reaches one agent URL. unary buffers answers (bounded by
// MaxAgentResponse) and reuses keep-alive connections; stream is for calls
// whose body goes through as a stream (SSE, downloads, uploads): its
// connections are closed after each call and every read or write on them is
// bounded by the idle timeout instead of a total deadline. Idle unary
// connections are closed after agentIdleConn.
type agentClient struct {
	base   string // scheme://host[:port], the prefix of request URIs
	unary  *fasthttp.HostClient
	stream *fasthttp.HostClient

	// The cache's: the key and the neighbours in its shard's recency list,
	// guarded by the shard's mutex.
	url        string
	prev, next *agentClient
}

// agentIdleConn is how long an idle keep-alive connection to an agent is
// kept (fasthttp's default, stated).
const agentIdleConn = 10 * time.Second

// agentShards is the number of separately locked parts of agentClients.
const agentShards = 16

// agentClients caches one agentClient per agent URL, at most max of them.
// Entries are dropped when the gateway sees their lease end, and, to stay
// within max, the least recently used of the inserting shard. Every
// operation but closeIdle is O(1). It holds nothing that cannot be rebuilt
// from a lease. Safe for concurrent use.
type agentClients struct {
	cfg     Config
	max     int64
	n       atomic.Int64 // cached clients, in all shards
	shards  [agentShards]agentShard
	dropped prometheus.Counter // clients dropped to stay within max
	log     *slog.Logger
	logged  logLimit
}

// agentShard is one part of the cache: a map and a recency list (a ring
// through head: head.next is the most recently used, head.prev the least).
type agentShard struct {
	mu   sync.Mutex
	m    map[string]*agentClient
	head agentClient
}

func newAgentClients(cfg Config, log *slog.Logger) *agentClients {
	a := &agentClients{
		cfg: cfg, max: int64(cfg.MaxAgentClients), log: log,
		dropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "quarry_gateway_agent_clients_dropped_total",
			Help: "Agent HTTP clients dropped, least recently used first, to stay within QUARRY_MAX_AGENT_CLIENTS.",
		}),
	}
	for i := range a.shards {
		s := &a.shards[i]
		s.m = make(map[string]*agentClient)
		s.head.prev, s.head.next = &s.head, &s.head
	}
	return a
}

// shard returns the shard of agentURL (FNV-1a).
func (a *agentClients) shard(agentURL string) *agentShard {
	h := uint32(2166136261)
	for i := 0; i < len(agentURL); i++ {
		h = (h ^ uint32(agentURL[i])) * 16777619
	}
	return &a.shards[h%agentShards]
}

// get returns the client of agentURL, creating it on first use. It fails
// when agentURL is not an absolute http(s) URL without a path.
func (a *agentClients) get(agentURL string) (*agentClient, error) {
	s := a.shard(agentURL)
	s.mu.Lock()
	if ac := s.m[agentURL]; ac != nil {
		s.toFront(ac)
		s.mu.Unlock()
		return ac, nil
	}
	s.mu.Unlock()
	ac, err := a.newClient(agentURL)
	if err != nil {
		return nil, err
	}
	var drop *agentClient
	s.mu.Lock()
	if existing := s.m[agentURL]; existing != nil {
		s.toFront(existing)
		s.mu.Unlock()
		return existing, nil
	}
	if a.n.Load() >= a.max && s.head.prev != &s.head {
		drop = s.head.prev
		s.remove(drop)
		a.n.Add(-1)
	}
	s.m[agentURL] = ac
	s.insertFront(ac)
	a.n.Add(1)
	s.mu.Unlock()
	if drop != nil {
		drop.closeIdle()
		a.dropped.Inc()
		if a.logged.allow(time.Now()) {
			a.log.Warn("agent clients: dropped the least recently used one to stay within QUARRY_MAX_AGENT_CLIENTS; raise it to the sandboxes a replica serves",
				"limit", a.max)
		}
	}
	return ac, nil
}

// evict drops the client of agentURL (its lease ended) and closes its idle
// connections. Calls in flight on it finish normally.
func (a *agentClients) evict(agentURL string) {
	s := a.shard(agentURL)
	s.mu.Lock()
	ac := s.m[agentURL]
	if ac != nil {
		s.remove(ac)
		a.n.Add(-1)
	}
	s.mu.Unlock()
	if ac != nil {
		ac.closeIdle()
	}
}

// closeIdle closes the idle connections of every cached client (at
// shutdown: it visits them all).
func (a *agentClients) closeIdle() {
	for i := range a.shards {
		s := &a.shards[i]
		s.mu.Lock()
		all := make([]*agentClient, 0, len(s.m))
		for _, ac := range s.m {
			all = append(all, ac)
		}
		s.mu.Unlock()
		for _, ac := range all {
			ac.closeIdle()
		}
	}
}

// len returns the number of cached clients.
func (a *agentClients) len() int { return int(a.n.Load()) }

// toFront makes ac the shard's most recently used client.
func (s *agentShard) toFront(ac *agentClient) {
	if s.head.next == ac {
		return
	}
	ac.prev.next, ac.next.prev = ac.next, ac.prev
	s.insertFront(ac)
}

func (s *agentShard) insertFront(ac *agentClient) {
	ac.prev, ac.next = &s.head, s.head.next
	s.head.next.prev = ac
	s.head.next = ac
}

// remove takes ac out of the shard.
func (s *agentShard) remove(ac *agentClient) {
	ac.prev.next, ac.next.prev = ac.next, ac.prev
	ac.prev, ac.next = nil, nil
	delete(s.m, ac.url)
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
		MaxIdleConnDuration:      agentIdleConn,
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
			return parkconn.NewIdleConn(c, idle), nil
		},
		MaxConns:                 a.cfg.MaxConnsPerAgent,
		MaxConnWaitTimeout:       a.cfg.AgentDialTimeout,
		MaxResponseBodySize:      streamPrefetch,
		StreamResponseBody:       true,
		NoDefaultUserAgentHeader: true,
		DisablePathNormalizing:   true,
	}
	return &agentClient{base: u.Scheme + "://" + u.Host, unary: unary, stream: stream, url: agentURL}, nil
}

func (ac *agentClient) closeIdle() {
	ac.unary.CloseIdleConnections()
	ac.stream.CloseIdleConnections()
}

// newAgentHTTP returns the net/http client of the typed agent clients
// (sandboxAgent.client): no total timeout (every call carries its own
// deadline), and larger buffers than the default 4 KiB, since archives
// stream through it (128 KiB per connection: a fork of 100 holds 12.5 MiB
// of them while it restores).
func newAgentHTTP(cfg Config) *http.Client {
	dialer := &net.Dialer{Timeout: cfg.AgentDialTimeout}
	return &http.Client{Transport: &http.Transport{
		DialContext:         dialer.DialContext,
		MaxIdleConnsPerHost: 16,
		IdleConnTimeout:     cfg.IdleTimeout,
		// A checkpoint's agent walks the tree before its answer's headers;
		// every call's context bounds it.
		DisableCompression: true,
		WriteBufferSize:    64 << 10,
		ReadBufferSize:     64 << 10,
	}}
}
