#!/usr/bin/env python3
"""One GRPO/PPO policy-gradient step on an Atropos batch, with a tiny torch causal LM.

Checks that a batch as the Atropos trajectory API hands it out (`GET /batch` answers
`{"batch": [group, ...]}`) is trainable: every group is a dict with

    tokens              list[list[int]]    one token sequence per rollout
    masks               list[list[int]]    -100 = not trained, else the token id (same length as tokens)
    scores              list[float]        one score per rollout
    advantages          list[list[float]]  token-level advantages (or null: then score - group mean,
                                           broadcast over the sequence)
    inference_logprobs  list[list[float]]  the sampler's logprobs (read for shape only)

Run it with the interpreter printed by `scripts/trl-env.sh` (it holds torch):

    PY=$(scripts/trl-env.sh | tail -n 1)
    $PY tests/atropos/grpo_step.py --batch FILE     # FILE: the JSON list (or the whole /batch reply)
    $PY tests/atropos/grpo_step.py --self-test      # a synthetic batch

The model is an embedding plus one linear layer (vocab = max token id + 1), seeded. The loss is
the GRPO/PPO policy-gradient loss at ratio 1: for every trained position t (masks[t] != -100,
t >= 1) the per-token loss is -advantage[t] * log p(tokens[t] | tokens[<t]), with the logits of
position t-1 predicting token t; the loss is the mean over all trained tokens of the batch. One SGD
step is taken and the loss recomputed. One JSON object is printed on stdout:

    {"loss_before": float, "loss_after": float, "tokens": int, "groups": int, "sequences": int, ...}

Exit status 0 when loss_after < loss_before and tokens > 0, 1 otherwise (the report's `reason`
says why; a batch whose groups all scored alike has zero advantages, hence no signal), 2 on a
malformed batch.
"""

from __future__ import annotations

import argparse
import json
import random
import sys

import torch

IGNORE = -100


class BatchError(ValueError):
    pass


def load_groups(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if isinstance(data, dict) and "batch" in data:
        data = data["batch"]
    if not isinstance(data, list) or not data:
        raise BatchError("the batch must be a non-empty JSON list of groups (or {\"batch\": [...]})")
    return data


def flatten(groups: list[dict]) -> list[tuple[list[int], list[int], list[float]]]:
    """(tokens, masks, per-token advantages) for every sequence, validated."""
    out = []
    for g, group in enumerate(groups):
        if not isinstance(group, dict):
            raise BatchError(f"group {g} is not an object")
        tokens, masks, scores = group.get("tokens"), group.get("masks"), group.get("scores")
        if not isinstance(tokens, list) or not isinstance(masks, list) or not isinstance(scores, list):
            raise BatchError(f"group {g} lacks tokens/masks/scores lists")
        if not (len(tokens) == len(masks) == len(scores)) or not tokens:
            raise BatchError(f"group {g}: tokens/masks/scores lengths differ ({len(tokens)}/{len(masks)}/{len(scores)})")
        advantages = group.get("advantages")
        mean = sum(float(s) for s in scores) / len(scores)
        lps = group.get("inference_logprobs")
        for i, (toks, mask) in enumerate(zip(tokens, masks)):
            if len(toks) != len(mask):
                raise BatchError(f"group {g} sequence {i}: {len(toks)} tokens but {len(mask)} masks")
            if any((not isinstance(t, int)) or t < 0 for t in toks):
                raise BatchError(f"group {g} sequence {i}: token ids must be non-negative integers")
            for t, (tok, m) in enumerate(zip(toks, mask)):
                if m != IGNORE and m != tok:
                    raise BatchError(f"group {g} sequence {i} position {t}: mask {m} is neither -100 nor the token {tok}")
            if advantages is not None:
                adv = advantages[i]
                if isinstance(adv, (int, float)):
                    adv = [float(adv)] * len(toks)
                if len(adv) != len(toks):
                    raise BatchError(f"group {g} sequence {i}: {len(adv)} advantages for {len(toks)} tokens")
            else:
                adv = [float(scores[i]) - mean] * len(toks)
            if lps is not None and len(lps[i]) != len(toks):
                raise BatchError(f"group {g} sequence {i}: {len(lps[i])} inference_logprobs for {len(toks)} tokens")
            out.append((list(toks), list(mask), [float(a) for a in adv]))
    return out


class TinyLM(torch.nn.Module):
    def __init__(self, vocab: int, dim: int = 16):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.head = torch.nn.Linear(dim, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # [B, T] -> [B, T, V]
        return self.head(self.embed(ids))


def tensors(seqs):
    """Right-padded ids [B, T], the trained-position mask [B, T] and advantages [B, T]."""
    width = max(len(t) for t, _, _ in seqs)
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    trained = torch.zeros(len(seqs), width, dtype=torch.bool)
    adv = torch.zeros(len(seqs), width)
    for b, (toks, mask, a) in enumerate(seqs):
        n = len(toks)
        ids[b, :n] = torch.tensor(toks)
        trained[b, :n] = torch.tensor([m != IGNORE for m in mask])
        adv[b, :n] = torch.tensor(a)
    trained[:, 0] = False  # position 0 has no predecessor to predict it
    return ids, trained, adv


def pg_loss(model: TinyLM, ids, trained, adv) -> torch.Tensor:
    logp = torch.log_softmax(model(ids[:, :-1]), dim=-1)  # position t-1 predicts token t
    token_logp = logp.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    m = trained[:, 1:].float()
    return -(adv[:, 1:] * token_logp * m).sum() / m.sum().clamp(min=1.0)


def synthetic_batch(seed: int = 0) -> list[dict]:
    """Two groups of two sequences: prompt tokens untrained, completion tokens trained, GRPO
    advantages (score - group mean, broadcast over the sequence), sampler logprobs 0 on the prompt."""
    rng = random.Random(seed)
    groups = []
    for _ in range(2):
        prompt = [rng.randrange(3, 20) for _ in range(4)]
        tokens, masks, scores, lps = [], [], [], []
        for s in (1.0, 0.0):
            comp = [rng.randrange(3, 20) for _ in range(rng.randrange(3, 6))] + [2]
            tokens.append(prompt + comp)
            masks.append([IGNORE] * len(prompt) + comp)
            scores.append(s)
            lps.append([0.0] * len(prompt) + [-round(rng.uniform(0.5, 3.0), 3) for _ in comp])
        mean = sum(scores) / len(scores)
        advantages = [[sc - mean] * len(t) for sc, t in zip(scores, tokens)]
        groups.append({"tokens": tokens, "masks": masks, "scores": scores, "advantages": advantages,
                       "ref_logprobs": None, "messages": None, "generation_params": None,
                       "inference_logprobs": lps, "overrides": None, "group_overrides": None,
                       "images": None, "env_id": 0, "distill_token_ids": None, "distill_logprobs": None})
    return groups


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--batch", metavar="FILE", help="JSON list of Atropos groups (or a GET /batch reply)")
    src.add_argument("--self-test", action="store_true", help="use a synthetic batch")
    ap.add_argument("--lr", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()

    try:
        groups = synthetic_batch(a.seed) if a.self_test else load_groups(a.batch)
        seqs = flatten(groups)
    except (OSError, json.JSONDecodeError, BatchError) as e:
        print(json.dumps({"error": str(e)}))
        return 2

    torch.manual_seed(a.seed)
    vocab = max(max(t) for t, _, _ in seqs) + 1
    model = TinyLM(vocab)
    ids, trained, adv = tensors(seqs)
    tokens = int(trained.sum())
    opt = torch.optim.SGD(model.parameters(), lr=a.lr)

    loss = pg_loss(model, ids, trained, adv)
    opt.zero_grad()
    loss.backward()
    opt.step()
    with torch.no_grad():
        after = pg_loss(model, ids, trained, adv)

    report = {"loss_before": float(loss.detach()) + 0.0, "loss_after": float(after) + 0.0, "tokens": tokens,
              "groups": len(groups), "sequences": len(seqs), "vocab": vocab,
              "nonzero_advantage_tokens": int(((adv != 0) & trained).sum())}
    ok = tokens > 0 and report["loss_after"] < report["loss_before"]
    report["passed"] = ok
    if not ok:
        report["reason"] = ("no trained tokens" if tokens == 0 else
                            "every trained token has advantage 0: no learning signal"
                            if report["nonzero_advantage_tokens"] == 0 else "the step did not lower the loss")
    print(json.dumps(report))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
