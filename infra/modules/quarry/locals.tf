data "aws_region" "current" {}

data "aws_caller_identity" "current" {}

data "aws_partition" "current" {}

locals {
  tags        = merge({ "quarry.gateway" = var.name }, var.tags)
  lambda      = var.gateway_mode == "lambda"
  ecs_service = var.gateway_mode == "ecs"
  region      = data.aws_region.current.name
  account     = data.aws_caller_identity.current.account_id
  partition   = data.aws_partition.current.partition

  api_keys_secret_arn  = var.api_keys_secret_arn != null ? var.api_keys_secret_arn : aws_secretsmanager_secret.api_keys[0].arn
  relay_secret_arn     = var.relay_secret_arn != null ? var.relay_secret_arn : aws_secretsmanager_secret.relay[0].arn
  token_key_secret_arn = var.token_key_secret_arn != null ? var.token_key_secret_arn : aws_secretsmanager_secret.token_key[0].arn
  secret_arns          = [local.api_keys_secret_arn, local.relay_secret_arn, local.token_key_secret_arn]

  # The gateway's secrets, by the variable each one fills. ECS injects them
  # into the gateway's container; in Lambda the gateway reads them itself at
  # its cold start (QUARRY_SECRET_ARNS). The agent token key the gateway
  # reads from QUARRY_ECS_TOKEN_KEY_SECRET_ARN in both modes. Only ARNs are
  # in the state.
  gateway_secrets = {
    QUARRY_API_KEYS     = local.api_keys_secret_arn
    QUARRY_RELAY_SECRET = local.relay_secret_arn
  }

  # The families of the task definitions the gateway registers itself
  # (images on demand): "<name>_<pool>-<hash>" (QUARRY_ECS_FAMILY_PREFIX).
  # Terraform's are "<name>-<pool>": the '_' keeps the two apart, so IAM
  # lets the gateway register and deregister its own only.
  family_prefix = "${var.name}_"

  # The pools document (QUARRY_POOLS): each pool launches the task
  # definition registered for it below; only images on demand need the
  # gateway to register task definitions (iam.tf).
  pools_document = jsonencode({
    pools = [for name, p in var.pools : {
      name                  = name
      provider              = "ecs"
      image                 = p.image
      cpu                   = p.cpu
      memory                = p.memory_mb
      min_warm              = p.min_warm
      max_total             = p.max_total
      default_lease_seconds = p.default_lease_seconds
      max_lease_seconds     = p.max_lease_seconds
      options = {
        task_definition   = aws_ecs_task_definition.pool[name].arn
        capacity_provider = p.capacity_provider
      }
    }]
  })

  # Every gateway's configuration (docs/CONFIG.md); no secret values.
  gateway_environment = merge({
    QUARRY_GATEWAY_ID               = var.name
    QUARRY_PROVIDER                 = "ecs"
    QUARRY_POOLS                    = local.pools_document
    QUARRY_STORE                    = "dynamodb"
    QUARRY_DYNAMODB_TASKS_TABLE     = aws_dynamodb_table.tasks.name
    QUARRY_DYNAMODB_LEASES_TABLE    = aws_dynamodb_table.leases.name
    QUARRY_DYNAMODB_SHARDS          = tostring(var.dynamodb_shards)
    QUARRY_RELAY_BROKER             = "dynamodb"
    QUARRY_RELAY_DYNAMODB_TABLE     = aws_dynamodb_table.model_relay.name
    QUARRY_CHECKPOINT_STORE         = "s3"
    QUARRY_CHECKPOINT_BUCKET        = aws_s3_bucket.checkpoints.id
    QUARRY_CHECKPOINT_TABLE         = aws_dynamodb_table.checkpoints.name
    QUARRY_ECS_CLUSTER              = aws_ecs_cluster.this.name
    QUARRY_ECS_SUBNETS              = join(",", var.private_subnet_ids)
    QUARRY_ECS_SECURITY_GROUPS      = aws_security_group.sandbox.id
    QUARRY_ECS_TOKEN_KEY_SECRET_ARN = local.token_key_secret_arn
    QUARRY_ECS_AGENT_PORT           = tostring(var.agent_port)
    QUARRY_ECS_LOG_GROUP            = aws_cloudwatch_log_group.sandboxes.name
    }, var.on_demand_images ? merge({
      # What the gateway renders an on-demand image's task definition with.
      QUARRY_ECS_FAMILY_PREFIX      = local.family_prefix
      QUARRY_ECS_EXECUTION_ROLE_ARN = aws_iam_role.sandbox_execution.arn
      QUARRY_ECS_AGENT_IMAGE        = var.agent_image
      }, var.sandbox_task_role_arn != null ? {
      QUARRY_ECS_TASK_ROLE_ARN = var.sandbox_task_role_arn
    } : {}) : {}, var.task_state_events ? {
    QUARRY_ECS_EVENTS_QUEUE_URL = aws_sqs_queue.task_events[0].url
  } : {}, var.gateway_environment)
}
