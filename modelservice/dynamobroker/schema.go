package dynamobroker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"

	"github.com/quarryhq/quarry/internal/awserr"
	"github.com/quarryhq/quarry/modelservice"
)

// API is the subset of *dynamodb.Client the broker and the table functions
// call; *dynamodb.Client satisfies it.
type API interface {
	GetItem(ctx context.Context, in *dynamodb.GetItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error)
	PutItem(ctx context.Context, in *dynamodb.PutItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.PutItemOutput, error)
	UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error)
	DeleteItem(ctx context.Context, in *dynamodb.DeleteItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.DeleteItemOutput, error)
	Query(ctx context.Context, in *dynamodb.QueryInput, optFns ...func(*dynamodb.Options)) (*dynamodb.QueryOutput, error)
	BatchGetItem(ctx context.Context, in *dynamodb.BatchGetItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error)
	BatchWriteItem(ctx context.Context, in *dynamodb.BatchWriteItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.BatchWriteItemOutput, error)
	CreateTable(ctx context.Context, in *dynamodb.CreateTableInput, optFns ...func(*dynamodb.Options)) (*dynamodb.CreateTableOutput, error)
	DescribeTable(ctx context.Context, in *dynamodb.DescribeTableInput, optFns ...func(*dynamodb.Options)) (*dynamodb.DescribeTableOutput, error)
	UpdateTable(ctx context.Context, in *dynamodb.UpdateTableInput, optFns ...func(*dynamodb.Options)) (*dynamodb.UpdateTableOutput, error)
	DeleteTable(ctx context.Context, in *dynamodb.DeleteTableInput, optFns ...func(*dynamodb.Options)) (*dynamodb.DeleteTableOutput, error)
	UpdateTimeToLive(ctx context.Context, in *dynamodb.UpdateTimeToLiveInput, optFns ...func(*dynamodb.Options)) (*dynamodb.UpdateTimeToLiveOutput, error)
}

var _ API = (*dynamodb.Client)(nil)

// Index names and key attributes of the relay's table.
const (
	indexLease = "by-lease"       // lease (S) + rid (S): a lease's exchanges in id order
	indexQueue = "queue-by-shard" // qp (S) + qk (S): one shard of an owner's pending and claimed requests by visibility time
	attrPK     = "pk"
	attrSK     = "sk"
	attrTTL    = "ttl"
)

// queueProjection is what the queue index holds besides its keys and the
// table's: what a claim filters, expires and sizes candidates by. Never a
// body: an entry stays well under 1 KB, one write unit.
var queueProjection = []string{aRID, aPool, aLabels, aDeadline, aQSize}

// DefaultTable is the table's default name (QUARRY_RELAY_DYNAMODB_TABLE).
const DefaultTable = "quarry-model-relay"

// TTLAttribute is the attribute whose epoch seconds DynamoDB's TTL reads on
// the relay's table.
const TTLAttribute = attrTTL

// TableDefinition returns the definition CreateTables creates: key schema,
// attribute types, global secondary indexes and their projections. It is
// for tools that create the table another way (the Terraform module in
// infra/ is checked against it).
func TableDefinition(table string) *dynamodb.CreateTableInput {
	str := func(name string) types.AttributeDefinition {
		return types.AttributeDefinition{AttributeName: aws.String(name), AttributeType: types.ScalarAttributeTypeS}
	}
	key := func(hash, rng string) []types.KeySchemaElement {
		return []types.KeySchemaElement{
			{AttributeName: aws.String(hash), KeyType: types.KeyTypeHash},
			{AttributeName: aws.String(rng), KeyType: types.KeyTypeRange},
		}
	}
	all := &types.Projection{ProjectionType: types.ProjectionTypeAll}
	queue := &types.Projection{ProjectionType: types.ProjectionTypeInclude, NonKeyAttributes: queueProjection}
	return &dynamodb.CreateTableInput{
		TableName:            aws.String(table),
		BillingMode:          types.BillingModePayPerRequest,
		AttributeDefinitions: []types.AttributeDefinition{str(attrPK), str(attrSK), str(aLease), str(aRID), str(aQPart), str(aQKey)},
		KeySchema:            key(attrPK, attrSK),
		GlobalSecondaryIndexes: []types.GlobalSecondaryIndex{
			{IndexName: aws.String(indexLease), KeySchema: key(aLease, aRID), Projection: all},
			{IndexName: aws.String(indexQueue), KeySchema: key(aQPart, aQKey), Projection: queue},
		},
		Tags: []types.Tag{{Key: aws.String("quarry.managed"), Value: aws.String("true")}},
	}
}

// CreateTables creates the relay's table (TableDefinition: on-demand
// capacity, two global secondary indexes, expiry on the "ttl" attribute)
// and waits until it is active (bounded by ctx). On a table that exists
// already it adds each index of TableDefinition the table lacks (one
// UpdateTable at a time, each waited for until ACTIVE: DynamoDB fills it
// from the existing items while the table stays available); it changes and
// deletes nothing else, so an index of an older schema stays until an
// operator deletes it. Safe to run again, and from several processes.
func CreateTables(ctx context.Context, api API, table string) error {
	def := TableDefinition(table)
	_, err := api.CreateTable(ctx, def)
	var inUse *types.ResourceInUseException
	if err != nil && !errors.As(err, &inUse) {
		return fmt.Errorf("create table %s: %w", table, err)
	}
	desc, err := waitActive(ctx, api, table)
	if err != nil {
		return err
	}
	for _, ix := range missingIndexes(desc, def) {
		_, err := api.UpdateTable(ctx, &dynamodb.UpdateTableInput{
			TableName:                   aws.String(table),
			AttributeDefinitions:        def.AttributeDefinitions,
			GlobalSecondaryIndexUpdates: []types.GlobalSecondaryIndexUpdate{{Create: &types.CreateGlobalSecondaryIndexAction{IndexName: ix.IndexName, KeySchema: ix.KeySchema, Projection: ix.Projection}}},
		})
		// An error may be another process adding it meanwhile: the table's
		// own description decides.
		desc, derr := waitActive(ctx, api, table)
		if derr != nil {
			return derr
		}
		if err != nil && !hasIndex(desc, aws.ToString(ix.IndexName)) {
			return fmt.Errorf("add index %s to table %s: %w", aws.ToString(ix.IndexName), table, err)
		}
	}
	_, err = api.UpdateTimeToLive(ctx, &dynamodb.UpdateTimeToLiveInput{
		TableName:               aws.String(table),
		TimeToLiveSpecification: &types.TimeToLiveSpecification{AttributeName: aws.String(attrTTL), Enabled: aws.Bool(true)},
	})
	var apiErr smithy.APIError
	if err != nil && !(errors.As(err, &apiErr) && apiErr.ErrorCode() == "ValidationException") { // already enabled
		return fmt.Errorf("enable expiry on table %s: %w", table, err)
	}
	return nil
}

// missingIndexes returns the global secondary indexes of def that the
// described table does not have.
func missingIndexes(desc *types.TableDescription, def *dynamodb.CreateTableInput) []types.GlobalSecondaryIndex {
	var out []types.GlobalSecondaryIndex
	for _, ix := range def.GlobalSecondaryIndexes {
		if !hasIndex(desc, aws.ToString(ix.IndexName)) {
			out = append(out, ix)
		}
	}
	return out
}

func hasIndex(desc *types.TableDescription, name string) bool {
	for _, ix := range desc.GlobalSecondaryIndexes {
		if aws.ToString(ix.IndexName) == name {
			return true
		}
	}
	return false
}

// tablePoll is how often waitActive describes the table.
const tablePoll = 200 * time.Millisecond

// waitActive waits until the table and every one of its indexes are
// ACTIVE (bounded by ctx) and returns its description.
func waitActive(ctx context.Context, api API, table string) (*types.TableDescription, error) {
	for {
		out, err := api.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(table)})
		if err != nil {
			return nil, fmt.Errorf("describe table %s: %w", table, err)
		}
		if d := out.Table; d != nil && d.TableStatus == types.TableStatusActive && indexesActive(d) {
			return d, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("wait for table %s: %w", table, ctx.Err())
		case <-time.After(tablePoll):
		}
	}
}

func indexesActive(d *types.TableDescription) bool {
	for _, ix := range d.GlobalSecondaryIndexes {
		if ix.IndexStatus != "" && ix.IndexStatus != types.IndexStatusActive {
			return false
		}
	}
	return true
}

// DeleteTables deletes the relay's table. A missing table is not an error.
func DeleteTables(ctx context.Context, api API, table string) error {
	_, err := api.DeleteTable(ctx, &dynamodb.DeleteTableInput{TableName: aws.String(table)})
	var rnf *types.ResourceNotFoundException
	if err != nil && !errors.As(err, &rnf) {
		return fmt.Errorf("delete table %s: %w", table, err)
	}
	return nil
}

// translate turns an SDK error into the contract's terms: throttling,
// server errors, timeouts and connection failures wrap ErrUnavailable; a
// cancelled ctx stays context.Canceled.
func translate(action string, err error) error {
	if err == nil {
		return nil
	}
	if isUnavailable(err) {
		return fmt.Errorf("%s: %w: %w", action, modelservice.ErrUnavailable, err)
	}
	return fmt.Errorf("%s: %w", action, err)
}

func isUnavailable(err error) bool { return awserr.IsUnavailable(err) }

// isConditionFailed reports whether err is a failed condition of one item
// write.
func isConditionFailed(err error) bool {
	var ccf *types.ConditionalCheckFailedException
	return errors.As(err, &ccf)
}
