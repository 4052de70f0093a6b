package s3store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/s3/transfermanager"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	s3types "github.com/aws/aws-sdk-go-v2/service/s3/types"

	"github.com/quarryhq/quarry/checkpoints"
	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/internal/awserr"
)

// S3API is the subset of *s3.Client the store calls (the transfer
// manager's, and DeleteObject); *s3.Client satisfies it. Give the client
// UsePathStyle for an emulator on 127.0.0.1.
type S3API interface {
	transfermanager.S3APIClient
	DeleteObject(ctx context.Context, in *s3.DeleteObjectInput, optFns ...func(*s3.Options)) (*s3.DeleteObjectOutput, error)
}

// DynamoAPI is the subset of *dynamodb.Client the store calls;
// *dynamodb.Client satisfies it.
type DynamoAPI interface {
	GetItem(ctx context.Context, in *dynamodb.GetItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error)
	PutItem(ctx context.Context, in *dynamodb.PutItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.PutItemOutput, error)
	UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error)
	DeleteItem(ctx context.Context, in *dynamodb.DeleteItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.DeleteItemOutput, error)
	Query(ctx context.Context, in *dynamodb.QueryInput, optFns ...func(*dynamodb.Options)) (*dynamodb.QueryOutput, error)
	BatchGetItem(ctx context.Context, in *dynamodb.BatchGetItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error)
	TransactWriteItems(ctx context.Context, in *dynamodb.TransactWriteItemsInput, optFns ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error)
}

var (
	_ S3API     = (*s3.Client)(nil)
	_ DynamoAPI = (*dynamodb.Client)(nil)
)

// batchGetMax is BatchGetItem's limit of keys per call; batchGetTries
// bounds the calls of one read whose keys DynamoDB leaves unprocessed.
const (
	batchGetMax   = 100
	batchGetTries = 20
)

// cleanupTimeout bounds the cleanup of a failed Put (under
// context.WithoutCancel: a cancelled Put still cleans up).
const cleanupTimeout = 30 * time.Second

// Store is the S3 + DynamoDB checkpoint store. It is safe for concurrent
// use, by many processes on one table and bucket.
type Store struct {
	cfg    Config
	s3     S3API
	ddb    DynamoAPI
	up     *transfermanager.Client
	purge  atomic.Uint32 // the shard the next Purge starts with
	closed atomic.Bool
}

var _ checkpoints.Store = (*Store)(nil)

// New returns a store on cfg's bucket and table through the given clients.
// It makes no call: the table must exist (CreateTables) and the bucket too.
func New(cfg Config, s3c S3API, ddb DynamoAPI) (*Store, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("new checkpoint store: %w", err)
	}
	up := transfermanager.New(s3c, func(o *transfermanager.Options) {
		o.PartSizeBytes = cfg.PartSize
		o.MultipartUploadThreshold = cfg.PartSize
		o.Concurrency = cfg.UploadConcurrency
		o.FailTimeout = cleanupTimeout
	})
	return &Store{cfg: cfg, s3: s3c, ddb: ddb, up: up}, nil
}

// Close makes every later call return ErrClosed; the clients stay the
// caller's. Closing twice is nil.
func (s *Store) Close() error {
	s.closed.Store(true)
	return nil
}

func (s *Store) begin(ctx context.Context, action string) error {
	if s.closed.Load() {
		return fmt.Errorf("%s: %w", action, checkpoints.ErrClosed)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%s: %w", action, err)
	}
	return nil
}

// Put implements checkpoints.Store: a pending item reserves the id, the
// archive streams into its own object (no further than the budget left),
// and the item becomes ready only when the object is whole, in the
// transaction that counts its bytes if the budget still has room (ready).
func (s *Store) Put(ctx context.Context, meta checkpoints.Checkpoint, r io.Reader, maxBytes int64) (checkpoints.Checkpoint, error) {
	action := "put checkpoint " + meta.ID
	if err := s.begin(ctx, action); err != nil {
		return checkpoints.Checkpoint{}, err
	}
	meta, err := checkpoints.CheckPut(meta, maxBytes)
	if err != nil {
		return checkpoints.Checkpoint{}, err
	}
	used, err := s.usage(ctx, meta.Owner)
	if err != nil {
		return checkpoints.Checkpoint{}, translate(action, err)
	}
	d, err := s.cfg.Budget.Reader(ctx, r, maxBytes, used)
	if err != nil {
		return checkpoints.Checkpoint{}, fmt.Errorf("%s: %w", action, err)
	}
	nonce := newNonce()
	blob := s.cfg.Prefix + meta.ID + "." + nonce + ".tar.gz"
	sh := shard(meta.ID)
	_, err = s.ddb.PutItem(ctx, &dynamodb.PutItemInput{
		TableName: aws.String(s.cfg.Table),
		Item: map[string]types.AttributeValue{
			attrPK: str(meta.ID), attrState: str(statePending), attrOwner: str(meta.Owner),
			attrBlob: str(blob), attrNonce: str(nonce),
			attrExpPK: str(expPK(sh)), attrExpSK: num(s.cfg.Clock.Now().Add(s.cfg.PendingGrace).UnixNano()),
		},
		ConditionExpression: aws.String("attribute_not_exists(pk)"),
	})
	if isConditionFailed(err) {
		return checkpoints.Checkpoint{}, fmt.Errorf("%s: %w", action, checkpoints.ErrExists)
	}
	if err != nil {
		return checkpoints.Checkpoint{}, translate(action, err)
	}
	_, err = s.up.UploadObject(ctx, &transfermanager.UploadObjectInput{
		Bucket: aws.String(s.cfg.Bucket), Key: aws.String(blob), Body: d,
		ContentType: aws.String(agentapi.ContentType(meta.Format)),
	})
	if err != nil {
		s.abandon(ctx, meta.ID, nonce, blob)
		if derr := d.Err(); derr != nil {
			return checkpoints.Checkpoint{}, fmt.Errorf("%s: %w", action, derr)
		}
		return checkpoints.Checkpoint{}, translate(action+": upload", err)
	}
	meta.SHA256, meta.SizeBytes = d.SHA256(), d.Size()
	doc, err := json.Marshal(meta)
	if err != nil {
		s.abandon(ctx, meta.ID, nonce, blob)
		return checkpoints.Checkpoint{}, fmt.Errorf("%s: %w", action, err)
	}
	ready := &types.Update{
		TableName:           aws.String(s.cfg.Table),
		Key:                 key(meta.ID),
		UpdateExpression:    aws.String("SET #st = :ready, #meta = :meta, owner_pk = :opk, owner_sk = :osk, exp_sk = :exp, #counted = :size"),
		ConditionExpression: aws.String("#st = :pending AND nonce = :nonce"),
		ExpressionAttributeNames: map[string]string{
			"#st": attrState, "#meta": attrMeta, "#counted": attrCounted,
		},
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":ready": str(stateReady), ":pending": str(statePending), ":nonce": str(nonce),
			":meta": str(string(doc)), ":opk": str(ownerPK(meta.Owner, sh)), ":osk": str(ownerSK(meta.CreatedAt, meta.ID)),
			":exp": num(meta.ExpiresAt.UnixNano()), ":size": num(meta.SizeBytes),
		},
	}
	err = s.ready(ctx, ready, meta)
	if amb := (*ambiguousError)(nil); errors.As(err, &amb) {
		switch s.settled(ctx, meta.ID, nonce) {
		case stateReady:
			return meta, nil // the transaction went through; its answer was lost
		case "":
			// Unknown: abandon could delete the object of a ready
			// checkpoint. Purge collects a pending item and its object
			// after the grace.
			return checkpoints.Checkpoint{}, translate(action, amb.err)
		}
		err = amb.err
	}
	if err != nil {
		s.abandon(ctx, meta.ID, nonce, blob)
		return checkpoints.Checkpoint{}, translate(action, err)
	}
	return meta, nil
}

// abandon removes what a failed Put made: its object (the transfer
// manager aborted a multipart upload already) and its pending item. What
// it cannot remove, Purge collects after the grace.
func (s *Store) abandon(ctx context.Context, id, nonce, blob string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	log := s.cfg.Logger.With("checkpoint", id, "object", blob)
	if _, err := s.s3.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String(s.cfg.Bucket), Key: aws.String(blob)}); err != nil {
		log.Warn("checkpoint store: delete the object of a failed put; Purge retries after the grace", "err", err)
	}
	_, err := s.ddb.DeleteItem(ctx, &dynamodb.DeleteItemInput{
		TableName: aws.String(s.cfg.Table), Key: key(id),
		ConditionExpression:       aws.String("#st = :pending AND nonce = :nonce"),
		ExpressionAttributeNames:  map[string]string{"#st": attrState},
		ExpressionAttributeValues: map[string]types.AttributeValue{":pending": str(statePending), ":nonce": str(nonce)},
	})
	if err != nil && !isConditionFailed(err) {
		log.Warn("checkpoint store: delete the record of a failed put; Purge collects it after the grace", "err", err)
	}
}

// item is a table item as the store reads it.
type item struct {
	State, Owner, Blob, Meta, Nonce string
	// Counted is what a ready checkpoint counts in its owner's usage and
	// the total (counted: it has the attribute; items made before the
	// budget have not, and count nothing).
	Counted int64
	counted bool
}

func decodeItem(av map[string]types.AttributeValue) item {
	it := item{State: decodeS(av[attrState]), Owner: decodeS(av[attrOwner]), Blob: decodeS(av[attrBlob]), Meta: decodeS(av[attrMeta]),
		Nonce: decodeS(av[attrNonce])}
	it.Counted, it.counted = decodeN(av[attrCounted])
	return it
}

// visible returns the checkpoint of it when owner may see it now.
func (s *Store) visible(it item, id, owner string) (checkpoints.Checkpoint, bool, error) {
	if it.State != stateReady || it.Owner != owner {
		return checkpoints.Checkpoint{}, false, nil
	}
	var c checkpoints.Checkpoint
	if err := json.Unmarshal([]byte(it.Meta), &c); err != nil {
		return checkpoints.Checkpoint{}, false, fmt.Errorf("decode checkpoint %s: %w", id, err)
	}
	c.Owner = it.Owner
	if !s.cfg.Clock.Now().Before(c.ExpiresAt) {
		return checkpoints.Checkpoint{}, false, nil
	}
	return c, true, nil
}

func (s *Store) get(ctx context.Context, action, id, owner string) (checkpoints.Checkpoint, item, error) {
	if err := s.begin(ctx, action); err != nil {
		return checkpoints.Checkpoint{}, item{}, err
	}
	if !checkpoints.ValidID(id) {
		return checkpoints.Checkpoint{}, item{}, fmt.Errorf("%s: %w", action, checkpoints.ErrNotFound)
	}
	out, err := s.ddb.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(s.cfg.Table), Key: key(id), ConsistentRead: aws.Bool(true)})
	if err != nil {
		return checkpoints.Checkpoint{}, item{}, translate(action, err)
	}
	it := decodeItem(out.Item)
	c, ok, err := s.visible(it, id, owner)
	if err != nil {
		return checkpoints.Checkpoint{}, item{}, fmt.Errorf("%s: %w", action, err)
	}
	if !ok {
		return checkpoints.Checkpoint{}, item{}, fmt.Errorf("%s: %w", action, checkpoints.ErrNotFound)
	}
	return c, it, nil
}

// Get implements checkpoints.Store: one consistent GetItem.
func (s *Store) Get(ctx context.Context, id, owner string) (checkpoints.Checkpoint, error) {
	c, _, err := s.get(ctx, "get checkpoint "+id, id, owner)
	return c, err
}

// Open implements checkpoints.Store: the object streamed through a
// checkpoints.VerifyReader. An object deleted meanwhile is ErrNotFound.
func (s *Store) Open(ctx context.Context, id, owner string) (io.ReadCloser, checkpoints.Checkpoint, error) {
	action := "open checkpoint " + id
	c, it, err := s.get(ctx, action, id, owner)
	if err != nil {
		return nil, checkpoints.Checkpoint{}, err
	}
	out, err := s.s3.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(s.cfg.Bucket), Key: aws.String(it.Blob)})
	var nsk *s3types.NoSuchKey
	if errors.As(err, &nsk) {
		return nil, checkpoints.Checkpoint{}, fmt.Errorf("%s: its archive was deleted: %w", action, checkpoints.ErrNotFound)
	}
	if err != nil {
		return nil, checkpoints.Checkpoint{}, translate(action, err)
	}
	return checkpoints.NewVerifyReader(out.Body, c.SizeBytes, c.SHA256), c, nil
}

// Delete implements checkpoints.Store: the item moves to deleting, then
// its object and the item go.
func (s *Store) Delete(ctx context.Context, id, owner string) error {
	action := "delete checkpoint " + id
	if err := s.begin(ctx, action); err != nil {
		return err
	}
	if !checkpoints.ValidID(id) {
		return nil
	}
	out, err := s.ddb.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                           aws.String(s.cfg.Table),
		Key:                                 key(id),
		UpdateExpression:                    aws.String("SET #st = :deleting, exp_sk = :zero REMOVE owner_pk, owner_sk"),
		ConditionExpression:                 aws.String("#owner = :owner AND #st = :ready"),
		ExpressionAttributeNames:            map[string]string{"#st": attrState, "#owner": attrOwner},
		ExpressionAttributeValues:           map[string]types.AttributeValue{":deleting": str(stateDeleting), ":ready": str(stateReady), ":owner": str(owner), ":zero": num(0)},
		ReturnValues:                        types.ReturnValueAllNew,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	var ccf *types.ConditionalCheckFailedException
	if errors.As(err, &ccf) {
		old := decodeItem(ccf.Item)
		switch {
		case len(ccf.Item) == 0:
			return nil // unknown or gone
		case old.Owner != owner:
			return fmt.Errorf("%s: %w", action, checkpoints.ErrNotFound)
		case old.State == stateDeleting:
			return s.finish(ctx, action, id, old) // a Delete or Purge that stopped halfway
		default:
			return nil // pending: not a checkpoint yet
		}
	}
	if err != nil {
		return translate(action, err)
	}
	return s.finish(ctx, action, id, decodeItem(out.Attributes))
}

// finish removes a deleting item's object, then the item, which frees
// what it counted in the same transaction (once: the item must still be
// deleting).
func (s *Store) finish(ctx context.Context, action, id string, it item) error {
	if it.Blob != "" {
		_, err := s.s3.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String(s.cfg.Bucket), Key: aws.String(it.Blob)})
		if err != nil {
			return translate(action+": delete object", err)
		}
	}
	cond, names := aws.String("#st = :deleting"), map[string]string{"#st": attrState}
	values := map[string]types.AttributeValue{":deleting": str(stateDeleting)}
	var err error
	if it.counted {
		del := &types.Delete{TableName: aws.String(s.cfg.Table), Key: key(id), ConditionExpression: cond,
			ExpressionAttributeNames: names, ExpressionAttributeValues: values}
		err = s.transact(ctx, append([]types.TransactWriteItem{{Delete: del}}, s.counts(it.Owner, -it.Counted, checkpoints.Budget{})...))
		if reasons, ok := awserr.CancelReasons(err); ok && awserr.ReasonCode(reasons, 0) == awserr.ReasonCondition {
			return nil // another removal finished it
		}
	} else {
		_, err = s.ddb.DeleteItem(ctx, &dynamodb.DeleteItemInput{TableName: aws.String(s.cfg.Table), Key: key(id), ConditionExpression: cond,
			ExpressionAttributeNames: names, ExpressionAttributeValues: values})
		if isConditionFailed(err) {
			return nil
		}
	}
	if err != nil {
		return translate(action, err)
	}
	return nil
}

// Purge implements checkpoints.Store: it queries by-expiry shard by shard
// (the first rotating between calls) for items due by now — expired
// checkpoints, pending items past their grace, removals a crash stopped —
// and removes each as Delete does, at most budget of them.
func (s *Store) Purge(ctx context.Context, now time.Time, budget int) (int, error) {
	const action = "purge checkpoints"
	if err := s.begin(ctx, action); err != nil {
		return 0, err
	}
	n := 0
	first := int(s.purge.Add(1))
	for i := range Shards {
		if n >= budget {
			break
		}
		sh := (first + i) % Shards
		out, err := s.ddb.Query(ctx, &dynamodb.QueryInput{
			TableName:              aws.String(s.cfg.Table),
			IndexName:              aws.String(indexExpiry),
			KeyConditionExpression: aws.String("exp_pk = :pk AND exp_sk <= :now"),
			ExpressionAttributeValues: map[string]types.AttributeValue{
				":pk": str(expPK(sh)), ":now": num(now.UnixNano()),
			},
			Limit: aws.Int32(int32(budget - n)),
		})
		if err != nil {
			return n, translate(action, err)
		}
		for _, k := range out.Items {
			id := decodeS(k[attrPK])
			upd, err := s.ddb.UpdateItem(ctx, &dynamodb.UpdateItemInput{
				TableName:                 aws.String(s.cfg.Table),
				Key:                       key(id),
				UpdateExpression:          aws.String("SET #st = :deleting, exp_sk = :zero REMOVE owner_pk, owner_sk"),
				ConditionExpression:       aws.String("exp_sk = :seen"),
				ExpressionAttributeNames:  map[string]string{"#st": attrState},
				ExpressionAttributeValues: map[string]types.AttributeValue{":deleting": str(stateDeleting), ":zero": num(0), ":seen": k[attrExpSK]},
				ReturnValues:              types.ReturnValueAllNew,
			})
			if isConditionFailed(err) {
				continue // changed since the index showed it: a Put finished, or it is gone
			}
			if err != nil {
				return n, translate(action, err)
			}
			if err := s.finish(ctx, action, id, decodeItem(upd.Attributes)); err != nil {
				return n, err
			}
			n++
		}
	}
	return n, nil
}

// List implements checkpoints.Store: the owner's Shards by-owner
// partitions, each read newest first a page at a time and merged, and the
// candidates' items read consistently in batches, filtered again.
func (s *Store) List(ctx context.Context, f checkpoints.Filter) ([]checkpoints.Checkpoint, error) {
	const action = "list checkpoints"
	if err := s.begin(ctx, action); err != nil {
		return nil, err
	}
	f, err := f.Check()
	if err != nil {
		return nil, err
	}
	page := int32(min(max(f.Limit, 25), batchGetMax))
	heads := make([]*shardPager, Shards)
	for i := range heads {
		heads[i] = &shardPager{s: s, pk: ownerPK(f.Owner, i), page: page}
	}
	var res []checkpoints.Checkpoint
	for len(res) < f.Limit {
		var ids []string
		for len(ids) < batchGetMax {
			best := -1
			for i, h := range heads {
				if err := h.fill(ctx); err != nil {
					return nil, translate(action, err)
				}
				if h.head() != "" && (best < 0 || h.head() > heads[best].head()) {
					best = i
				}
			}
			if best < 0 {
				break
			}
			ids = append(ids, heads[best].pop())
		}
		if len(ids) == 0 {
			break
		}
		cs, err := s.batch(ctx, ids, f)
		if err != nil {
			return nil, translate(action, err)
		}
		res = append(res, cs...)
	}
	return res[:min(len(res), f.Limit)], nil
}

// getItems reads the items of pks (at most batchGetMax) consistently, by
// pk; an item that does not exist is absent. Keys DynamoDB leaves
// unprocessed are asked again, batchGetTries times at most.
func (s *Store) getItems(ctx context.Context, pks []string) (map[string]map[string]types.AttributeValue, error) {
	keys := make([]map[string]types.AttributeValue, len(pks))
	for i, pk := range pks {
		keys[i] = key(pk)
	}
	items := map[string]map[string]types.AttributeValue{}
	req := map[string]types.KeysAndAttributes{s.cfg.Table: {Keys: keys, ConsistentRead: aws.Bool(true)}}
	for try := 0; len(req) > 0 && len(req[s.cfg.Table].Keys) > 0; try++ {
		if try == batchGetTries {
			return nil, fmt.Errorf("%d keys still unprocessed after %d tries: %w", len(req[s.cfg.Table].Keys), try, checkpoints.ErrUnavailable)
		}
		out, err := s.ddb.BatchGetItem(ctx, &dynamodb.BatchGetItemInput{RequestItems: req})
		if err != nil {
			return nil, err
		}
		for _, av := range out.Responses[s.cfg.Table] {
			items[decodeS(av[attrPK])] = av
		}
		req = out.UnprocessedKeys
		if len(req) > 0 {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	return items, nil
}

// batch reads ids' items consistently and returns, in ids' order, the
// checkpoints f's owner sees now that match f's labels.
func (s *Store) batch(ctx context.Context, ids []string, f checkpoints.Filter) ([]checkpoints.Checkpoint, error) {
	items, err := s.getItems(ctx, ids)
	if err != nil {
		return nil, err
	}
	var res []checkpoints.Checkpoint
	for _, id := range ids {
		av, ok := items[id]
		if !ok {
			continue
		}
		it := decodeItem(av)
		c, ok, err := s.visible(it, id, f.Owner)
		if err != nil {
			return nil, err
		}
		if ok && labelsMatch(c.Labels, f.Labels) {
			res = append(res, c)
		}
	}
	return res, nil
}

func labelsMatch(have, want map[string]string) bool {
	for k, v := range want {
		if hv, ok := have[k]; !ok || hv != v {
			return false
		}
	}
	return true
}

// shardPager reads one by-owner partition newest first, a page at a time.
type shardPager struct {
	s    *Store
	pk   string
	page int32
	buf  []map[string]types.AttributeValue
	next map[string]types.AttributeValue
	done bool
}

// fill reads the next page when the buffer is empty and pages are left.
func (p *shardPager) fill(ctx context.Context) error {
	if len(p.buf) > 0 || p.done {
		return nil
	}
	out, err := p.s.ddb.Query(ctx, &dynamodb.QueryInput{
		TableName:                 aws.String(p.s.cfg.Table),
		IndexName:                 aws.String(indexOwner),
		KeyConditionExpression:    aws.String("owner_pk = :pk"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":pk": str(p.pk)},
		ScanIndexForward:          aws.Bool(false),
		Limit:                     aws.Int32(p.page),
		ExclusiveStartKey:         p.next,
	})
	if err != nil {
		return err
	}
	p.buf, p.next = out.Items, out.LastEvaluatedKey
	p.done = len(p.next) == 0
	return nil
}

// head is the sort key of the newest unread entry ("" when none).
func (p *shardPager) head() string {
	if len(p.buf) == 0 {
		return ""
	}
	return decodeS(p.buf[0][attrOwnerSK])
}

// pop returns the newest unread entry's id.
func (p *shardPager) pop() string {
	id := decodeS(p.buf[0][attrPK])
	p.buf = p.buf[1:]
	return id
}

func key(id string) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{attrPK: str(id)}
}

func str(v string) types.AttributeValue { return &types.AttributeValueMemberS{Value: v} }

func num(v int64) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: strconv.FormatInt(v, 10)}
}

func decodeS(av types.AttributeValue) string {
	if v, ok := av.(*types.AttributeValueMemberS); ok {
		return v.Value
	}
	return ""
}

// decodeN returns a number attribute, and whether there was one.
func decodeN(av types.AttributeValue) (int64, bool) {
	v, ok := av.(*types.AttributeValueMemberN)
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(v.Value, 10, 64)
	return n, err == nil
}

// newNonce returns 16 random hex characters: an upload's own object key.
func newNonce() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return hex.EncodeToString(b[:])
}

// translate turns an SDK error into the contract's terms: throttling,
// server errors, timeouts and connection failures wrap ErrUnavailable.
func translate(action string, err error) error {
	if awserr.IsUnavailable(err) {
		return fmt.Errorf("%s: %w: %w", action, checkpoints.ErrUnavailable, err)
	}
	return fmt.Errorf("%s: %w", action, err)
}

func isConditionFailed(err error) bool {
	var ccf *types.ConditionalCheckFailedException
	return errors.As(err, &ccf)
}
