// Package ddbtable creates and deletes the DynamoDB tables of Quarry's
// simpler AWS backends (the relay broker's, the checkpoint store's) the
// same way: create unless it exists, add the indexes an existing table
// lacks, wait until everything is active, delete unless missing.
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
	UpdateTable(ctx context.Context, in *dynamodb.UpdateTableInput, optFns ...func(*dynamodb.Options)) (*dynamodb.UpdateTableOutput, error)
	DeleteTable(ctx context.Context, in *dynamodb.DeleteTableInput, optFns ...func(*dynamodb.Options)) (*dynamodb.DeleteTableOutput, error)
}

var _ API = (*dynamodb.Client)(nil)

// poll is how often Create describes the table while it waits.
const poll = 200 * time.Millisecond

// Create creates def's table and waits until it and its indexes are active
// (bounded by ctx). On a table that exists already it adds each global
// secondary index of def the table lacks (one UpdateTable at a time, each
// waited for until ACTIVE: DynamoDB fills it from the existing items while
// the table stays available); it changes and deletes nothing else, so an
// index of an older schema stays until an operator deletes it. Safe to run
// again, and from several processes.
func Create(ctx context.Context, api API, def *dynamodb.CreateTableInput) error {
	table := aws.ToString(def.TableName)
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
		case <-time.After(poll):
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

// Delete deletes the table. A missing table is not an error.
func Delete(ctx context.Context, api API, table string) error {
	_, err := api.DeleteTable(ctx, &dynamodb.DeleteTableInput{TableName: aws.String(table)})
	var rnf *types.ResourceNotFoundException
	if err != nil && !errors.As(err, &rnf) {
		return fmt.Errorf("delete table %s: %w", table, err)
	}
	return nil
}
