#!/usr/bin/env bash
# Installs the real protocol peers the tests talk to, cached under ~/.cache/trellis/:
# llmock (a mock of the providers' HTTP APIs, from PyPI), git, and the local model server with both
# models (scripts/local-model.sh --all). Idempotent.
set -euo pipefail
CACHE="${TRELLIS_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/trellis}"
LLMOCK_VERSION="0.2.2"
if ! "$CACHE/peers/bin/llmock" --help >/dev/null 2>&1; then
    echo "test-peers: installing llmock==$LLMOCK_VERSION" >&2
    python3 -m venv "$CACHE/peers"
    "$CACHE/peers/bin/pip" install -q --disable-pip-version-check "llmock==$LLMOCK_VERSION"
fi
# git: the CLI-agent tests track files_touched in a scratch repository.
if ! command -v git >/dev/null 2>&1; then
    echo "test-peers: installing git" >&2
    if [ "$(id -u)" = 0 ]; then
        apt-get install -y git >/dev/null 2>&1 \
            || { apt-get update >/dev/null && apt-get install -y git >/dev/null; }
    else
        echo "test-peers: git is missing; install it (apt-get install -y git)" >&2
        exit 1
    fi
fi
"$(dirname "$0")/local-model.sh" --all >/dev/null
echo "test-peers: ready ($CACHE)" >&2
