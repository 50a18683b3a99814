#!/usr/bin/env bash
# The served policy improves while it is used (BENCHMARKS.md, "Learning while serving").
#
#   scripts/served-learning.sh SFT_CHECKPOINT OUT [HELD_OUT_SEED] [-- extra `jobs submit` flags]
#
# One daemon serves an SFT checkpoint over /v1/chat/completions and a held-out world's tools over
# MCP (`serve --corpus`). A client evaluates the held-out questions through both, then the daemon
# runs an RL job (the smol-gap preset from the same checkpoint, on training worlds only) and swaps
# the served weights after each checkpoint while the client keeps asking a few questions; when the
# job ends the client evaluates again. Writes OUT/before.json, OUT/during.jsonl, OUT/after.json.
set -euo pipefail

sft=${1:?usage: served-learning.sh SFT_CHECKPOINT OUT [HELD_OUT_SEED] [-- jobs submit flags]}
out=${2:?usage: served-learning.sh SFT_CHECKPOINT OUT [HELD_OUT_SEED] [-- jobs submit flags]}
world=${3:-1001}
shift $(($# < 3 ? $# : 3))
[ "${1:-}" = "--" ] && shift
bin=${TOOLSMITH:-toolsmith}
port=${PORT:-8761}
base=http://127.0.0.1:$port
mkdir -p "$out"

# The held-out world the client asks about; its corpus is the served search tool.
"$bin" world generate --seed "$world" --countries 6 --tasks-per-family 10 --out "$out/world" >/dev/null
"$bin" --registry "$out/registry.db" serve --http "127.0.0.1:$port" --policy "$sft" \
    --corpus "$out/world/corpus.jsonl" --state-dir "$out/state" 2>"$out/serve.log" &
daemon=$!
trap 'kill $daemon 2>/dev/null; wait $daemon 2>/dev/null' EXIT
for _ in $(seq 120); do curl -sf "$base/health" >/dev/null && break; sleep 1; done

# What the RL presets' held-out evaluation asks (EvalConfig::smol, gap mode), but as a client.
ask() {
    "$bin" --registry "$out/client.db" eval --policy "$base/v1" --tools "$base/mcp" --mode gap \
        --tool-format brief --max-turns 6 --max-tokens 128 --seed "$world" --countries 6 --json "$@"
}
# The optimiser step of the served weights (0 until the job's first checkpoint).
step() { curl -sf "$base/status" | python3 -c 'import json,sys; print((json.load(sys.stdin)["training"]["running"] or {}).get("served_step") or 0)'; }

start=$(date +%s)
ask --tasks-per-family 10 --parallel 16 >"$out/before.json"
echo "before: $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["overall"]["em"])' "$out/before.json") ($(($(date +%s) - start)) s)"

job=$("$bin" jobs --server "$base" submit rl --preset smol-gap --init "$sft" --no-eval "$@" 2>&1 | sed -n 's/^job \([0-9]*\) queued.*/\1/p')
[ -n "$job" ] || { echo "the job was not queued" >&2; exit 1; }
echo "job $job queued"
: >"$out/during.jsonl"
while true; do
    state=$(curl -sf "$base/jobs/$job" | python3 -c 'import json,sys; print(json.load(sys.stdin)["state"])')
    case $state in succeeded) break ;; failed | cancelled) echo "job $job $state" >&2; exit 1 ;; esac
    before_step=$(step)
    # A subset of the same questions: single-hop and parallel multi-hop.
    em=$(ask --tasks-per-family 10 --family single_hop --family multi_hop_parallel --parallel 8 |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["overall"]["em"])')
    echo "{\"t\": $(($(date +%s) - start)), \"step_before\": $before_step, \"step_after\": $(step), \"em\": $em}" | tee -a "$out/during.jsonl"
    sleep 60
done
echo "job $job succeeded at $(($(date +%s) - start)) s"
ask --tasks-per-family 10 --parallel 16 >"$out/after.json"
python3 - "$out" <<'EOF'
import json, sys
b, a = (json.load(open(f"{sys.argv[1]}/{n}.json")) for n in ("before", "after"))
print(f"{'':24} {'before':>8} {'after':>8}")
for fam in sorted(b["families"]):
    print(f"{fam:24} {b['families'][fam]['em']:8.3f} {a['families'][fam]['em']:8.3f}")
print(f"{'overall EM':24} {b['overall']['em']:8.3f} {a['overall']['em']:8.3f}")
print(f"{'turns':24} {b['overall']['turns']:8.2f} {a['overall']['turns']:8.2f}")
EOF
echo "total $(($(date +%s) - start)) s"
