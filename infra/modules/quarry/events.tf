# ECS task state changes for the gateway (docs/ECS.md, "Events"): an
# EventBridge rule sends the cluster's "ECS Task State Change" events to an
# SQS queue, which the gateways long-poll (QUARRY_ECS_EVENTS_QUEUE_URL), so
# that the warm pool learns a task stopped without describing every task on
# every pass. Rate-limited DescribeTasks stays the fallback: an event lost
# or older than the queue's retention costs a later discovery, never a
# wrong state.

resource "aws_sqs_queue" "task_events" {
  count = var.task_state_events ? 1 : 0

  name                       = "${var.name}-ecs-task-events"
  message_retention_seconds  = var.task_events_retention_seconds
  visibility_timeout_seconds = 30
  receive_wait_time_seconds  = 20
  sqs_managed_sse_enabled    = true
  tags                       = local.tags
}

resource "aws_cloudwatch_event_rule" "task_events" {
  count = var.task_state_events ? 1 : 0

  name        = "${var.name}-ecs-task-state-change"
  description = "ECS task state changes of the ${var.name} sandboxes' cluster, for the Quarry gateways."
  event_pattern = jsonencode({
    source        = ["aws.ecs"]
    "detail-type" = ["ECS Task State Change"]
    detail = {
      clusterArn = [aws_ecs_cluster.this.arn]
    }
  })
  tags = local.tags
}

resource "aws_cloudwatch_event_target" "task_events" {
  count = var.task_state_events ? 1 : 0

  rule      = aws_cloudwatch_event_rule.task_events[0].name
  target_id = "quarry-gateways"
  arn       = aws_sqs_queue.task_events[0].arn
}

# Only this rule may send to the queue.
data "aws_iam_policy_document" "task_events_queue" {
  count = var.task_state_events ? 1 : 0

  statement {
    sid       = "EventBridgeRuleSends"
    actions   = ["sqs:SendMessage"]
    resources = [aws_sqs_queue.task_events[0].arn]
    principals {
      type        = "Service"
      identifiers = ["events.amazonaws.com"]
    }
    condition {
      test     = "ArnEquals"
      variable = "aws:SourceArn"
      values   = [aws_cloudwatch_event_rule.task_events[0].arn]
    }
  }
}

resource "aws_sqs_queue_policy" "task_events" {
  count = var.task_state_events ? 1 : 0

  queue_url = aws_sqs_queue.task_events[0].id
  policy    = data.aws_iam_policy_document.task_events_queue[0].json
}
