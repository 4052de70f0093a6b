package s3store

import (
	"context"
	"fmt"
	"hash/fnv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/quarryhq/quarry/internal/ddbtable"
)

// Shards is how many index keys spread one owner's checkpoints (by-owner)
// and all expiries (by-expiry) over partitions. A constant of the schema:
// changing it orphans what the old keys index.
const Shards = 8

// Index names, attributes and item states of the table.
const (
	indexOwner  = "by-owner"  // owner_pk (S) + owner_sk (S): an owner's ready checkpoints, newest last
	indexExpiry = "by-expiry" // exp_pk (S) + exp_sk (N): every item by the time Purge may remove it
	attrPK      = "pk"
	attrState   = "state"
	attrOwner   = "owner"
	attrBlob    = "blob"
	attrNonce   = "nonce"
	attrMeta    = "meta"
	attrOwnerPK = "owner_pk"
	attrOwnerSK = "owner_sk"
	attrExpPK   = "exp_pk"
	attrExpSK   = "exp_sk"
	attrCounted = "counted" // N: the bytes a ready checkpoint counts in its owner's usage and the total
	attrBytes   = "bytes"   // N: a usage counter's bytes

	statePending  = "pending"
	stateReady    = "ready"
	stateDeleting = "deleting"
)

// TableDefinition returns the definition CreateTables creates: key schema,
// attribute types, the two keys-only global secondary indexes. It is for
// tools that create the table another way (the Terraform module in infra/
// and the LocalStack hook are checked against it).
func TableDefinition(table string) *dynamodb.CreateTableInput {
	attr := func(name string, t types.ScalarAttributeType) types.AttributeDefinition {
		return types.AttributeDefinition{AttributeName: aws.String(name), AttributeType: t}
	}
	key := func(hash, rng string) []types.KeySchemaElement {
		return []types.KeySchemaElement{
			{AttributeName: aws.String(hash), KeyType: types.KeyTypeHash},
			{AttributeName: aws.String(rng), KeyType: types.KeyTypeRange},
		}
	}
	keysOnly := &types.Projection{ProjectionType: types.ProjectionTypeKeysOnly}
	return &dynamodb.CreateTableInput{
		TableName:   aws.String(table),
		BillingMode: types.BillingModePayPerRequest,
		AttributeDefinitions: []types.AttributeDefinition{
			attr(attrPK, types.ScalarAttributeTypeS),
			attr(attrOwnerPK, types.ScalarAttributeTypeS), attr(attrOwnerSK, types.ScalarAttributeTypeS),
			attr(attrExpPK, types.ScalarAttributeTypeS), attr(attrExpSK, types.ScalarAttributeTypeN),
		},
		KeySchema: []types.KeySchemaElement{{AttributeName: aws.String(attrPK), KeyType: types.KeyTypeHash}},
		GlobalSecondaryIndexes: []types.GlobalSecondaryIndex{
			{IndexName: aws.String(indexOwner), KeySchema: key(attrOwnerPK, attrOwnerSK), Projection: keysOnly},
			{IndexName: aws.String(indexExpiry), KeySchema: key(attrExpPK, attrExpSK), Projection: keysOnly},
		},
		Tags: []types.Tag{{Key: aws.String("quarry.managed"), Value: aws.String("true")}},
	}
}

// TableAPI is what CreateTables and DeleteTables call; *dynamodb.Client
// satisfies it.
type TableAPI = ddbtable.API

// CreateTables creates the checkpoint table (TableDefinition) and waits
// until it is active (bounded by ctx). A table that exists already is left
// as it is. The bucket is not created here: it belongs to the deployment
// (infra/), with its lifecycle rule.
func CreateTables(ctx context.Context, api TableAPI, table string) error {
	return ddbtable.Create(ctx, api, TableDefinition(table))
}

// DeleteTables deletes the checkpoint table. A missing table is not an
// error.
func DeleteTables(ctx context.Context, api TableAPI, table string) error {
	return ddbtable.Delete(ctx, api, table)
}

// shard is id's shard of the index keys.
func shard(id string) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(id))
	return int(h.Sum32() % Shards)
}

// ownerPK is the by-owner partition of an owner's shard.
func ownerPK(owner string, s int) string { return fmt.Sprintf("%s#%d", owner, s) }

// ownerSK orders an owner's checkpoints as checkpoints.Newer does
// (created time, then id), as a string that sorts the same way.
func ownerSK(created time.Time, id string) string {
	return fmt.Sprintf("%020d#%s", created.UnixNano(), id)
}

// usagePK is the item of owner's usage counter; usageTotalPK the item of
// the total. Neither is in an index, and neither can be a checkpoint id.
func usagePK(owner string) string { return "usage#o#" + owner }

const usageTotalPK = "usage#t"

// expPK is the by-expiry partition of a shard.
func expPK(s int) string { return fmt.Sprintf("x#%d", s) }
