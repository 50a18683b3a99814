#!/usr/bin/env bash
# Create (idempotently) the Python virtual environment used by the MCP
# end-to-end test client (tests/mcp/client.py), with a pinned release of the
# official `mcp` SDK from PyPI.
#
# Usage: scripts/mcp-client-env.sh
#   The LAST line on stdout is the absolute path of the venv's python
#   interpreter; everything else (pip output, diagnostics) goes to stderr.
#
# Environment:
#   TOOLSMITH_MCP_VENV    venv location
#                         (default: $HOME/.cache/toolsmith/venvs/mcp-<version>)
#   TOOLSMITH_MCP_PYTHON  base interpreter used to create it (default: python3,
#                         must be >= 3.10)
#
# When the venv already holds the pinned version this only runs one quick
# interpreter check. A fresh install is built in a temporary directory next to
# the target and renamed into place once verified, so an interrupted install
# never leaves a half-built venv at the target path.
set -euo pipefail

MCP_VERSION="2.3.0"

venv="${TOOLSMITH_MCP_VENV:-$HOME/.cache/toolsmith/venvs/mcp-$MCP_VERSION}"
base_python="${TOOLSMITH_MCP_PYTHON:-python3}"
stamp_name=".toolsmith-mcp-$MCP_VERSION"

log() { printf 'mcp-client-env: %s\n' "$*" >&2; }

# Make the path absolute (the parent must exist for that).
parent="$(dirname -- "$venv")"
mkdir -p -- "$parent"
parent="$(cd -- "$parent" && pwd -P)"
venv="$parent/$(basename -- "$venv")"
python="$venv/bin/python"

# True when $1 is a complete venv holding mcp==$MCP_VERSION. The stamp is only
# written after a verified install; the metadata look-up is cheap (no import of
# the SDK itself), so the fast path stays well under a second.
venv_ok() {
    [ -f "$1/$stamp_name" ] && [ -x "$1/bin/python" ] &&
        "$1/bin/python" - "$MCP_VERSION" >/dev/null 2>&1 <<'EOF'
import importlib.metadata, importlib.util, sys
ok = importlib.metadata.version("mcp") == sys.argv[1] and importlib.util.find_spec("mcp") is not None
sys.exit(0 if ok else 1)
EOF
}

if venv_ok "$venv"; then
    printf '%s\n' "$python"
    exit 0
fi

# Serialise concurrent installers (parallel tests) where flock(1) exists; the
# rename below is race-safe on its own, this only avoids duplicate downloads.
if command -v flock >/dev/null 2>&1; then
    exec 9>"$venv.lock"
    flock 9
    if venv_ok "$venv"; then
        printf '%s\n' "$python"
        exit 0
    fi
fi

if ! command -v "$base_python" >/dev/null 2>&1; then
    log "error: '$base_python' not found (set TOOLSMITH_MCP_PYTHON to a Python >= 3.10)"
    exit 1
fi
if ! "$base_python" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)'; then
    log "error: $("$base_python" -V 2>&1) is too old; mcp $MCP_VERSION needs Python >= 3.10"
    exit 1
fi

tmp="$(mktemp -d "$parent/.mcp-venv.XXXXXX")"
chmod u=rwx,go=rx "$tmp"
cleanup() { rm -rf -- "$tmp"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

log "creating venv with mcp==$MCP_VERSION at $venv"
"$base_python" -m venv "$tmp"
"$tmp/bin/python" -m pip install --quiet --disable-pip-version-check --no-input \
    "mcp==$MCP_VERSION" >&2
# Verify the client modules really import before declaring the venv complete.
"$tmp/bin/python" - "$MCP_VERSION" <<'EOF' >&2
import importlib.metadata, sys
import mcp  # noqa: F401
from mcp import ClientSession, StdioServerParameters  # noqa: F401
from mcp.client.stdio import stdio_client  # noqa: F401
from mcp.client.streamable_http import streamable_http_client  # noqa: F401
got = importlib.metadata.version("mcp")
if got != sys.argv[1]:
    sys.exit(f"installed mcp {got}, expected {sys.argv[1]}")
EOF

# Console scripts and activate files embed the build path; point them at the
# final location (bin/python itself is a symlink and needs nothing).
for f in "$tmp"/bin/*; do
    if [ -f "$f" ] && [ ! -L "$f" ] && grep -qF -- "$tmp" "$f" 2>/dev/null; then
        sed -i.bak "s|$tmp|$venv|g" "$f" && rm -f -- "$f.bak"
    fi
done
: >"$tmp/$stamp_name"

# Move an invalid leftover out of the way, then rename the new venv in.
if [ -e "$venv" ] || [ -L "$venv" ]; then
    old="$(mktemp -d "$parent/.mcp-venv-old.XXXXXX")"
    mv -- "$venv" "$old/" 2>/dev/null || true
    rm -rf -- "$old"
fi
if ! "$tmp/bin/python" -c 'import os, sys; os.rename(sys.argv[1], sys.argv[2])' "$tmp" "$venv" 2>/dev/null; then
    # Lost a race with a concurrent installer: use its venv if it is complete.
    if ! venv_ok "$venv"; then
        log "error: could not move the new venv into place at $venv"
        exit 1
    fi
fi

venv_ok "$venv" || { log "error: venv at $venv failed verification"; exit 1; }
printf '%s\n' "$python"
