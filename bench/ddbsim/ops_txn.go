package ddbsim

import (
	"crypto/sha256"
	"encoding/json"
	"strings"
	"time"
)

// Transaction limits: 100 actions, 4 MB; a client request token is
// remembered for 10 minutes.
const (
	maxTxnItems = 100
	maxTxnBytes = 4 << 20
	tokenTTL    = 10 * time.Minute
)

type txnTarget struct {
	TableName string
	Key       Item
	condIn
	ReturnValuesOnConditionCheckFailure string
}

type txnPut struct {
	TableName string
	Item      Item
	condIn
	ReturnValuesOnConditionCheckFailure string
}

type txnUpdate struct {
	txnTarget
	UpdateExpression *string
}

type txnWriteItem struct {
	ConditionCheck *txnTarget `json:",omitempty"`
	Put            *txnPut    `json:",omitempty"`
	Delete         *txnTarget `json:",omitempty"`
	Update         *txnUpdate `json:",omitempty"`
}

type transactWriteIn struct {
	TransactItems               []txnWriteItem
	ClientRequestToken          *string
	ReturnConsumedCapacity      string
	ReturnItemCollectionMetrics string
}

// txnAction is one action of a transaction, parsed.
type txnAction struct {
	table     string
	key       Item // the key (Put: the item)
	put       Item
	cnd       *cond
	upd       *update
	del       bool
	check     bool
	onFailure string
}

// tokenCache remembers the client request tokens of committed
// transactions for tokenTTL: a retry with the same token and parameters
// succeeds without acting again; other parameters are refused.
type tokenCache struct {
	m map[string]tokenEntry
	q []string
}

type tokenEntry struct {
	fp [32]byte
	at time.Time
}

func (c *tokenCache) prune(now time.Time) {
	n := 0
	for n < len(c.q) {
		e, ok := c.m[c.q[n]]
		if ok && now.Sub(e.at) < tokenTTL {
			break
		}
		delete(c.m, c.q[n])
		n++
	}
	c.q = c.q[n:]
}

func (c *tokenCache) add(tok string, fp [32]byte, now time.Time) {
	if c.m == nil {
		c.m = map[string]tokenEntry{}
	}
	c.m[tok] = tokenEntry{fp: fp, at: now}
	c.q = append(c.q, tok)
}

func parseTxnWrite(it txnWriteItem) (*txnAction, *apiError) {
	n := 0
	for _, set := range []bool{it.ConditionCheck != nil, it.Put != nil, it.Delete != nil, it.Update != nil} {
		if set {
			n++
		}
	}
	if n != 1 {
		return nil, validation("TransactItems can only contain one of Check, Put, Update or Delete")
	}
	a := &txnAction{}
	var (
		c   condIn
		err *apiError
	)
	switch {
	case it.ConditionCheck != nil:
		t := it.ConditionCheck
		a.table, a.key, a.check, a.onFailure, c = t.TableName, t.Key, true, t.ReturnValuesOnConditionCheckFailure, t.condIn
		if t.ConditionExpression == nil {
			return nil, validation("1 validation error detected: Value null at 'transactItems.member.conditionCheck.conditionExpression' failed to satisfy constraint: Member must not be null")
		}
	case it.Put != nil:
		t := it.Put
		a.table, a.put, a.onFailure, c = t.TableName, t.Item, t.ReturnValuesOnConditionCheckFailure, t.condIn
		if err := checkItem(a.put); err != nil {
			return nil, err
		}
	case it.Delete != nil:
		t := it.Delete
		a.table, a.key, a.del, a.onFailure, c = t.TableName, t.Key, true, t.ReturnValuesOnConditionCheckFailure, t.condIn
	default:
		t := it.Update
		a.table, a.key, a.onFailure, c = t.TableName, t.Key, t.ReturnValuesOnConditionCheckFailure, t.condIn
		if t.UpdateExpression == nil {
			return nil, validation("1 validation error detected: Value null at 'transactItems.member.update.updateExpression' failed to satisfy constraint: Member must not be null")
		}
	}
	if a.put == nil {
		if err := checkItem(a.key); err != nil {
			return nil, err
		}
	}
	if err := checkOnFailure(a.onFailure); err != nil {
		return nil, err
	}
	var upd *string
	if it.Update != nil {
		upd = it.Update.UpdateExpression
	}
	if a.cnd, a.upd, err = parseWriteExprs(c, upd); err != nil {
		return nil, err
	}
	return a, nil
}

func (s *Server) transactWriteItems(body []byte) (any, *apiError) {
	var in transactWriteIn
	if err := decode(body, &in); err != nil {
		return nil, err
	}
	if n := len(in.TransactItems); n == 0 || n > maxTxnItems {
		return nil, validation("1 validation error detected: Value at 'transactItems' failed to satisfy constraint: Member must have length less than or equal to 100, Member must have length greater than or equal to 1")
	}
	if len(body) > maxTxnBytes {
		return nil, validation("Transaction request size has exceeded the maximum allowed size of 4 MB")
	}
	if tok := in.ClientRequestToken; tok != nil && (len(*tok) < 1 || len(*tok) > 36) {
		return nil, validation("1 validation error detected: Value '%s' at 'clientRequestToken' failed to satisfy constraint: Member must have length less than or equal to 36", *tok)
	}
	m, err := newMeter(in.ReturnConsumedCapacity)
	if err != nil {
		return nil, err
	}
	actions := make([]*txnAction, len(in.TransactItems))
	for i, it := range in.TransactItems {
		if actions[i], err = parseTxnWrite(it); err != nil {
			return nil, err
		}
	}
	var fp [32]byte
	if in.ClientRequestToken != nil {
		b, _ := json.Marshal(in.TransactItems) // maps marshal sorted: a fingerprint of the parameters
		fp = sha256.Sum256(b)
	}
	aerr := s.locked(func(now time.Time) *apiError {
		if tok := in.ClientRequestToken; tok != nil {
			s.tokens.prune(now)
			if e, ok := s.tokens.m[*tok]; ok {
				if e.fp != fp {
					return newError(codeIdempotentMismatch, 400, "Request with the provided ClientRequestToken has different parameters than the original request")
				}
				return nil // committed already: the retry succeeds without acting
			}
		}
		ws, reasons, err := s.planTxn(actions, now)
		if err != nil {
			return err
		}
		if reasons != nil {
			return cancelled(reasons)
		}
		if i, terr := s.admitWrites(ws, now); terr != nil {
			reasons := make([]cancelReason, len(ws))
			for j := range reasons {
				reasons[j] = cancelReason{Code: reasonNone}
			}
			reasons[i] = cancelReason{Code: reasonThrottled, Message: terr.message}
			return cancelled(reasons)
		}
		s.chargeWrites(ws, now, m)
		s.commitWrites(ws, now)
		if tok := in.ClientRequestToken; tok != nil {
			s.tokens.add(*tok, fp, now)
		}
		return nil
	})
	if aerr != nil {
		return nil, aerr
	}
	out := map[string]any{}
	if l := m.list(); l != nil {
		out["ConsumedCapacity"] = l
	}
	return out, nil
}

// planTxn resolves and checks every action: the table and key, the
// condition on the stored item, the new item. It returns the writes, or
// the cancellation reasons when a condition failed or an update could not
// apply, or an error for the whole request.
func (s *Server) planTxn(actions []*txnAction, now time.Time) ([]*itemWrite, []cancelReason, *apiError) {
	ws := make([]*itemWrite, len(actions))
	reasons := make([]cancelReason, len(actions))
	failed := false
	seen := map[string]bool{}
	for i, a := range actions {
		t, err := s.table(a.table, now)
		if err != nil {
			return nil, nil, err
		}
		var hk, rk *Value
		if a.put != nil {
			if err := checkNewItem(t, a.put, false); err != nil {
				return nil, nil, err
			}
			hk, rk, _ = t.ks.keyValues(a.put, true)
		} else {
			if hk, rk, err = t.ks.tableKey(a.key); err != nil {
				return nil, nil, err
			}
			if err := checkKeyUntouched(t.ks, a.upd); err != nil {
				return nil, nil, err
			}
		}
		tkey := encodeKey(hk, rk)
		if id := a.table + "\x00" + tkey; seen[id] {
			return nil, nil, validation("Transaction request cannot include multiple operations on one item")
		} else {
			seen[id] = true
		}
		old := t.get(tkey)
		reasons[i] = cancelReason{Code: reasonNone}
		if a.cnd != nil && !a.cnd.eval(old) {
			failed = true
			reasons[i] = cancelReason{Code: reasonCondition, Message: msgConditionFailed}
			if a.onFailure == rvAllOld {
				reasons[i].Item = old
			}
			continue
		}
		switch {
		case a.check:
			// A condition check writes nothing; it costs a transactional
			// read of the item.
			ws[i] = &itemWrite{t: t, tkey: tkey, hk: hk, rk: rk, old: old, check: true}
			continue
		case a.put != nil:
			ws[i] = planWrite(t, tkey, hk, rk, old, a.put, true)
		case a.del:
			ws[i] = planWrite(t, tkey, hk, rk, old, nil, true)
		default:
			next, err := applyUpdate(t, a.upd, old, a.key)
			if err != nil {
				failed = true
				reasons[i] = cancelReason{Code: reasonValidation, Message: err.message}
				continue
			}
			ws[i] = planWrite(t, tkey, hk, rk, old, next, true)
		}
	}
	if failed {
		return nil, reasons, nil
	}
	return ws, nil, nil
}

func cancelled(reasons []cancelReason) *apiError {
	codes := make([]string, len(reasons))
	for i, r := range reasons {
		codes[i] = r.Code
	}
	e := newError(codeTxnCanceled, 400, "Transaction cancelled, please refer cancellation reasons for specific reasons [%s]", strings.Join(codes, ", "))
	e.reasons = reasons
	return e
}

type txnGet struct {
	Get struct {
		TableName                string
		Key                      Item
		ProjectionExpression     *string
		ExpressionAttributeNames map[string]string
	}
}

type transactGetIn struct {
	TransactItems          []txnGet
	ReturnConsumedCapacity string
}

func (s *Server) transactGetItems(body []byte) (any, *apiError) {
	var in transactGetIn
	if err := decode(body, &in); err != nil {
		return nil, err
	}
	if n := len(in.TransactItems); n == 0 || n > maxTxnItems {
		return nil, validation("1 validation error detected: Value at 'transactItems' failed to satisfy constraint: Member must have length less than or equal to 100, Member must have length greater than or equal to 1")
	}
	m, err := newMeter(in.ReturnConsumedCapacity)
	if err != nil {
		return nil, err
	}
	projs := make([][]docPath, len(in.TransactItems))
	for i, g := range in.TransactItems {
		if err := checkItem(g.Get.Key); err != nil {
			return nil, err
		}
		if projs[i], err = parseOptionalProjection(newExprContext(g.Get.ExpressionAttributeNames, nil), g.Get.ProjectionExpression); err != nil {
			return nil, err
		}
	}
	responses := make([]map[string]Item, len(in.TransactItems))
	aerr := s.locked(func(now time.Time) *apiError {
		type read struct {
			t    *table
			henc string
			tkey string
		}
		reads := make([]read, len(in.TransactItems))
		seen := map[string]bool{}
		for i, g := range in.TransactItems {
			t, err := s.table(g.Get.TableName, now)
			if err != nil {
				return err
			}
			hk, rk, err := t.ks.tableKey(g.Get.Key)
			if err != nil {
				return err
			}
			r := read{t: t, henc: encodeKey(hk), tkey: encodeKey(hk, rk)}
			if seen[t.name+"\x00"+r.tkey] {
				return validation("Transaction request cannot include multiple operations on one item")
			}
			seen[t.name+"\x00"+r.tkey] = true
			reads[i] = r
		}
		for i, r := range reads {
			if terr := s.admitRead(r.t, nil, r.henc, now); terr != nil {
				reasons := make([]cancelReason, len(reads))
				for j := range reasons {
					reasons[j] = cancelReason{Code: reasonNone}
				}
				reasons[i] = cancelReason{Code: reasonThrottled, Message: terr.message}
				return cancelled(reasons)
			}
		}
		for i, r := range reads {
			it := r.t.get(r.tkey)
			s.chargeRead(r.t, nil, r.henc, 2*readUnits(itemSize(it), true), now, m)
			resp := map[string]Item{}
			if it != nil {
				if projs[i] != nil {
					it = project(it, projs[i])
				}
				resp["Item"] = it
			}
			responses[i] = resp
		}
		return nil
	})
	if aerr != nil {
		return nil, aerr
	}
	out := map[string]any{"Responses": responses}
	if l := m.list(); l != nil {
		out["ConsumedCapacity"] = l
	}
	return out, nil
}
