package agentapi

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// DefaultMaxEventBytes bounds one server-sent event read by SSEReader when
// the caller names no bound.
const DefaultMaxEventBytes = 16 << 20

// ErrEventTooLarge is returned by SSEReader.Next for an event over its bound.
var ErrEventTooLarge = errors.New("server-sent event too large")

// Event is one server-sent event: its name ("message" when the stream names
// none) and its data (data lines joined by "\n").
type Event struct {
	Name string
	Data []byte
}

// Decode decodes the event's JSON data into v: a StreamChunk for
// stdout/stderr/output events, an ExecResult or ProcessInfo for exit events,
// an ErrorDetail for error events.
func (e Event) Decode(v any) error {
	if err := json.Unmarshal(e.Data, v); err != nil {
		return fmt.Errorf("decode %s event: %w", e.Name, err)
	}
	return nil
}

// SSEReader reads server-sent events (text/event-stream) from a stream. It
// is what the gateway, the CLI and tests use to read the agent's streams. It
// is not safe for concurrent use.
type SSEReader struct {
	r        *bufio.Reader
	max      int
	comments int
}

// NewSSEReader returns a reader of the events in r; maxEvent bounds one
// event's size (0: DefaultMaxEventBytes).
func NewSSEReader(r io.Reader, maxEvent int) *SSEReader {
	if maxEvent <= 0 {
		maxEvent = DefaultMaxEventBytes
	}
	return &SSEReader{r: bufio.NewReaderSize(r, 32<<10), max: maxEvent}
}

// Comments returns how many comment lines (such as ": keep-alive") were
// skipped so far.
func (s *SSEReader) Comments() int { return s.comments }

// Next returns the next event, skipping comments. It returns io.EOF at the
// end of the stream (an event cut off by the end is dropped, and the error is
// io.ErrUnexpectedEOF), and ErrEventTooLarge for an event over the bound.
func (s *SSEReader) Next() (Event, error) {
	var ev Event
	var data bytes.Buffer
	hasData := false
	size := 0
	for {
		line, err := s.readLine(s.max - size)
		if err != nil {
			if errors.Is(err, io.EOF) && (hasData || ev.Name != "") {
				return Event{}, io.ErrUnexpectedEOF
			}
			return Event{}, err
		}
		size += len(line)
		if len(line) == 0 { // dispatch
			if !hasData {
				ev = Event{}
				continue
			}
			if ev.Name == "" {
				ev.Name = "message"
			}
			ev.Data = data.Bytes()
			return ev, nil
		}
		if line[0] == ':' {
			s.comments++
			continue
		}
		field, value, _ := bytes.Cut(line, []byte(":"))
		value = bytes.TrimPrefix(value, []byte(" "))
		switch string(field) {
		case "event":
			ev.Name = string(value)
		case "data":
			if hasData {
				data.WriteByte('\n')
			}
			data.Write(value)
			hasData = true
		}
	}
}

// readLine reads one line without its line ending, at most limit bytes.
func (s *SSEReader) readLine(limit int) ([]byte, error) {
	var line []byte
	for {
		chunk, err := s.r.ReadSlice('\n')
		if len(line)+len(chunk) > limit+2 {
			return nil, ErrEventTooLarge
		}
		line = append(line, chunk...)
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if err != nil {
			if errors.Is(err, io.EOF) && len(line) > 0 {
				return nil, io.ErrUnexpectedEOF
			}
			return nil, err
		}
		line = bytes.TrimSuffix(line[:len(line)-1], []byte("\r"))
		return line, nil
	}
}

// EventStream is an event stream answered by the agent (a streaming exec or
// a followed process output). Close it when done; closing early makes the
// agent see a disconnect (for an exec, that kills the command).
type EventStream struct {
	body io.ReadCloser
	sse  *SSEReader
}

// NewEventStream reads the events of an HTTP response body.
func NewEventStream(body io.ReadCloser) *EventStream {
	return &EventStream{body: body, sse: NewSSEReader(body, 0)}
}

// Next returns the next event; io.EOF after the last one.
func (s *EventStream) Next() (Event, error) { return s.sse.Next() }

// Comments returns how many keep-alive comments were received so far.
func (s *EventStream) Comments() int { return s.sse.Comments() }

// Close closes the stream.
func (s *EventStream) Close() error { return s.body.Close() }
