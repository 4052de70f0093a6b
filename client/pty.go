package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/websocket"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

// CreatePTY starts a program under a PTY (POST /v1/sandboxes/{id}/ptys);
// attach to it with AttachPTY and PTYOptions.PTY.
func (c *Client) CreatePTY(ctx context.Context, id string, req agentapi.PTYCreateRequest) (agentapi.PTYInfo, error) {
	var out agentapi.PTYInfo
	err := c.do(ctx, call{method: http.MethodPost, route: sandboxRoute(id, "ptys"), in: req}, &out)
	return out, err
}

// ListPTYs returns the sandbox's PTYs (GET /v1/sandboxes/{id}/ptys).
func (c *Client) ListPTYs(ctx context.Context, id string) ([]agentapi.PTYInfo, error) {
	var out agentapi.PTYList
	err := c.do(ctx, call{method: http.MethodGet, route: sandboxRoute(id, "ptys")}, &out)
	return out.PTYs, err
}

// GetPTY returns one PTY (GET /v1/sandboxes/{id}/ptys/{pty}).
func (c *Client) GetPTY(ctx context.Context, id, pty string) (agentapi.PTYInfo, error) {
	var out agentapi.PTYInfo
	err := c.do(ctx, call{method: http.MethodGet, route: childRoute(id, "ptys", "pty", pty)}, &out)
	return out, err
}

// ResizePTY sets a PTY's size (POST /v1/sandboxes/{id}/ptys/{pty}/resize).
func (c *Client) ResizePTY(ctx context.Context, id, pty string, cols, rows int) (agentapi.PTYInfo, error) {
	var out agentapi.PTYInfo
	err := c.do(ctx, call{method: http.MethodPost, route: childRoute(id, "ptys", "pty", pty, "resize"),
		in: agentapi.PTYResizeRequest{Cols: cols, Rows: rows}}, &out)
	return out, err
}

// KillPTY hangs a PTY up and forgets it (DELETE /v1/sandboxes/{id}/ptys/{pty}).
func (c *Client) KillPTY(ctx context.Context, id, pty string) (agentapi.PTYInfo, error) {
	var out agentapi.PTYInfo
	err := c.do(ctx, call{method: http.MethodDelete, route: childRoute(id, "ptys", "pty", pty)}, &out)
	return out, err
}

// PTYOptions say which terminal AttachPTY opens.
type PTYOptions struct {
	// PTY attaches to an existing PTY; empty creates one running the
	// sandbox's shell, of Cols×Rows (0: 80×24) in Cwd.
	PTY        string
	Cols, Rows int
	Cwd        string
}

// AttachPTY opens a terminal over GET /v1/sandboxes/{id}/pty (a WebSocket,
// subprotocol quarry.pty.v1). The handshake is bounded by ctx; the
// connection then lives until Close or the program's exit. A refusal
// before the upgrade is an *Error.
func (c *Client) AttachPTY(ctx context.Context, id string, opts PTYOptions) (*PTYConn, error) {
	rt := sandboxRoute(id, "pty")
	if rt.err != nil {
		return nil, rt.err
	}
	q := url.Values{}
	if opts.PTY != "" {
		q.Set("pty", opts.PTY)
	}
	if opts.Cols > 0 {
		q.Set("cols", strconv.Itoa(opts.Cols))
	}
	if opts.Rows > 0 {
		q.Set("rows", strconv.Itoa(opts.Rows))
	}
	if opts.Cwd != "" {
		q.Set("cwd", opts.Cwd)
	}
	u := "ws" + strings.TrimPrefix(c.baseURL, "http") + rt.path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	d := websocket.Dialer{Proxy: http.ProxyFromEnvironment, Subprotocols: []string{agentapi.PTYSubprotocol}}
	if tr, ok := c.http.Transport.(*http.Transport); ok {
		d.TLSClientConfig = tr.TLSClientConfig
	}
	conn, resp, err := d.DialContext(ctx, u, http.Header{"Authorization": {"Bearer " + c.apiKey}})
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			defer resp.Body.Close()
			if e := checkResponse(resp); e != nil {
				return nil, e
			}
		}
		return nil, fmt.Errorf("GET %s: %w", rt.path, err)
	}
	conn.SetReadLimit(agentapi.MaxPTYMessage)
	return &PTYConn{ID: resp.Header.Get(agentapi.HeaderPTY), conn: conn}, nil
}

// PTYConn is an open terminal. Read and Write may be called from different
// goroutines (one reader at a time); Write, Resize and Close are safe for
// concurrent use.
type PTYConn struct {
	// ID is the PTY's id (agentapi.HeaderPTY): attach to it again with
	// PTYOptions.PTY; the replay ring restores the recent screen.
	ID   string
	conn *websocket.Conn

	readMu  sync.Mutex
	pending []byte
	exit    *agentapi.PTYControl
	err     error // the read side's end: io.EOF after the exit, or why it broke

	writeMu sync.Mutex
}

// Read reads terminal output. After the program's exit it returns io.EOF
// (ExitCode then reports the code); a close by the gateway with a code of
// 4000 + status is an *Error (4410 lease_gone: the lease ended).
func (p *PTYConn) Read(b []byte) (int, error) {
	p.readMu.Lock()
	defer p.readMu.Unlock()
	for len(p.pending) == 0 {
		if p.err != nil {
			return 0, p.err
		}
		typ, msg, err := p.conn.ReadMessage()
		if err != nil {
			p.err = p.endOf(err)
			continue
		}
		if typ == websocket.BinaryMessage {
			p.pending = msg
			continue
		}
		var ctl agentapi.PTYControl
		if json.Unmarshal(msg, &ctl) == nil && ctl.Type == agentapi.PTYControlExit {
			p.exit = &ctl
		}
	}
	n := copy(b, p.pending)
	p.pending = p.pending[n:]
	return n, nil
}

// endOf turns the error that ended the reads into Read's error.
func (p *PTYConn) endOf(err error) error {
	var ce *websocket.CloseError
	switch {
	case p.exit != nil:
		return io.EOF
	case errors.As(err, &ce) && ce.Code >= 4000 && ce.Code < 5000:
		return &Error{Status: ce.Code - 4000, Code: ce.Text, Message: "terminal closed: " + ce.Text}
	case errors.As(err, &ce) && ce.Code == websocket.CloseNormalClosure:
		return io.EOF
	}
	return fmt.Errorf("terminal: %w", err)
}

// ExitCode returns the program's exit code (-1 when a signal killed it)
// once Read has returned io.EOF after its exit; ok is false before.
func (p *PTYConn) ExitCode() (code int, ok bool) {
	p.readMu.Lock()
	defer p.readMu.Unlock()
	if p.exit == nil || p.exit.ExitCode == nil {
		return 0, false
	}
	return *p.exit.ExitCode, true
}

// Write sends input (keystrokes), in messages of at most 64 KiB.
func (p *PTYConn) Write(b []byte) (int, error) {
	p.writeMu.Lock()
	defer p.writeMu.Unlock()
	n := 0
	for n < len(b) {
		m := min(len(b)-n, agentapi.MaxPTYMessage)
		if err := p.conn.WriteMessage(websocket.BinaryMessage, b[n:n+m]); err != nil {
			return n, fmt.Errorf("terminal: %w", err)
		}
		n += m
	}
	return n, nil
}

// Resize sets the terminal's size.
func (p *PTYConn) Resize(cols, rows int) error {
	msg, _ := json.Marshal(agentapi.PTYControl{Type: agentapi.PTYControlResize, Cols: cols, Rows: rows})
	p.writeMu.Lock()
	defer p.writeMu.Unlock()
	if err := p.conn.WriteMessage(websocket.TextMessage, msg); err != nil {
		return fmt.Errorf("terminal: %w", err)
	}
	return nil
}

// Close detaches (the PTY keeps running; its replay ring keeps the recent
// screen for the next attach). It is idempotent.
func (p *PTYConn) Close() error {
	p.writeMu.Lock()
	_ = p.conn.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
	p.writeMu.Unlock()
	return p.conn.Close()
}
