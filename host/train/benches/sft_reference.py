"""The SFT step loop of `toolsmith train sft` written plainly in PyTorch, for the benchmark.

Reads the initial checkpoint (Hugging Face layout), the batches the Rust trainer took (sequence
ids, loss masks, learning rate per step) and the settings, then takes the same steps with
`torch.optim.AdamW` (decay on matrices only, as the trainer does), masked token-mean NLL over
micro-batches, gradient accumulation and global-norm clipping. Prints one JSON object: the loss
and tokens/s of each step.
"""
import json
import sys
import time

import torch
from transformers import AutoModelForCausalLM


def main():
    ckpt, plan_path, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
    torch.set_num_threads(threads)
    plan = json.load(open(plan_path))
    cfg = plan["config"]
    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)
    model.train()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg["weight_decay"]}, {"params": rest, "weight_decay": 0.0}],
        lr=cfg["lr"], betas=(cfg["beta1"], cfg["beta2"]), eps=cfg["eps"], foreach=False,
    )
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
            ids = torch.tensor([s["ids"] + [pad] * (t - len(s["ids"])) for s in batch])
            mask = torch.tensor([s["mask"] + [0] * (t - len(s["mask"])) for s in batch], dtype=torch.float32)
            logits = model(input_ids=ids).logits[:, :-1].float()
            logp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
            loss = -(logp * mask[:, 1:]).sum() / max(trained, 1)
            loss.backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["max_grad_norm"])
        opt.step()
        seconds = time.perf_counter() - started
        losses.append(total)
        rates.append(sum(len(s["ids"]) for s in seqs) / seconds)
    print(json.dumps({"losses": losses, "tokens_per_sec": rates}))


if __name__ == "__main__":
    main()
