"""Schemathesis hooks of the API fuzz run (tests/apifuzz_test.go), loaded through SCHEMATHESIS_HOOKS.

Quarry's archive uploads (a sandbox's files, an image build's context) take a tar or a gzip'd tar
as the raw body: they are sent as bytes, as application/octet-stream is.
"""

import schemathesis

schemathesis.serializer.alias(["application/x-tar", "application/gzip"], "application/octet-stream")
