package dynamobroker

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/quarryhq/quarry/modelservice"
)

// item is one DynamoDB item.
type item = map[string]types.AttributeValue

// Attribute names of a request's meta item (pk "R#<rid>", sk "M").
const (
	aLease    = "lease"    // GSI by-lease hash
	aRID      = "rid"      // GSI by-lease range
	aOwner    = "owner"    //
	aPool     = "pool"     //
	aLabels   = "labels"   // M of S
	aRoute    = "route"    //
	aStream   = "stream"   // BOOL
	aRecv     = "recv"     // N, unix ms
	aDeadline = "deadline" // N, unix ms
	aKeep     = "keep"     // N, unix ms: the end of the retention
	aState    = "st"       //
	aAttempt  = "attempt"  // N
	aClaimed  = "claimed"  // N, unix ms
	aEnded    = "ended"    // N, unix ms
	aReason   = "reason"   //
	aUpstream = "upstream" //
	aTrunc    = "trunc"    // BOOL
	aReplica  = "repl"     // the submitting replica (its inbox gets the answer's notice)
	aQBody    = "qb"       // B: the request body inline (items of the first schema only)
	aQChunks  = "qn"       // N: the request body's chunk count
	aQSize    = "qs"       // N: the request body's size
	aQID      = "qid"      // the request body's id (its chunk keys "Q#<qid>#…"; absent on old items, whose chunks are "Q#…")
	aStatus   = "rs"       // N
	aCType    = "rct"      //
	aAnsAt    = "rat"      // N, unix ms
	aABody    = "ab"       // B: the answer body when inline
	aAChunks  = "an"       // N: the answer body's chunk count otherwise
	aASize    = "as"       // N
	aAnsID    = "aid"      // the answer's id (its chunk keys)
	aQPart    = "qp"       // GSI queue-by-shard hash: owner "#" shard, present while pending or claimed
	aQKey     = "qk"       // GSI queue-by-shard range: visible-at ms (13 digits) "#" rid
	aQOwner   = "qo"       // the first schema's queue hash (owner alone): removed when an old item ends
	aData     = "d"        // B: one chunk's bytes
	aIDs      = "ids"      // L of S: the request ids of a notice batch
)

func metaKey(rid string) item {
	return item{attrPK: s("R#" + rid), attrSK: s("M")}
}

func chunkKey(rid, prefix string, i int) item {
	return item{attrPK: s("R#" + rid), attrSK: s(fmt.Sprintf("%s%05d", prefix, i))}
}

// inboxPK is the partition key of replica's inbox of notices.
func inboxPK(replica string) string { return "N#" + replica }

func s(v string) types.AttributeValue { return &types.AttributeValueMemberS{Value: v} }
func n(v int64) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: strconv.FormatInt(v, 10)}
}
func b(v []byte) types.AttributeValue     { return &types.AttributeValueMemberB{Value: v} }
func bl(v bool) types.AttributeValue      { return &types.AttributeValueMemberBOOL{Value: v} }
func ms(t time.Time) types.AttributeValue { return n(t.UnixMilli()) }

func getS(it item, k string) string {
	if v, ok := it[k].(*types.AttributeValueMemberS); ok {
		return v.Value
	}
	return ""
}

func getN(it item, k string) int64 {
	if v, ok := it[k].(*types.AttributeValueMemberN); ok {
		x, _ := strconv.ParseInt(v.Value, 10, 64)
		return x
	}
	return 0
}

func getB(it item, k string) []byte {
	if v, ok := it[k].(*types.AttributeValueMemberB); ok {
		return v.Value
	}
	return nil
}

func getBool(it item, k string) bool {
	v, ok := it[k].(*types.AttributeValueMemberBOOL)
	return ok && v.Value
}

func getTime(it item, k string) time.Time {
	x := getN(it, k)
	if x == 0 {
		return time.Time{}
	}
	return time.UnixMilli(x).UTC()
}

func getLabels(it item) map[string]string {
	m, ok := it[aLabels].(*types.AttributeValueMemberM)
	if !ok || len(m.Value) == 0 {
		return nil
	}
	out := make(map[string]string, len(m.Value))
	for k, v := range m.Value {
		if sv, ok := v.(*types.AttributeValueMemberS); ok {
			out[k] = sv.Value
		}
	}
	return out
}

func labelsAttr(labels map[string]string) types.AttributeValue {
	m := make(map[string]types.AttributeValue, len(labels))
	for k, v := range labels {
		m[k] = s(v)
	}
	return &types.AttributeValueMemberM{Value: m}
}

// requestOf decodes the request fields of a meta item (not its body).
func requestOf(it item) modelservice.Request {
	return modelservice.Request{
		ID: getS(it, aRID), LeaseID: getS(it, aLease), Owner: getS(it, aOwner), Pool: getS(it, aPool),
		Labels: getLabels(it), Route: getS(it, aRoute), Stream: getBool(it, aStream),
		ReceivedAt: getTime(it, aRecv), Deadline: getTime(it, aDeadline), Attempt: int(getN(it, aAttempt)),
	}
}

// exchangeOf decodes a meta item without bodies.
func exchangeOf(it item) modelservice.Exchange {
	ex := modelservice.Exchange{
		Request: requestOf(it), State: modelservice.State(getS(it, aState)), Reason: getS(it, aReason),
		Upstream: getS(it, aUpstream), ClaimedAt: getTime(it, aClaimed), EndedAt: getTime(it, aEnded),
		Truncated: getBool(it, aTrunc),
	}
	if _, ok := it[aStatus]; ok {
		ex.Response = &modelservice.Response{Status: int(getN(it, aStatus)), ContentType: getS(it, aCType), AnsweredAt: getTime(it, aAnsAt)}
	}
	return ex
}

// bodyAttrs names the attributes of a meta item that say where one of its
// bodies is: inline in attribute inline, or split into chunks items whose
// sort keys start with prefix, then id and "#" (old request items have no
// id: their chunks are prefix alone).
type bodyAttrs struct {
	inline, chunks, size, id, prefix string
}

var (
	requestBody = bodyAttrs{inline: aQBody, chunks: aQChunks, size: aQSize, id: aQID, prefix: "Q#"}
	answerBody  = bodyAttrs{inline: aABody, chunks: aAChunks, size: aASize, id: aAnsID, prefix: "A#"}
)

// chunkPrefix is the sort-key prefix of the chunk items of it's body.
func (a bodyAttrs) chunkPrefix(it item) string {
	if id := getS(it, a.id); id != "" {
		return a.prefix + id + "#"
	}
	return a.prefix
}

// setBody records body in it under id: inline when it is at most inline
// bytes (a negative inline: never), otherwise as chunk items (returned, to
// be written before it).
func setBody(it item, rid string, a bodyAttrs, id string, body []byte, inline int, ttl types.AttributeValue) []item {
	it[a.size] = n(int64(len(body)))
	it[a.id] = s(id)
	if len(body) <= inline {
		it[a.inline] = b(body)
		return nil
	}
	prefix := a.chunkPrefix(it)
	var chunks []item
	for i := 0; len(body) > 0; i++ {
		size := min(chunkSize, len(body))
		c := chunkKey(rid, prefix, i)
		c[aData], c[attrTTL] = b(body[:size]), ttl
		chunks = append(chunks, c)
		body = body[size:]
	}
	it[a.chunks] = n(int64(len(chunks)))
	return chunks
}

// writeChunks writes chunk items, 25 per batch, retrying what DynamoDB
// leaves unprocessed (with backoff, bounded by ctx).
func (br *Broker) writeChunks(ctx context.Context, chunks []item) error {
	return br.batchWrite(ctx, chunks, func(c item) types.WriteRequest {
		return types.WriteRequest{PutRequest: &types.PutRequest{Item: c}}
	})
}

// deleteItems deletes items by key (best effort, for orphans).
func (br *Broker) deleteItems(ctx context.Context, keys []item) error {
	return br.batchWrite(ctx, keys, func(k item) types.WriteRequest {
		return types.WriteRequest{DeleteRequest: &types.DeleteRequest{Key: item{attrPK: k[attrPK], attrSK: k[attrSK]}}}
	})
}

// batchWrite writes one request per item, 25 per BatchWriteItem.
func (br *Broker) batchWrite(ctx context.Context, items []item, req func(item) types.WriteRequest) error {
	for len(items) > 0 {
		batch := items[:min(25, len(items))]
		items = items[len(batch):]
		reqs := make([]types.WriteRequest, 0, len(batch))
		for _, it := range batch {
			reqs = append(reqs, req(it))
		}
		err := br.untilProcessed(ctx, "write items", func(ctx context.Context) (bool, error) {
			out, err := br.api.BatchWriteItem(ctx, &dynamodb.BatchWriteItemInput{RequestItems: map[string][]types.WriteRequest{br.cfg.Table: reqs}})
			if err != nil {
				return false, err
			}
			reqs = out.UnprocessedItems[br.cfg.Table]
			return len(reqs) > 0, nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// untilProcessed runs one batch call (each bounded by CallTimeout) until it
// reports nothing left unprocessed, pausing with backoff in between
// (bounded by ctx).
func (br *Broker) untilProcessed(ctx context.Context, action string, call func(ctx context.Context) (more bool, err error)) error {
	pause := 10 * time.Millisecond
	for {
		cctx, cancel := context.WithTimeout(ctx, br.cfg.CallTimeout)
		more, err := call(cctx)
		cancel()
		if err != nil {
			return translate(action, err)
		}
		if !more {
			return nil
		}
		select {
		case <-ctx.Done():
			return translate(action, ctx.Err())
		case <-time.After(pause):
		}
		pause = min(2*pause, time.Second)
	}
}

// bodyRef is one body to load: the one a of meta item it of request rid
// describes.
type bodyRef struct {
	rid string
	it  item
	a   bodyAttrs
}

// loadBodies returns the bodies refs describe, in order: inline ones from
// their items, chunked ones with consistent BatchGetItem calls (100 keys
// each) for all of them at once. A missing chunk is ErrUnavailable.
func (br *Broker) loadBodies(ctx context.Context, refs []bodyRef) ([][]byte, error) {
	out := make([][]byte, len(refs))
	var keys []item
	for i, ref := range refs {
		if v, ok := ref.it[ref.a.inline]; ok {
			out[i] = []byte{}
			if bv, _ := v.(*types.AttributeValueMemberB); bv != nil {
				out[i] = bv.Value
			}
			continue
		}
		prefix := ref.a.chunkPrefix(ref.it)
		for c := range int(getN(ref.it, ref.a.chunks)) {
			keys = append(keys, chunkKey(ref.rid, prefix, c))
		}
	}
	got, err := br.batchGet(ctx, keys)
	if err != nil {
		return nil, err
	}
	for i, ref := range refs {
		if out[i] != nil {
			continue
		}
		count := int(getN(ref.it, ref.a.chunks))
		var body bytes.Buffer
		found := 0
		prefix := ref.a.chunkPrefix(ref.it)
		for c := range count {
			if data, ok := got[keyString(chunkKey(ref.rid, prefix, c))]; ok {
				body.Write(data)
				found++
			}
		}
		if found != count {
			return nil, fmt.Errorf("read body of %s: %d of %d chunks found: %w", ref.rid, found, count, modelservice.ErrUnavailable)
		}
		out[i] = body.Bytes()
		if out[i] == nil {
			out[i] = []byte{}
		}
	}
	return out, nil
}

func keyString(k item) string { return getS(k, attrPK) + "\x00" + getS(k, attrSK) }

// batchGet reads the chunk data of keys (strongly consistent: a body is
// written just before its meta item), 100 keys per BatchGetItem, retrying
// what DynamoDB leaves unprocessed.
func (br *Broker) batchGet(ctx context.Context, keys []item) (map[string][]byte, error) {
	got := make(map[string][]byte, len(keys))
	for len(keys) > 0 {
		batch := keys[:min(100, len(keys))]
		keys = keys[len(batch):]
		req := &types.KeysAndAttributes{Keys: batch, ConsistentRead: aws.Bool(true),
			ProjectionExpression:     aws.String("#k, #s, #d"),
			ExpressionAttributeNames: map[string]string{"#k": attrPK, "#s": attrSK, "#d": aData}}
		err := br.untilProcessed(ctx, "read bodies", func(ctx context.Context) (bool, error) {
			out, err := br.api.BatchGetItem(ctx, &dynamodb.BatchGetItemInput{RequestItems: map[string]types.KeysAndAttributes{br.cfg.Table: *req}})
			if err != nil {
				return false, err
			}
			for _, it := range out.Responses[br.cfg.Table] {
				got[keyString(it)] = getB(it, aData)
			}
			left, ok := out.UnprocessedKeys[br.cfg.Table]
			if !ok || len(left.Keys) == 0 {
				return false, nil
			}
			req = &left
			return true, nil
		})
		if err != nil {
			return nil, err
		}
	}
	return got, nil
}
