package client

import (
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

// Stream is an open stream of server-sent events decoded into E, read with
// agentapi's SSE reader (keep-alive comments skipped, each event bounded by
// the client's WithMaxResponseBytes). Next returns the events in order as
// they arrive; Close ends the stream early. A Stream is used by one goroutine
// at a time.
type Stream[E any] struct {
	body   io.ReadCloser
	sse    *agentapi.SSEReader
	decode func(ev agentapi.Event) (e E, final, ok bool, err error)
	done   bool
}

// newStream reads the events of body, each at most max bytes.
func newStream[E any](body io.ReadCloser, max int64, decode func(agentapi.Event) (E, bool, bool, error)) *Stream[E] {
	return &Stream[E]{body: body, sse: agentapi.NewSSEReader(body, int(min(max, math.MaxInt32))), decode: decode}
}

// Next returns the next event. After the final event (exit) it returns
// io.EOF; a stream that ends before it returns an error wrapping
// io.ErrUnexpectedEOF; an event over the bound, agentapi.ErrEventTooLarge;
// an "error" event is returned as *Error with Status 0. Events of unknown
// names are skipped. The stream's ctx bounds every wait.
func (s *Stream[E]) Next() (E, error) {
	var zero E
	if s.done {
		return zero, io.EOF
	}
	for {
		ev, err := s.sse.Next()
		if err != nil {
			s.done = true
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF // the final event never came
			}
			return zero, fmt.Errorf("read event stream: %w", err)
		}
		if ev.Name == agentapi.EventError {
			s.done = true
			var d agentapi.ErrorDetail
			if err := ev.Decode(&d); err != nil {
				return zero, err
			}
			return zero, &Error{Code: d.Code, Message: oneLine(d.Message)}
		}
		e, final, ok, err := s.decode(ev)
		if err != nil {
			s.done = true
			return zero, err
		}
		if !ok {
			continue
		}
		s.done = final
		return e, nil
	}
}

// Close ends the stream and releases its connection; closing an exec stream
// before its exit event makes the agent kill the command. It is safe to call
// more than once.
func (s *Stream[E]) Close() error {
	s.done = true
	return s.body.Close()
}
