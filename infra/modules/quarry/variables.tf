variable "name" {
  description = "Prefix of every resource name, and the gateway fleet's id (QUARRY_GATEWAY_ID) that tags every sandbox task. Lowercase letters, digits and '-'."
  type        = string
  default     = "quarry"

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{0,30}$", var.name))
    error_message = "name: 1-31 lowercase letters, digits or '-', starting with a letter."
  }
}

variable "tags" {
  description = "Tags added to every resource the module creates."
  type        = map(string)
  default     = {}
}

variable "vpc_id" {
  description = "VPC of the sandboxes and the gateway."
  type        = string
}

variable "private_subnet_ids" {
  description = "Private subnets (with a NAT gateway or VPC endpoints for ECR, Secrets Manager, DynamoDB and CloudWatch Logs) for the sandbox tasks and the gateway (the Lambda function's VPC attachment, or the ECS service)."
  type        = list(string)

  validation {
    condition     = length(var.private_subnet_ids) > 0
    error_message = "private_subnet_ids: at least one subnet is required."
  }
}

variable "public_subnet_ids" {
  description = "Public subnets of the load balancer in front of the gateway (gateway_mode = \"ecs\" only)."
  type        = list(string)
  default     = []
}

variable "gateway_mode" {
  description = "How the gateway runs: \"lambda\" (AWS Lambda behind an API Gateway HTTP API, reconciled by an EventBridge schedule) or \"ecs\" (an ECS service behind an HTTPS load balancer, reconciling continuously; needed for streams and commands longer than 29 s)."
  type        = string
  default     = "lambda"

  validation {
    condition     = contains(["lambda", "ecs"], var.gateway_mode)
    error_message = "gateway_mode: want \"lambda\" or \"ecs\"."
  }
}

variable "lambda_zip_path" {
  description = "Path of the gateway's Lambda deployment package: a zip holding the linux binary of ./cmd/gateway named bootstrap (docs/DEPLOY.md). Required with gateway_mode = \"lambda\"."
  type        = string
  default     = null
}

variable "lambda_architecture" {
  description = "Instruction set of the Lambda function and its bootstrap binary: \"arm64\" or \"x86_64\"."
  type        = string
  default     = "arm64"

  validation {
    condition     = contains(["arm64", "x86_64"], var.lambda_architecture)
    error_message = "lambda_architecture: want \"arm64\" or \"x86_64\"."
  }
}

variable "lambda_memory_mb" {
  description = "Memory of the gateway's Lambda function in MiB (CPU scales with it)."
  type        = number
  default     = 1024
}

variable "lambda_timeout_seconds" {
  description = "Timeout of one invocation of the gateway's Lambda function. HTTP requests are cut at 30 s by API Gateway whatever this is; the scheduled reconcile pass uses the whole timeout (it waits for the launches it starts)."
  type        = number
  default     = 300
}

variable "enable_function_url" {
  description = "Also expose the Lambda function through a Lambda Function URL (auth NONE: the gateway checks its API keys itself), which has no 30 s limit; sandboxes still reach the model relay through the HTTP API."
  type        = bool
  default     = false
}

variable "reconcile_schedule" {
  description = "EventBridge schedule expression of the reconcile pass in Lambda mode (warm-pool refill, reaper, orphan sweep)."
  type        = string
  default     = "rate(1 minute)"
}

variable "gateway_image" {
  description = "Container image of the gateway (the ./cmd/gateway binary as entry point) for gateway_mode = \"ecs\"."
  type        = string
  default     = null
}

variable "gateway_desired_count" {
  description = "Gateway replicas of the ECS service (gateway_mode = \"ecs\"); replicas share the tables and split the background work by locks."
  type        = number
  default     = 2
}

variable "gateway_cpu" {
  description = "CPU units of one gateway task (gateway_mode = \"ecs\")."
  type        = number
  default     = 1024
}

variable "gateway_memory_mb" {
  description = "Memory of one gateway task in MiB (gateway_mode = \"ecs\")."
  type        = number
  default     = 2048
}

variable "certificate_arn" {
  description = "ACM certificate of the load balancer's HTTPS listener (gateway_mode = \"ecs\")."
  type        = string
  default     = null
}

variable "alb_ingress_cidrs" {
  description = "CIDR blocks allowed to reach the load balancer's HTTPS listener (gateway_mode = \"ecs\")."
  type        = list(string)
  default     = ["0.0.0.0/0"]
}

variable "sandbox_internet_egress" {
  description = "Whether sandbox tasks may open connections anywhere (image pulls, package installs). False leaves them the gateway's internal relay endpoint only (gateway_mode = \"ecs\"); images must then come through VPC endpoints (ECR, S3)."
  type        = bool
  default     = true
}

variable "agent_image" {
  description = "Image holding the static exec agent at /execagent and a cp command (scripts/images); each sandbox task's init container copies the agent from it."
  type        = string
}

variable "agent_port" {
  description = "Port of the exec agent inside each sandbox task; only the gateway's security group may reach it."
  type        = number
  default     = 8000
}

variable "pools" {
  description = "Warm pools by name: the sandbox image, Fargate size, warm and total task counts, capacity provider strategy (\"FARGATE\", \"FARGATE_SPOT\" or weighted \"FARGATE_SPOT:3,FARGATE:1\") and lease lengths. One task definition is registered per pool."
  type = map(object({
    image                 = string
    cpu                   = optional(number, 1)
    memory_mb             = optional(number, 2048)
    min_warm              = optional(number, 2)
    max_total             = optional(number, 50)
    capacity_provider     = optional(string, "FARGATE_SPOT:3,FARGATE:1")
    default_lease_seconds = optional(number, 1800)
    max_lease_seconds     = optional(number, 86400)
    arch                  = optional(string, "X86_64")
  }))

  validation {
    condition     = length(var.pools) > 0 && alltrue([for k, _ in var.pools : can(regex("^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$", k))])
    error_message = "pools: at least one pool; names are 1-63 lowercase letters, digits or '-'."
  }
}

variable "sandbox_task_role_arn" {
  description = "IAM role the commands inside sandboxes get (their AWS credentials). null gives them none, the safe default."
  type        = string
  default     = null
}

variable "api_keys_secret_arn" {
  description = "Secrets Manager secret holding the gateway's API keys (QUARRY_API_KEYS, comma separated). null: the module creates an empty secret to fill with put-secret-value."
  type        = string
  default     = null
}

variable "relay_secret_arn" {
  description = "Secrets Manager secret holding the model relay's token secret (QUARRY_RELAY_SECRET, at least 32 characters). null: the module creates an empty secret to fill."
  type        = string
  default     = null
}

variable "token_key_secret_arn" {
  description = "Secrets Manager secret holding the agent token key in hex (QUARRY_ECS_TOKEN_KEY_SECRET_ARN: the gateway reads it, and ECS injects it into each agent as QUARRY_AGENT_TOKEN_KEY). null: the module creates an empty secret to fill."
  type        = string
  default     = null
}

variable "dynamodb_shards" {
  description = "Shards of the lease store's hot keys (QUARRY_DYNAMODB_SHARDS); recorded in the tasks table and fixed once the tables exist."
  type        = number
  default     = 8
}

variable "point_in_time_recovery" {
  description = "Enable DynamoDB point-in-time recovery on the lease and relay tables."
  type        = bool
  default     = true
}

variable "log_retention_days" {
  description = "Retention of the CloudWatch log groups (gateway, sandboxes) in days."
  type        = number
  default     = 30
}

variable "task_state_events" {
  description = "Send the cluster's ECS task state change events to an SQS queue (EventBridge rule) that the gateways read (QUARRY_ECS_EVENTS_QUEUE_URL), so that they learn of stopped tasks from events instead of describing every task."
  type        = bool
  default     = true
}

variable "task_events_retention_seconds" {
  description = "How long the task events queue keeps an event nobody read (seconds, 60 to 1209600): older events are stale, the gateways describe the tasks instead."
  type        = number
  default     = 3600

  validation {
    condition     = var.task_events_retention_seconds >= 60 && var.task_events_retention_seconds <= 1209600
    error_message = "task_events_retention_seconds: want 60 to 1209600 (SQS's limits)."
  }
}

variable "gateway_environment" {
  description = "Extra QUARRY_* variables of the gateway (docs/CONFIG.md), e.g. QUARRY_LOG_LEVEL. Never put secrets here: they would land in the Terraform state; use the *_secret_arn variables."
  type        = map(string)
  default     = {}
}

variable "on_demand_images" {
  description = "Let the gateway register (and deregister) task definitions for images no pool names (images on demand, docs/ECS.md): only families starting with \"<name>_\" (QUARRY_ECS_FAMILY_PREFIX), run with the sandboxes' roles. False: the gateway runs the pools' task definitions only."
  type        = bool
  default     = true
}

variable "pull_through_cache_rules" {
  description = "ECR pull-through cache rules, by ECR repository prefix (2-30 of a-z, 0-9, '-', '_', '.', '/'), for the public registries you name, e.g. { \"ecr-public\" = { upstream_registry_url = \"public.ecr.aws\" }, \"quay\" = { upstream_registry_url = \"quay.io\" }, \"docker-hub\" = { upstream_registry_url = \"registry-1.docker.io\", credential_arn = \"arn:...:secret:ecr-pullthroughcache/docker-hub\" } }. A sandbox then names <account>.dkr.ecr.<region>.amazonaws.com/<prefix>/<path in the upstream registry>; the first pull copies the image into this account's ECR. Docker Hub, GitHub and GitLab need a credential (a Secrets Manager secret whose name starts with ecr-pullthroughcache/). Default: none."
  type = map(object({
    upstream_registry_url = string
    credential_arn        = optional(string)
  }))
  default = {}

  validation {
    condition     = alltrue([for prefix, _ in var.pull_through_cache_rules : can(regex("^[a-z0-9][a-z0-9._/-]{1,29}$", prefix))])
    error_message = "pull_through_cache_rules: each key is an ECR repository prefix of 2-30 lowercase letters, digits, '-', '_', '.' or '/', starting with a letter or digit."
  }
}
