"""Reference implementation for the policy's equivalence tests and benchmark: Hugging Face
transformers on PyTorch eager (CPU unless --device says otherwise).

  reference.py make  --arch qwen2|llama --tokenizer DIR --out DIR --inputs FILE
      Creates a small random model with transformers, saves it (safetensors + tokenizer) to OUT,
      and writes OUT/reference.json (token ids of the inputs, greedy generations) and
      OUT/reference.safetensors (logits of a right-padded batch).
  reference.py bench --model DIR --threads N --batch B --seq T --steps S --new-tokens K
                    [--dtype float32|bfloat16] [--generate-batch G] [--prompts random|same]
      Prints one JSON line: forward+backward tokens/s (batch B x T), generate tokens/s (greedy,
      KV cache, exactly K new tokens per row, EOS ignored; over all G rows of a batch of G
      prompts of --prompt tokens, distinct random ones or one repeated), peak RSS (MiB).
      --dtype is the dtype of the weights and of the compute on both (the loss is taken in fp32).
  reference.py lora --model DIR --adapter DIR --ids FILE --out FILE
      Loads the base with transformers and the adapter with PEFT, and writes the logits of the
      token ids in FILE (a JSON list of equal-length lists) to OUT (safetensors, "logits"), with
      the adapter and, as "merged", after PEFT's merge_and_unload.
"""
import argparse
import json
import resource
import sys
import time

import torch
from safetensors.torch import save_file
from transformers import (AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM,
                          PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM)


def tokenizer_from(dir):
    tok = PreTrainedTokenizerFast(tokenizer_file=f"{dir}/tokenizer.json")
    tok.eos_token = "<|im_end|>"
    tok.pad_token = "<|endoftext|>"
    return tok


def make(args):
    torch.manual_seed(args.seed)
    tok = tokenizer_from(args.tokenizer)
    vocab = (len(tok) + 63) // 64 * 64
    common = dict(vocab_size=vocab, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  rms_norm_eps=1e-6, initializer_range=0.2, eos_token_id=tok.eos_token_id,
                  pad_token_id=tok.pad_token_id, bos_token_id=None)
    if args.arch == "qwen2":
        config = Qwen2Config(**common, tie_word_embeddings=False,
                             rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
        model = Qwen2ForCausalLM(config)
    else:
        # Llama 3.1's rope schedule and tied embeddings: the other code paths.
        config = LlamaConfig(**common, tie_word_embeddings=True,
                             rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                              "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                              "original_max_position_embeddings": 64})
        model = LlamaForCausalLM(config)
    model = model.to(args.device).eval()
    model.save_pretrained(args.out, safe_serialization=True)
    tok.save_pretrained(args.out)

    inputs = json.load(open(args.inputs))
    texts = inputs["texts"]
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    longest = max(map(len, ids))
    eos = [tok.eos_token_id, tok.pad_token_id]
    with torch.no_grad():
        # Right padding: positions 0.. for every real token, the same as the Rust scorer.
        batch = torch.tensor([x + [tok.pad_token_id] * (longest - len(x)) for x in ids], device=args.device)
        mask = torch.tensor([[1] * len(x) + [0] * (longest - len(x)) for x in ids], device=args.device)
        logits = model(input_ids=batch, attention_mask=mask).logits.float().cpu()
        save_file({"logits": logits.contiguous()}, f"{args.out}/reference.safetensors")

        def greedy(prompts):
            left = max(map(len, prompts))
            batch = torch.tensor([[tok.pad_token_id] * (left - len(x)) + x for x in prompts], device=args.device)
            mask = torch.tensor([[0] * (left - len(x)) + [1] * len(x) for x in prompts], device=args.device)
            out = model.generate(input_ids=batch, attention_mask=mask, do_sample=False,
                                 max_new_tokens=inputs["max_new_tokens"], eos_token_id=eos,
                                 pad_token_id=tok.pad_token_id)
            return [cut(row[left:].tolist(), eos) for row in out]

        single = [greedy([x])[0] for x in ids]
        batched = greedy(ids)
    json.dump({"input_ids": ids, "greedy_single": single, "greedy_batched": batched}, open(f"{args.out}/reference.json", "w"))


def cut(tokens, eos):
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[: i + 1]
    return tokens


def bench(args):
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    device = torch.device(args.device)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype).to(device).train()
    vocab = model.config.vocab_size
    x = torch.randint(0, vocab, (args.batch, args.seq), device=device)

    def sync():
        # CUDA runs asynchronously: a timer must wait for the queued kernels.
        if device.type == "cuda":
            torch.cuda.synchronize()

    def step():
        logits = model(input_ids=x).logits.float()
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, vocab), x[:, 1:].reshape(-1))
        loss.backward()
        model.zero_grad(set_to_none=True)

    for _ in range(2):
        step()
    times = []
    for _ in range(args.steps):
        sync()
        t = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t)
    train = args.batch * args.seq / sorted(times)[len(times) // 2]

    model.eval()
    rows = args.generate_batch
    if args.prompts == "same":
        prompt = torch.randint(3, vocab, (1, args.prompt), device=device).repeat(rows, 1)
    else:
        prompt = torch.randint(3, vocab, (rows, args.prompt), device=device)
    # Prompts of equal length: no padding, every row generates exactly new_tokens (EOS is ignored).
    mask = torch.ones_like(prompt)
    with torch.no_grad():
        kwargs = dict(do_sample=False, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                      pad_token_id=0, eos_token_id=None, use_cache=True)
        model.generate(input_ids=prompt, attention_mask=mask, **kwargs)
        rates = []
        for _ in range(args.generations):
            sync()
            t = time.perf_counter()
            out = model.generate(input_ids=prompt, attention_mask=mask, **kwargs)
            sync()
            rates.append(out.shape[0] * (out.shape[1] - args.prompt) / (time.perf_counter() - t))
    generate = sorted(rates)[len(rates) // 2]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"train_tokens_per_sec": train, "generate_tokens_per_sec": generate, "peak_rss_mib": peak,
                      "dtype": args.dtype, "generate_batch": rows, "generated_tokens_per_row": out.shape[1] - args.prompt}))


def lora(args):
    from peft import PeftModel
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    model = PeftModel.from_pretrained(model, args.adapter).eval()
    ids = torch.tensor(json.load(open(args.ids)))
    with torch.no_grad():
        adapted = model(input_ids=ids).logits.float()
        merged = model.merge_and_unload()(input_ids=ids).logits.float()
    save_file({"logits": adapted.contiguous(), "merged": merged.contiguous()}, args.out)


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("--arch", choices=["qwen2", "llama"], required=True)
    m.add_argument("--tokenizer", required=True)
    m.add_argument("--out", required=True)
    m.add_argument("--inputs", required=True)
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--device", default="cpu")
    b = sub.add_parser("bench")
    b.add_argument("--model", required=True)
    b.add_argument("--threads", type=int, default=1)
    b.add_argument("--batch", type=int, default=8)
    b.add_argument("--seq", type=int, default=128)
    b.add_argument("--steps", type=int, default=10)
    b.add_argument("--prompt", type=int, default=16)
    b.add_argument("--new-tokens", type=int, default=128)
    b.add_argument("--generations", type=int, default=5)
    b.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    b.add_argument("--device", default="cpu")
    # Rows generated at once (--batch is the training batch; existing callers expect batch-1 generation).
    b.add_argument("--generate-batch", type=int, default=1)
    b.add_argument("--prompts", choices=["random", "same"], default="random",
                   help="distinct random prompts per row, or one random prompt repeated")
    lo = sub.add_parser("lora")
    lo.add_argument("--model", required=True)
    lo.add_argument("--adapter", required=True)
    lo.add_argument("--ids", required=True)
    lo.add_argument("--out", required=True)
    args = p.parse_args()
    torch.set_num_threads(getattr(args, "threads", 1))
    {"make": make, "bench": bench, "lora": lora}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
