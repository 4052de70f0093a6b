# The sandboxes' cluster, with Fargate and Fargate Spot, and one task
# definition per pool: the layout providers/ecs renders (an init container
# copies the agent from agent_image into a shared volume; the "sandbox"
# container runs the pool's image with the agent as its entry point).

resource "aws_ecs_cluster" "this" {
  name = var.name
  tags = local.tags

  setting {
    name  = "containerInsights"
    value = "enabled"
  }
}

resource "aws_ecs_cluster_capacity_providers" "this" {
  cluster_name       = aws_ecs_cluster.this.name
  capacity_providers = ["FARGATE", "FARGATE_SPOT"]

  default_capacity_provider_strategy {
    capacity_provider = "FARGATE"
    weight            = 1
    base              = 0
  }
}

resource "aws_cloudwatch_log_group" "sandboxes" {
  name              = "/quarry/${var.name}/sandboxes"
  retention_in_days = var.log_retention_days
  tags              = local.tags
}

resource "aws_ecs_task_definition" "pool" {
  for_each = var.pools

  family                   = "${var.name}-${each.key}"
  requires_compatibilities = ["FARGATE"]
  network_mode             = "awsvpc"
  cpu                      = tostring(floor(each.value.cpu * 1024))
  memory                   = tostring(each.value.memory_mb)
  execution_role_arn       = aws_iam_role.sandbox_execution.arn
  task_role_arn            = var.sandbox_task_role_arn
  tags                     = merge(local.tags, { "quarry.pool" = each.key, "quarry.managed" = "true" })

  runtime_platform {
    operating_system_family = "LINUX"
    cpu_architecture        = each.value.arch
  }

  volume {
    name = "quarry-agent"
  }

  container_definitions = jsonencode([
    {
      name              = "quarry-agent-init"
      image             = var.agent_image
      essential         = false
      entryPoint        = ["cp", "/execagent", "/.quarry/execagent"]
      mountPoints       = [{ sourceVolume = "quarry-agent", containerPath = "/.quarry", readOnly = false }]
      memoryReservation = 16
      logConfiguration = {
        logDriver = "awslogs"
        options = {
          awslogs-group         = aws_cloudwatch_log_group.sandboxes.name
          awslogs-region        = local.region
          awslogs-stream-prefix = "init"
        }
      }
    },
    {
      name         = "sandbox"
      image        = each.value.image
      essential    = true
      entryPoint   = ["/.quarry/execagent"]
      command      = []
      dependsOn    = [{ containerName = "quarry-agent-init", condition = "SUCCESS" }]
      mountPoints  = [{ sourceVolume = "quarry-agent", containerPath = "/.quarry", readOnly = true }]
      portMappings = [{ containerPort = var.agent_port, protocol = "tcp" }]
      environment = [
        { name = "QUARRY_AGENT_ADDR", value = "0.0.0.0:${var.agent_port}" },
        { name = "QUARRY_AGENT_WORKDIR", value = "/tmp/quarry-work" },
        # The agent derives its token from the key and its task's ARN
        # (read from the ECS task metadata endpoint): no per-task override.
        { name = "QUARRY_AGENT_TOKEN_NONCE_FROM", value = "ecs-task-arn" },
      ]
      secrets           = [{ name = "QUARRY_AGENT_TOKEN_KEY", valueFrom = local.token_key_secret_arn }]
      memoryReservation = each.value.memory_mb - 16
      user              = "65534:65534"
      linuxParameters = {
        capabilities = { drop = ["AUDIT_WRITE", "MKNOD", "NET_RAW", "SETFCAP", "SETPCAP", "SYS_CHROOT"] }
      }
      logConfiguration = {
        logDriver = "awslogs"
        options = {
          awslogs-group         = aws_cloudwatch_log_group.sandboxes.name
          awslogs-region        = local.region
          awslogs-stream-prefix = "sandbox"
        }
      }
    },
  ])
}
