# ECS service mode: gateway replicas behind an internet-facing load
# balancer that terminates TLS. Streams (SSE exec, downloads, uploads) are
# served as they come, and every replica runs the background loops
# (lock-gated), so no schedule is needed.

resource "aws_security_group" "alb" {
  count       = local.ecs_service ? 1 : 0
  name_prefix = "${var.name}-alb-"
  description = "Quarry gateway load balancer: HTTPS in, the gateway's port out."
  vpc_id      = var.vpc_id
  tags        = local.tags

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_vpc_security_group_ingress_rule" "alb_https" {
  for_each          = local.ecs_service ? toset(var.alb_ingress_cidrs) : toset([])
  security_group_id = aws_security_group.alb[0].id
  description       = "HTTPS from clients."
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
  cidr_ipv4         = each.value
}

resource "aws_vpc_security_group_egress_rule" "alb_gateway" {
  count                        = local.ecs_service ? 1 : 0
  security_group_id            = aws_security_group.alb[0].id
  description                  = "To the gateway tasks."
  ip_protocol                  = "tcp"
  from_port                    = 8080
  to_port                      = 8080
  referenced_security_group_id = aws_security_group.gateway.id
}

resource "aws_vpc_security_group_ingress_rule" "gateway_from_alb" {
  count                        = local.ecs_service ? 1 : 0
  security_group_id            = aws_security_group.gateway.id
  description                  = "From the load balancer only."
  ip_protocol                  = "tcp"
  from_port                    = 8080
  to_port                      = 8080
  referenced_security_group_id = aws_security_group.alb[0].id
}

resource "aws_lb" "gateway" {
  count                      = local.ecs_service ? 1 : 0
  name_prefix                = "qgw-"
  load_balancer_type         = "application"
  internal                   = false
  subnets                    = var.public_subnet_ids
  security_groups            = [aws_security_group.alb[0].id]
  idle_timeout               = 3600 # long streams; agents send keep-alives well within it
  drop_invalid_header_fields = true
  tags                       = local.tags
}

resource "aws_lb_target_group" "gateway" {
  count       = local.ecs_service ? 1 : 0
  name_prefix = "qgw-"
  port        = 8080
  protocol    = "HTTP"
  target_type = "ip"
  vpc_id      = var.vpc_id
  tags        = local.tags

  health_check {
    path    = "/healthz"
    matcher = "200"
  }

  deregistration_delay = 60
}

resource "aws_lb_listener" "https" {
  count             = local.ecs_service ? 1 : 0
  load_balancer_arn = aws_lb.gateway[0].arn
  port              = 443
  protocol          = "HTTPS"
  ssl_policy        = "ELBSecurityPolicy-TLS13-1-2-2021-06"
  certificate_arn   = var.certificate_arn
  tags              = local.tags

  default_action {
    type             = "forward"
    target_group_arn = aws_lb_target_group.gateway[0].arn
  }
}

resource "aws_cloudwatch_log_group" "gateway_service" {
  count             = local.ecs_service ? 1 : 0
  name              = "/quarry/${var.name}/gateway"
  retention_in_days = var.log_retention_days
  tags              = local.tags
}

resource "aws_ecs_task_definition" "gateway" {
  count                    = local.ecs_service ? 1 : 0
  family                   = "${var.name}-gateway"
  requires_compatibilities = ["FARGATE"]
  network_mode             = "awsvpc"
  cpu                      = tostring(var.gateway_cpu)
  memory                   = tostring(var.gateway_memory_mb)
  execution_role_arn       = aws_iam_role.gateway_execution[0].arn
  task_role_arn            = aws_iam_role.gateway.arn
  tags                     = local.tags

  container_definitions = jsonencode([{
    name         = "gateway"
    image        = var.gateway_image
    essential    = true
    portMappings = [{ containerPort = 8080, protocol = "tcp" }]
    environment = [for k, v in merge(local.gateway_environment, {
      QUARRY_ADDR                = "0.0.0.0:8080"
      QUARRY_DATA_DIR            = "/tmp/quarry"
      QUARRY_SANDBOX_GATEWAY_URL = "http://${aws_lb.relay[0].dns_name}:${local.relay_port}"
    }) : { name = k, value = v }]
    secrets = [for k, arn in local.gateway_secrets : { name = k, valueFrom = arn }]
    logConfiguration = {
      logDriver = "awslogs"
      options = {
        awslogs-group         = aws_cloudwatch_log_group.gateway_service[0].name
        awslogs-region        = local.region
        awslogs-stream-prefix = "gateway"
      }
    }
    stopTimeout = 60
  }])
}

resource "aws_ecs_service" "gateway" {
  count                              = local.ecs_service ? 1 : 0
  name                               = "${var.name}-gateway"
  cluster                            = aws_ecs_cluster.this.id
  task_definition                    = aws_ecs_task_definition.gateway[0].arn
  desired_count                      = var.gateway_desired_count
  launch_type                        = "FARGATE"
  deployment_minimum_healthy_percent = 100
  deployment_maximum_percent         = 200
  tags                               = local.tags

  network_configuration {
    subnets          = var.private_subnet_ids
    security_groups  = [aws_security_group.gateway.id]
    assign_public_ip = false
  }

  load_balancer {
    target_group_arn = aws_lb_target_group.gateway[0].arn
    container_name   = "gateway"
    container_port   = 8080
  }

  load_balancer {
    target_group_arn = aws_lb_target_group.relay[0].arn
    container_name   = "gateway"
    container_port   = 8080
  }

  lifecycle {
    precondition {
      condition     = var.gateway_image != null && var.certificate_arn != null && length(var.public_subnet_ids) > 0
      error_message = "gateway_image, certificate_arn and public_subnet_ids: required with gateway_mode = \"ecs\"."
    }
  }

  depends_on = [aws_lb_listener.https, aws_lb_listener.relay]
}
