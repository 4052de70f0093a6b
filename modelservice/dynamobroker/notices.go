package dynamobroker

import (
	"context"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"golang.org/x/sync/errgroup"
)

// Bounds of the notices an answering replica sends to waiting replicas.
const (
	// maxQueuedNotices bounds the ids queued for the flusher; past it a
	// notice is dropped (logged) and its call learns of its answer at its
	// next recheck.
	maxQueuedNotices = 10000
	// maxNoticeIDs bounds the ids of one notice item (~40 KB).
	maxNoticeIDs = 1000
)

// notify tells the replica that submitted rid that it ended: directly when
// that is this replica, otherwise by queueing rid for the flusher, which
// writes what is queued for one replica as one item in its inbox (best
// effort: the waiting call also rechecks its request).
func (br *Broker) notify(replica, rid string) {
	if replica == br.replica {
		br.wake(rid)
		return
	}
	br.mu.Lock()
	defer br.mu.Unlock()
	if br.queued >= maxQueuedNotices {
		br.log.Warn("drop an answer notice: the notice queue is full; the waiting call finds the answer at its next recheck",
			"limit", maxQueuedNotices, "request", rid, "replica", replica)
		return
	}
	br.notices[replica] = append(br.notices[replica], rid)
	br.queued++
	if !br.flushing {
		br.flushing = true
		br.wg.Add(1)
		go br.flushNotices()
	}
}

// flushNotices writes the queued notices until none is queued: each round
// takes everything queued and writes one item per waiting replica (per
// maxNoticeIDs ids), several at once. Notices queued while a round writes
// go in the next one, so a busy replica writes few, large items (group
// commit) and an idle one writes each notice at once.
func (br *Broker) flushNotices() {
	defer br.wg.Done()
	for {
		br.mu.Lock()
		batch := br.notices
		if len(batch) == 0 {
			br.flushing = false
			br.mu.Unlock()
			return
		}
		br.notices, br.queued = map[string][]string{}, 0
		br.mu.Unlock()
		var g errgroup.Group
		g.SetLimit(maxParallel)
		for replica, ids := range batch {
			for len(ids) > 0 {
				part := ids[:min(maxNoticeIDs, len(ids))]
				ids = ids[len(part):]
				g.Go(func() error {
					br.writeNotice(replica, part)
					return nil
				})
			}
		}
		_ = g.Wait()
	}
}

// writeNotice puts one notice item naming ids into replica's inbox
// (bounded by CallTimeout; a failure is logged: the calls recheck).
func (br *Broker) writeNotice(replica string, ids []string) {
	list := make([]types.AttributeValue, len(ids))
	for i, id := range ids {
		list[i] = s(id)
	}
	_, ttl := br.keep(br.now())
	it := item{attrPK: s(inboxPK(replica)), attrSK: s(fmt.Sprintf("%013d#%s", br.now().UnixMilli(), newID(6))),
		aIDs: &types.AttributeValueMemberL{Value: list}, attrTTL: ttl}
	ctx, cancel := context.WithTimeout(context.Background(), br.cfg.CallTimeout)
	defer cancel()
	if _, err := br.api.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(br.cfg.Table), Item: it}); err != nil {
		br.log.Warn("notify the waiting replica", "replica", replica, "requests", len(ids), "err", err)
	}
}
