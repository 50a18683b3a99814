"""The RL update of `toolsmith train rl` written plainly in PyTorch, for the benchmark.

Reads the initial checkpoint (Hugging Face layout) and the plan the Rust side took: per step the
sequences (ids, loss masks), micro-batches, one advantage and one token weight per sequence, and
the learning rate. Each step scores the old log-probs without gradients (untimed), then takes
`epochs` updates: the clipped surrogate `min(r A, clip(r, 1 - low, 1 + high) A)` with
`r = exp(logp - old)` on trained tokens, weighted per token and summed, gradient accumulation
over micro-batches, global-norm clipping and `torch.optim.AdamW`. Frozen layers and LoRA are set
up as in sft_reference.py. Prints one JSON object: the last epoch's loss and the update's
tokens/s per step, and the peak resident memory (KiB).
"""
import contextlib
import json
import os
import resource
import sys
import time

import torch
from transformers import AutoModelForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sft_reference import adamw, freeze_below, with_lora  # noqa: E402


def main():
    ckpt, plan_path, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
    torch.set_num_threads(threads)
    plan = json.load(open(plan_path))
    cfg = plan["config"]
    torch.manual_seed(0)
    precision = cfg.get("precision") or "f32"
    trainable_layers, lora = cfg.get("trainable_layers"), cfg.get("lora")
    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)
    if trainable_layers is not None and not lora:
        freeze_below(model, trainable_layers)
    if lora:
        model = with_lora(model, lora)
    model.train()
    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if precision == "bf16" else contextlib.nullcontext
    trainable, opt = adamw(model, cfg)
    pad, low, high = plan["pad_id"], cfg["clip_low"], cfg["clip_high"]

    def logprobs(batch):
        t = max(len(s["ids"]) for s in batch)
        ids = torch.tensor([s["ids"] + [pad] * (t - len(s["ids"])) for s in batch])
        mask = torch.tensor([s["mask"] + [0] * (t - len(s["mask"])) for s in batch], dtype=torch.float32)
        with autocast():
            logits = model(input_ids=ids).logits
        logp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
        return logp, mask[:, 1:]

    losses, rates = [], []
    for step in plan["steps"]:
        seqs = step["sequences"]
        micro = [(m[0], m[1]) for m in step["micro_batches"]]
        with torch.no_grad():
            old = [logprobs(seqs[a:b])[0] for a, b in micro]
        for group in opt.param_groups:
            group["lr"] = step["lr"]
        started = time.perf_counter()
        for _ in range(cfg["epochs"]):
            opt.zero_grad(set_to_none=True)
            total = 0.0
            for (a, b), old_lp in zip(micro, old):
                logp, mask = logprobs(seqs[a:b])
                adv = torch.tensor(step["advantages"][a:b], dtype=torch.float32).unsqueeze(1)
                w = torch.tensor(step["weights"][a:b], dtype=torch.float32).unsqueeze(1) * mask
                ratio = torch.exp((logp - old_lp) * mask)
                surrogate = torch.minimum(ratio * adv, ratio.clamp(1 - low, 1 + high) * adv)
                loss = -(surrogate * w).sum()
                loss.backward()
                total += loss.item()
            torch.nn.utils.clip_grad_norm_(trainable, cfg["max_grad_norm"])
            opt.step()
        seconds = time.perf_counter() - started
        losses.append(total)
        rates.append(sum(len(s["ids"]) for s in seqs) / seconds)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    print(json.dumps({"losses": losses, "tokens_per_sec": rates, "peak_rss_kib": peak}))


if __name__ == "__main__":
    main()
