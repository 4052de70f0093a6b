#!/usr/bin/env bash
# The gateway id of this checkout's `make run`: QUARRY_GATEWAY_ID when set, else "quarry-" and 10 hex
# digits of a hash of the checkout's path. `make run` labels its sandboxes with it and `make clean`
# removes only the Docker sandboxes labelled with it, not those of other checkouts or users.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${QUARRY_GATEWAY_ID:-}" ]; then
  echo "$QUARRY_GATEWAY_ID"
else
  echo "quarry-$(pwd -P | sha256sum | cut -c1-10)"
fi
