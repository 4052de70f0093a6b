# The model relay's endpoint for sandbox tasks (gateway_mode = "ecs"): an
# internal load balancer in the private subnets that only the sandboxes'
# security group reaches, and that forwards only the relay's sandbox routes
# (/v1/sandboxes/{id}/model/v1/...) to the gateway tasks; everything else
# answers 404. A sandbox needs no route to the internet-facing load balancer
# and no other port of the gateway. Calls carry the lease's relay token;
# the listener is plain HTTP inside the VPC.

locals {
  relay_port = 8080
}

resource "aws_security_group" "relay_lb" {
  count       = local.ecs_service ? 1 : 0
  name_prefix = "${var.name}-relay-"
  description = "Quarry model relay endpoint: sandboxes in, the gateway's port out."
  vpc_id      = var.vpc_id
  tags        = local.tags

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_vpc_security_group_ingress_rule" "relay_from_sandboxes" {
  count                        = local.ecs_service ? 1 : 0
  security_group_id            = aws_security_group.relay_lb[0].id
  description                  = "Relay calls from sandbox tasks only."
  ip_protocol                  = "tcp"
  from_port                    = local.relay_port
  to_port                      = local.relay_port
  referenced_security_group_id = aws_security_group.sandbox.id
}

resource "aws_vpc_security_group_egress_rule" "relay_gateway" {
  count                        = local.ecs_service ? 1 : 0
  security_group_id            = aws_security_group.relay_lb[0].id
  description                  = "To the gateway tasks."
  ip_protocol                  = "tcp"
  from_port                    = 8080
  to_port                      = 8080
  referenced_security_group_id = aws_security_group.gateway.id
}

resource "aws_vpc_security_group_ingress_rule" "gateway_from_relay" {
  count                        = local.ecs_service ? 1 : 0
  security_group_id            = aws_security_group.gateway.id
  description                  = "From the relay endpoint only."
  ip_protocol                  = "tcp"
  from_port                    = 8080
  to_port                      = 8080
  referenced_security_group_id = aws_security_group.relay_lb[0].id
}

resource "aws_vpc_security_group_egress_rule" "sandbox_relay" {
  count                        = local.ecs_service ? 1 : 0
  security_group_id            = aws_security_group.sandbox.id
  description                  = "The model relay's internal endpoint."
  ip_protocol                  = "tcp"
  from_port                    = local.relay_port
  to_port                      = local.relay_port
  referenced_security_group_id = aws_security_group.relay_lb[0].id
}

resource "aws_lb" "relay" {
  count                      = local.ecs_service ? 1 : 0
  name_prefix                = "qrl-"
  load_balancer_type         = "application"
  internal                   = true
  subnets                    = var.private_subnet_ids
  security_groups            = [aws_security_group.relay_lb[0].id]
  idle_timeout               = 3600 # a relay call waits for the trainer (QUARRY_RELAY_TIMEOUT)
  drop_invalid_header_fields = true
  tags                       = local.tags
}

resource "aws_lb_target_group" "relay" {
  count       = local.ecs_service ? 1 : 0
  name_prefix = "qrl-"
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

resource "aws_lb_listener" "relay" {
  count             = local.ecs_service ? 1 : 0
  load_balancer_arn = aws_lb.relay[0].arn
  port              = local.relay_port
  protocol          = "HTTP"
  tags              = local.tags

  default_action {
    type = "fixed-response"
    fixed_response {
      content_type = "application/json"
      message_body = "{\"error\":{\"code\":\"not_found\",\"message\":\"the relay endpoint serves only the model relay's sandbox routes\"}}"
      status_code  = "404"
    }
  }
}

resource "aws_lb_listener_rule" "relay_routes" {
  count        = local.ecs_service ? 1 : 0
  listener_arn = aws_lb_listener.relay[0].arn
  priority     = 10
  tags         = local.tags

  action {
    type             = "forward"
    target_group_arn = aws_lb_target_group.relay[0].arn
  }

  condition {
    path_pattern {
      values = ["/v1/sandboxes/*/model/v1/*"]
    }
  }
}
