"""The SFT step loop of `toolsmith train sft` written plainly in PyTorch, for the benchmark.

Reads the initial checkpoint (Hugging Face layout), the batches the Rust trainer took (sequence
ids, loss masks, learning rate per step) and the settings, then takes the same steps with
`torch.optim.AdamW` (decay on matrices only, as the trainer does), masked token-mean NLL over
micro-batches, gradient accumulation and global-norm clipping. Prints one JSON object: the loss
and tokens/s of each step, the number of trained parameters and the peak resident memory (KiB).

Optional keys of the plan's "config" (absent or null: full fp32 training, as before):
  "precision": "f32" | "bf16"      bf16 compute with fp32 master weights: the model stays fp32 and
                                   its forward runs under CPU autocast to bfloat16; log-softmax,
                                   loss and AdamW stay fp32.
  "trainable_layers": N            only the top N decoder layers and the final norm train; the
                                   embeddings (so a tied LM head), an untied LM head and the lower
                                   layers are frozen.
  "lora": {"rank": r, "alpha": a, "dropout": d, "target_modules": [...]}
                                   PEFT LoRA adapters on the named modules (no bias); only the
                                   adapters train, with weight decay like other matrices. With
                                   "adapter": DIR, the initial adapter is read from DIR (PEFT's
                                   layout), so both sides start from the same A; with
                                   "trainable_layers" as well, that adapter's layers_to_transform
                                   (the top N) say which layers are adapted.
  "gradient_checkpointing": true   transformers' gradient checkpointing (non-reentrant), as the
                                   trainer's recomputation of each layer in the backward pass.
"""
import contextlib
import json
import resource
import sys
import time

import torch
from transformers import AutoModelForCausalLM


def freeze_below(model, n):
    """Train only the top `n` decoder layers and the final norm."""
    layers = model.model.layers
    if not 0 <= n <= len(layers):
        sys.exit(f"trainable_layers {n} is outside 0..{len(layers)}")
    model.requires_grad_(False)
    for layer in layers[len(layers) - n:]:
        layer.requires_grad_(True)
    model.model.norm.requires_grad_(True)


def with_lora(model, lora):
    from peft import LoraConfig, PeftModel, get_peft_model

    if lora.get("adapter"):
        return PeftModel.from_pretrained(model, lora["adapter"], is_trainable=True)
    config = LoraConfig(r=lora["rank"], lora_alpha=lora["alpha"], lora_dropout=lora.get("dropout", 0.0),
                        target_modules=list(lora["target_modules"]), bias="none", task_type="CAUSAL_LM")
    return get_peft_model(model, config)


def adamw(model, cfg):
    """The trained parameters and AdamW over them, decaying matrices only (as the trainer does)."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in trainable if p.dim() >= 2]
    rest = [p for p in trainable if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg["weight_decay"]}, {"params": rest, "weight_decay": 0.0}],
        lr=cfg["lr"], betas=(cfg["beta1"], cfg["beta2"]), eps=cfg["eps"], foreach=False,
    )
    return trainable, opt


def main():
    ckpt, plan_path, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
    device = torch.device(sys.argv[4] if len(sys.argv) > 4 else "cpu")
    torch.set_num_threads(threads)
    plan = json.load(open(plan_path))
    cfg = plan["config"]
    torch.manual_seed(0)  # LoRA's initial A matrices and dropout
    precision = cfg.get("precision") or "f32"
    if precision not in ("f32", "bf16"):
        sys.exit(f"unknown precision {precision!r} (f32 or bf16)")
    trainable_layers, lora = cfg.get("trainable_layers"), cfg.get("lora")
    if trainable_layers is not None and lora and not lora.get("adapter"):
        sys.exit("trainable_layers with lora needs the adapter saved by the trainer (its layers_to_transform)")
    # fp32 master weights either way; bf16 is compute only (autocast).
    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).to(device)
    # With LoRA, trainable_layers picked the adapted layers: the adapter's config lists them.
    if trainable_layers is not None and not lora:
        freeze_below(model, trainable_layers)
    if lora:
        model = with_lora(model, lora)
    if cfg.get("gradient_checkpointing"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    autocast = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if precision == "bf16" else contextlib.nullcontext
    trainable, opt = adamw(model, cfg)
    pad = plan["pad_id"]
    losses, rates = [], []
    for step in plan["steps"]:
        started = time.perf_counter()
        seqs = step["sequences"]
        for group in opt.param_groups:
            group["lr"] = step["lr"]
        opt.zero_grad(set_to_none=True)
        trained = sum(sum(s["mask"][1:]) for s in seqs)
        total = 0.0
        for micro in step["micro_batches"]:
            batch = [seqs[i] for i in range(micro[0], micro[1])]
            t = max(len(s["ids"]) for s in batch)
            ids = torch.tensor([s["ids"] + [pad] * (t - len(s["ids"])) for s in batch], device=device)
            mask = torch.tensor([s["mask"] + [0] * (t - len(s["mask"])) for s in batch], dtype=torch.float32,
                                device=device)
            with autocast():
                logits = model(input_ids=ids).logits
            logits = logits[:, :-1].float()
            logp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
            loss = -(logp * mask[:, 1:]).sum() / max(trained, 1)
            loss.backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(trainable, cfg["max_grad_norm"])
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize()  # the step's kernels, queued asynchronously, must finish
        seconds = time.perf_counter() - started
        losses.append(total)
        rates.append(sum(len(s["ids"]) for s in seqs) / seconds)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    print(json.dumps({"losses": losses, "tokens_per_sec": rates,
                      "trainable_parameters": sum(p.numel() for p in trainable), "peak_rss_kib": peak}))


if __name__ == "__main__":
    main()
