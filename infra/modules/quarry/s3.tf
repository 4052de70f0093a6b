# The S3 checkpoint store's archives (checkpoints/s3store): private,
# encrypted, and incomplete multipart uploads (a gateway that died mid-Put)
# aborted after a day. Objects are removed by the gateway's Delete and
# Purge, not by a lifecycle rule: their metadata must go first.
resource "aws_s3_bucket" "checkpoints" {
  bucket_prefix = "${var.name}-checkpoints-"
  force_destroy = false
  tags          = merge(local.tags, { "quarry.managed" = "true" })
}

resource "aws_s3_bucket_public_access_block" "checkpoints" {
  bucket                  = aws_s3_bucket.checkpoints.id
  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_server_side_encryption_configuration" "checkpoints" {
  bucket = aws_s3_bucket.checkpoints.id
  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm = "AES256"
    }
  }
}

resource "aws_s3_bucket_lifecycle_configuration" "checkpoints" {
  bucket = aws_s3_bucket.checkpoints.id
  rule {
    id     = "abort-incomplete-uploads"
    status = "Enabled"
    filter {}
    abort_incomplete_multipart_upload {
      days_after_initiation = 1
    }
  }
}
