package client

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"strconv"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

// ExecEvent is one event of ExecStream.
type ExecEvent struct {
	// Type is agentapi.EventStdout, agentapi.EventStderr or agentapi.EventExit.
	Type string
	// Data is the output of a stdout or stderr event. When the request's
	// Encoding is agentapi.EncodingBase64 it holds the exact bytes (the
	// client decodes the events; they need not be UTF-8); otherwise it is
	// text, in which the agent turned bytes that are not UTF-8 into U+FFFD.
	Data string
	// Result is the result of the exit event, without Stdout and Stderr.
	Result agentapi.ExecResult
}

// OutputEvent is one event of FollowOutput.
type OutputEvent struct {
	// Type is agentapi.EventOutput or agentapi.EventExit.
	Type string
	// Chunk is the output of an output event, with its byte offset.
	Chunk agentapi.StreamChunk
	// Process is the process as it exited, for the exit event.
	Process agentapi.ProcessInfo
}

// openStream sends cl asking for server-sent events and returns the stream.
func openStream[E any](ctx context.Context, c *Client, cl call, decode func(agentapi.Event) (E, bool, bool, error)) (*Stream[E], error) {
	cl.accept = "text/event-stream"
	resp, err := c.send(ctx, cl)
	if err != nil {
		return nil, err
	}
	return newStream(resp.Body, c.maxBytes, decode), nil
}

// Exec runs a command to completion and returns its result
// (POST /v1/sandboxes/{id}/exec). A command that fails still returns a
// result (ExitCode, TimedOut); only a failed call returns an error. When
// req.Encoding is agentapi.EncodingBase64 the client decodes Stdout and
// Stderr: they hold the command's exact bytes.
func (c *Client) Exec(ctx context.Context, id string, req agentapi.ExecRequest) (agentapi.ExecResult, error) {
	var res agentapi.ExecResult
	if err := c.do(ctx, call{method: http.MethodPost, route: sandboxRoute(id, "exec"), in: req}, &res); err != nil {
		return res, err
	}
	for _, out := range []*string{&res.Stdout, &res.Stderr} {
		b, err := agentapi.DecodeOutput(req.Encoding, *out)
		if err != nil {
			return res, err
		}
		*out = string(b)
	}
	return res, nil
}

// ExecStream runs a command and streams its output as it is written: stdout
// and stderr events (with req.Encoding agentapi.EncodingBase64, each
// decoded to the exact bytes), then one exit event. The caller must Close
// the stream.
func (c *Client) ExecStream(ctx context.Context, id string, req agentapi.ExecRequest) (*Stream[ExecEvent], error) {
	return openStream(ctx, c, call{method: http.MethodPost, route: sandboxRoute(id, "exec"), in: req},
		func(ev agentapi.Event) (ExecEvent, bool, bool, error) {
			e := ExecEvent{Type: ev.Name}
			switch ev.Name {
			case agentapi.EventStdout, agentapi.EventStderr:
				var ch agentapi.StreamChunk
				if err := ev.Decode(&ch); err != nil {
					return e, false, true, err
				}
				b, err := agentapi.DecodeOutput(req.Encoding, ch.Data)
				e.Data = string(b)
				return e, false, true, err
			case agentapi.EventExit:
				return e, true, true, ev.Decode(&e.Result)
			}
			return e, false, false, nil
		})
}

// KillAll sends SIGKILL to every process in the sandbox but its agent
// (POST /v1/sandboxes/{id}/kill-all): a sandbox that a runaway command
// (a fork bomb) filled is usable again without a new lease. Sessions end
// with their shells; see agentapi.KillAllResult.
func (c *Client) KillAll(ctx context.Context, id string) (agentapi.KillAllResult, error) {
	var res agentapi.KillAllResult
	err := c.do(ctx, call{method: http.MethodPost, route: sandboxRoute(id, "kill-all")}, &res)
	return res, err
}

// CreateSession starts a persistent shell in the sandbox
// (POST /v1/sandboxes/{id}/sessions).
func (c *Client) CreateSession(ctx context.Context, id string, req agentapi.SessionCreateRequest) (agentapi.SessionInfo, error) {
	var s agentapi.SessionInfo
	err := c.do(ctx, call{method: http.MethodPost, route: sandboxRoute(id, "sessions"), in: req}, &s)
	return s, err
}

// ListSessions returns the sandbox's sessions.
func (c *Client) ListSessions(ctx context.Context, id string) ([]agentapi.SessionInfo, error) {
	var l agentapi.SessionList
	err := c.do(ctx, call{method: http.MethodGet, route: sandboxRoute(id, "sessions")}, &l)
	return l.Sessions, err
}

// RunSession runs one command in session sid. A session already running a
// command fails with a 409 for which IsBusy is true; a command that ends the
// shell returns Closed, and later runs fail with IsNotFound.
func (c *Client) RunSession(ctx context.Context, id, sid string, req agentapi.SessionRunRequest) (agentapi.SessionRunResult, error) {
	var res agentapi.SessionRunResult
	err := c.do(ctx, call{method: http.MethodPost, route: childRoute(id, "sessions", "session id", sid, "run"), in: req}, &res)
	return res, err
}

// CloseSession ends session sid and its shell.
func (c *Client) CloseSession(ctx context.Context, id, sid string) error {
	return c.do(ctx, call{method: http.MethodDelete, route: childRoute(id, "sessions", "session id", sid)}, nil)
}

// StartProcess starts a background process (POST /v1/sandboxes/{id}/processes).
func (c *Client) StartProcess(ctx context.Context, id string, req agentapi.ProcessStartRequest) (agentapi.ProcessInfo, error) {
	var p agentapi.ProcessInfo
	err := c.do(ctx, call{method: http.MethodPost, route: sandboxRoute(id, "processes"), in: req}, &p)
	return p, err
}

// ListProcesses returns the sandbox's background processes.
func (c *Client) ListProcesses(ctx context.Context, id string) ([]agentapi.ProcessInfo, error) {
	var l agentapi.ProcessList
	err := c.do(ctx, call{method: http.MethodGet, route: sandboxRoute(id, "processes")}, &l)
	return l.Processes, err
}

// GetProcess returns process pid; ExitCode is set once State is exited.
func (c *Client) GetProcess(ctx context.Context, id, pid string) (agentapi.ProcessInfo, error) {
	var p agentapi.ProcessInfo
	err := c.do(ctx, call{method: http.MethodGet, route: childRoute(id, "processes", "process id", pid)}, &p)
	return p, err
}

// ProcessOutput returns one page of the process's combined output from
// offset; limit 0 means the gateway's default page size.
func (c *Client) ProcessOutput(ctx context.Context, id, pid string, offset, limit int64) (agentapi.ProcessOutput, error) {
	q := url.Values{"offset": {strconv.FormatInt(offset, 10)}}
	if limit > 0 {
		q.Set("limit", strconv.FormatInt(limit, 10))
	}
	var o agentapi.ProcessOutput
	err := c.do(ctx, call{method: http.MethodGet, route: childRoute(id, "processes", "process id", pid, "output"), query: q}, &o)
	return o, err
}

// FollowOutput streams the process's output from offset: output events until
// the process exits, then one exit event. The caller must Close the stream.
func (c *Client) FollowOutput(ctx context.Context, id, pid string, offset int64) (*Stream[OutputEvent], error) {
	q := url.Values{"offset": {strconv.FormatInt(offset, 10)}, "follow": {"true"}}
	cl := call{method: http.MethodGet, route: childRoute(id, "processes", "process id", pid, "output"), query: q}
	return openStream(ctx, c, cl, func(ev agentapi.Event) (OutputEvent, bool, bool, error) {
		e := OutputEvent{Type: ev.Name}
		switch ev.Name {
		case agentapi.EventOutput:
			return e, false, true, ev.Decode(&e.Chunk)
		case agentapi.EventExit:
			return e, true, true, ev.Decode(&e.Process)
		}
		return e, false, false, nil
	})
}

// Signal sends sig ("TERM", "SIGKILL", "9") to the process's group.
func (c *Client) Signal(ctx context.Context, id, pid, sig string) error {
	return c.do(ctx, call{method: http.MethodPost, route: childRoute(id, "processes", "process id", pid, "signal"),
		in: agentapi.SignalRequest{Signal: sig}}, nil)
}

// WriteStdin streams r to the stdin of a process started with Stdin true;
// with closeStdin the process's stdin is closed afterwards. r may be nil.
func (c *Client) WriteStdin(ctx context.Context, id, pid string, r io.Reader, closeStdin bool) error {
	cl := call{method: http.MethodPost, route: childRoute(id, "processes", "process id", pid, "stdin"), body: r}
	if closeStdin {
		cl.query = url.Values{"close": {"true"}}
	}
	return c.do(ctx, cl, nil)
}

// KillProcess kills process pid if it runs and forgets it.
func (c *Client) KillProcess(ctx context.Context, id, pid string) error {
	return c.do(ctx, call{method: http.MethodDelete, route: childRoute(id, "processes", "process id", pid)}, nil)
}
