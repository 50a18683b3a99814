#!/usr/bin/env bash
# The venv of the policy's reference implementation (PyTorch eager + Hugging Face transformers, and
# PEFT for the LoRA reference), used by the equivalence tests and the benchmarks. About 3 GB of
# wheels (PyTorch pulls its CUDA libraries even for CPU use), installed once into
# ~/.cache/toolsmith/venvs. The last line on stdout is its python interpreter (see python-venv.sh).
#
# The venv's name changes with its pins. Where the venv of the previous pins (the same torch,
# transformers and safetensors, without peft) is already there, the new one starts as a hard-linked
# copy of it and only installs what is missing (peft and its few dependencies), instead of
# downloading PyTorch again; should that fail for any reason, python-venv.sh installs from scratch.
set -euo pipefail

here="$(cd -- "$(dirname -- "$0")" && pwd)"
base=(torch==2.11.0 transformers==5.23.0 safetensors==0.8.0)
specs=("${base[@]}" peft==0.21.2)
name=torch-2.11.0-peft-0.21.2
seed_name=torch-2.11.0 # python-venv.sh's venv of exactly ${base[@]}

root="${TOOLSMITH_VENVS:-$HOME/.cache/toolsmith/venvs}"
[ -d "$root" ] && root="$(cd -- "$root" && pwd -P)" # python-venv.sh's paths are physical
venv="$root/$name"
seed="$root/$seed_name"
stamp=.toolsmith-venv

log() { printf 'torch-reference-env: %s\n' "$*" >&2; }

# Clone the seed venv into a temporary directory beside the target (hard links: no extra space,
# and installs or upgrades only ever unlink and recreate files, so the seed is never changed),
# install the new pins there, check they import, and rename it into place, under the same lock as
# python-venv.sh. Run in a subshell: any failure just falls back to the full install.
seed_venv() (
    set -e
    exec 9>"$venv.lock"
    flock 9
    [ -f "$venv/$stamp" ] && exit 0 # another process made it meanwhile; python-venv.sh checks it
    [ -e "$venv" ] && exit 1        # an invalid leftover: python-venv.sh replaces it
    tmp="$(mktemp -d "$root/.venv-$name.XXXXXX")"
    trap 'rm -rf -- "$tmp"' EXIT
    log "creating $venv from $seed (hard links) plus ${specs[*]:${#base[@]}}"
    cp -al -- "$seed/." "$tmp/"
    rm -f -- "$tmp/$stamp"
    "$tmp/bin/python" -m pip install --quiet --disable-pip-version-check --no-input "${specs[@]}" >&2
    "$tmp/bin/python" - "${specs[@]}" <<'PY' >&2
import importlib, importlib.metadata, sys
for spec in sys.argv[1:]:
    package, version = spec.split("==")
    got = importlib.metadata.version(package)
    if got != version:
        sys.exit(f"installed {package} {got}, expected {version}")
    importlib.import_module(package.replace("-", "_"))
PY
    # Scripts embed the seed's path (copied) or the build path (new ones); point them at the target.
    # The seed's path first: the target's path starts with it.
    for f in "$tmp"/bin/*; do
        if [ -f "$f" ] && [ ! -L "$f" ] && grep -qF -e "$seed" -e "$tmp" -- "$f" 2>/dev/null; then
            sed -i.bak -e "s|$seed|$venv|g" -e "s|$tmp|$venv|g" "$f" && rm -f -- "$f.bak"
        fi
    done
    printf '%s\n' "${specs[@]}" >"$tmp/$stamp"
    mv -T -- "$tmp" "$venv"
)

if [ ! -f "$venv/$stamp" ] && [ -x "$seed/bin/python" ] && command -v flock >/dev/null 2>&1 &&
    [ "$(cat -- "$seed/$stamp" 2>/dev/null)" = "$(printf '%s\n' "${base[@]}")" ]; then
    # Not `seed_venv || ...`: that would switch off errexit inside it.
    set +e
    seed_venv
    rc=$?
    set -e
    [ "$rc" -eq 0 ] || log "could not build on $seed; installing from scratch"
fi
exec "$here/python-venv.sh" "$name" "${specs[@]}"
