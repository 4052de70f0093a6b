# The gateway's security group (the Lambda function's network interfaces,
# or the gateway service's tasks) and the sandboxes': an agent's port is
# open to the gateway's group only.

resource "aws_security_group" "gateway" {
  name_prefix = "${var.name}-gateway-"
  description = "Quarry gateway: calls sandbox agents and AWS APIs."
  vpc_id      = var.vpc_id
  tags        = local.tags

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_vpc_security_group_egress_rule" "gateway_all" {
  security_group_id = aws_security_group.gateway.id
  description       = "Agents, DynamoDB, ECS, Secrets Manager (through the NAT gateway or VPC endpoints)."
  ip_protocol       = "-1"
  cidr_ipv4         = "0.0.0.0/0"
}

resource "aws_security_group" "sandbox" {
  name_prefix = "${var.name}-sandbox-"
  description = "Quarry sandbox tasks: the agent port is open to the gateway only."
  vpc_id      = var.vpc_id
  tags        = local.tags

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_vpc_security_group_ingress_rule" "sandbox_agent" {
  security_group_id            = aws_security_group.sandbox.id
  description                  = "Exec agent, from the gateway only."
  ip_protocol                  = "tcp"
  from_port                    = var.agent_port
  to_port                      = var.agent_port
  referenced_security_group_id = aws_security_group.gateway.id
}

resource "aws_vpc_security_group_egress_rule" "sandbox_all" {
  count             = var.sandbox_internet_egress ? 1 : 0
  security_group_id = aws_security_group.sandbox.id
  description       = "Image pulls, the model relay, package installs."
  ip_protocol       = "-1"
  cidr_ipv4         = "0.0.0.0/0"
}
