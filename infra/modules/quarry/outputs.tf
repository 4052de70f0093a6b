output "gateway_url" {
  description = "The gateway's HTTPS URL: the HTTP API's endpoint (Lambda mode) or the load balancer's (ECS mode; point a DNS name covered by certificate_arn at it)."
  value       = local.lambda ? aws_apigatewayv2_api.gateway[0].api_endpoint : "https://${aws_lb.gateway[0].dns_name}"
}

output "function_url" {
  description = "The Lambda Function URL (enable_function_url), or null."
  value       = try(aws_lambda_function_url.gateway[0].function_url, null)
}

output "cluster_name" {
  description = "The sandboxes' ECS cluster."
  value       = aws_ecs_cluster.this.name
}

output "table_names" {
  description = "The DynamoDB tables: lease store (tasks, leases), model relay and checkpoint store."
  value = {
    tasks       = aws_dynamodb_table.tasks.name
    leases      = aws_dynamodb_table.leases.name
    model_relay = aws_dynamodb_table.model_relay.name
    checkpoints = aws_dynamodb_table.checkpoints.name
  }
}

output "checkpoint_bucket" {
  description = "The S3 bucket of the checkpoint store's archives."
  value       = aws_s3_bucket.checkpoints.id
}

output "secret_arns" {
  description = "The secrets to fill (aws secretsmanager put-secret-value) before the first request: API keys, relay secret, agent token key."
  value = {
    api_keys  = local.api_keys_secret_arn
    relay     = local.relay_secret_arn
    token_key = local.token_key_secret_arn
  }
}

output "ecs_events_queue_url" {
  description = "The SQS queue of the cluster's ECS task state change events (QUARRY_ECS_EVENTS_QUEUE_URL), or null (task_state_events = false)."
  value       = try(aws_sqs_queue.task_events[0].url, null)
}

output "pool_task_definitions" {
  description = "The task definition ARN of each pool."
  value       = { for name, td in aws_ecs_task_definition.pool : name => td.arn }
}

output "security_group_ids" {
  description = "The gateway's and the sandboxes' security groups."
  value = {
    gateway = aws_security_group.gateway.id
    sandbox = aws_security_group.sandbox.id
  }
}

output "gateway_environment" {
  description = "The QUARRY_* variables the gateway runs with (no secret values), e.g. to run a gateway elsewhere against the same deployment."
  value       = local.gateway_environment
}

output "pull_through_cache_prefixes" {
  description = "Where each pull-through cache rule serves its upstream registry's images: ECR repository prefix => \"<account>.dkr.ecr.<region>.amazonaws.com/<prefix>\" (append the image's path in the upstream registry)."
  value = { for prefix, rule in aws_ecr_pull_through_cache_rule.this :
  prefix => "${local.account}.dkr.ecr.${local.region}.amazonaws.com/${prefix}" }
}
