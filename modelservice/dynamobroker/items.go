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
	aQBody    = "qb"       // B: the request body when inline
	aQChunks  = "qn"       // N: the request body's chunk count otherwise
	aQSize    = "qs"       // N: the request body's size
	aStatus   = "rs"       // N
	aCType    = "rct"      //
	aAnsAt    = "rat"      // N, unix ms
	aABody    = "ab"       // B: the answer body when inline
	aAChunks  = "an"       // N: the answer body's chunk count otherwise
	aASize    = "as"       // N
	aAnsID    = "aid"      // the answer's id (its chunk keys)
	aQOwner   = "qo"       // GSI queue hash: present while pending or claimed
	aQKey     = "qk"       // GSI queue range: visible-at ms (13 digits) "#" rid
	aData     = "d"        // B: one chunk's bytes
)

func metaKey(rid string) item {
	return item{attrPK: s("R#" + rid), attrSK: s("M")}
}

func chunkKey(rid, prefix string, i int) item {
	return item{attrPK: s("R#" + rid), attrSK: s(fmt.Sprintf("%s%05d", prefix, i))}
}

func inboxKey(replica, rid string) item {
	return item{attrPK: s("N#" + replica), attrSK: s(rid)}
}

// queueKey is the queue index's range key of rid, visible from at.
func queueKey(at time.Time, rid string) string {
	return fmt.Sprintf("%013d#%s", at.UnixMilli(), rid)
}

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

// setBody puts body into it: inline when small, otherwise as chunk items
// (returned, to be written before it) under prefix.
func setBody(it item, rid, prefix, inlineAttr, chunksAttr, sizeAttr string, body []byte, ttl types.AttributeValue) []item {
	it[sizeAttr] = n(int64(len(body)))
	if len(body) <= inlineLimit {
		it[inlineAttr] = b(body)
		return nil
	}
	var chunks []item
	for i := 0; len(body) > 0; i++ {
		size := min(chunkSize, len(body))
		c := chunkKey(rid, prefix, i)
		c[aData], c[attrTTL] = b(body[:size]), ttl
		chunks = append(chunks, c)
		body = body[size:]
	}
	it[chunksAttr] = n(int64(len(chunks)))
	return chunks
}

// writeChunks writes chunk items, 25 per batch, retrying what DynamoDB
// leaves unprocessed (with backoff, bounded by ctx).
func (br *Broker) writeChunks(ctx context.Context, chunks []item) error {
	for len(chunks) > 0 {
		batch := chunks[:min(25, len(chunks))]
		chunks = chunks[len(batch):]
		reqs := make([]types.WriteRequest, 0, len(batch))
		for _, c := range batch {
			reqs = append(reqs, types.WriteRequest{PutRequest: &types.PutRequest{Item: c}})
		}
		if err := br.batchWrite(ctx, reqs); err != nil {
			return err
		}
	}
	return nil
}

// deleteItems deletes items by key (best effort, for orphans).
func (br *Broker) deleteItems(ctx context.Context, keys []item) error {
	for len(keys) > 0 {
		batch := keys[:min(25, len(keys))]
		keys = keys[len(batch):]
		reqs := make([]types.WriteRequest, 0, len(batch))
		for _, k := range batch {
			reqs = append(reqs, types.WriteRequest{DeleteRequest: &types.DeleteRequest{Key: item{attrPK: k[attrPK], attrSK: k[attrSK]}}})
		}
		if err := br.batchWrite(ctx, reqs); err != nil {
			return err
		}
	}
	return nil
}

func (br *Broker) batchWrite(ctx context.Context, reqs []types.WriteRequest) error {
	pause := 10 * time.Millisecond
	for len(reqs) > 0 {
		cctx, cancel := context.WithTimeout(ctx, br.cfg.CallTimeout)
		out, err := br.api.BatchWriteItem(cctx, &dynamodb.BatchWriteItemInput{RequestItems: map[string][]types.WriteRequest{br.cfg.Table: reqs}})
		cancel()
		if err != nil {
			return translate("write items", err)
		}
		reqs = out.UnprocessedItems[br.cfg.Table]
		if len(reqs) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return translate("write items", ctx.Err())
		case <-time.After(pause):
		}
		pause = min(2*pause, time.Second)
	}
	return nil
}

// loadBody returns the body whose inline attribute or chunks it describes.
func (br *Broker) loadBody(ctx context.Context, it item, rid, prefix, inlineAttr, chunksAttr string) ([]byte, error) {
	if v, ok := it[inlineAttr]; ok {
		bv, _ := v.(*types.AttributeValueMemberB)
		if bv == nil {
			return []byte{}, nil
		}
		return bv.Value, nil
	}
	count := int(getN(it, chunksAttr))
	if count == 0 {
		return []byte{}, nil
	}
	var out bytes.Buffer
	var start item
	got := 0
	for {
		cctx, cancel := context.WithTimeout(ctx, br.cfg.CallTimeout)
		res, err := br.api.Query(cctx, &dynamodb.QueryInput{
			TableName:                 aws.String(br.cfg.Table),
			KeyConditionExpression:    aws.String("pk = :pk AND begins_with(sk, :pre)"),
			ExpressionAttributeValues: item{":pk": s("R#" + rid), ":pre": s(prefix)},
			ConsistentRead:            aws.Bool(true),
			ExclusiveStartKey:         start,
		})
		cancel()
		if err != nil {
			return nil, translate("read body chunks", err)
		}
		for _, c := range res.Items {
			out.Write(getB(c, aData))
			got++
		}
		if len(res.LastEvaluatedKey) == 0 {
			break
		}
		start = res.LastEvaluatedKey
	}
	if got != count {
		return nil, fmt.Errorf("read body of %s: %d of %d chunks found: %w", rid, got, count, modelservice.ErrUnavailable)
	}
	return out.Bytes(), nil
}
