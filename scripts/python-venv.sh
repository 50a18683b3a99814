#!/usr/bin/env bash
# Create (idempotently) a pinned Python virtual environment for tests and benchmarks that need a
# Python reference (the MCP SDK client, PyTorch + transformers), cached outside the clone.
#
# Usage: scripts/python-venv.sh NAME SPEC [SPEC ...]
#   SPEC is a pip requirement pinned as `package==version`. The venv lives at
#   $TOOLSMITH_VENVS/NAME (default ~/.cache/toolsmith/venvs/NAME). The LAST line on stdout is the
#   absolute path of its python interpreter; pip output and diagnostics go to stderr.
#   TOOLSMITH_VENV_PYTHON picks the base interpreter (default python3, >= 3.10).
#
# When the venv already holds every pinned version this is one quick interpreter check. A fresh
# install is built in a temporary directory beside the target and renamed into place once verified,
# so an interrupted install never leaves a half-built venv at the target path.
set -euo pipefail

if [ $# -lt 2 ]; then
    echo "usage: $0 NAME package==version [package==version ...]" >&2
    exit 2
fi
name=$1
shift
specs=("$@")

root="${TOOLSMITH_VENVS:-$HOME/.cache/toolsmith/venvs}"
base_python="${TOOLSMITH_VENV_PYTHON:-python3}"
stamp_name=".toolsmith-venv"

log() { printf 'python-venv(%s): %s\n' "$name" "$*" >&2; }

mkdir -p -- "$root"
root="$(cd -- "$root" && pwd -P)"
venv="$root/$name"
python="$venv/bin/python"

# True when $1 is a complete venv holding every pinned version. Only metadata is read (no imports),
# so the fast path stays well under a second.
venv_ok() {
    [ -f "$1/$stamp_name" ] && [ -x "$1/bin/python" ] &&
        "$1/bin/python" - "${specs[@]}" >/dev/null 2>&1 <<'PY'
import importlib.metadata, sys
for spec in sys.argv[1:]:
    package, version = spec.split("==")
    if importlib.metadata.version(package) != version:
        sys.exit(1)
PY
}

if venv_ok "$venv"; then
    printf '%s\n' "$python"
    exit 0
fi

# Serialise concurrent installers (parallel tests) where flock(1) exists; the rename below is
# race-safe on its own, this only avoids duplicate downloads.
if command -v flock >/dev/null 2>&1; then
    exec 9>"$venv.lock"
    flock 9
    if venv_ok "$venv"; then
        printf '%s\n' "$python"
        exit 0
    fi
fi

if ! command -v "$base_python" >/dev/null 2>&1; then
    log "error: '$base_python' not found (set TOOLSMITH_VENV_PYTHON to a Python >= 3.10)"
    exit 1
fi
if ! "$base_python" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)'; then
    log "error: $("$base_python" -V 2>&1) is too old; Python >= 3.10 is needed"
    exit 1
fi

tmp="$(mktemp -d "$root/.venv-$name.XXXXXX")"
chmod u=rwx,go=rx "$tmp"
cleanup() { rm -rf -- "$tmp"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

log "creating venv with ${specs[*]} at $venv"
"$base_python" -m venv "$tmp"
"$tmp/bin/python" -m pip install --quiet --disable-pip-version-check --no-input "${specs[@]}" >&2
# Every pinned package must really import before the venv counts as complete.
"$tmp/bin/python" - "${specs[@]}" <<'PY' >&2
import importlib, importlib.metadata, sys
for spec in sys.argv[1:]:
    package, version = spec.split("==")
    got = importlib.metadata.version(package)
    if got != version:
        sys.exit(f"installed {package} {got}, expected {version}")
    # The modules the distribution installs (openai-agents installs `agents`), its own name first.
    mine = package.replace("-", "_").lower()
    modules = sorted(
        (m for m, dists in importlib.metadata.packages_distributions().items()
         if package.lower() in (d.lower() for d in dists) and not m.startswith("_")),
        key=lambda m: m.lower() != mine,
    )
    importlib.import_module(modules[0] if modules else mine)
PY

# Console scripts and activate files embed the build path; point them at the final location.
for f in "$tmp"/bin/*; do
    if [ -f "$f" ] && [ ! -L "$f" ] && grep -qF -- "$tmp" "$f" 2>/dev/null; then
        sed -i.bak "s|$tmp|$venv|g" "$f" && rm -f -- "$f.bak"
    fi
done
printf '%s\n' "${specs[@]}" >"$tmp/$stamp_name"

# Move an invalid leftover out of the way, then rename the new venv in.
if [ -e "$venv" ] || [ -L "$venv" ]; then
    old="$(mktemp -d "$root/.venv-old.XXXXXX")"
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
