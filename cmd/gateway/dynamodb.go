package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/quarryhq/quarry/warmpool"
	"github.com/quarryhq/quarry/warmpool/dynamostore"
)

// DynamoConfig is the DynamoDB store's configuration
// (QUARRY_DYNAMODB_TASKS_TABLE, QUARRY_DYNAMODB_LEASES_TABLE,
// QUARRY_DYNAMODB_SHARDS, ...), embedded in Config so that its variables
// stay flat for envconfig.
type DynamoConfig = dynamostore.Config

// validateDynamo checks the DynamoDB settings against the manager's: an
// ended lease must stay in the table for as long as the manager keeps ended
// leases readable.
func (c Config) validateDynamo() error {
	if err := c.DynamoConfig.Validate(); err != nil {
		return err
	}
	endedTTL := c.EndedTTL
	if endedTTL == 0 {
		endedTTL = dynamostore.DefaultEndedTTL
	}
	if retention := c.ManagerConfig.WithDefaults().LeaseRetention; endedTTL <= retention {
		return fmt.Errorf("QUARRY_DYNAMODB_ENDED_TTL: %s must exceed QUARRY_LEASE_RETENTION %s", endedTTL, retention)
	}
	return nil
}

// loadAWS loads the AWS SDK's configuration the standard way
// (config.LoadDefaultConfig: AWS_REGION, AWS_ENDPOINT_URL, credentials
// from the environment, profile or instance role) with the store's retry
// attempts and region. It fails when no region is configured.
func loadAWS(ctx context.Context, cfg DynamoConfig) (aws.Config, error) {
	awsCfg, err := config.LoadDefaultConfig(ctx, cfg.SDKOptions()...)
	if err != nil {
		return aws.Config{}, fmt.Errorf("load AWS configuration: %w", err)
	}
	if awsCfg.Region == "" {
		return aws.Config{}, errors.New("AWS_REGION (or QUARRY_DYNAMODB_REGION): no AWS region is configured")
	}
	return awsCfg, nil
}

// openDynamoStore opens the DynamoDB lease store on the configured tables
// (which `quarry tables create` makes). Every HTTP request the SDK sends is
// counted in quarry_dynamodb_requests_total by operation and by the manager
// call it serves (warmpool.CallerOf), retries included.
func openDynamoStore(ctx context.Context, cfg Config, deps storeDeps) (warmpool.Store, error) {
	awsCfg, err := loadAWS(ctx, cfg.DynamoConfig)
	if err != nil {
		return nil, err
	}
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quarry_dynamodb_requests_total",
		Help: "HTTP requests to DynamoDB (SDK retries included), by operation and by the manager call they serve (acquire, get, heartbeat, release, reconcile, reaper, ...).",
	}, []string{"operation", "caller"})
	if err := deps.metrics.Register(requests); err != nil {
		return nil, fmt.Errorf("register DynamoDB metrics: %w", err)
	}
	next := awsCfg.HTTPClient
	if next == nil {
		next = awshttp.NewBuildableClient()
	}
	client := dynamodb.NewFromConfig(awsCfg, func(o *dynamodb.Options) {
		o.HTTPClient = countingClient{next: next, requests: requests}
	})
	s, err := dynamostore.New(client, cfg.DynamoConfig)
	if err != nil {
		return nil, err
	}
	deps.log.Info("lease store: DynamoDB", "region", awsCfg.Region,
		"tasks_table", cmp.Or(cfg.TasksTable, dynamostore.DefaultTasksTable),
		"leases_table", cmp.Or(cfg.LeasesTable, dynamostore.DefaultLeasesTable))
	return s, nil
}

// countingClient counts the SDK's HTTP requests before sending them.
type countingClient struct {
	next     aws.HTTPClient
	requests *prometheus.CounterVec
}

// Do counts req by its DynamoDB operation (the X-Amz-Target header,
// "DynamoDB_20120810.GetItem") and its caller, then sends it.
func (c countingClient) Do(req *http.Request) (*http.Response, error) {
	op := req.Header.Get("X-Amz-Target")
	if i := strings.LastIndexByte(op, '.'); i >= 0 {
		op = op[i+1:]
	}
	if op == "" {
		op = "unknown"
	}
	caller := warmpool.CallerOf(req.Context())
	if caller == "" {
		caller = "other"
	}
	c.requests.WithLabelValues(op, caller).Inc()
	return c.next.Do(req)
}
