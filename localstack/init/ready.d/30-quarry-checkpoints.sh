#!/usr/bin/env bash
# Creates the S3 checkpoint store's bucket in LocalStack (run from /etc/localstack/init/ready.d/,
# after 10-quarry-tables.sh, which creates its table quarry-checkpoints), so that a gateway runs
# locally with QUARRY_CHECKPOINT_STORE=s3 QUARRY_CHECKPOINT_BUCKET=quarry-checkpoints
# (docs/CONFIG.md). Idempotent. Outside LocalStack (no awslocal) it talks to AWS_ENDPOINT_URL
# (default http://127.0.0.1:4566) with the aws CLI. Override the name with QUARRY_LOCAL_CHECKPOINT_BUCKET.
set -euo pipefail

if ! command -v awslocal >/dev/null 2>&1; then
  awslocal() { aws --endpoint-url "${AWS_ENDPOINT_URL:-http://127.0.0.1:4566}" "$@"; }
fi
export AWS_DEFAULT_REGION="${AWS_DEFAULT_REGION:-${AWS_REGION:-us-east-1}}"

bucket="${QUARRY_LOCAL_CHECKPOINT_BUCKET:-quarry-checkpoints}"
if awslocal s3api head-bucket --bucket "$bucket" >/dev/null 2>&1; then
  echo "quarry: bucket $bucket exists"
else
  awslocal s3api create-bucket --bucket "$bucket" >/dev/null
  echo "quarry: created bucket $bucket"
fi
# As infra/modules/quarry/s3.tf: incomplete multipart uploads (a gateway that died mid-Put) go after a day.
awslocal s3api put-bucket-lifecycle-configuration --bucket "$bucket" --lifecycle-configuration \
  '{"Rules":[{"ID":"abort-incomplete-uploads","Status":"Enabled","Filter":{},"AbortIncompleteMultipartUpload":{"DaysAfterInitiation":1}}]}'
