// Package ddbtable creates and deletes the DynamoDB tables of Quarry's
// simpler AWS backends (the relay broker's, the checkpoint store's) the
// same way: create unless it exists, wait until active, delete unless
// missing.
//
// It must not import any other Quarry package.
package ddbtable

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// API is what Create and Delete call; *dynamodb.Client satisfies it.
type API interface {
	CreateTable(ctx context.Context, in *dynamodb.CreateTableInput, optFns ...func(*dynamodb.Options)) (*dynamodb.CreateTableOutput, error)
	DescribeTable(ctx context.Context, in *dynamodb.DescribeTableInput, optFns ...func(*dynamodb.Options)) (*dynamodb.DescribeTableOutput, error)
	DeleteTable(ctx context.Context, in *dynamodb.DeleteTableInput, optFns ...func(*dynamodb.Options)) (*dynamodb.DeleteTableOutput, error)
}

var _ API = (*dynamodb.Client)(nil)

// poll is how often Create asks whether the table is active.
const poll = 200 * time.Millisecond

// Create creates def's table and waits until it is active (bounded by
// ctx). A table that exists already is left as it is.
func Create(ctx context.Context, api API, def *dynamodb.CreateTableInput) error {
	table := aws.ToString(def.TableName)
	_, err := api.CreateTable(ctx, def)
	var inUse *types.ResourceInUseException
	if err != nil && !errors.As(err, &inUse) {
		return fmt.Errorf("create table %s: %w", table, err)
	}
	for {
		out, err := api.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(table)})
		if err != nil {
			return fmt.Errorf("describe table %s: %w", table, err)
		}
		if out.Table != nil && out.Table.TableStatus == types.TableStatusActive {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for table %s: %w", table, ctx.Err())
		case <-time.After(poll):
		}
	}
}

// Delete deletes the table. A missing table is not an error.
func Delete(ctx context.Context, api API, table string) error {
	_, err := api.DeleteTable(ctx, &dynamodb.DeleteTableInput{TableName: aws.String(table)})
	var rnf *types.ResourceNotFoundException
	if err != nil && !errors.As(err, &rnf) {
		return fmt.Errorf("delete table %s: %w", table, err)
	}
	return nil
}
