package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"mime"

	"github.com/valyala/fasthttp"

	"github.com/quarryhq/quarry/errclass"
	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/warmpool"
)

// errStreamCut is why an agent's event stream is reported broken when it
// ended cleanly but without its final exit or error event.
var errStreamCut = errors.New("its event stream ended before the command's exit event")

// maxEventLine bounds how much of one SSE line the stream watch keeps: only
// "event: ..." lines are inspected, and they are short.
const maxEventLine = 64

// passStream hands the agent's streamed answer up on to the client's
// response: status and headers are copied, the body is read from up as the
// client reads it, and up is released when the client's response is done
// with it. An event stream (200, text/event-stream) is watched: when it
// ends or breaks without its final exit or error event, an error event is
// sent in its place (see streamEnd), unless the client has left. leave (may
// be nil) is the watch of the client's connection; it is stopped with the
// body.
func (g *Gateway) passStream(ctx context.Context, id string, lease warmpool.Lease, up *fasthttp.Response, resp *fasthttp.Response, leave *leaveWatch) {
	up.Header.CopyTo(&resp.Header)
	size := up.Header.ContentLength()
	if size < 0 {
		size = -1
	}
	body := &upstreamBody{up: up, leave: leave}
	if s := up.BodyStream(); s != nil {
		body.src = s
	} else {
		body.src = bytes.NewReader(up.Body())
	}
	if up.StatusCode() == fasthttp.StatusOK && isEventStream(up.Header.ContentType()) {
		body.watch = &eventWatch{}
		body.end = func(err error) []byte { return g.streamEnd(ctx, id, lease, err) }
		size = -1 // the error event may be added
	}
	resp.SetBodyStream(body, size)
}

// isEventStream reports whether a Content-Type is text/event-stream.
func isEventStream(ct []byte) bool {
	mt, _, err := mime.ParseMediaType(string(ct))
	return err == nil && mt == "text/event-stream"
}

// streamEnd returns the error event that ends an agent's event stream that
// broke (err) or ended without its final event: the lease's end when the
// manager finds it ended (code gone, with its state and reason), else the
// agent's failure. Its data is an agentapi.ErrorDetail, as the agent's own
// error events.
func (g *Gateway) streamEnd(ctx context.Context, id string, lease warmpool.Lease, err error) []byte {
	if err == nil {
		err = errStreamCut
	}
	a := errclass.Of(errclass.Sandbox(id, g.agentCallFailed(ctx, lease, err)))
	g.log.Warn("agent event stream broke", "lease", lease.ID, "err", err, "code", a.Code)
	data, _ := json.Marshal(agentapi.ErrorDetail{Code: a.Code, Message: a.Message})
	ev := make([]byte, 0, len(data)+32)
	ev = append(ev, "event: "+agentapi.EventError+"\ndata: "...)
	ev = append(ev, data...)
	return append(ev, "\n\n"...)
}

// upstreamBody is the body of a client's response read from an agent's
// streamed answer. With watch set it tracks the SSE events that pass and,
// when the agent's stream ends without a final exit or error event, ends
// the client's stream with the event end returns, unless leave found the
// client gone (then the agent ended the stream because its call was
// cancelled). It is read by one goroutine (the server writing the
// response).
type upstreamBody struct {
	up    *fasthttp.Response
	src   io.Reader
	watch *eventWatch
	end   func(err error) []byte
	leave *leaveWatch

	tail []byte // the closing bytes still to send, once src ended
	done bool   // src ended; tail is what remains
}

func (b *upstreamBody) Read(p []byte) (int, error) {
	if b.done {
		if len(b.tail) == 0 {
			return 0, io.EOF
		}
		n := copy(p, b.tail)
		b.tail = b.tail[n:]
		return n, nil
	}
	n, err := b.src.Read(p)
	if b.watch != nil {
		b.watch.feed(p[:n])
	}
	if err == nil {
		return n, nil
	}
	if b.watch == nil || b.watch.final || b.leave.left() {
		return n, err
	}
	if errors.Is(err, io.EOF) {
		err = nil
	}
	b.done = true
	b.tail = append(b.watch.terminator(), b.end(err)...)
	return n, nil
}

// Close ends the watch of the client and releases the agent's answer (and
// its connection).
func (b *upstreamBody) Close() error {
	b.leave.stop()
	if b.up == nil {
		return nil
	}
	err := b.up.CloseBodyStream()
	fasthttp.ReleaseResponse(b.up)
	b.up = nil
	return err
}

// eventWatch follows the lines of a server-sent event stream to learn
// whether its final event (exit or error) was sent whole.
type eventWatch struct {
	line     []byte // the start of the current line (at most maxEventLine)
	inLine   bool   // the current line has started
	inEvent  bool   // an event has fields but was not dispatched
	terminal bool   // the pending event is an exit or error event
	final    bool   // an exit or error event was dispatched
}

func (w *eventWatch) feed(p []byte) {
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		chunk := p
		if i >= 0 {
			chunk = p[:i]
		}
		if room := maxEventLine - len(w.line); room > 0 {
			w.line = append(w.line, chunk[:min(room, len(chunk))]...)
		}
		if len(chunk) > 0 {
			w.inLine = true
		}
		if i < 0 {
			return
		}
		w.endLine()
		p = p[i+1:]
	}
}

// endLine handles one complete line.
func (w *eventWatch) endLine() {
	line := bytes.TrimSuffix(w.line, []byte("\r"))
	w.line, w.inLine = w.line[:0], false
	switch {
	case len(line) == 0:
		if w.inEvent && w.terminal {
			w.final = true
		}
		w.inEvent, w.terminal = false, false
	case line[0] == ':':
		// a comment (keep-alive)
	default:
		w.inEvent = true
		if name, ok := bytes.CutPrefix(line, []byte("event:")); ok {
			name = bytes.TrimSpace(name)
			w.terminal = string(name) == agentapi.EventExit || string(name) == agentapi.EventError
		}
	}
}

// terminator returns the bytes that end a partial line and an undispatched
// event, so that the next event stands alone.
func (w *eventWatch) terminator() []byte {
	var t []byte
	if w.inLine {
		t = append(t, '\n')
	}
	if w.inLine || w.inEvent {
		t = append(t, '\n')
	}
	return t
}
