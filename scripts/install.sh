#!/usr/bin/env bash
# Installs toolsmith for this user: the binary in PREFIX/bin, and in PREFIX/share/toolsmith the
# native parts it loads at run time (libtorch, ONNX Runtime, the MiniLM embedding model, the Python
# guest, componentize-py, SmolLM2) and the SDK sources `toolsmith plugin new` points projects at.
# The binary finds them beside itself (see docs/install.md), so it works from any directory and
# outlives this checkout.
#
#   ./scripts/setup.sh && ./scripts/install.sh            # PREFIX is ~/.local
#
# Options:
#   --prefix DIR    install under DIR (DIR/bin/toolsmith, DIR/share/toolsmith) [default: ~/.local]
#   --binary FILE   install this already-built binary instead of building a release one
#   --link          hard-link the native parts instead of copying them (same filesystem only)
#   --no-models     leave out SmolLM2-135M (517 MB; only `--init smollm2-135m` and smol presets need it)
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '[install] %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

prefix="$HOME/.local"
binary=""
copy=(cp -a)
models=1
while [ $# -gt 0 ]; do
    case "$1" in
        --prefix) prefix="${2:?--prefix needs a directory}"; shift 2 ;;
        --binary) binary="${2:?--binary needs a file}"; shift 2 ;;
        --link) copy=(cp -al); shift ;;
        --no-models) models=0; shift ;;
        -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
        *) die "unknown option $1 (see --help)" ;;
    esac
done

deps="${TOOLSMITH_DEPS:-$PWD/.deps}"
for part in libtorch onnxruntime minilm python/runner.wasm; do
    [ -e "$deps/$part" ] || die "$deps/$part is missing: run ./scripts/setup.sh first"
done

if [ -z "$binary" ]; then
    say "building the release binary (cargo build --release; a cold build takes a while)"
    cargo build --release --locked --bin toolsmith >&2
    binary="${CARGO_TARGET_DIR:-$PWD/target}/release/toolsmith"
fi
[ -x "$binary" ] || die "$binary is not an executable"

data="$prefix/share/toolsmith"
mkdir -p "$prefix/bin" "$data"

# Replace each part whole, so a reinstall never mixes two versions of one library.
place() {
    local from="$1" to="$2"
    rm -rf "$to.new"
    "${copy[@]}" "$from" "$to.new" 2>/dev/null || cp -a "$from" "$to.new"
    rm -rf "$to"
    mv "$to.new" "$to"
}
for part in libtorch onnxruntime minilm python; do
    say "placing $part"
    place "$deps/$part" "$data/$part"
done
if [ "$models" = 1 ] && [ -e "$deps/smollm2-135m-instruct/config.json" ]; then
    say "placing smollm2-135m-instruct"
    place "$deps/smollm2-135m-instruct" "$data/smollm2-135m-instruct"
fi
if [ -x "$deps/componentize-py/bin/componentize-py" ]; then
    say "placing componentize-py"
    # A venv's scripts name their interpreter by absolute path: point them at the new place.
    rm -rf "$data/componentize-py"
    cp -a "$deps/componentize-py" "$data/componentize-py"
    for script in "$data/componentize-py/bin/"*; do
        if [ -f "$script" ] && [ ! -L "$script" ] && head -c 2 "$script" | grep -q '#!'; then
            sed -i "1s|^#!.*/bin/python[0-9.]*\$|#!$data/componentize-py/bin/python|" "$script"
        fi
    done
fi

# The SDK as cargo packages it: Cargo.toml normalised (no workspace inheritance), the WIT inside.
# The packaged SDK names the contract by version only; point it at the copy beside it.
say "placing the SDK sources"
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -1)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cargo package --quiet --no-verify --allow-dirty -p toolsmith-contract -p toolsmith-sdk --target-dir "$work/target" >&2
rm -rf "$data/sdk.new"
mkdir -p "$data/sdk.new"
for crate in toolsmith-contract toolsmith-sdk; do
    tar -xzf "$work/target/package/$crate-$version.crate" -C "$data/sdk.new"
done
sed -i "/^\[\(target\..*\.\)\?dependencies\.toolsmith-contract\]\$/a path = \"../toolsmith-contract-$version\"" \
    "$data/sdk.new/toolsmith-sdk-$version/Cargo.toml"
rm -rf "$data/sdk"
mv "$data/sdk.new" "$data/sdk"

install -m 755 "$binary" "$prefix/bin/toolsmith.new"
mv "$prefix/bin/toolsmith.new" "$prefix/bin/toolsmith"

say "installed $prefix/bin/toolsmith (data in $data)"
case ":$PATH:" in
    *":$prefix/bin:"*) ;;
    *) say "add it to PATH: export PATH=\"$prefix/bin:\$PATH\"" ;;
esac
say "check it: toolsmith doctor"
