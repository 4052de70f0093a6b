package faults

import (
	"fmt"
	"net"
	"sync"
	"time"
)

// NetFault is what a Proxy does to the bytes it carries.
type NetFault string

// The faults a Proxy injects.
const (
	// Pass: bytes flow both ways.
	Pass NetFault = "pass"
	// Latency: each chunk waits Proxy's latency before it is passed on.
	Latency NetFault = "latency"
	// Reset: every open connection is reset (RST), and new ones are reset
	// as they arrive.
	Reset NetFault = "reset"
	// Blackhole: connections stay open and nothing flows either way; when
	// the fault ends, the connections it held are reset.
	Blackhole NetFault = "blackhole"
)

// Proxy is a TCP proxy on loopback that injects faults into the
// connections it carries: a replica's connections to its store, for
// example. It is safe for concurrent use.
type Proxy struct {
	ln       net.Listener
	upstream string
	latency  time.Duration

	mu     sync.Mutex
	fault  NetFault
	healed chan struct{} // closed when a blackhole ends
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
	closed bool
}

// NewProxy listens on a free loopback port and passes connections on to
// upstream (host:port). latency is what Latency adds to each chunk.
func NewProxy(upstream string, latency time.Duration) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	p := &Proxy{ln: ln, upstream: upstream, latency: latency, fault: Pass,
		healed: make(chan struct{}), conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's address (host:port).
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Set injects fault from now on (Pass heals). Reset and the end of a
// blackhole reset every connection the proxy holds.
func (p *Proxy) Set(fault NetFault) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.fault == Blackhole && fault != Blackhole {
		close(p.healed)
		p.healed = make(chan struct{})
		p.resetLocked()
	}
	if fault == Reset {
		p.resetLocked()
	}
	p.fault = fault
}

// Close stops the proxy and every connection it carries, and waits for
// its goroutines.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	err := p.ln.Close()
	if p.fault == Blackhole {
		close(p.healed)
		p.healed = make(chan struct{})
	}
	p.resetLocked()
	p.mu.Unlock()
	p.wg.Wait()
	return err
}

func (p *Proxy) resetLocked() {
	for c := range p.conns {
		reset(c)
		delete(p.conns, c)
	}
}

// reset closes c with an RST rather than a FIN, as a failed peer or path
// does.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.closed || p.fault == Reset {
			p.mu.Unlock()
			reset(c)
			continue
		}
		p.conns[c] = struct{}{}
		p.wg.Add(1)
		p.mu.Unlock()
		go p.serve(c)
	}
}

func (p *Proxy) serve(c net.Conn) {
	defer p.wg.Done()
	up, err := net.DialTimeout("tcp", p.upstream, 5*time.Second)
	if err != nil {
		p.drop(c)
		return
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		reset(c)
		reset(up)
		return
	}
	p.conns[up] = struct{}{}
	p.mu.Unlock()
	done := make(chan struct{}, 2)
	go func() { p.pipe(up, c); done <- struct{}{} }()
	p.pipe(c, up)
	<-done
	p.drop(c)
	p.drop(up)
}

func (p *Proxy) drop(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	_ = c.Close()
}

// pipe copies src to dst chunk by chunk, applying the fault of the moment
// to each chunk. When one side ends, it closes both.
func (p *Proxy) pipe(dst, src net.Conn) {
	defer func() { _ = dst.Close(); _ = src.Close() }()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.hold() {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // EOF or a reset: the other direction ends with it
		}
	}
}

// hold applies the current fault to one chunk: it waits out latency, or a
// blackhole until it ends. It returns false when the chunk must not pass
// (the connection was reset meanwhile).
func (p *Proxy) hold() bool {
	p.mu.Lock()
	fault, healed, closed := p.fault, p.healed, p.closed
	p.mu.Unlock()
	switch {
	case closed || fault == Reset:
		return false
	case fault == Latency:
		time.Sleep(p.latency)
	case fault == Blackhole:
		<-healed
		return false // the blackhole's end reset this connection
	}
	return true
}
