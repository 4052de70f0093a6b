package modelservice

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"sync"

	"github.com/quarryhq/quarry/warmpool"
)

// Forwarded is an upstream's answer to a passthrough call, read by the
// gateway as it streams it to the agent. Read tees what it returns into the
// transcript (up to Config.MaxRecordedBody); Finish records the exchange.
// It is used by one goroutine at a time.
type Forwarded struct {
	// Status and ContentType are the upstream's.
	Status      int
	ContentType string

	s        *Service
	ex       Exchange
	body     io.ReadCloser
	cancel   context.CancelFunc
	record   bool
	rec      bytes.Buffer
	readErr  error
	finished sync.Once
}

// Forward sends an agent's call to upstream (with key as its bearer token,
// when set) and returns once the upstream's status and headers arrived.
// method and route are the agent's ("POST chat/completions", "GET
// models"); body is sent verbatim. ctx ending before the headers arrive
// (the agent disconnected) cancels the call. The answer must then be read
// and Finish called. Errors: *badinput.Error for a POST body that is not
// a JSON object; *UpstreamError when the upstream cannot be reached.
func (s *Service) Forward(ctx context.Context, l warmpool.Lease, method, route string, body []byte, upstream, key string) (*Forwarded, error) {
	record := method == http.MethodPost
	var cb callBody
	if record {
		var err error
		if cb, err = parseCall(body); err != nil {
			return nil, err
		}
	}
	now := s.clock.Now()
	timeout := s.pools[l.Pool].timeout
	if timeout <= 0 {
		timeout = s.cfg.Timeout
	}
	// The call outlives the handler that starts it (the answer streams
	// after it returns): its context is its own, bounded by the timeout.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	stop := context.AfterFunc(ctx, cancel)
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	url := upstream + "/" + route
	hreq, err := http.NewRequestWithContext(cctx, method, url, rd)
	if err != nil {
		stop()
		cancel()
		return nil, &UpstreamError{URL: upstream, Err: err}
	}
	if body != nil {
		hreq.Header.Set("Content-Type", ContentTypeJSON)
	}
	if cb.Stream {
		hreq.Header.Set("Accept", ContentTypeSSE)
	}
	if key != "" {
		hreq.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := s.http.Do(hreq)
	stop()
	f := &Forwarded{
		s: s, cancel: cancel, record: record,
		ex: Exchange{Request: Request{
			ID: NewRequestID(now), LeaseID: l.ID, Owner: l.Owner, Pool: l.Pool, Labels: maps.Clone(l.Labels),
			Route: route, Stream: cb.Stream, Body: body, ReceivedAt: now, Deadline: now.Add(timeout),
		}, Upstream: upstream},
	}
	if err != nil {
		cancel()
		uerr := &UpstreamError{URL: upstream, Err: err}
		if ctx.Err() != nil {
			f.finish(StateCancelled, disconnectedReason)
			return nil, ctx.Err()
		}
		f.finish(StateFailed, uerr.Error())
		return nil, uerr
	}
	f.Status, f.ContentType, f.body = resp.StatusCode, resp.Header.Get("Content-Type"), resp.Body
	return f, nil
}

// ID is the request id of the forwarded call.
func (f *Forwarded) ID() string { return f.ex.ID }

// Read reads the upstream's answer and keeps a bounded copy.
func (f *Forwarded) Read(p []byte) (int, error) {
	n, err := f.body.Read(p)
	if f.record && n > 0 {
		room := f.s.cfg.MaxRecordedBody - int64(f.rec.Len())
		switch {
		case room >= int64(n):
			f.rec.Write(p[:n])
		case room > 0:
			f.rec.Write(p[:room])
			f.ex.Truncated = true
		default:
			f.ex.Truncated = true
		}
	}
	if err != nil && !errors.Is(err, io.EOF) {
		f.readErr = err
	}
	return n, err
}

// Finish closes the upstream's answer and records the exchange in the
// lease's transcript: answered when the whole answer was read, failed when
// the upstream broke off, cancelled when agentErr (the agent went away
// while the answer streamed) is set. Recording failures are logged. Safe
// to call more than once; only the first call counts.
func (f *Forwarded) Finish(agentErr error) {
	f.finished.Do(func() {
		_ = f.body.Close()
		f.cancel()
		switch {
		case agentErr != nil:
			f.finish(StateCancelled, disconnectedReason)
		case f.readErr != nil:
			f.finish(StateFailed, fmt.Sprintf("%s: %v", upstreamFailedReason, f.readErr))
		default:
			f.finish(StateAnswered, "")
		}
	})
}

// finish records the exchange in state.
func (f *Forwarded) finish(state State, reason string) {
	if !f.record {
		return
	}
	now := f.s.clock.Now()
	f.ex.State, f.ex.Reason, f.ex.EndedAt = state, reason, now
	if f.Status != 0 {
		f.ex.Response = &Response{Status: f.Status, ContentType: f.ContentType, Body: f.rec.Bytes(), AnsweredAt: now}
	}
	ctx, cancel := context.WithTimeout(context.Background(), f.s.cfg.BrokerTimeout)
	defer cancel()
	if err := f.s.broker.Record(ctx, f.ex); err != nil {
		f.s.log.Warn("record passthrough exchange", "lease", f.ex.LeaseID, "request", f.ex.ID, "err", err)
	}
}
