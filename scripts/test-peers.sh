#!/usr/bin/env bash
# Installs the real protocol peers the tests talk to, cached under ~/.cache/trellis/:
# llmock (a mock of the providers' HTTP APIs, from PyPI) and the local model server with both
# models (scripts/local-model.sh --all). Idempotent.
set -euo pipefail
CACHE="${TRELLIS_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/trellis}"
LLMOCK_VERSION="0.2.2"
if ! "$CACHE/peers/bin/llmock" --help >/dev/null 2>&1; then
    echo "test-peers: installing llmock==$LLMOCK_VERSION" >&2
    python3 -m venv "$CACHE/peers"
    "$CACHE/peers/bin/pip" install -q --disable-pip-version-check "llmock==$LLMOCK_VERSION"
fi
"$(dirname "$0")/local-model.sh" --all >/dev/null
echo "test-peers: ready ($CACHE)" >&2
