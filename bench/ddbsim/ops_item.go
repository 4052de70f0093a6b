package ddbsim

import (
	"slices"
	"time"
)

// Values of ReturnValues and ReturnValuesOnConditionCheckFailure.
const (
	rvNone       = "NONE"
	rvAllOld     = "ALL_OLD"
	rvUpdatedOld = "UPDATED_OLD"
	rvAllNew     = "ALL_NEW"
	rvUpdatedNew = "UPDATED_NEW"
)

func checkReturnValues(rv string, allowed ...string) *apiError {
	if rv == "" || slices.Contains(allowed, rv) {
		return nil
	}
	return validation("Return values set to invalid value")
}

func checkOnFailure(rv string) *apiError {
	switch rv {
	case "", rvNone, rvAllOld:
		return nil
	}
	return validation("1 validation error detected: Value '%s' at 'returnValuesOnConditionCheckFailure' failed to satisfy constraint: Member must satisfy enum value set: [ALL_OLD, NONE]", rv)
}

// itemOut is the answer of the item operations.
type itemOut struct {
	Item             Item         `json:",omitempty"`
	Attributes       Item         `json:",omitempty"`
	ConsumedCapacity *consumedOut `json:",omitempty"`
}

type getItemIn struct {
	TableName                string
	Key                      Item
	ConsistentRead           bool
	ProjectionExpression     *string
	ExpressionAttributeNames map[string]string
	ReturnConsumedCapacity   string
	AttributesToGet          []string
}

func (s *Server) getItem(body []byte) (any, *apiError) {
	var in getItemIn
	if err := decode(body, &in); err != nil {
		return nil, err
	}
	if err := legacy(map[string]bool{"AttributesToGet": in.AttributesToGet != nil}); err != nil {
		return nil, err
	}
	if err := checkItem(in.Key); err != nil {
		return nil, err
	}
	m, err := newMeter(in.ReturnConsumedCapacity)
	if err != nil {
		return nil, err
	}
	x := newExprContext(in.ExpressionAttributeNames, nil)
	proj, err := parseOptionalProjection(x, in.ProjectionExpression)
	if err != nil {
		return nil, err
	}
	var it Item
	aerr := s.locked(func(now time.Time) *apiError {
		t, err := s.table(in.TableName, now)
		if err != nil {
			return err
		}
		hk, rk, err := t.ks.tableKey(in.Key)
		if err != nil {
			return err
		}
		henc := encodeKey(hk)
		if err := s.admitRead(t, nil, henc, now); err != nil {
			return err
		}
		it = t.get(encodeKey(hk, rk))
		s.chargeRead(t, nil, henc, readUnits(itemSize(it), in.ConsistentRead), now, m)
		return nil
	})
	if aerr != nil {
		return nil, aerr
	}
	if proj != nil {
		it = project(it, proj)
	}
	return itemOut{Item: it, ConsumedCapacity: m.one(in.TableName)}, nil
}

// parseOptionalProjection parses a ProjectionExpression when given, and
// checks the request's placeholders (every one must be used).
func parseOptionalProjection(x *exprContext, src *string) ([]docPath, *apiError) {
	if err := x.checkInputs(); err != nil {
		return nil, err
	}
	var proj []docPath
	if src != nil {
		var err *apiError
		if proj, err = parseProjection(x, *src); err != nil {
			return nil, err
		}
	}
	return proj, x.checkUnused()
}

// condIn holds the condition parameters of a write.
type condIn struct {
	ConditionExpression       *string
	ExpressionAttributeNames  map[string]string
	ExpressionAttributeValues map[string]*Value
}

// parseWriteExprs parses a write's condition and update expressions and
// checks its placeholders.
func parseWriteExprs(c condIn, updateSrc *string) (*cond, *update, *apiError) {
	x := newExprContext(c.ExpressionAttributeNames, c.ExpressionAttributeValues)
	if err := x.checkInputs(); err != nil {
		return nil, nil, err
	}
	var (
		cnd *cond
		upd *update
		err *apiError
	)
	if updateSrc != nil {
		if upd, err = parseUpdate(x, *updateSrc); err != nil {
			return nil, nil, err
		}
	}
	if c.ConditionExpression != nil {
		if cnd, err = parseCondition(x, kindCondition, *c.ConditionExpression); err != nil {
			return nil, nil, err
		}
	}
	return cnd, upd, x.checkUnused()
}

// writeIn is what PutItem, UpdateItem and DeleteItem share.
type writeIn struct {
	TableName string
	condIn
	ReturnValues                        string
	ReturnValuesOnConditionCheckFailure string
	ReturnConsumedCapacity              string
	ReturnItemCollectionMetrics         string
	Expected                            map[string]any
	ConditionalOperator                 string
}

// prepare checks a write's parameters (item: its Item or Key; returnValues:
// what ReturnValues may be) and parses its expressions.
func (in *writeIn) prepare(item Item, updateSrc *string, returnValues ...string) (*meter, *cond, *update, *apiError) {
	if err := legacy(map[string]bool{"Expected": in.Expected != nil, "ConditionalOperator": in.ConditionalOperator != ""}); err != nil {
		return nil, nil, nil, err
	}
	if err := checkReturnValues(in.ReturnValues, returnValues...); err != nil {
		return nil, nil, nil, err
	}
	if err := checkOnFailure(in.ReturnValuesOnConditionCheckFailure); err != nil {
		return nil, nil, nil, err
	}
	if err := checkItem(item); err != nil {
		return nil, nil, nil, err
	}
	m, err := newMeter(in.ReturnConsumedCapacity)
	if err != nil {
		return nil, nil, nil, err
	}
	cnd, upd, err := parseWriteExprs(in.condIn, updateSrc)
	return m, cnd, upd, err
}

// conditionalWrite writes next(old) at t's key unless cnd fails on old
// (the stored item, nil when none), which is a
// ConditionalCheckFailedException (charged all the same).
func (s *Server) conditionalWrite(t *table, hk, rk *Value, old Item, cnd *cond, onFailure string, now time.Time, m *meter,
	next func() (Item, *apiError)) *apiError {
	if cnd != nil && !cnd.eval(old) {
		if _, err := s.admitWrites([]*itemWrite{{t: t, hk: hk}}, now); err != nil {
			return err
		}
		s.chargeFailedWrite(t, hk, old, false, now, m)
		if onFailure == rvAllOld {
			return conditionFailed(old)
		}
		return conditionFailed(nil)
	}
	it, err := next()
	if err != nil {
		return err
	}
	return s.writeOne(planWrite(t, encodeKey(hk, rk), hk, rk, old, it, false), now, m)
}

type putItemIn struct {
	writeIn
	Item Item
}

func (s *Server) putItem(body []byte) (any, *apiError) {
	var in putItemIn
	if err := decode(body, &in); err != nil {
		return nil, err
	}
	m, cnd, _, err := in.prepare(in.Item, nil, rvNone, rvAllOld)
	if err != nil {
		return nil, err
	}
	var old Item
	aerr := s.locked(func(now time.Time) *apiError {
		t, err := s.table(in.TableName, now)
		if err != nil {
			return err
		}
		if err := checkNewItem(t, in.Item, false); err != nil {
			return err
		}
		hk, rk, _ := t.ks.keyValues(in.Item, true)
		old = t.get(encodeKey(hk, rk))
		return s.conditionalWrite(t, hk, rk, old, cnd, in.ReturnValuesOnConditionCheckFailure, now, m, func() (Item, *apiError) { return in.Item, nil })
	})
	if aerr != nil {
		return nil, aerr
	}
	out := itemOut{ConsumedCapacity: m.one(in.TableName)}
	if in.ReturnValues == rvAllOld {
		out.Attributes = old
	}
	return out, nil
}

// writeOne admits, charges and commits one write.
func (s *Server) writeOne(w *itemWrite, now time.Time, m *meter) *apiError {
	ws := []*itemWrite{w}
	if _, err := s.admitWrites(ws, now); err != nil {
		return err
	}
	s.chargeWrites(ws, now, m)
	s.commitWrites(ws, now)
	return nil
}

type updateItemIn struct {
	writeIn
	Key              Item
	UpdateExpression *string
	AttributeUpdates map[string]any
}

func (s *Server) updateItem(body []byte) (any, *apiError) {
	var in updateItemIn
	if err := decode(body, &in); err != nil {
		return nil, err
	}
	if err := legacy(map[string]bool{"AttributeUpdates": in.AttributeUpdates != nil}); err != nil {
		return nil, err
	}
	m, cnd, upd, err := in.prepare(in.Key, in.UpdateExpression, rvNone, rvAllOld, rvUpdatedOld, rvAllNew, rvUpdatedNew)
	if err != nil {
		return nil, err
	}
	var old, next Item
	aerr := s.locked(func(now time.Time) *apiError {
		t, err := s.table(in.TableName, now)
		if err != nil {
			return err
		}
		hk, rk, err := t.ks.tableKey(in.Key)
		if err != nil {
			return err
		}
		if err := checkKeyUntouched(t.ks, upd); err != nil {
			return err
		}
		old = t.get(encodeKey(hk, rk))
		return s.conditionalWrite(t, hk, rk, old, cnd, in.ReturnValuesOnConditionCheckFailure, now, m, func() (Item, *apiError) {
			next, err = applyUpdate(t, upd, old, in.Key)
			return next, err
		})
	})
	if aerr != nil {
		return nil, aerr
	}
	out := itemOut{ConsumedCapacity: m.one(in.TableName)}
	switch in.ReturnValues {
	case rvAllOld:
		out.Attributes = old
	case rvAllNew:
		out.Attributes = next
	case rvUpdatedOld, rvUpdatedNew:
		if upd != nil {
			src := old
			if in.ReturnValues == rvUpdatedNew {
				src = next
			}
			out.Attributes = project(src, upd.paths())
		}
	}
	if len(out.Attributes) == 0 {
		out.Attributes = nil
	}
	return out, nil
}

// checkKeyUntouched refuses an update of a key attribute.
func checkKeyUntouched(ks keySchema, upd *update) *apiError {
	if upd == nil {
		return nil
	}
	for _, p := range upd.paths() {
		for _, k := range ks.names() {
			if p[0].name == k {
				return validation("One or more parameter values were invalid: Cannot update attribute %s. This attribute is part of the key", k)
			}
		}
	}
	return nil
}

// applyUpdate returns the item old becomes (a new item from key when old
// is nil: UpdateItem creates what it does not find), checked for t.
func applyUpdate(t *table, upd *update, old, key Item) (Item, *apiError) {
	var next Item
	if upd == nil {
		next = copyItem(old)
		for k, v := range key {
			next[k] = v
		}
	} else {
		var err *apiError
		if next, err = upd.apply(old, key); err != nil {
			return nil, err
		}
	}
	if err := checkNewItem(t, next, true); err != nil {
		return nil, err
	}
	return next, nil
}

type deleteItemIn struct {
	writeIn
	Key Item
}

func (s *Server) deleteItem(body []byte) (any, *apiError) {
	var in deleteItemIn
	if err := decode(body, &in); err != nil {
		return nil, err
	}
	m, cnd, _, err := in.prepare(in.Key, nil, rvNone, rvAllOld)
	if err != nil {
		return nil, err
	}
	var old Item
	aerr := s.locked(func(now time.Time) *apiError {
		t, err := s.table(in.TableName, now)
		if err != nil {
			return err
		}
		hk, rk, err := t.ks.tableKey(in.Key)
		if err != nil {
			return err
		}
		old = t.get(encodeKey(hk, rk))
		return s.conditionalWrite(t, hk, rk, old, cnd, in.ReturnValuesOnConditionCheckFailure, now, m, func() (Item, *apiError) { return nil, nil })
	})
	if aerr != nil {
		return nil, aerr
	}
	out := itemOut{ConsumedCapacity: m.one(in.TableName)}
	if in.ReturnValues == rvAllOld {
		out.Attributes = old
	}
	return out, nil
}
