# The tables of the lease store (warmpool/dynamostore) and of the model
# relay (modelservice/dynamobroker). Their keys, indexes and TTL attribute
# must be exactly what the Go stores create: infra/module_test.go compares
# them with dynamostore.TableDefinitions and dynamobroker.TableDefinition.

resource "aws_dynamodb_table" "tasks" {
  name         = "${var.name}-tasks"
  billing_mode = "PAY_PER_REQUEST"
  hash_key     = "pk"

  attribute {
    name = "pk"
    type = "S"
  }
  attribute {
    name = "pool_pk"
    type = "S"
  }
  attribute {
    name = "ready_pk"
    type = "S"
  }
  attribute {
    name = "ready_sk"
    type = "N"
  }

  global_secondary_index {
    name            = "tasks-by-pool"
    hash_key        = "pool_pk"
    projection_type = "KEYS_ONLY"
  }
  global_secondary_index {
    name            = "ready-tasks"
    hash_key        = "ready_pk"
    range_key       = "ready_sk"
    projection_type = "ALL"
  }

  point_in_time_recovery {
    enabled = var.point_in_time_recovery
  }
  server_side_encryption {
    enabled = true
  }

  tags = local.tags
}

# The shard count the lease store was made with (what `quarry tables create`
# records); the gateway refuses another QUARRY_DYNAMODB_SHARDS.
resource "aws_dynamodb_table_item" "schema" {
  table_name = aws_dynamodb_table.tasks.name
  hash_key   = aws_dynamodb_table.tasks.hash_key
  item = jsonencode({
    pk     = { S = "meta#schema" }
    shards = { N = tostring(var.dynamodb_shards) }
  })

  lifecycle {
    ignore_changes = [item]
  }
}

resource "aws_dynamodb_table" "leases" {
  name         = "${var.name}-leases"
  billing_mode = "PAY_PER_REQUEST"
  hash_key     = "pk"

  attribute {
    name = "pk"
    type = "S"
  }
  attribute {
    name = "owner_pk"
    type = "S"
  }
  attribute {
    name = "owner_sk"
    type = "N"
  }
  attribute {
    name = "expiry_pk"
    type = "S"
  }
  attribute {
    name = "expiry_sk"
    type = "N"
  }
  attribute {
    name = "ended_pk"
    type = "S"
  }
  attribute {
    name = "ended_sk"
    type = "N"
  }

  global_secondary_index {
    name            = "leases-by-owner"
    hash_key        = "owner_pk"
    range_key       = "owner_sk"
    projection_type = "KEYS_ONLY"
  }
  global_secondary_index {
    name            = "active-by-expiry"
    hash_key        = "expiry_pk"
    range_key       = "expiry_sk"
    projection_type = "KEYS_ONLY"
  }
  global_secondary_index {
    name               = "ended-by-time"
    hash_key           = "ended_pk"
    range_key          = "ended_sk"
    projection_type    = "INCLUDE"
    non_key_attributes = ["owner", "idempotency_key", "idempotency_forgotten"]
  }

  ttl {
    attribute_name = "ttl"
    enabled        = true
  }

  point_in_time_recovery {
    enabled = var.point_in_time_recovery
  }
  server_side_encryption {
    enabled = true
  }

  tags = local.tags
}

resource "aws_dynamodb_table" "model_relay" {
  name         = "${var.name}-model-relay"
  billing_mode = "PAY_PER_REQUEST"
  hash_key     = "pk"
  range_key    = "sk"

  attribute {
    name = "pk"
    type = "S"
  }
  attribute {
    name = "sk"
    type = "S"
  }
  attribute {
    name = "lease"
    type = "S"
  }
  attribute {
    name = "rid"
    type = "S"
  }
  attribute {
    name = "qp"
    type = "S"
  }
  attribute {
    name = "qk"
    type = "S"
  }

  global_secondary_index {
    name            = "by-lease"
    hash_key        = "lease"
    range_key       = "rid"
    projection_type = "ALL"
  }
  # One owner's queue spread over the broker's queue shards
  # (qp = owner#shard), holding only what a claim filters by: no bodies
  # (docs/ARCHITECTURE.md, "The relay's table design"). It replaced the
  # index "queue" (hash key qo, ALL); applying this on an existing table
  # creates it and deletes that one.
  global_secondary_index {
    name               = "queue-by-shard"
    hash_key           = "qp"
    range_key          = "qk"
    projection_type    = "INCLUDE"
    non_key_attributes = ["rid", "pool", "labels", "deadline", "qs"]
  }

  ttl {
    attribute_name = "ttl"
    enabled        = true
  }

  point_in_time_recovery {
    enabled = var.point_in_time_recovery
  }
  server_side_encryption {
    enabled = true
  }

  tags = merge(local.tags, { "quarry.managed" = "true" })
}
