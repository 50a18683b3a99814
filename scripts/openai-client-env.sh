#!/usr/bin/env bash
# The venv of the OpenAI-compatible end-to-end test client (tests/openai/client.py): the official
# `openai` SDK, the `openai-agents` SDK (imported as `agents`) and `jsonschema`, pinned.
# The last line on stdout is its python interpreter, as with python-venv.sh.
#
#   PY=$(scripts/openai-client-env.sh | tail -n 1)
#   $PY tests/openai/client.py --base-url http://127.0.0.1:PORT/v1 --model NAME
#
# Same layout and guarantees as python-venv.sh ($TOOLSMITH_VENVS/NAME, default
# ~/.cache/toolsmith/venvs/NAME; TOOLSMITH_VENV_PYTHON picks the base interpreter, >= 3.10; built in
# a temporary directory and renamed into place once verified; a quick metadata check when it is
# already complete). It is not a plain `exec python-venv.sh` because that script verifies each
# package by importing its distribution name, and openai-agents installs the module `agents`.
set -euo pipefail

name=openai-clients-3.57.0-agents-0.24.0
specs=(openai==3.57.0 openai-agents==0.24.0 jsonschema==4.26.0)
modules=(openai agents jsonschema)

root="${TOOLSMITH_VENVS:-$HOME/.cache/toolsmith/venvs}"
base_python="${TOOLSMITH_VENV_PYTHON:-python3}"
stamp_name=".toolsmith-venv"

log() { printf 'openai-client-env(%s): %s\n' "$name" "$*" >&2; }

mkdir -p -- "$root"
root="$(cd -- "$root" && pwd -P)"
venv="$root/$name"
python="$venv/bin/python"

# True when $1 is a complete venv holding every pinned version (metadata only, no imports).
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
# Every pinned version must be the one installed, and every module must really import.
"$tmp/bin/python" - "${#specs[@]}" "${specs[@]}" "${modules[@]}" <<'PY' >&2
import importlib, importlib.metadata, sys
n = int(sys.argv[1])
specs, modules = sys.argv[2 : 2 + n], sys.argv[2 + n :]
for spec in specs:
    package, version = spec.split("==")
    got = importlib.metadata.version(package)
    if got != version:
        sys.exit(f"installed {package} {got}, expected {version}")
for module in modules:
    importlib.import_module(module)
PY

# Console scripts and activate files embed the build path; point them at the final location.
for f in "$tmp"/bin/*; do
    if [ -f "$f" ] && [ ! -L "$f" ] && grep -qF -- "$tmp" "$f" 2>/dev/null; then
        sed -i.bak "s|$tmp|$venv|g" "$f" && rm -f -- "$f.bak"
    fi
done
printf '%s\n' "${specs[@]}" >"$tmp/$stamp_name"

if [ -e "$venv" ] || [ -L "$venv" ]; then
    old="$(mktemp -d "$root/.venv-old.XXXXXX")"
    mv -- "$venv" "$old/" 2>/dev/null || true
    rm -rf -- "$old"
fi
if ! "$tmp/bin/python" -c 'import os, sys; os.rename(sys.argv[1], sys.argv[2])' "$tmp" "$venv" 2>/dev/null; then
    if ! venv_ok "$venv"; then
        log "error: could not move the new venv into place at $venv"
        exit 1
    fi
fi

venv_ok "$venv" || { log "error: venv at $venv failed verification"; exit 1; }
printf '%s\n' "$python"
