package dynamostore_test

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/internal/testenv"
	"github.com/quarryhq/quarry/warmpool/dynamostore"
)

// runID makes this run's table names unique, so that runs sharing an
// endpoint never see each other's data.
var runID = fmt.Sprintf("%x", time.Now().UnixNano()&0xffffffffff)

// tableSeq numbers the tables of this run.
var tableSeq atomic.Int64

// newClient returns an SDK client from the default chain, after checking
// that the endpoint answers. The tests that call it need a DynamoDB
// endpoint and ask testenv.AWS first: AWS_ENDPOINT_URL (the emulator,
// LocalStack) or real AWS, with AWS_REGION and credentials from the
// environment.
func newClient(t testing.TB) *dynamodb.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg, err := config.LoadDefaultConfig(ctx, dynamostore.Config{MaxAttempts: 3}.SDKOptions()...)
	require.NoError(t, err, "load the AWS SDK config")
	if cfg.Region == "" {
		cfg.Region = "us-east-1"
	}
	c := dynamodb.NewFromConfig(cfg)
	_, err = c.ListTables(ctx, &dynamodb.ListTablesInput{Limit: aws.Int32(1)})
	require.NoError(t, err, "%s=1 but the DynamoDB endpoint (AWS_ENDPOINT_URL=%q) does not answer", testenv.EnvAWS, os.Getenv("AWS_ENDPOINT_URL"))
	return c
}

// freshTables creates a pair of tables no other test or run uses and
// deletes them when t ends; it returns their Config.
func freshTables(t testing.TB, c *dynamodb.Client, cfg dynamostore.Config) dynamostore.Config {
	t.Helper()
	n := tableSeq.Add(1)
	cfg.TasksTable = fmt.Sprintf("quarry-test-%s-%d-tasks", runID, n)
	cfg.LeasesTable = fmt.Sprintf("quarry-test-%s-%d-leases", runID, n)
	require.NoError(t, dynamostore.CreateTables(context.Background(), c, cfg))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		if err := dynamostore.DeleteTables(ctx, c, cfg); err != nil {
			t.Errorf("delete test tables: %v", err)
		}
	})
	return cfg
}

// newStore returns a store on fresh tables, closed when t ends.
func newStore(t testing.TB, c *dynamodb.Client, cfg dynamostore.Config) *dynamostore.Store {
	t.Helper()
	cfg = freshTables(t, c, cfg)
	s, err := dynamostore.New(c, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}
