# Least privilege. The sandboxes' execution role pulls images, writes logs
# and reads the agent token key only. The gateway's role may run tasks only
# from the pools' task definitions and its own (family prefix
# local.family_prefix, images on demand) and only on this cluster, register
# and deregister task definitions of that prefix only, stop and describe
# only this cluster's tasks, pass only the sandboxes' roles, use only its
# tables, and read only its three secrets.

data "aws_iam_policy_document" "ecs_tasks_assume" {
  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["ecs-tasks.amazonaws.com"]
    }
  }
}

resource "aws_iam_role" "sandbox_execution" {
  name_prefix        = "${var.name}-sandbox-exec-"
  assume_role_policy = data.aws_iam_policy_document.ecs_tasks_assume.json
  tags               = local.tags
}

resource "aws_iam_role_policy_attachment" "sandbox_execution" {
  role       = aws_iam_role.sandbox_execution.name
  policy_arn = "arn:${local.partition}:iam::aws:policy/service-role/AmazonECSTaskExecutionRolePolicy"
}

data "aws_iam_policy_document" "sandbox_execution_secret" {
  statement {
    sid       = "AgentTokenKey"
    actions   = ["secretsmanager:GetSecretValue"]
    resources = [local.token_key_secret_arn]
  }
}

resource "aws_iam_role_policy" "sandbox_execution_secret" {
  name   = "agent-token-key"
  role   = aws_iam_role.sandbox_execution.id
  policy = data.aws_iam_policy_document.sandbox_execution_secret.json
}

# The gateway's own role: the Lambda function's execution role, or the
# gateway service's task role.
data "aws_iam_policy_document" "gateway_assume" {
  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = local.lambda ? ["lambda.amazonaws.com"] : ["ecs-tasks.amazonaws.com"]
    }
  }
}

resource "aws_iam_role" "gateway" {
  name_prefix        = "${var.name}-gateway-"
  assume_role_policy = data.aws_iam_policy_document.gateway_assume.json
  tags               = local.tags
}

locals {
  cluster_arn = aws_ecs_cluster.this.arn
  table_arns = [
    aws_dynamodb_table.tasks.arn,
    aws_dynamodb_table.leases.arn,
    aws_dynamodb_table.model_relay.arn,
    aws_dynamodb_table.checkpoints.arn,
  ]
  passed_roles = compact([aws_iam_role.sandbox_execution.arn, var.sandbox_task_role_arn])
  # The task definitions the gateway registers itself (images on demand):
  # families "<name>_<pool>-<hash>". Terraform's own are "<name>-<pool>",
  # which no '_' can start like them.
  own_task_definitions = "arn:${local.partition}:ecs:${local.region}:${local.account}:task-definition/${local.family_prefix}*"
}

data "aws_iam_policy_document" "gateway" {
  statement {
    sid = "LeaseStoreRelayAndCheckpointTables"
    actions = [
      "dynamodb:GetItem",
      "dynamodb:PutItem",
      "dynamodb:UpdateItem",
      "dynamodb:DeleteItem",
      "dynamodb:Query",
      "dynamodb:Scan",
      "dynamodb:BatchGetItem",
      "dynamodb:BatchWriteItem",
      "dynamodb:TransactWriteItems",
      "dynamodb:ConditionCheckItem",
      "dynamodb:DescribeTable",
      "dynamodb:DescribeTimeToLive",
    ]
    resources = concat(local.table_arns, [for arn in local.table_arns : "${arn}/index/*"])
  }

  statement {
    sid = "CheckpointObjects"
    actions = [
      "s3:PutObject",
      "s3:GetObject",
      "s3:DeleteObject",
      "s3:AbortMultipartUpload",
    ]
    resources = ["${aws_s3_bucket.checkpoints.arn}/*"]
  }

  statement {
    sid     = "RunPoolTasksOnThisCluster"
    actions = ["ecs:RunTask"]
    resources = concat([for td in aws_ecs_task_definition.pool :
    "arn:${local.partition}:ecs:${local.region}:${local.account}:task-definition/${td.family}:*"], var.on_demand_images ? [local.own_task_definitions] : [])
    condition {
      test     = "ArnEquals"
      variable = "ecs:cluster"
      values   = [local.cluster_arn]
    }
  }

  statement {
    sid       = "ManageThisClustersTasks"
    actions   = ["ecs:StopTask", "ecs:DescribeTasks"]
    resources = ["arn:${local.partition}:ecs:${local.region}:${local.account}:task/${aws_ecs_cluster.this.name}/*"]
    condition {
      test     = "ArnEquals"
      variable = "ecs:cluster"
      values   = [local.cluster_arn]
    }
  }

  statement {
    sid       = "ListThisClustersTasks"
    actions   = ["ecs:ListTasks"]
    resources = ["*"]
    condition {
      test     = "ArnEquals"
      variable = "ecs:cluster"
      values   = [local.cluster_arn]
    }
  }

  statement {
    sid       = "TagTasksAtLaunch"
    actions   = ["ecs:TagResource"]
    resources = ["arn:${local.partition}:ecs:${local.region}:${local.account}:task/${aws_ecs_cluster.this.name}/*"]
    condition {
      test     = "StringEquals"
      variable = "ecs:CreateAction"
      values   = ["RunTask"]
    }
  }

  # After RunTask (one call starts up to 10 tasks with shared tags), the
  # provider names each task with its own quarry.task tag.
  statement {
    sid       = "NameTasksAfterLaunch"
    actions   = ["ecs:TagResource"]
    resources = ["arn:${local.partition}:ecs:${local.region}:${local.account}:task/${aws_ecs_cluster.this.name}/*"]
    condition {
      test     = "ForAllValues:StringEquals"
      variable = "aws:TagKeys"
      values   = ["quarry.task"]
    }
  }

  statement {
    sid       = "ReadTaskDefinitions"
    actions   = ["ecs:DescribeTaskDefinition"]
    resources = ["*"] # DescribeTaskDefinition has no resource-level permissions
  }

  # Images on demand: the gateway registers a task definition per image (and
  # class) on first use and deregisters it after its retention, only in its
  # own families; tagged at registration (quarry.pool, .gateway, .class).
  dynamic "statement" {
    for_each = var.on_demand_images ? [1] : []
    content {
      sid       = "RegisterAndDeregisterItsOwnTaskDefinitions"
      actions   = ["ecs:RegisterTaskDefinition", "ecs:DeregisterTaskDefinition"]
      resources = [local.own_task_definitions]
    }
  }

  dynamic "statement" {
    for_each = var.on_demand_images ? [1] : []
    content {
      sid       = "TagItsTaskDefinitionsAtRegistration"
      actions   = ["ecs:TagResource"]
      resources = [local.own_task_definitions]
      condition {
        test     = "StringEquals"
        variable = "ecs:CreateAction"
        values   = ["RegisterTaskDefinition"]
      }
    }
  }

  # RegisterTaskDefinition passes the execution role (and the task role):
  # only the sandboxes' roles, only to ECS tasks.
  statement {
    sid       = "PassOnlyTheSandboxRoles"
    actions   = ["iam:PassRole"]
    resources = local.passed_roles
    condition {
      test     = "StringEquals"
      variable = "iam:PassedToService"
      values   = ["ecs-tasks.amazonaws.com"]
    }
  }

  statement {
    sid       = "ReadItsSecrets"
    actions   = ["secretsmanager:GetSecretValue"]
    resources = local.secret_arns
  }

  dynamic "statement" {
    for_each = var.task_state_events ? [1] : []
    content {
      sid       = "ReadTaskStateEvents"
      actions   = ["sqs:ReceiveMessage", "sqs:DeleteMessage"] # DeleteMessageBatch is DeleteMessage's
      resources = [aws_sqs_queue.task_events[0].arn]
    }
  }
}

resource "aws_iam_role_policy" "gateway" {
  name   = "quarry-gateway"
  role   = aws_iam_role.gateway.id
  policy = data.aws_iam_policy_document.gateway.json
}

# Lambda: logs and the network interfaces of its VPC attachment.
resource "aws_iam_role_policy_attachment" "gateway_lambda_vpc" {
  count      = local.lambda ? 1 : 0
  role       = aws_iam_role.gateway.name
  policy_arn = "arn:${local.partition}:iam::aws:policy/service-role/AWSLambdaVPCAccessExecutionRole"
}

# ECS service mode: the gateway task's execution role pulls its image,
# writes its logs and injects its secrets.
resource "aws_iam_role" "gateway_execution" {
  count              = local.ecs_service ? 1 : 0
  name_prefix        = "${var.name}-gateway-exec-"
  assume_role_policy = data.aws_iam_policy_document.ecs_tasks_assume.json
  tags               = local.tags
}

resource "aws_iam_role_policy_attachment" "gateway_execution" {
  count      = local.ecs_service ? 1 : 0
  role       = aws_iam_role.gateway_execution[0].name
  policy_arn = "arn:${local.partition}:iam::aws:policy/service-role/AmazonECSTaskExecutionRolePolicy"
}

data "aws_iam_policy_document" "gateway_execution_secrets" {
  statement {
    sid       = "InjectGatewaySecrets"
    actions   = ["secretsmanager:GetSecretValue"]
    resources = local.secret_arns
  }
}

resource "aws_iam_role_policy" "gateway_execution_secrets" {
  count  = local.ecs_service ? 1 : 0
  name   = "gateway-secrets"
  role   = aws_iam_role.gateway_execution[0].id
  policy = data.aws_iam_policy_document.gateway_execution_secrets.json
}
