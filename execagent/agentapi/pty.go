package agentapi

import (
	"context"
	"net/http"
	"net/url"
	"time"
)

// PTY routes of the agent (docs/API.md "Terminals (PTY)").
const (
	RoutePTYs      = "/v1/ptys"
	RoutePTY       = "/v1/ptys/{id}"
	RoutePTYResize = "/v1/ptys/{id}/resize"
	RoutePTYAttach = "/v1/ptys/{id}/attach"
)

// PTYSubprotocol is the WebSocket subprotocol of a PTY attach, the same on
// the agent and the gateway. Binary messages are terminal bytes (client →
// server: input; server → client: output); text messages are PTYControl
// JSON: the client sends "resize", the server sends "exit" once and then
// closes normally (1000). A message over MaxPTYMessage is refused with
// close 1009.
const PTYSubprotocol = "quarry.pty.v1"

// ReasonLeaseGone is the close reason of a WebSocket whose lease ended
// (close code 4410).
const ReasonLeaseGone = "lease_gone"

// MaxPTYMessage bounds one message of a PTY WebSocket in either direction.
const MaxPTYMessage = 64 << 10

// HeaderPTY names, on the gateway's 101 answer to GET
// /v1/sandboxes/{id}/pty, the PTY the socket is attached to (the one it
// created, without ?pty=): reattach with ?pty=<it>.
const HeaderPTY = "X-Quarry-Pty"

// PTY control message types (PTYControl.Type).
const (
	PTYControlResize = "resize"
	PTYControlExit   = "exit"
)

// PTYControl is a text message of a PTY WebSocket.
type PTYControl struct {
	// Type is PTYControlResize (client → server: Cols, Rows) or
	// PTYControlExit (server → client: ExitCode, Signal).
	Type     string `json:"type"`
	Cols     int    `json:"cols,omitempty"`
	Rows     int    `json:"rows,omitempty"`
	ExitCode *int   `json:"exit_code,omitempty"`
	Signal   string `json:"signal,omitempty"`
}

// PTYCreateRequest is the body of POST /v1/ptys. Every field is optional.
type PTYCreateRequest struct {
	// Command is the program and its arguments (default: the sandbox's
	// shell as a login-less interactive shell: $SHELL or /bin/sh).
	Command []string `json:"command,omitempty"`
	// Env is added to the sandbox's environment (TERM defaults to
	// xterm-256color).
	Env map[string]string `json:"env,omitempty"`
	// Cwd is the working directory (default: the agent's workdir).
	Cwd string `json:"cwd,omitempty"`
	// Cols and Rows are the terminal size (default 80×24; 1..1000 each).
	Cols int `json:"cols,omitempty"`
	Rows int `json:"rows,omitempty"`
}

// PTYResizeRequest is the body of POST /v1/ptys/{id}/resize.
type PTYResizeRequest struct {
	Cols int `json:"cols"`
	Rows int `json:"rows"`
}

// PTY states (PTYInfo.State).
const (
	PTYRunning = "running"
	PTYExited  = "exited"
)

// PTYInfo describes one PTY.
type PTYInfo struct {
	ID        string     `json:"id"`
	PID       int        `json:"pid"`
	Command   []string   `json:"command"`
	Cols      int        `json:"cols"`
	Rows      int        `json:"rows"`
	State     string     `json:"state"`
	ExitCode  *int       `json:"exit_code,omitempty"`
	Signal    string     `json:"signal,omitempty"`
	StartedAt time.Time  `json:"started_at"`
	EndedAt   *time.Time `json:"ended_at,omitempty"`
	// Clients is the number of attached WebSockets.
	Clients int `json:"clients"`
	// OutputBytes counts every byte the PTY has written; the replay ring
	// keeps the most recent ones.
	OutputBytes int64 `json:"output_bytes"`
}

// PTYList is the answer of GET /v1/ptys.
type PTYList struct {
	PTYs []PTYInfo `json:"ptys"`
}

// PTYPath returns the agent path of PTY id, with suffix ("", "/resize",
// "/attach").
func PTYPath(id, suffix string) string {
	return RoutePTYs + "/" + url.PathEscape(id) + suffix
}

// CreatePTY calls POST /v1/ptys.
func (c *Client) CreatePTY(ctx context.Context, req PTYCreateRequest) (PTYInfo, error) {
	var out PTYInfo
	err := c.Do(ctx, http.MethodPost, RoutePTYs, req, &out)
	return out, err
}

// ListPTYs calls GET /v1/ptys.
func (c *Client) ListPTYs(ctx context.Context) ([]PTYInfo, error) {
	var out PTYList
	err := c.Do(ctx, http.MethodGet, RoutePTYs, nil, &out)
	return out.PTYs, err
}

// GetPTY calls GET /v1/ptys/{id}.
func (c *Client) GetPTY(ctx context.Context, id string) (PTYInfo, error) {
	var out PTYInfo
	err := c.Do(ctx, http.MethodGet, PTYPath(id, ""), nil, &out)
	return out, err
}

// ResizePTY calls POST /v1/ptys/{id}/resize.
func (c *Client) ResizePTY(ctx context.Context, id string, cols, rows int) (PTYInfo, error) {
	var out PTYInfo
	err := c.Do(ctx, http.MethodPost, PTYPath(id, "/resize"), PTYResizeRequest{Cols: cols, Rows: rows}, &out)
	return out, err
}

// KillPTY calls DELETE /v1/ptys/{id}: hang up, then kill its session's
// processes, and forget it.
func (c *Client) KillPTY(ctx context.Context, id string) (PTYInfo, error) {
	var out PTYInfo
	err := c.Do(ctx, http.MethodDelete, PTYPath(id, ""), nil, &out)
	return out, err
}
