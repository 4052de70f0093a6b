# The gateway's secrets. When no ARN is given, the module creates the
# secret without a value: fill it with `aws secretsmanager put-secret-value`
# (docs/DEPLOY.md), so that no secret value is ever in the Terraform state.

resource "aws_secretsmanager_secret" "api_keys" {
  count       = var.api_keys_secret_arn == null ? 1 : 0
  name_prefix = "${var.name}/api-keys-"
  description = "Quarry gateway API keys (QUARRY_API_KEYS), comma separated."
  tags        = local.tags
}

resource "aws_secretsmanager_secret" "relay" {
  count       = var.relay_secret_arn == null ? 1 : 0
  name_prefix = "${var.name}/relay-secret-"
  description = "Quarry model relay token secret (QUARRY_RELAY_SECRET), at least 32 characters."
  tags        = local.tags
}

resource "aws_secretsmanager_secret" "token_key" {
  count       = var.token_key_secret_arn == null ? 1 : 0
  name_prefix = "${var.name}/agent-token-key-"
  description = "Quarry agent token key in hex (read by the gateway; QUARRY_AGENT_TOKEN_KEY in each sandbox)."
  tags        = local.tags
}
