#!/usr/bin/env bash
# Headless Chromium for the graph page's browser test (tests/graph.rs): Debian's package.
# Idempotent: does nothing when a Chromium is already on PATH.
set -euo pipefail

say() { printf '[setup] %s\n' "$*" >&2; }

for name in chromium chromium-browser google-chrome; do
    if command -v "$name" >/dev/null 2>&1; then
        exit 0
    fi
done
if ! command -v apt-get >/dev/null 2>&1; then
    say "no Chromium and no apt-get: install Chromium yourself for the graph page's browser test"
    exit 0
fi
sudo=()
if [ "$(id -u)" -ne 0 ]; then
    if ! command -v sudo >/dev/null 2>&1; then
        say "no Chromium, and installing Debian's package needs root: apt-get install chromium"
        exit 0
    fi
    sudo=(sudo)
fi
say "installing Debian's chromium (for the graph page's browser test)"
export DEBIAN_FRONTEND=noninteractive
if ! "${sudo[@]}" apt-get install -y --no-install-recommends chromium >/dev/null; then
    "${sudo[@]}" apt-get update >/dev/null
    "${sudo[@]}" apt-get install -y --no-install-recommends chromium >/dev/null
fi
