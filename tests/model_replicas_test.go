//go:build integration

package tests

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/client"
	"github.com/quarryhq/quarry/internal/testenv"
	"github.com/quarryhq/quarry/modelservice/dynamobroker"
	"github.com/quarryhq/quarry/modelservice/modeltest"
	"github.com/quarryhq/quarry/warmpool/dynamostore"
)

// relayReplicaEnv creates fresh lease-store and relay tables on the AWS
// endpoint (the emulator of make test: AWS_ENDPOINT_URL, default
// 127.0.0.1:4566) and returns the gateway settings that use them; the
// tables are deleted when the test ends. It fails when the endpoint does
// not answer; its callers ask testenv.AWS first.
func relayReplicaEnv(t *testing.T) []string {
	t.Helper()
	endpoint := cmp.Or(os.Getenv("AWS_ENDPOINT_URL"), "http://127.0.0.1:4566")
	region := cmp.Or(os.Getenv("AWS_REGION"), "us-east-1")
	keyID := cmp.Or(os.Getenv("AWS_ACCESS_KEY_ID"), "test")
	secret := cmp.Or(os.Getenv("AWS_SECRET_ACCESS_KEY"), "test")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	awsCfg, err := config.LoadDefaultConfig(ctx, config.WithRegion(region),
		config.WithCredentialsProvider(credentials.NewStaticCredentialsProvider(keyID, secret, "")))
	require.NoError(t, err)
	api := dynamodb.NewFromConfig(awsCfg, func(o *dynamodb.Options) { o.BaseEndpoint = aws.String(endpoint) })
	_, err = api.ListTables(ctx, &dynamodb.ListTablesInput{Limit: aws.Int32(1)})
	require.NoError(t, err, "QUARRY_TEST_AWS=1, but the AWS endpoint %s does not answer (localstack/emulator.sh start)", endpoint)

	b := make([]byte, 4)
	_, _ = rand.Read(b)
	prefix := "e2e-relay-" + hex.EncodeToString(b)
	store := dynamostore.Config{TasksTable: prefix + "-tasks", LeasesTable: prefix + "-leases"}
	relayTable := prefix + "-model"
	require.NoError(t, dynamostore.CreateTables(ctx, api, store))
	require.NoError(t, dynamobroker.CreateTables(ctx, api, relayTable))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		assert.NoError(t, dynamostore.DeleteTables(ctx, api, store))
		assert.NoError(t, dynamobroker.DeleteTables(ctx, api, relayTable))
	})
	return []string{
		"AWS_ENDPOINT_URL=" + endpoint, "AWS_REGION=" + region, "AWS_ACCESS_KEY_ID=" + keyID,
		"AWS_SECRET_ACCESS_KEY=" + secret, "AWS_EC2_METADATA_DISABLED=true",
		"QUARRY_STORE=dynamodb", "QUARRY_DYNAMODB_TASKS_TABLE=" + store.TasksTable, "QUARRY_DYNAMODB_LEASES_TABLE=" + store.LeasesTable,
		"QUARRY_RELAY_BROKER=dynamodb", "QUARRY_RELAY_DYNAMODB_TABLE=" + relayTable,
		"QUARRY_RELAY_SECRET=relay-secret-shared-by-the-replicas-0123456789",
	}
}

// Two gateway replicas on one DynamoDB: the agent's call reaches replica A
// (its OPENAI_BASE_URL), the trainer claims and answers on replica B, and
// the answer reaches the agent through A.
func TestModelRelayReplicas_CallOnOneAnswerOnTheOther(t *testing.T) {
	testenv.AWS(t)
	py := testenv.PythonPath(t, "openai")
	env := relayReplicaEnv(t)
	dataDir := t.TempDir()
	// One process holds an embedded checkpoint store: each replica its own.
	a := startGateway(t, defaultPools, withDataDir(dataDir), withEnv(append(env, "QUARRY_REPLICA_ID=relay-a", "QUARRY_CHECKPOINT_DIR="+t.TempDir())...))
	b := startGateway(t, defaultPools, withDataDir(dataDir), withEnv(append(env, "QUARRY_REPLICA_ID=relay-b", "QUARRY_CHECKPOINT_DIR="+t.TempDir())...))
	ctx := ctx(t)
	c := a.client()
	sbx, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{})
	require.NoError(t, err)
	base, _ := relayTokenOf(ctx, t, c, sbx.ID)
	require.Equal(t, a.url()+"/v1/sandboxes/"+sbx.ID+"/model/v1", base, "the agent calls replica A")

	tctx, stop := context.WithCancel(ctx)
	answered := trainerLoop(tctx, t, &modeltest.Trainer{URL: b.url(), Key: b.key})
	out := runAgent(ctx, t, c, sbx.ID, py)
	stop()
	reqs := answered()
	assert.Contains(t, out, "plain: answer to: hello relay\n")
	assert.Contains(t, out, "stream: answer to: stream please\n")
	assert.Contains(t, out, "error: 429 trainer is busy\n")
	assert.Len(t, reqs, 3, "replica B claimed every call made through replica A")

	for _, g := range []*gatewayProc{a, b} {
		eventually(t, 30*time.Second, "the transcript is readable on "+g.addr, func() error {
			exs, _ := transcriptOf(t, g.url(), g.key, sbx.ID)["exchanges"].([]any)
			if len(exs) != 3 {
				return fmt.Errorf("%d exchanges", len(exs))
			}
			return nil
		})
	}
	status, body := httpCall(t, http.MethodGet, b.url()+"/v1/sandboxes/"+sbx.ID, a.key, "")
	assert.Equal(t, http.StatusOK, status, body)
}
