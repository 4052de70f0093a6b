package ddbsim

import (
	"time"
)

// DynamoDB's batch limits, and its 16 MB answer.
const (
	maxBatchGet   = 100
	maxBatchWrite = 25
	maxBatchBytes = 16 << 20
)

type keysAndAttrs struct {
	Keys                     []Item
	ConsistentRead           bool              `json:",omitempty"`
	ProjectionExpression     *string           `json:",omitempty"`
	ExpressionAttributeNames map[string]string `json:",omitempty"`
	AttributesToGet          []string          `json:",omitempty"`
}

type batchGetIn struct {
	RequestItems           map[string]keysAndAttrs
	ReturnConsumedCapacity string
}

type batchGetOut struct {
	Responses        map[string][]Item
	UnprocessedKeys  map[string]keysAndAttrs
	ConsumedCapacity []consumedOut `json:",omitempty"`
}

func (s *Server) batchGetItem(body []byte) (any, *apiError) {
	var in batchGetIn
	if err := decode(body, &in); err != nil {
		return nil, err
	}
	if len(in.RequestItems) == 0 {
		return nil, validation("1 validation error detected: Value null at 'requestItems' failed to satisfy constraint: Member must have length greater than or equal to 1")
	}
	m, err := newMeter(in.ReturnConsumedCapacity)
	if err != nil {
		return nil, err
	}
	total := 0
	projs := map[string][]docPath{}
	for name, ka := range in.RequestItems {
		if err := legacy(map[string]bool{"AttributesToGet": ka.AttributesToGet != nil}); err != nil {
			return nil, err
		}
		if len(ka.Keys) == 0 {
			return nil, validation("1 validation error detected: Value '[]' at 'requestItems.%s.member.keys' failed to satisfy constraint: Member must have length greater than or equal to 1", name)
		}
		total += len(ka.Keys)
		for _, k := range ka.Keys {
			if err := checkItem(k); err != nil {
				return nil, err
			}
		}
		x := newExprContext(ka.ExpressionAttributeNames, nil)
		p, err := parseOptionalProjection(x, ka.ProjectionExpression)
		if err != nil {
			return nil, err
		}
		projs[name] = p
	}
	if total > maxBatchGet {
		return nil, validation("Too many items requested for the BatchGetItem call")
	}
	out := batchGetOut{Responses: map[string][]Item{}, UnprocessedKeys: map[string]keysAndAttrs{}}
	aerr := s.locked(func(now time.Time) *apiError {
		tables := map[string]*table{}
		for name, ka := range in.RequestItems {
			t, err := s.table(name, now)
			if err != nil {
				return err
			}
			tables[name] = t
			seen := map[string]bool{}
			for _, k := range ka.Keys {
				hk, rk, err := t.ks.tableKey(k)
				if err != nil {
					return err
				}
				tk := encodeKey(hk, rk)
				if seen[tk] {
					return validation("Provided list of item keys contains duplicates")
				}
				seen[tk] = true
			}
		}
		bytes, done := 0, 0
		var throttled *apiError
		for name, ka := range in.RequestItems {
			t := tables[name]
			got := []Item{}
			for _, k := range ka.Keys {
				hk, rk, _ := t.ks.tableKey(k)
				henc := encodeKey(hk)
				if bytes >= maxBatchBytes {
					unprocessed(out.UnprocessedKeys, name, ka, k)
					continue
				}
				if err := s.admitRead(t, nil, henc, now); err != nil {
					throttled = err
					unprocessed(out.UnprocessedKeys, name, ka, k)
					continue
				}
				it := t.get(encodeKey(hk, rk))
				s.chargeRead(t, nil, henc, readUnits(itemSize(it), ka.ConsistentRead), now, m)
				done++
				if it != nil {
					bytes += itemSize(it)
					if projs[name] != nil {
						it = project(it, projs[name])
					}
					got = append(got, it)
				}
			}
			out.Responses[name] = got
		}
		if done == 0 && throttled != nil {
			return throttled
		}
		return nil
	})
	if aerr != nil {
		return nil, aerr
	}
	out.ConsumedCapacity = m.list()
	return out, nil
}

func unprocessed(u map[string]keysAndAttrs, name string, ka keysAndAttrs, k Item) {
	e, ok := u[name]
	if !ok {
		e = keysAndAttrs{ConsistentRead: ka.ConsistentRead, ProjectionExpression: ka.ProjectionExpression, ExpressionAttributeNames: ka.ExpressionAttributeNames}
	}
	e.Keys = append(e.Keys, k)
	u[name] = e
}

type putRequest struct{ Item Item }
type deleteRequest struct{ Key Item }

type writeRequest struct {
	PutRequest    *putRequest    `json:",omitempty"`
	DeleteRequest *deleteRequest `json:",omitempty"`
}

type batchWriteIn struct {
	RequestItems                map[string][]writeRequest
	ReturnConsumedCapacity      string
	ReturnItemCollectionMetrics string
}

type batchWriteOut struct {
	UnprocessedItems map[string][]writeRequest
	ConsumedCapacity []consumedOut `json:",omitempty"`
}

func (s *Server) batchWriteItem(body []byte) (any, *apiError) {
	var in batchWriteIn
	if err := decode(body, &in); err != nil {
		return nil, err
	}
	total := 0
	for _, reqs := range in.RequestItems {
		total += len(reqs)
		for _, r := range reqs {
			switch {
			case (r.PutRequest == nil) == (r.DeleteRequest == nil):
				return nil, validation("Supplied AttributeValue has more than one datatypes set, must contain exactly one of the supported datatypes")
			case r.PutRequest != nil:
				if err := checkItem(r.PutRequest.Item); err != nil {
					return nil, err
				}
			default:
				if err := checkItem(r.DeleteRequest.Key); err != nil {
					return nil, err
				}
			}
		}
	}
	if len(in.RequestItems) == 0 || total == 0 || total > maxBatchWrite {
		return nil, validation("1 validation error detected: Value at 'requestItems' failed to satisfy constraint: Map value must satisfy constraint: [Member must have length less than or equal to 25, Member must have length greater than or equal to 1]")
	}
	m, err := newMeter(in.ReturnConsumedCapacity)
	if err != nil {
		return nil, err
	}
	out := batchWriteOut{UnprocessedItems: map[string][]writeRequest{}}
	aerr := s.locked(func(now time.Time) *apiError {
		type planned struct {
			name string
			req  writeRequest
			w    *itemWrite
		}
		var plan []planned
		for name, reqs := range in.RequestItems {
			t, err := s.table(name, now)
			if err != nil {
				return err
			}
			seen := map[string]bool{}
			for _, r := range reqs {
				var hk, rk *Value
				var next Item
				if r.PutRequest != nil {
					next = r.PutRequest.Item
					if err := checkNewItem(t, next, false); err != nil {
						return err
					}
					hk, rk, _ = t.ks.keyValues(next, true)
				} else if hk, rk, err = t.ks.tableKey(r.DeleteRequest.Key); err != nil {
					return err
				}
				tkey := encodeKey(hk, rk)
				if seen[tkey] {
					return validation("Provided list of item keys contains duplicates")
				}
				seen[tkey] = true
				plan = append(plan, planned{name: name, req: r, w: &itemWrite{t: t, tkey: tkey, hk: hk, rk: rk, new: next}})
			}
		}
		done := 0
		var throttled *apiError
		for _, p := range plan {
			w := planWrite(p.w.t, p.w.tkey, p.w.hk, p.w.rk, p.w.t.get(p.w.tkey), p.w.new, false)
			if err := s.writeOne(w, now, m); err != nil {
				throttled = err
				out.UnprocessedItems[p.name] = append(out.UnprocessedItems[p.name], p.req)
				continue
			}
			done++
		}
		if done == 0 && throttled != nil {
			return throttled
		}
		return nil
	})
	if aerr != nil {
		return nil, aerr
	}
	out.ConsumedCapacity = m.list()
	return out, nil
}
