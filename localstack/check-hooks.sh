#!/usr/bin/env bash
# Runs LocalStack's init hooks (localstack/init/ready.d/*.sh, in order, twice: they must be
# idempotent) against the AWS endpoint in AWS_ENDPOINT_URL (the local emulator under make test, or
# LocalStack), with `awslocal` standing for `aws --endpoint-url $AWS_ENDPOINT_URL`, then checks
# that what they promise exists: the four DynamoDB tables (TTL on two) and the schema item, the checkpoint bucket, the ECS
# cluster with both Fargate capacity providers, the agent token key secret, the task definition.
# The aws CLI is installed into .cache/awscli-venv (pinned) when the venv lacks it.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${AWS_ENDPOINT_URL:?set AWS_ENDPOINT_URL (make test sets it to the local emulator)}"
export AWS_DEFAULT_REGION="${AWS_REGION:-us-east-1}"

venv=.cache/awscli-venv
awscli_version=1.45.11
if ! "$venv/bin/aws" --version >/dev/null 2>&1; then
  echo "== installing awscli==$awscli_version into $venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "awscli==$awscli_version"
fi
shim="$(mktemp -d)"
trap 'rm -rf "$shim"' EXIT
printf '#!/bin/sh\nexec "%s" --endpoint-url "$AWS_ENDPOINT_URL" "$@"\n' "$PWD/$venv/bin/aws" >"$shim/awslocal"
chmod +x "$shim/awslocal"
export PATH="$shim:$PWD/$venv/bin:$PATH"

fail() { echo "check-hooks: $*" >&2; exit 1; }
revision() { awslocal ecs describe-task-definition --task-definition quarry-default --query taskDefinition.revision --output text; }
for round in 1 2; do
  for hook in localstack/init/ready.d/*.sh; do
    echo "== $hook (round $round)"
    "$hook"
  done
  [ "$round" = 1 ] && first="$(revision)"
done
[ "$(revision)" = "$first" ] || fail "the second run registered the unchanged task definition again (revision $first -> $(revision))"

for table in quarry-tasks quarry-leases quarry-model-relay quarry-checkpoints; do
  [ "$(awslocal dynamodb describe-table --table-name "$table" --query Table.TableStatus --output text)" = ACTIVE ] ||
    fail "table $table is not ACTIVE"
done
for table in quarry-leases quarry-model-relay; do
  [ "$(awslocal dynamodb describe-time-to-live --table-name "$table" --query TimeToLiveDescription.TimeToLiveStatus --output text)" = ENABLED ] ||
    fail "TTL is not enabled on $table"
done
[ "$(awslocal dynamodb get-item --table-name quarry-tasks --key '{"pk":{"S":"meta#schema"}}' --query Item.shards.N --output text)" = 8 ] ||
  fail "the schema item of quarry-tasks is missing"
providers="$(awslocal ecs describe-clusters --clusters quarry --query 'clusters[0].capacityProviders' --output text)"
[[ "$providers" == *FARGATE* && "$providers" == *FARGATE_SPOT* ]] || fail "cluster quarry lacks FARGATE/FARGATE_SPOT: $providers"
awslocal secretsmanager describe-secret --secret-id quarry/agent-token-key >/dev/null || fail "no agent token key secret"
awslocal ecs describe-task-definition --task-definition quarry-default >/dev/null || fail "no task definition quarry-default"
awslocal s3api head-bucket --bucket quarry-checkpoints >/dev/null || fail "no checkpoint bucket quarry-checkpoints"
[ "$(awslocal s3api get-bucket-lifecycle-configuration --bucket quarry-checkpoints --query 'Rules[0].AbortIncompleteMultipartUpload.DaysAfterInitiation' --output text)" = 1 ] ||
  fail "the checkpoint bucket does not abort incomplete multipart uploads"
echo "== LocalStack init hooks: ok (idempotent; tables, TTL, schema item, bucket, cluster, secret, task definition)"
