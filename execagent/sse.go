package execagent

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
)

// eventWriter writes server-sent events and flushes each one. It is used by
// one goroutine at a time.
type eventWriter struct {
	w   http.ResponseWriter
	rc  *http.ResponseController
	buf bytes.Buffer
	err error
}

func newEventWriter(w http.ResponseWriter) *eventWriter {
	return &eventWriter{w: w, rc: http.NewResponseController(w)}
}

// start sends the headers of an event stream.
func (e *eventWriter) start() {
	h := e.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	e.w.WriteHeader(http.StatusOK)
	e.flush()
}

// event writes one event whose data is v as JSON. After the first write
// error every call returns it.
func (e *eventWriter) event(name string, v any) error {
	if e.err != nil {
		return e.err
	}
	e.buf.Reset()
	e.buf.WriteString("event: ")
	e.buf.WriteString(name)
	e.buf.WriteString("\ndata: ")
	enc := json.NewEncoder(&e.buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil { // Encode ends with '\n'; JSON has no raw newlines
		e.err = fmt.Errorf("encode event: %w", err)
		return e.err
	}
	e.buf.WriteByte('\n')
	return e.write()
}

// comment writes a comment line (": text"), e.g. a keep-alive.
func (e *eventWriter) comment(text string) error {
	if e.err != nil {
		return e.err
	}
	e.buf.Reset()
	e.buf.WriteString(": ")
	e.buf.WriteString(text)
	e.buf.WriteString("\n\n")
	return e.write()
}

func (e *eventWriter) write() error {
	if _, err := e.w.Write(e.buf.Bytes()); err != nil {
		e.err = fmt.Errorf("write event: %w", err)
		return e.err
	}
	return e.flush()
}

func (e *eventWriter) flush() error {
	if err := e.rc.Flush(); err != nil {
		e.err = fmt.Errorf("flush event: %w", err)
	}
	return e.err
}
