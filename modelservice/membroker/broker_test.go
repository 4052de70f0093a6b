package membroker

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/modelservice"
	"github.com/quarryhq/quarry/modelservice/brokertest"
)

func TestBroker_Conformance(t *testing.T) {
	brokertest.Run(t, func(t *testing.T) modelservice.Broker {
		b := New(Config{})
		t.Cleanup(func() { _ = b.Close(context.Background()) })
		return b
	}, brokertest.Options{})
}

// fakeClock is a settable clock.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func request(id, lease string, now time.Time, body string) modelservice.Request {
	return modelservice.Request{ID: id, LeaseID: lease, Owner: "o1", Pool: "p", Route: "chat/completions",
		Body: []byte(body), ReceivedAt: now, Deadline: now.Add(time.Minute)}
}

func TestBroker_Purge_DropsExchangesPastRetention(t *testing.T) {
	ctx := context.Background()
	clock := &fakeClock{now: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	b := New(Config{Retention: time.Hour, Clock: clock})
	now := clock.Now()
	answered := request(modelservice.NewRequestID(now), "sbx-a", now, `{"a":1}`)
	pending := request(modelservice.NewRequestID(now.Add(1)), "sbx-a", now, `{"b":2}`)
	require.NoError(t, b.Submit(ctx, answered))
	require.NoError(t, b.Submit(ctx, pending))
	require.NoError(t, b.Respond(ctx, answered.ID, "o1", modelservice.Response{Status: 200, Body: []byte("{}"), AnsweredAt: now}))

	clock.advance(30 * time.Minute)
	n, err := b.Purge(ctx)
	require.NoError(t, err)
	assert.Zero(t, n, "both are within their retention")

	clock.advance(31 * time.Minute) // both deadlines (1 min) passed 60 min ago
	page, _, err := b.Transcript(ctx, modelservice.TranscriptQuery{LeaseID: "sbx-a", Limit: 10})
	require.NoError(t, err)
	assert.Empty(t, page, "exchanges past retention are not returned, purged or not")
	n, err = b.Purge(ctx)
	require.NoError(t, err)
	assert.Equal(t, 2, n)
	assert.Zero(t, b.bytes, "the bytes held are released")
	assert.ErrorIs(t, b.Respond(ctx, pending.ID, "o1", modelservice.Response{}), modelservice.ErrNotFound)
}

func TestBroker_Submit_FullPastMaxBytes(t *testing.T) {
	ctx := context.Background()
	now := time.Now()
	b := New(Config{MaxBytes: 10})
	require.NoError(t, b.Submit(ctx, request(modelservice.NewRequestID(now), "sbx-a", now, "12345678")))
	err := b.Submit(ctx, request(modelservice.NewRequestID(now.Add(1)), "sbx-a", now, "123"))
	assert.ErrorIs(t, err, modelservice.ErrFull)
}
