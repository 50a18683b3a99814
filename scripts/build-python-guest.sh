#!/usr/bin/env bash
# Builds the Python guest (plugins/python) into a WebAssembly component with componentize-py.
#
# componentize-py is pinned and its wheel verified by sha256; it is installed into a local venv
# (.deps/componentize-py). The component is cached by the hash of its inputs (the WIT, app.py and the
# componentize-py version): rebuilds are not byte-identical, so the cache key is the inputs, not the
# output. Result: .deps/python/runner.wasm (a link to the hash-named file).
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '[python-guest] %s\n' "$*" >&2; }

VERSION=0.25.1
WHEEL=componentize_py-0.25.1-cp39-abi3-manylinux_2_28_x86_64.whl
SHA256=8623cd8cab8453cb0cd8bf03f3c7103420d06f2f3d360186a280a70a1ca5e89f
DOWNLOADS="${TOOLSMITH_DOWNLOAD_CACHE:-$HOME/.cache/toolsmith/downloads}"
VENV=.deps/componentize-py
OUT=.deps/python

if [ "$(uname -m)" != x86_64 ] || [ "$(uname -s)" != Linux ]; then
    say "only x86_64 Linux is scripted; install componentize-py==$VERSION yourself and put it on PATH as $VENV/bin/componentize-py"
fi

if ! "$VENV/bin/componentize-py" --version 2>/dev/null | grep -q "$VERSION"; then
    mkdir -p "$DOWNLOADS"
    if ! echo "$SHA256  $DOWNLOADS/$WHEEL" | sha256sum -c --status 2>/dev/null; then
        say "downloading componentize-py $VERSION"
        python3 -m pip download --quiet --no-deps --only-binary=:all: "componentize-py==$VERSION" \
            --platform manylinux_2_28_x86_64 --python-version 3.11 -d "$DOWNLOADS"
    fi
    echo "$SHA256  $DOWNLOADS/$WHEEL" | sha256sum -c --status || { say "sha256 mismatch for $WHEEL"; exit 1; }
    rm -rf "$VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --no-deps "$DOWNLOADS/$WHEEL"
fi

hash=$(cat plugins/python/wit/runner.wit schemas/wit/tool.wit plugins/python/app.py <(echo "$VERSION") | sha256sum | cut -c1-16)
target="$OUT/runner-$hash.wasm"
# Shared by every checkout of this user: the same inputs give an equivalent component, and reusing
# the very same bytes also lets the host's precompiled-artifact cache hit in a fresh clone.
shared="${TOOLSMITH_BUILD_CACHE:-$HOME/.cache/toolsmith/python}/runner-$hash.wasm"
if [ ! -f "$target" ]; then
    mkdir -p "$OUT"
    if [ ! -f "$shared" ]; then
        say "building the CPython component (about 20 s)"
        mkdir -p "$(dirname "$shared")"
        "$VENV/bin/componentize-py" -d plugins/python/wit -w runner componentize app \
            -p plugins/python -o "$shared.tmp.$$" >&2
        mv "$shared.tmp.$$" "$shared"
    fi
    cp "$shared" "$target.tmp"
    mv "$target.tmp" "$target"
    # Keep only the current build.
    find "$OUT" -name 'runner-*.wasm' ! -name "runner-$hash.wasm" -delete
fi
ln -sfn "runner-$hash.wasm" "$OUT/runner.wasm"
