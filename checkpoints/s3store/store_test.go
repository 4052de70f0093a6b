package s3store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	s3types "github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/checkpoints"
	"github.com/quarryhq/quarry/checkpoints/checkpointtest"
	"github.com/quarryhq/quarry/internal/clock"
	"github.com/quarryhq/quarry/internal/testenv"
)

var (
	runID = fmt.Sprintf("%x", time.Now().UnixNano()&0xffffffffff)
	seq   atomic.Int64
)

// clients returns S3 (path style, as an emulator on 127.0.0.1 needs) and
// DynamoDB clients from the SDK's default chain, after checking that the
// endpoint answers. Callers ask testenv.AWS first.
func clients(t *testing.T) (*s3.Client, *dynamodb.Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg, err := config.LoadDefaultConfig(ctx)
	require.NoError(t, err, "load the AWS SDK config")
	if cfg.Region == "" {
		cfg.Region = "us-east-1"
	}
	ddb := dynamodb.NewFromConfig(cfg)
	_, err = ddb.ListTables(ctx, &dynamodb.ListTablesInput{Limit: aws.Int32(1)})
	require.NoError(t, err, "%s=1 but DynamoDB (AWS_ENDPOINT_URL=%q) does not answer", testenv.EnvAWS, os.Getenv("AWS_ENDPOINT_URL"))
	return s3.NewFromConfig(cfg, func(o *s3.Options) { o.UsePathStyle = true }), ddb
}

// fixture is one test's bucket, emptied and deleted when the test ends;
// each store on it has a table and a key prefix of its own.
type fixture struct {
	s3     *s3.Client
	ddb    *dynamodb.Client
	bucket string
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	testenv.AWS(t)
	s3c, ddb := clients(t)
	f := &fixture{s3: s3c, ddb: ddb, bucket: fmt.Sprintf("quarry-test-checkpoints-%s-%d", runID, seq.Add(1))}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := s3c.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(f.bucket)})
	var owned *s3types.BucketAlreadyOwnedByYou
	if err != nil && !errors.As(err, &owned) {
		require.NoError(t, err, "create the test bucket")
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := f.removeBucket(ctx); err != nil {
			t.Errorf("remove test bucket %s: %v", f.bucket, err)
		}
	})
	return f
}

// removeBucket deletes what the bucket holds (objects, incomplete
// multipart uploads), then the bucket.
func (f *fixture) removeBucket(ctx context.Context) error {
	b := aws.String(f.bucket)
	p := s3.NewListObjectsV2Paginator(f.s3, &s3.ListObjectsV2Input{Bucket: b})
	for p.HasMorePages() {
		out, err := p.NextPage(ctx)
		if err != nil {
			return err
		}
		for _, o := range out.Contents {
			if _, err := f.s3.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: b, Key: o.Key}); err != nil {
				return err
			}
		}
	}
	mu, err := f.s3.ListMultipartUploads(ctx, &s3.ListMultipartUploadsInput{Bucket: b})
	if err != nil {
		return err
	}
	for _, u := range mu.Uploads {
		if _, err := f.s3.AbortMultipartUpload(ctx, &s3.AbortMultipartUploadInput{Bucket: b, Key: u.Key, UploadId: u.UploadId}); err != nil {
			return err
		}
	}
	_, err = f.s3.DeleteBucket(ctx, &s3.DeleteBucketInput{Bucket: b})
	return err
}

// store returns a store on a fresh table and prefix, removed when t ends.
func (f *fixture) store(t *testing.T, clk clock.Clock, cfg Config) harness {
	return f.storeOn(t, clk, cfg, f.ddb)
}

// storeOn is store with the store's calls to DynamoDB made through ddb.
func (f *fixture) storeOn(t *testing.T, clk clock.Clock, cfg Config, ddb DynamoAPI) harness {
	t.Helper()
	n := seq.Add(1)
	cfg.Table = fmt.Sprintf("quarry-test-checkpoints-%s-%d", runID, n)
	cfg.Bucket = f.bucket
	cfg.Prefix = fmt.Sprintf("t%d/", n)
	cfg.Clock = clk
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, CreateTables(ctx, f.ddb, cfg.Table))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := DeleteTables(ctx, f.ddb, cfg.Table); err != nil {
			t.Errorf("delete test table: %v", err)
		}
	})
	s, err := New(cfg, f.s3, ddb)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return harness{Store: s, f: f}
}

// harness adds the suite's test interfaces to a Store.
type harness struct {
	*Store
	f *fixture
}

// Reopen closes the store and makes another on its table and prefix.
func (h harness) Reopen(context.Context) (checkpoints.Store, error) {
	if err := h.Close(); err != nil {
		return nil, err
	}
	s, err := New(h.cfg, h.s3, h.ddb)
	if err != nil {
		return nil, err
	}
	return harness{Store: s, f: h.f}, nil
}

// Corrupt rewrites the object of id's checkpoint.
func (h harness) Corrupt(ctx context.Context, id string, mutate func([]byte) []byte) error {
	out, err := h.f.ddb.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(h.cfg.Table), Key: key(id), ConsistentRead: aws.Bool(true)})
	if err != nil {
		return err
	}
	blob := decodeItem(out.Item).Blob
	if blob == "" {
		return fmt.Errorf("no checkpoint %s", id)
	}
	obj, err := h.f.s3.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(h.cfg.Bucket), Key: aws.String(blob)})
	if err != nil {
		return err
	}
	b, err := io.ReadAll(obj.Body)
	_ = obj.Body.Close()
	if err != nil {
		return err
	}
	_, err = h.f.s3.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(h.cfg.Bucket), Key: aws.String(blob), Body: bytes.NewReader(mutate(b))})
	return err
}

// Blobs counts the objects and the incomplete multipart uploads under the
// store's prefix.
func (h harness) Blobs(ctx context.Context) (int, error) {
	n := 0
	p := s3.NewListObjectsV2Paginator(h.f.s3, &s3.ListObjectsV2Input{Bucket: aws.String(h.cfg.Bucket), Prefix: aws.String(h.cfg.Prefix)})
	for p.HasMorePages() {
		out, err := p.NextPage(ctx)
		if err != nil {
			return 0, err
		}
		n += len(out.Contents)
	}
	mu, err := h.f.s3.ListMultipartUploads(ctx, &s3.ListMultipartUploadsInput{Bucket: aws.String(h.cfg.Bucket), Prefix: aws.String(h.cfg.Prefix)})
	if err != nil {
		return 0, err
	}
	return n + len(mu.Uploads), nil
}

// requireNoItem fails t when the table holds an item for id.
func (h harness) requireNoItem(t *testing.T, id, msg string) {
	t.Helper()
	out, err := h.f.ddb.GetItem(context.Background(), &dynamodb.GetItemInput{TableName: aws.String(h.cfg.Table), Key: key(id), ConsistentRead: aws.Bool(true)})
	require.NoError(t, err)
	require.Empty(t, out.Item, msg)
}

var _ checkpointtest.Corrupter = harness{}
var _ checkpointtest.BlobCounter = harness{}
var _ checkpointtest.Reopener = harness{}

// The store passes the conformance suite on the emulator, with the
// smallest parts S3 allows so that the large archive is a multipart
// upload of several parts and memory stays within two of them.
func TestStore_Conformance(t *testing.T) {
	f := newFixture(t)
	checkpointtest.Run(t, func(t *testing.T, s checkpointtest.Setup) checkpoints.Store {
		return f.store(t, s.Clock, Config{PartSize: MinPartSize, UploadConcurrency: 1, Budget: s.Budget})
	}, checkpointtest.Options{MaxBuffered: 16 << 20, LargeBytes: 48 << 20})
}

func meta(now time.Time) checkpoints.Checkpoint {
	return checkpoints.Checkpoint{
		ID: checkpoints.NewID(), Owner: "owner-a", Pool: "default", Image: "quarry-test/bash",
		Paths: []string{"/work"}, Format: "tar+gzip", CreatedAt: now, ExpiresAt: now.Add(time.Hour),
	}
}

// hookReader gives data, calling hook once before its last byte.
type hookReader struct {
	data []byte
	hook func()
}

func (r *hookReader) Read(p []byte) (int, error) {
	switch {
	case len(r.data) == 0:
		return 0, io.EOF
	case len(r.data) == 1 && r.hook != nil:
		r.hook()
		r.hook = nil
	}
	n := copy(p, r.data[:max(1, len(r.data)-1)]) // the last byte waits for the hook
	r.data = r.data[n:]
	return n, nil
}

// A Put whose upload outlives its pending grace finds its reservation
// purged: it fails, and leaves neither a checkpoint nor an object.
func TestPut_OutlivingItsGraceFailsAndKeepsNothing(t *testing.T) {
	f := newFixture(t)
	start := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	clk := checkpointtest.NewClock(start)
	h := f.store(t, clk, Config{PendingGrace: time.Minute})
	ctx := context.Background()
	m := meta(start)
	purged := 0
	r := &hookReader{data: bytes.Repeat([]byte("x"), 1000), hook: func() {
		later := start.Add(2 * time.Minute)
		clk.Set(later)
		n, err := h.Purge(ctx, later, 10)
		require.NoError(t, err)
		purged = n
	}}
	_, err := h.Put(ctx, m, r, 1<<20)
	require.ErrorIs(t, err, checkpoints.ErrUnavailable)
	require.Equal(t, 1, purged, "Purge collected the pending reservation")
	_, err = h.Get(ctx, m.ID, m.Owner)
	require.ErrorIs(t, err, checkpoints.ErrNotFound)
	n, err := h.Blobs(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "the late upload's object is deleted")
	h.requireNoItem(t, m.ID, "no item is left")
}

// A removal that stopped after marking the item deleting (a crash before
// the object and the item went) is finished by the next Purge, and the
// half-deleted checkpoint is invisible meanwhile.
func TestPurge_FinishesAHalfDoneDelete(t *testing.T) {
	f := newFixture(t)
	start := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	h := f.store(t, checkpointtest.NewClock(start), Config{})
	ctx := context.Background()
	m, err := h.Put(ctx, meta(start), bytes.NewReader([]byte("archive")), 1<<20)
	require.NoError(t, err)
	_, err = f.ddb.UpdateItem(ctx, &dynamodb.UpdateItemInput{ // Delete's first step, alone
		TableName: aws.String(h.cfg.Table), Key: key(m.ID),
		UpdateExpression:          aws.String("SET #st = :deleting, exp_sk = :zero REMOVE owner_pk, owner_sk"),
		ExpressionAttributeNames:  map[string]string{"#st": attrState},
		ExpressionAttributeValues: map[string]types.AttributeValue{":deleting": str(stateDeleting), ":zero": num(0)},
	})
	require.NoError(t, err)
	_, err = h.Get(ctx, m.ID, m.Owner)
	require.ErrorIs(t, err, checkpoints.ErrNotFound, "a deleting checkpoint is invisible")
	list, err := h.List(ctx, checkpoints.Filter{Owner: m.Owner})
	require.NoError(t, err)
	require.Empty(t, list)
	n, err := h.Purge(ctx, start, 10)
	require.NoError(t, err)
	require.Equal(t, 1, n, "Purge finishes the removal although the checkpoint has not expired")
	blobs, err := h.Blobs(ctx)
	require.NoError(t, err)
	require.Zero(t, blobs, "its object is gone")
	h.requireNoItem(t, m.ID, "its item is gone")
}
