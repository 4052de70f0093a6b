# Lambda mode: the gateway as a function (cmd/gateway detects Lambda by
# AWS_LAMBDA_RUNTIME_API) behind an API Gateway HTTP API (payload 2.0, HTTPS
# only), and an EventBridge schedule that runs the reconcile pass. Buffered
# responses: streams arrive whole once done; docs/DEPLOY.md has the limits.

resource "aws_cloudwatch_log_group" "gateway_lambda" {
  count             = local.lambda ? 1 : 0
  name              = "/aws/lambda/${var.name}-gateway"
  retention_in_days = var.log_retention_days
  tags              = local.tags
}

resource "aws_apigatewayv2_api" "gateway" {
  count         = local.lambda ? 1 : 0
  name          = "${var.name}-gateway"
  protocol_type = "HTTP"
  description   = "Quarry gateway (AWS Lambda)."
  tags          = local.tags
}

resource "aws_lambda_function" "gateway" {
  count            = local.lambda ? 1 : 0
  function_name    = "${var.name}-gateway"
  description      = "Quarry gateway: the REST API and, on a schedule, the warm pools' reconcile pass."
  role             = aws_iam_role.gateway.arn
  runtime          = "provided.al2023"
  handler          = "bootstrap"
  architectures    = [var.lambda_architecture]
  filename         = var.lambda_zip_path
  source_code_hash = filebase64sha256(var.lambda_zip_path)
  memory_size      = var.lambda_memory_mb
  timeout          = var.lambda_timeout_seconds
  tags             = local.tags

  vpc_config {
    subnet_ids         = var.private_subnet_ids
    security_group_ids = [aws_security_group.gateway.id]
  }

  environment {
    variables = merge(local.gateway_environment, {
      QUARRY_DATA_DIR            = "/tmp/quarry"
      QUARRY_SANDBOX_GATEWAY_URL = aws_apigatewayv2_api.gateway[0].api_endpoint
      QUARRY_SECRET_ARNS         = join(",", [for k, arn in local.gateway_secrets : "${k}=${arn}"])
    })
  }

  logging_config {
    log_format = "Text"
    log_group  = aws_cloudwatch_log_group.gateway_lambda[0].name
  }

  lifecycle {
    precondition {
      condition     = var.lambda_zip_path != null
      error_message = "lambda_zip_path: required with gateway_mode = \"lambda\" (docs/DEPLOY.md builds the package)."
    }
  }

  depends_on = [aws_iam_role_policy.gateway, aws_iam_role_policy_attachment.gateway_lambda_vpc]
}

resource "aws_apigatewayv2_integration" "gateway" {
  count                  = local.lambda ? 1 : 0
  api_id                 = aws_apigatewayv2_api.gateway[0].id
  integration_type       = "AWS_PROXY"
  integration_uri        = aws_lambda_function.gateway[0].invoke_arn
  payload_format_version = "2.0"
  timeout_milliseconds   = 30000
}

resource "aws_apigatewayv2_route" "gateway" {
  count     = local.lambda ? 1 : 0
  api_id    = aws_apigatewayv2_api.gateway[0].id
  route_key = "$default"
  target    = "integrations/${aws_apigatewayv2_integration.gateway[0].id}"
}

resource "aws_cloudwatch_log_group" "gateway_api" {
  count             = local.lambda ? 1 : 0
  name              = "/quarry/${var.name}/gateway-api"
  retention_in_days = var.log_retention_days
  tags              = local.tags
}

resource "aws_apigatewayv2_stage" "gateway" {
  count       = local.lambda ? 1 : 0
  api_id      = aws_apigatewayv2_api.gateway[0].id
  name        = "$default"
  auto_deploy = true
  tags        = local.tags

  access_log_settings {
    destination_arn = aws_cloudwatch_log_group.gateway_api[0].arn
    format = jsonencode({
      requestId = "$context.requestId"
      ip        = "$context.identity.sourceIp"
      method    = "$context.httpMethod"
      path      = "$context.path"
      status    = "$context.status"
      latency   = "$context.integrationLatency"
      error     = "$context.integrationErrorMessage"
    })
  }
}

resource "aws_lambda_permission" "api" {
  count         = local.lambda ? 1 : 0
  statement_id  = "AllowHTTPAPI"
  action        = "lambda:InvokeFunction"
  function_name = aws_lambda_function.gateway[0].function_name
  principal     = "apigateway.amazonaws.com"
  source_arn    = "${aws_apigatewayv2_api.gateway[0].execution_arn}/*/*"
}

resource "aws_lambda_function_url" "gateway" {
  count              = local.lambda && var.enable_function_url ? 1 : 0
  function_name      = aws_lambda_function.gateway[0].function_name
  authorization_type = "NONE" # the gateway checks its bearer API keys
}

resource "aws_cloudwatch_event_rule" "reconcile" {
  count               = local.lambda ? 1 : 0
  name                = "${var.name}-reconcile"
  description         = "Quarry: one warm-pool reconcile pass, reaper and orphan sweep (lock-gated)."
  schedule_expression = var.reconcile_schedule
  tags                = local.tags
}

resource "aws_cloudwatch_event_target" "reconcile" {
  count     = local.lambda ? 1 : 0
  rule      = aws_cloudwatch_event_rule.reconcile[0].name
  target_id = "gateway"
  arn       = aws_lambda_function.gateway[0].arn
}

resource "aws_lambda_permission" "reconcile" {
  count         = local.lambda ? 1 : 0
  statement_id  = "AllowReconcileSchedule"
  action        = "lambda:InvokeFunction"
  function_name = aws_lambda_function.gateway[0].function_name
  principal     = "events.amazonaws.com"
  source_arn    = aws_cloudwatch_event_rule.reconcile[0].arn
}
