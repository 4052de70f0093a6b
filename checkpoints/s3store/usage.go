package s3store

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/quarryhq/quarry/checkpoints"
	"github.com/quarryhq/quarry/internal/awserr"
)

// The budget's accounting (checkpoints.Budget): two kinds of counter item
// in the checkpoint table, usagePK(owner) and usageTotalPK, each with its
// bytes. Each checkpoint is its own object, so each counts its size. A
// Put's ready transaction adds the size to both, on the condition that
// neither passes its limit; the transaction that deletes a deleting item
// takes what the item counted away. Both counters are in every such
// transaction, so concurrent Puts are checked against each other's counts,
// and a crash leaves nothing counted that is not a ready or deleting item.
// The total is one item: DynamoDB serves one item about 1,000 writes a
// second, and a transaction writes twice, so the store takes about 500
// checkpoints and removals a second in all (conflicts are retried).

// transactTries bounds the tries of one transaction that DynamoDB cancels
// for a conflicting transaction in flight or throttling; readyTries the
// tries of a Put's commit refused for a budget that had room by the time
// the refusal was read.
const (
	transactTries = 8
	readyTries    = 3
)

// ambiguousError is a failed commit whose answer does not say whether it
// happened (a timeout, a connection lost).
type ambiguousError struct{ err error }

func (e *ambiguousError) Error() string { return e.err.Error() }
func (e *ambiguousError) Unwrap() error { return e.err }

// counts returns the updates of owner's usage and the total by n bytes;
// when n adds, each is on the condition that it stays within its limit of
// b.
func (s *Store) counts(owner string, n int64, b checkpoints.Budget) []types.TransactWriteItem {
	return []types.TransactWriteItem{s.count(usagePK(owner), n, b.PerOwner), s.count(usageTotalPK, n, b.Total)}
}

func (s *Store) count(pk string, n, limit int64) types.TransactWriteItem {
	u := &types.Update{
		TableName: aws.String(s.cfg.Table), Key: key(pk),
		UpdateExpression:          aws.String("ADD #b :n"),
		ExpressionAttributeNames:  map[string]string{"#b": attrBytes},
		ExpressionAttributeValues: map[string]types.AttributeValue{":n": num(n)},
	}
	if limit > 0 && n > 0 {
		room := limit - n
		cond := "attribute_not_exists(#b) OR #b <= :room"
		if room < 0 {
			cond = "#b <= :room" // false for a counter that does not exist too
		}
		u.ConditionExpression = aws.String(cond)
		u.ExpressionAttributeValues[":room"] = num(room)
	}
	return types.TransactWriteItem{Update: u}
}

// ready commits a Put: item (the pending item's update to ready) and the
// counts of meta's bytes, in one transaction. It returns a
// *checkpoints.BudgetError when the budget has no room for them, an error
// wrapping ErrUnavailable when the pending item was purged meanwhile or
// DynamoDB stayed busy, and an *ambiguousError when the answer does not
// say whether the transaction happened.
func (s *Store) ready(ctx context.Context, item *types.Update, meta checkpoints.Checkpoint) error {
	items := append([]types.TransactWriteItem{{Update: item}}, s.counts(meta.Owner, meta.SizeBytes, s.cfg.Budget)...)
	for try := 1; ; try++ {
		err := s.transact(ctx, items)
		reasons, cancelled := awserr.CancelReasons(err)
		switch {
		case err == nil:
			return nil
		case !cancelled:
			return &ambiguousError{err}
		case awserr.ReasonCode(reasons, 0) == awserr.ReasonCondition:
			return fmt.Errorf("the upload outlived its grace (%s) and its record was purged: %w", s.cfg.PendingGrace, checkpoints.ErrUnavailable)
		case awserr.ReasonCode(reasons, 1) != awserr.ReasonCondition && awserr.ReasonCode(reasons, 2) != awserr.ReasonCondition:
			return err
		}
		u, err := s.usage(ctx, meta.Owner)
		if err != nil {
			return err
		}
		if err := s.cfg.Budget.Check(u, meta.SizeBytes); err != nil {
			return err
		}
		if try == readyTries {
			return fmt.Errorf("the budget refused the archive %d times, and had room each time it was read again: %w", try, checkpoints.ErrUnavailable)
		}
	}
}

// settled reads the state of a Put's item after an ambiguous commit:
// stateReady when the commit happened, statePending when it did not, ""
// when the item is another Put's, gone, or could not be read.
func (s *Store) settled(ctx context.Context, id, nonce string) string {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	out, err := s.ddb.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(s.cfg.Table), Key: key(id), ConsistentRead: aws.Bool(true)})
	if err != nil {
		s.cfg.Logger.Warn("checkpoint store: read a checkpoint after its commit's answer was lost; Purge collects it after the grace if it is pending",
			"checkpoint", id, "err", err)
		return ""
	}
	it := decodeItem(out.Item)
	if it.Nonce != nonce {
		return ""
	}
	return it.State
}

// transact runs a transaction, again while DynamoDB cancels it only for
// reasons that pass (a conflicting transaction in flight, throttling), at
// most transactTries times with a growing, jittered pause. Each try has
// its own ClientRequestToken, so that the SDK's retry of a try that
// committed but lost its answer succeeds instead of failing its
// conditions. It returns nil, an error wrapping the cancellation (for
// awserr.CancelReasons; wrapping ErrUnavailable too when its reasons
// never passed), or the SDK's error.
func (s *Store) transact(ctx context.Context, items []types.TransactWriteItem) error {
	for try := 1; ; try++ {
		_, err := s.ddb.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: items, ClientRequestToken: aws.String(newNonce())})
		reasons, cancelled := awserr.CancelReasons(err)
		if !cancelled {
			return err
		}
		if retry, _ := awserr.RetryableReasons(reasons); !retry {
			return err
		}
		if try == transactTries {
			return fmt.Errorf("cancelled %d times (%w): %w", try, checkpoints.ErrUnavailable, err)
		}
		pause := min(10*time.Millisecond<<try, 500*time.Millisecond)
		pause = pause/2 + rand.N(pause/2)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(pause):
		}
	}
}

// usage reads owner's and the total counters (one consistent batch read).
func (s *Store) usage(ctx context.Context, owner string) (checkpoints.Usage, error) {
	items, err := s.getItems(ctx, []string{usagePK(owner), usageTotalPK})
	if err != nil {
		return checkpoints.Usage{}, err
	}
	var u checkpoints.Usage
	u.Owner, _ = decodeN(items[usagePK(owner)][attrBytes])
	u.Total, _ = decodeN(items[usageTotalPK][attrBytes])
	return u, nil
}

// Usage implements checkpoints.Store: the two counter items, read
// consistently in one call.
func (s *Store) Usage(ctx context.Context, owner string) (checkpoints.Usage, error) {
	const action = "read checkpoint usage"
	if err := s.begin(ctx, action); err != nil {
		return checkpoints.Usage{}, err
	}
	u, err := s.usage(ctx, owner)
	if err != nil {
		return checkpoints.Usage{}, translate(action, err)
	}
	return u, nil
}
