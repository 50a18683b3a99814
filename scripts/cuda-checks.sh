#!/usr/bin/env bash
# The CUDA checks of BENCHMARKS.md ("The CUDA path"), on a machine with a GPU and a CUDA PyTorch
# 2.11 (`python3`), run from the repository root:
#   BIN=<dir> scripts/cuda-checks.sh <out-dir>
# BIN holds `toolsmith` and the `reference`, `decode` and `sft` test and bench executables
# (built elsewhere against libtorch 2.11.0: `cargo test --no-run -p toolsmith-policy --test
# reference`, `cargo bench --no-run --profile dev -p toolsmith-policy --bench decode`, the same
# for `-p toolsmith-train --bench sft`). SmolLM2's weights are not needed: a model of its shape
# with random weights is made from its config.json and tokenizer.json (SMOL, default
# .deps/smollm2-135m-instruct), and the RL iteration's config is RL_CONFIG (default
# scripts/cuda-rl.json).
set -uo pipefail
out=${1:?usage: BIN=<dir> scripts/cuda-checks.sh <out-dir>}
bin=${BIN:?BIN names the directory of executables}
smol=${SMOL:-.deps/smollm2-135m-instruct}
mkdir -p "$out"
lib=$(python3 -c 'import os, torch; print(os.path.dirname(torch.__file__))')/lib
# The executables link libtorch_cpu only; libtorch_cuda is preloaded as linking a CUDA build does.
export LD_LIBRARY_PATH=$lib LD_PRELOAD=$lib/libtorch_cuda.so TOOLSMITH_REFERENCE_PYTHON=$(command -v python3)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
python3 -c 'import torch, transformers; print(torch.__version__, transformers.__version__)'
model=$(mktemp -d)/smollm2-shaped
"$bin/toolsmith" policy init --config "$smol/config.json" --tokenizer "$smol/tokenizer.json" --out "$model" --seed 1
cp "$smol/tokenizer_config.json" "$model/" 2>/dev/null
export TOOLSMITH_SMOLLM2=$model
echo "== equivalence with transformers"
timeout 150 "$bin/reference" on_cuda --nocapture 2>&1 | tail -8
echo "== decode"
timeout 200 "$bin/decode" --device cuda --threads 8 --batches 1,8 --rounds 1 --generations 2 \
    >"$out/decode.txt" 2>"$out/decode.err"
tail -6 "$out/decode.txt"
echo "== one RL iteration"
sed "s#\"init\": \"[^\"]*\"#\"init\": \"$model\"#" "${RL_CONFIG:-scripts/cuda-rl.json}" >"$out/rl.json"
timeout 200 "$bin/toolsmith" train rl --config "$out/rl.json" --out "$(mktemp -d)/rl" --no-eval --no-graph \
    >"$out/rl.log" 2>&1
grep -E "^iteration|^iterations" "$out/rl.log"
echo "== SFT, top 8 layers"
timeout 150 "$bin/sft" --init smollm2-135m --device cuda --precision bf16 --threads 8 --steps 10 --rounds 1 \
    --trainable-layers 8 >"$out/sft8.txt" 2>"$out/sft8.err"
tail -4 "$out/sft8.txt"
