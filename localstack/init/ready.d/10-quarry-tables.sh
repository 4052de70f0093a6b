#!/usr/bin/env bash
# Creates Quarry's DynamoDB tables in LocalStack (run from /etc/localstack/init/ready.d/).
# Generated from the Go table definitions (warmpool/dynamostore, modelservice/dynamobroker);
# do not edit: go test ./cmd/quarry -run TestLocalStackHook -update rewrites it.
set -euo pipefail

create_table() { # name cli-input-json
  if awslocal dynamodb describe-table --table-name "$1" >/dev/null 2>&1; then
    echo "quarry: table $1 exists"
    return
  fi
  awslocal dynamodb create-table --cli-input-json "$2" >/dev/null
  awslocal dynamodb wait table-exists --table-name "$1"
  echo "quarry: created table $1"
}

enable_ttl() { # table attribute
  if [ "$(awslocal dynamodb describe-time-to-live --table-name "$1" --query TimeToLiveDescription.TimeToLiveStatus --output text)" != ENABLED ]; then
    awslocal dynamodb update-time-to-live --table-name "$1" --time-to-live-specification "Enabled=true,AttributeName=$2" >/dev/null
  fi
}

create_table quarry-tasks '{"AttributeDefinitions":[{"AttributeName":"pk","AttributeType":"S"},{"AttributeName":"pool_pk","AttributeType":"S"},{"AttributeName":"ready_pk","AttributeType":"S"},{"AttributeName":"ready_sk","AttributeType":"N"}],"BillingMode":"PAY_PER_REQUEST","GlobalSecondaryIndexes":[{"IndexName":"tasks-by-pool","KeySchema":[{"AttributeName":"pool_pk","KeyType":"HASH"}],"Projection":{"ProjectionType":"KEYS_ONLY"}},{"IndexName":"ready-tasks","KeySchema":[{"AttributeName":"ready_pk","KeyType":"HASH"},{"AttributeName":"ready_sk","KeyType":"RANGE"}],"Projection":{"ProjectionType":"ALL"}}],"KeySchema":[{"AttributeName":"pk","KeyType":"HASH"}],"TableName":"quarry-tasks"}'
create_table quarry-leases '{"AttributeDefinitions":[{"AttributeName":"pk","AttributeType":"S"},{"AttributeName":"owner_pk","AttributeType":"S"},{"AttributeName":"owner_sk","AttributeType":"N"},{"AttributeName":"expiry_pk","AttributeType":"S"},{"AttributeName":"expiry_sk","AttributeType":"N"},{"AttributeName":"ended_pk","AttributeType":"S"},{"AttributeName":"ended_sk","AttributeType":"N"}],"BillingMode":"PAY_PER_REQUEST","GlobalSecondaryIndexes":[{"IndexName":"leases-by-owner","KeySchema":[{"AttributeName":"owner_pk","KeyType":"HASH"},{"AttributeName":"owner_sk","KeyType":"RANGE"}],"Projection":{"ProjectionType":"KEYS_ONLY"}},{"IndexName":"active-by-expiry","KeySchema":[{"AttributeName":"expiry_pk","KeyType":"HASH"},{"AttributeName":"expiry_sk","KeyType":"RANGE"}],"Projection":{"ProjectionType":"KEYS_ONLY"}},{"IndexName":"ended-by-time","KeySchema":[{"AttributeName":"ended_pk","KeyType":"HASH"},{"AttributeName":"ended_sk","KeyType":"RANGE"}],"Projection":{"NonKeyAttributes":["owner","idempotency_key","idempotency_forgotten"],"ProjectionType":"INCLUDE"}}],"KeySchema":[{"AttributeName":"pk","KeyType":"HASH"}],"TableName":"quarry-leases"}'
create_table quarry-model-relay '{"AttributeDefinitions":[{"AttributeName":"pk","AttributeType":"S"},{"AttributeName":"sk","AttributeType":"S"},{"AttributeName":"lease","AttributeType":"S"},{"AttributeName":"rid","AttributeType":"S"},{"AttributeName":"qp","AttributeType":"S"},{"AttributeName":"qk","AttributeType":"S"}],"BillingMode":"PAY_PER_REQUEST","GlobalSecondaryIndexes":[{"IndexName":"by-lease","KeySchema":[{"AttributeName":"lease","KeyType":"HASH"},{"AttributeName":"rid","KeyType":"RANGE"}],"Projection":{"ProjectionType":"ALL"}},{"IndexName":"queue-by-shard","KeySchema":[{"AttributeName":"qp","KeyType":"HASH"},{"AttributeName":"qk","KeyType":"RANGE"}],"Projection":{"NonKeyAttributes":["rid","pool","labels","deadline","qs"],"ProjectionType":"INCLUDE"}}],"KeySchema":[{"AttributeName":"pk","KeyType":"HASH"},{"AttributeName":"sk","KeyType":"RANGE"}],"TableName":"quarry-model-relay"}'

enable_ttl quarry-leases ttl
enable_ttl quarry-model-relay ttl
awslocal dynamodb put-item --table-name quarry-tasks \
  --item '{"pk":{"S":"meta#schema"},"shards":{"N":"8"}}' \
  --condition-expression 'attribute_not_exists(pk) OR shards = :n' \
  --expression-attribute-values '{":n":{"N":"8"}}'
echo "quarry: tables ready (8 shards)"
