package dynamostore_test

import (
	"errors"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/internal/testenv"
	"github.com/quarryhq/quarry/warmpool/dynamostore"
)

// The store's transactions carry a ClientRequestToken so that the SDK's
// retry of one whose answer was lost (it was applied) succeeds as the
// first did, instead of failing its own conditions. DynamoDB does that
// within 10 minutes; the emulator of make test does too
// (localstack/moto_serial.py: moto alone ignores the token, and the fault
// runs then saw releases answered "already released" and launched tasks
// given up). This holds the endpoint the suites run on to it.
func TestDynamoDB_TransactionTokenReplaysItsSuccess(t *testing.T) {
	testenv.AWS(t)
	c := newClient(t)
	cfg := freshTables(t, c, dynamostore.Config{})
	in := func(token string) *dynamodb.TransactWriteItemsInput {
		return &dynamodb.TransactWriteItemsInput{
			ClientRequestToken: aws.String(token),
			TransactItems: []types.TransactWriteItem{{Put: &types.Put{
				TableName:           aws.String(cfg.TasksTable),
				Item:                map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "token-test"}},
				ConditionExpression: aws.String("attribute_not_exists(pk)"),
			}}},
		}
	}
	_, err := c.TransactWriteItems(t.Context(), in("token-one"))
	require.NoError(t, err, "the first write")
	_, err = c.TransactWriteItems(t.Context(), in("token-one"))
	require.NoError(t, err, "the same call again (a retry): the first one's success, nothing changed")
	_, err = c.TransactWriteItems(t.Context(), in("token-two"))
	var canceled *types.TransactionCanceledException
	require.True(t, errors.As(err, &canceled), "another call with the same condition fails it: %v", err)
}
