#!/usr/bin/env bash
# Creates Quarry's ECS resources in LocalStack (run from /etc/localstack/init/ready.d/, after
# 10-quarry-tables.sh), so that a gateway runs locally with QUARRY_PROVIDER=ecs (docs/DEPLOY.md):
#   - the cluster "quarry" with the FARGATE and FARGATE_SPOT capacity providers;
#   - the agent token key secret "quarry/agent-token-key" (32 random bytes in hex);
#   - the sandboxes' task execution role "quarry-sandbox-exec";
#   - the task definition "quarry-default" of the pool "default", with the layout providers/ecs
#     renders and infra/modules/quarry/ecs.tf registers (an init container copies /execagent from
#     the agent image into a shared volume; the "sandbox" container runs it as its entry point).
# Idempotent. Outside LocalStack (no awslocal) it talks to AWS_ENDPOINT_URL (default
# http://127.0.0.1:4566) with the aws CLI. Override the names and images with QUARRY_LOCAL_*.
set -euo pipefail

if ! command -v awslocal >/dev/null 2>&1; then
  awslocal() { aws --endpoint-url "${AWS_ENDPOINT_URL:-http://127.0.0.1:4566}" "$@"; }
fi
export AWS_DEFAULT_REGION="${AWS_DEFAULT_REGION:-${AWS_REGION:-us-east-1}}"

cluster="${QUARRY_LOCAL_CLUSTER:-quarry}"
secret="${QUARRY_LOCAL_TOKEN_SECRET:-quarry/agent-token-key}"
role="${QUARRY_LOCAL_EXECUTION_ROLE:-quarry-sandbox-exec}"
family="${QUARRY_LOCAL_TASK_FAMILY:-quarry-default}"
agent_image="${QUARRY_LOCAL_AGENT_IMAGE:-quarry/agent:latest}"   # /execagent and cp: scripts/images/agent.sh
pool_image="${QUARRY_LOCAL_POOL_IMAGE:-quarry-test/bash}"
agent_port="${QUARRY_LOCAL_AGENT_PORT:-8000}"

# The cluster, with both Fargate capacity providers.
status="$(awslocal ecs describe-clusters --clusters "$cluster" --query 'clusters[0].status' --output text 2>/dev/null || true)"
if [ "$status" = ACTIVE ]; then
  echo "quarry: cluster $cluster exists"
else
  awslocal ecs create-cluster --cluster-name "$cluster" \
    --capacity-providers FARGATE FARGATE_SPOT \
    --default-capacity-provider-strategy capacityProvider=FARGATE,weight=1 \
    --tags key=quarry.gateway,value=local >/dev/null
  echo "quarry: created cluster $cluster"
fi

# The agent token key: the gateway derives agent tokens from it, ECS injects it into each agent.
secret_arn="$(awslocal secretsmanager describe-secret --secret-id "$secret" --query ARN --output text 2>/dev/null || true)"
if [ -z "$secret_arn" ] || [ "$secret_arn" = None ]; then
  key="$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')"
  secret_arn="$(awslocal secretsmanager create-secret --name "$secret" \
    --description "Quarry agent token key (hex), local" --secret-string "$key" --query ARN --output text)"
  echo "quarry: created secret $secret"
else
  echo "quarry: secret $secret exists"
fi

# The sandboxes' task execution role (LocalStack does not enforce IAM; AWS does: infra/).
role_arn="$(awslocal iam get-role --role-name "$role" --query Role.Arn --output text 2>/dev/null || true)"
if [ -z "$role_arn" ] || [ "$role_arn" = None ]; then
  role_arn="$(awslocal iam create-role --role-name "$role" \
    --assume-role-policy-document '{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":{"Service":"ecs-tasks.amazonaws.com"},"Action":"sts:AssumeRole"}]}' \
    --query Role.Arn --output text)"
  echo "quarry: created role $role"
fi

# The default pool's task definition, registered once per content: the definition carries a tag
# with the hash of what was registered, and a run that finds the same hash on the latest revision
# registers nothing.
td_json="$(cat <<JSON
{
  "family": "$family",
  "requiresCompatibilities": ["FARGATE"],
  "networkMode": "awsvpc",
  "cpu": "1024",
  "memory": "2048",
  "executionRoleArn": "$role_arn",
  "runtimePlatform": {"cpuArchitecture": "X86_64", "operatingSystemFamily": "LINUX"},
  "volumes": [{"name": "quarry-agent"}],
  "containerDefinitions": [
    {
      "name": "quarry-agent-init",
      "image": "$agent_image",
      "essential": false,
      "entryPoint": ["cp", "/execagent", "/.quarry/execagent"],
      "mountPoints": [{"sourceVolume": "quarry-agent", "containerPath": "/.quarry", "readOnly": false}],
      "memoryReservation": 16
    },
    {
      "name": "sandbox",
      "image": "$pool_image",
      "essential": true,
      "entryPoint": ["/.quarry/execagent"],
      "command": [],
      "dependsOn": [{"containerName": "quarry-agent-init", "condition": "SUCCESS"}],
      "mountPoints": [{"sourceVolume": "quarry-agent", "containerPath": "/.quarry", "readOnly": true}],
      "portMappings": [{"containerPort": $agent_port, "protocol": "tcp"}],
      "environment": [{"name": "QUARRY_AGENT_ADDR", "value": "0.0.0.0:$agent_port"},
                      {"name": "QUARRY_AGENT_WORKDIR", "value": "/tmp/quarry-work"},
                      {"name": "QUARRY_AGENT_TOKEN_NONCE_FROM", "value": "ecs-task-arn"}],
      "secrets": [{"name": "QUARRY_AGENT_TOKEN_KEY", "valueFrom": "$secret_arn"}],
      "user": "65534:65534",
      "linuxParameters": {"capabilities": {"drop": ["AUDIT_WRITE", "MKNOD", "NET_RAW", "SETFCAP", "SETPCAP", "SYS_CHROOT"]}},
      "memoryReservation": 2032
    }
  ]
}
JSON
)"
td_hash="$(printf '%s' "$td_json" | sha256sum | cut -c1-32)"
have="$(awslocal ecs describe-task-definition --task-definition "$family" --include TAGS \
  --query "tags[?key=='quarry.spec-hash'].value | [0]" --output text 2>/dev/null || true)"
if [ "$have" = "$td_hash" ]; then
  td_arn="$(awslocal ecs describe-task-definition --task-definition "$family" --query taskDefinition.taskDefinitionArn --output text)"
  echo "quarry: task definition $family is up to date"
else
  td_json="${td_json%\}*}, \"tags\": [{\"key\": \"quarry.managed\", \"value\": \"true\"}, {\"key\": \"quarry.pool\", \"value\": \"default\"}, {\"key\": \"quarry.spec-hash\", \"value\": \"$td_hash\"}]}"
  td_arn="$(awslocal ecs register-task-definition --cli-input-json "$td_json" --query taskDefinition.taskDefinitionArn --output text)"
fi
echo "quarry: task definition $td_arn"

cat <<EOF2
quarry: ECS ready. Run the gateway against it (docs/DEPLOY.md):
  QUARRY_PROVIDER=ecs QUARRY_ECS_CLUSTER=$cluster QUARRY_ECS_SUBNETS=subnet-00000000
  QUARRY_ECS_TOKEN_KEY_SECRET_ARN=$secret_arn QUARRY_ECS_EXECUTION_ROLE_ARN=$role_arn
  QUARRY_ECS_AGENT_IMAGE=$agent_image  (or pool option task_definition=$td_arn)
EOF2
