package dynamobroker_test

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
	"github.com/quarryhq/quarry/modelservice"
	"github.com/quarryhq/quarry/modelservice/brokertest"
	"github.com/quarryhq/quarry/modelservice/dynamobroker"
)

var (
	runID    = fmt.Sprintf("%x", time.Now().UnixNano()&0xffffffffff)
	tableSeq atomic.Int64
)

// newClient returns an SDK client from the default chain (AWS_ENDPOINT_URL,
// AWS_REGION, credentials) after checking that the endpoint answers. Its
// callers ask testenv.AWS first.
func newClient(t *testing.T) *dynamodb.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg, err := config.LoadDefaultConfig(ctx)
	require.NoError(t, err, "load the AWS SDK config")
	if cfg.Region == "" {
		cfg.Region = "us-east-1"
	}
	c := dynamodb.NewFromConfig(cfg)
	_, err = c.ListTables(ctx, &dynamodb.ListTablesInput{Limit: aws.Int32(1)})
	require.NoError(t, err, "%s=1 but the DynamoDB endpoint (AWS_ENDPOINT_URL=%q) does not answer", testenv.EnvAWS, os.Getenv("AWS_ENDPOINT_URL"))
	return c
}

// freshTable creates a table no other test or run uses and deletes it when
// t ends.
func freshTable(t *testing.T, c *dynamodb.Client) string {
	t.Helper()
	table := fmt.Sprintf("quarry-test-relay-%s-%d", runID, tableSeq.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, dynamobroker.CreateTables(ctx, c, table))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := dynamobroker.DeleteTables(ctx, c, table); err != nil {
			t.Errorf("delete test table: %v", err)
		}
	})
	return table
}

func TestBroker_Conformance(t *testing.T) {
	testenv.AWS(t)
	c := newClient(t)
	open := func(t *testing.T, table string) modelservice.Broker {
		b := dynamobroker.New(dynamobroker.Config{Table: table}, c, nil)
		t.Cleanup(func() { _ = b.Close(context.Background()) })
		return b
	}
	tables := map[modelservice.Broker]string{}
	brokertest.Run(t, func(t *testing.T) modelservice.Broker {
		table := freshTable(t, c)
		b := open(t, table)
		tables[b] = table
		return b
	}, brokertest.Options{
		NewReplica: func(t *testing.T, b modelservice.Broker) modelservice.Broker { return open(t, tables[b]) },
	})
}
