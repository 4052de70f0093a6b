package dynamostore

import (
	"context"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/quarryhq/quarry/warmpool"
)

var _ warmpool.Locker = (*Store)(nil)

// TryLock implements warmpool.Locker: one UpdateItem on the lock's item,
// conditional on the lock being free, expired (expires_at <= now) or held
// by holder already. The item carries a TTL past its expiry, for garbage
// collection only.
func (s *Store) TryLock(ctx context.Context, name, holder string, ttl time.Duration, now time.Time) (bool, error) {
	const action = "try lock"
	if err := warmpool.CheckLock(name, holder, ttl); err != nil {
		return false, err
	}
	if err := s.begin(ctx, action); err != nil {
		return false, err
	}
	expires := now.Add(ttl)
	e := newExpr()
	e.Set(fHolder, avS(holder))
	e.Set(fExpiresAt, avTime(expires))
	e.Set(attrTTL, avN(ttlOf(expires, s.cfg.EndedTTL)))
	cond := "attribute_not_exists(" + e.n(attrPK) + ") OR " + e.n(fHolder) + " = " + e.v(avS(holder)) +
		" OR " + e.n(fExpiresAt) + " <= " + e.v(avTime(now))
	_, err := s.db.updateItem(ctx, &dynamodb.UpdateItemInput{
		TableName: ptr(s.cfg.LeasesTable), Key: key(lockPK(name)), UpdateExpression: e.update(),
		ConditionExpression: &cond, ExpressionAttributeNames: e.Names(), ExpressionAttributeValues: e.Values(),
	})
	if _, ok := isConditionFailed(err); ok {
		return false, nil
	}
	if err != nil {
		return false, translate(action, err)
	}
	return true, nil
}

// Unlock implements warmpool.Locker: one DeleteItem conditional on holder
// holding the lock. It is idempotent.
func (s *Store) Unlock(ctx context.Context, name, holder string) error {
	const action = "unlock"
	if err := s.begin(ctx, action); err != nil {
		return err
	}
	e := newExpr()
	cond := e.n(fHolder) + " = " + e.v(avS(holder))
	_, err := s.db.deleteItem(ctx, &dynamodb.DeleteItemInput{
		TableName: ptr(s.cfg.LeasesTable), Key: key(lockPK(name)), ConditionExpression: &cond,
		ExpressionAttributeNames: e.Names(), ExpressionAttributeValues: e.Values(),
	})
	if _, ok := isConditionFailed(err); ok {
		return nil
	}
	return translate(action, err)
}
