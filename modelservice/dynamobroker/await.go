package dynamobroker

import (
	"context"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/quarryhq/quarry/modelservice"
)

// watch is this replica's bookkeeping of one request that calls wait for.
// It outlives one Await call (the relay waits in steps of its lease
// check) for up to RecheckMax, so that the next step keeps the backoff of
// the reads instead of starting over. br.mu guards it.
type watch struct {
	ch      chan struct{} // closed when the request's end is noticed here
	noticed bool          // ch is closed
	waiting int           // Await calls on it now
	next    time.Time     // when the next read of the request is due
	pause   time.Duration // the pause after that read
	idleAt  time.Time     // when the last Await left it
}

// awaitAttrs is what a waiting call reads of its request: its state, its
// retention and where its answer is; never the request's body or labels.
var awaitAttrs = []string{aState, aReason, aKeep, aStatus, aCType, aAnsAt, aAnsID, aABody, aAChunks}

// Await waits until request id ends: it reads the request's state (a
// projection of its meta item), then waits for a notice (a local answer or
// cancel, or the inbox poller), reading the state again after Recheck,
// doubling up to RecheckMax.
func (br *Broker) Await(ctx context.Context, id string) (modelservice.Response, error) {
	action := "await model request " + id
	w, err := br.enter(id)
	if err != nil {
		return modelservice.Response{}, fmt.Errorf("%s: %w", action, err)
	}
	defer br.leave(id, w)
	for {
		br.mu.Lock()
		due := w.noticed || !time.Now().Before(w.next)
		br.mu.Unlock()
		if due {
			it, err := br.getMeta(ctx, id, awaitAttrs...)
			if err != nil {
				if ctx.Err() != nil {
					return modelservice.Response{}, ctx.Err()
				}
				return modelservice.Response{}, err
			}
			if it == nil {
				br.drop(id)
				return modelservice.Response{}, fmt.Errorf("%s: %w", action, modelservice.ErrNotFound)
			}
			if modelservice.State(getS(it, aState)).Ended() {
				br.drop(id)
				return br.answerOf(ctx, id, it, action)
			}
			br.reschedule(w)
		}
		br.mu.Lock()
		ch, wait := w.ch, time.Until(w.next)
		br.mu.Unlock()
		t := time.NewTimer(wait)
		select {
		case <-ch:
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return modelservice.Response{}, ctx.Err()
		case <-br.done:
			t.Stop()
			return modelservice.Response{}, fmt.Errorf("%s: %w", action, modelservice.ErrClosed)
		}
		t.Stop()
	}
}

// enter registers an Await call on id's watch (a read is due at once for a
// new watch) and starts the inbox poller if it is not running.
func (br *Broker) enter(id string) (*watch, error) {
	br.mu.Lock()
	defer br.mu.Unlock()
	if br.closed {
		return nil, modelservice.ErrClosed
	}
	w, ok := br.watches[id]
	if !ok {
		w = &watch{ch: make(chan struct{}), next: time.Now(), pause: br.cfg.Recheck}
		br.watches[id] = w
	}
	w.waiting++
	br.waiting++
	if !br.polling {
		br.polling = true
		br.wg.Add(1)
		go br.pollInbox()
	}
	return w, nil
}

// leave ends an Await call on w; w stays (idle) for the next one.
func (br *Broker) leave(id string, w *watch) {
	br.mu.Lock()
	defer br.mu.Unlock()
	w.waiting--
	br.waiting--
	if w.waiting == 0 {
		w.idleAt = time.Now()
		if w.noticed && br.watches[id] == w {
			delete(br.watches, id)
		}
	}
}

// reschedule sets w's next read after a read that found the request open:
// after the current pause, which doubles up to RecheckMax. A notice that
// woke it is spent.
func (br *Broker) reschedule(w *watch) {
	br.mu.Lock()
	defer br.mu.Unlock()
	w.next = time.Now().Add(w.pause)
	w.pause = min(2*w.pause, br.cfg.RecheckMax)
	if w.noticed {
		w.ch, w.noticed = make(chan struct{}), false
	}
}

// drop forgets id's watch: the request ended or is gone.
func (br *Broker) drop(id string) {
	br.mu.Lock()
	defer br.mu.Unlock()
	delete(br.watches, id)
}

// wake tells the waits of rid that it ended (a local answer or cancel, or
// a notice). A watch no call waits on is dropped: the next Await reads.
func (br *Broker) wake(rid string) {
	br.mu.Lock()
	defer br.mu.Unlock()
	w, ok := br.watches[rid]
	if !ok {
		return
	}
	if !w.noticed {
		close(w.ch)
		w.noticed = true
	}
	if w.waiting == 0 {
		delete(br.watches, rid)
	}
}

// sweepWatches drops the watches no call has waited on for RecheckMax.
// br.mu is held.
func (br *Broker) sweepWatches(now time.Time) {
	for id, w := range br.watches {
		if w.waiting == 0 && now.Sub(w.idleAt) > br.cfg.RecheckMax {
			delete(br.watches, id)
		}
	}
}

// pollInbox reads this replica's inbox every AwaitPoll while calls wait,
// wakes their waits and deletes the notices; every RecheckMax it drops the
// idle watches. It stops when no call waits or the broker closes.
func (br *Broker) pollInbox() {
	defer br.wg.Done()
	t := time.NewTicker(br.cfg.AwaitPoll)
	defer t.Stop()
	swept := time.Now()
	for {
		select {
		case <-br.done:
			return
		case <-t.C:
		}
		br.mu.Lock()
		if now := time.Now(); now.Sub(swept) > br.cfg.RecheckMax {
			br.sweepWatches(now)
			swept = now
		}
		if br.waiting == 0 {
			br.polling = false
			br.mu.Unlock()
			return
		}
		br.mu.Unlock()
		br.readInbox()
	}
}

// readInbox reads one page of this replica's inbox, wakes the waits of the
// requests its notices name and deletes them.
func (br *Broker) readInbox() {
	ctx, cancel := context.WithTimeout(context.Background(), br.cfg.CallTimeout)
	defer cancel()
	res, err := br.api.Query(ctx, &dynamodb.QueryInput{
		TableName: aws.String(br.cfg.Table), KeyConditionExpression: aws.String("pk = :pk"),
		ExpressionAttributeValues: item{":pk": s(inboxPK(br.replica))}, ConsistentRead: aws.Bool(true), Limit: aws.Int32(1000),
	})
	if err != nil {
		br.log.Warn("read the model relay inbox", "err", err)
		return
	}
	for _, it := range res.Items {
		for _, rid := range noticeIDs(it) {
			br.wake(rid)
		}
	}
	if err := br.deleteItems(ctx, res.Items); err != nil {
		br.log.Debug("delete inbox notices", "err", err)
	}
}

// noticeIDs returns the request ids a notice item names: its list, or (an
// older gateway's notice of one request) its sort key.
func noticeIDs(it item) []string {
	l, ok := it[aIDs].(*types.AttributeValueMemberL)
	if !ok {
		return []string{getS(it, attrSK)}
	}
	out := make([]string, 0, len(l.Value))
	for _, v := range l.Value {
		if sv, ok := v.(*types.AttributeValueMemberS); ok {
			out = append(out, sv.Value)
		}
	}
	return out
}

// answerOf returns the answer of ended request id from its meta item it
// (the full item or awaitAttrs), or ErrGone.
func (br *Broker) answerOf(ctx context.Context, id string, it item, action string) (modelservice.Response, error) {
	st := modelservice.State(getS(it, aState))
	if st != modelservice.StateAnswered {
		return modelservice.Response{}, fmt.Errorf("%s: %w (%s: %s)", action, modelservice.ErrGone, st, getS(it, aReason))
	}
	bodies, err := br.loadBodies(ctx, []bodyRef{{rid: id, it: it, a: answerBody}})
	if err != nil {
		return modelservice.Response{}, err
	}
	return modelservice.Response{Status: int(getN(it, aStatus)), ContentType: getS(it, aCType), Body: bodies[0], AnsweredAt: getTime(it, aAnsAt)}, nil
}
