package dynamobroker

import (
	"context"
	"errors"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"

	"github.com/quarryhq/quarry/internal/awserr"
	"github.com/quarryhq/quarry/internal/ddbtable"
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
	BatchWriteItem(ctx context.Context, in *dynamodb.BatchWriteItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.BatchWriteItemOutput, error)
	CreateTable(ctx context.Context, in *dynamodb.CreateTableInput, optFns ...func(*dynamodb.Options)) (*dynamodb.CreateTableOutput, error)
	DescribeTable(ctx context.Context, in *dynamodb.DescribeTableInput, optFns ...func(*dynamodb.Options)) (*dynamodb.DescribeTableOutput, error)
	DeleteTable(ctx context.Context, in *dynamodb.DeleteTableInput, optFns ...func(*dynamodb.Options)) (*dynamodb.DeleteTableOutput, error)
	UpdateTimeToLive(ctx context.Context, in *dynamodb.UpdateTimeToLiveInput, optFns ...func(*dynamodb.Options)) (*dynamodb.UpdateTimeToLiveOutput, error)
}

var _ API = (*dynamodb.Client)(nil)

// Index names and key attributes of the relay's table.
const (
	indexLease = "by-lease" // lease (S) + rid (S): a lease's exchanges in id order
	indexQueue = "queue"    // qo (S) + qk (S): an owner's pending and claimed requests by visibility time
	attrPK     = "pk"
	attrSK     = "sk"
	attrTTL    = "ttl"
)

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
	return &dynamodb.CreateTableInput{
		TableName:            aws.String(table),
		BillingMode:          types.BillingModePayPerRequest,
		AttributeDefinitions: []types.AttributeDefinition{str(attrPK), str(attrSK), str("lease"), str("rid"), str("qo"), str("qk")},
		KeySchema:            key(attrPK, attrSK),
		GlobalSecondaryIndexes: []types.GlobalSecondaryIndex{
			{IndexName: aws.String(indexLease), KeySchema: key("lease", "rid"), Projection: all},
			{IndexName: aws.String(indexQueue), KeySchema: key("qo", "qk"), Projection: all},
		},
		Tags: []types.Tag{{Key: aws.String("quarry.managed"), Value: aws.String("true")}},
	}
}

// CreateTables creates the relay's table (TableDefinition: on-demand
// capacity, two global secondary indexes, expiry on the "ttl" attribute)
// and waits until it is active (bounded by ctx). A table that exists
// already is left as it is.
func CreateTables(ctx context.Context, api API, table string) error {
	if err := ddbtable.Create(ctx, api, TableDefinition(table)); err != nil {
		return err
	}
	_, err := api.UpdateTimeToLive(ctx, &dynamodb.UpdateTimeToLiveInput{
		TableName:               aws.String(table),
		TimeToLiveSpecification: &types.TimeToLiveSpecification{AttributeName: aws.String(attrTTL), Enabled: aws.Bool(true)},
	})
	var apiErr smithy.APIError
	if err != nil && !(errors.As(err, &apiErr) && apiErr.ErrorCode() == "ValidationException") { // already enabled
		return fmt.Errorf("enable expiry on table %s: %w", table, err)
	}
	return nil
}

// DeleteTables deletes the relay's table. A missing table is not an error.
func DeleteTables(ctx context.Context, api API, table string) error {
	return ddbtable.Delete(ctx, api, table)
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
