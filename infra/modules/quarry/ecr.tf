# Optional ECR pull-through cache rules for the public registries a user
# names (var.pull_through_cache_rules, default none): a sandbox image
# <account>.dkr.ecr.<region>.amazonaws.com/<prefix>/<upstream path> is
# pulled from the upstream registry once, then from this account's ECR,
# through the VPC endpoints or the NAT like any ECR image. The first pull
# of an image creates its repository: the sandboxes' execution role may
# create repositories and import upstream images under the rules'
# prefixes only.

resource "aws_ecr_pull_through_cache_rule" "this" {
  for_each = var.pull_through_cache_rules

  ecr_repository_prefix = each.key
  upstream_registry_url = each.value.upstream_registry_url
  credential_arn        = each.value.credential_arn
}

data "aws_iam_policy_document" "sandbox_execution_pull_through" {
  count = length(var.pull_through_cache_rules) > 0 ? 1 : 0

  statement {
    sid     = "PullThroughCacheRepositories"
    actions = ["ecr:CreateRepository", "ecr:BatchImportUpstreamImage"]
    resources = [for prefix, _ in var.pull_through_cache_rules :
    "arn:${local.partition}:ecr:${local.region}:${local.account}:repository/${prefix}/*"]
  }
}

resource "aws_iam_role_policy" "sandbox_execution_pull_through" {
  count  = length(var.pull_through_cache_rules) > 0 ? 1 : 0
  name   = "pull-through-cache"
  role   = aws_iam_role.sandbox_execution.id
  policy = data.aws_iam_policy_document.sandbox_execution_pull_through[0].json
}
