# A Quarry deployment in Lambda mode in an existing VPC: two pools, one on
# Fargate Spot. Build the package first (docs/DEPLOY.md):
#   GOOS=linux GOARCH=arm64 CGO_ENABLED=0 go build -tags lambda.norpc -o bootstrap ./cmd/gateway
#   zip gateway.zip bootstrap

terraform {
  required_version = ">= 1.6.0"

  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = ">= 5.40.0, < 7.0.0"
    }
  }
}

provider "aws" {
  region = var.region
}

variable "region" {
  description = "AWS region of the deployment."
  type        = string
  default     = "us-east-1"
}

variable "vpc_id" {
  description = "An existing VPC with private subnets that reach the internet through a NAT gateway."
  type        = string
}

variable "private_subnet_ids" {
  description = "Private subnets of vpc_id for the gateway and the sandboxes."
  type        = list(string)
}

variable "agent_image" {
  description = "Image with the exec agent at /execagent (scripts/images), pushed to ECR."
  type        = string
}

module "quarry" {
  source = "../../modules/quarry"

  name               = "quarry"
  vpc_id             = var.vpc_id
  private_subnet_ids = var.private_subnet_ids
  gateway_mode       = "lambda"
  lambda_zip_path    = "${path.module}/gateway.zip"
  agent_image        = var.agent_image

  pools = {
    default = {
      image     = "public.ecr.aws/docker/library/python:3.12-slim"
      min_warm  = 4
      max_total = 64
    }
    spot = {
      image             = "public.ecr.aws/docker/library/python:3.12-slim"
      cpu               = 2
      memory_mb         = 4096
      min_warm          = 0
      max_total         = 200
      capacity_provider = "FARGATE_SPOT"
    }
  }

  # Images on demand may come from ECR Public through this account's ECR:
  # <account>.dkr.ecr.<region>.amazonaws.com/ecr-public/docker/library/python:3.12
  pull_through_cache_rules = {
    "ecr-public" = { upstream_registry_url = "public.ecr.aws" }
  }

  gateway_environment = {
    QUARRY_LOG_LEVEL = "info"
  }

  tags = {
    project = "quarry"
  }
}

output "gateway_url" {
  description = "The gateway's HTTPS URL."
  value       = module.quarry.gateway_url
}

output "secret_arns" {
  description = "Fill these secrets before the first request (docs/DEPLOY.md)."
  value       = module.quarry.secret_arns
}
