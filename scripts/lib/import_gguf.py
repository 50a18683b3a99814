"""Converts a llama.cpp GGUF file of a Llama-architecture model into the Hugging Face layout the
policy loads (config.json, model.safetensors, tokenizer.json, tokenizer_config.json).

Usage: import_gguf.py MODEL.gguf OUT_DIR

Weights are dequantized to float32 (F32, F16, BF16, Q8_0, Q4_0, Q4_1 and the K-quants that the
`gguf` package can dequantize). llama.cpp stores the query and key projections permuted for its
rotary layout; they are permuted back so the checkpoint matches the original one. The tokenizer is
rebuilt from the GGUF vocabulary and merges (byte-level BPE, `tokenizer.ggml.model == "gpt2"`)
with the pre-tokenizer named by `tokenizer.ggml.pre`. The output is written to OUT_DIR.tmp and
renamed into place, so an interrupted import never leaves a half-written checkpoint.
"""

import json
import os
import shutil
import sys

import gguf
import numpy as np
from safetensors.numpy import save_file
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

# Pre-tokenizers of the byte-level vocabularies we know how to rebuild exactly.
PRE_TOKENIZERS = {
    # SmolLM / SmolLM2: every digit alone, then GPT-2's regex.
    "smollm": lambda: pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    ),
    "gpt2": lambda: pre_tokenizers.ByteLevel(add_prefix_space=False),
    "default": lambda: pre_tokenizers.ByteLevel(add_prefix_space=False),
}
LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
CONTROL_TOKEN = 3


def fail(message):
    sys.exit(f"import_gguf: {message}")


def unpermute(w, heads):
    """Undoes llama.cpp's interleaving of each head's rotary halves."""
    return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def main(src, out):
    reader = gguf.GGUFReader(src)

    def field(key, default=None):
        f = reader.fields.get(key)
        if f is None:
            if default is None:
                fail(f"{src}: no {key} in the metadata")
            return default
        return f.contents()

    arch = field("general.architecture")
    if arch != "llama":
        fail(f"{src}: architecture {arch!r} is not supported (llama only)")
    heads, kv_heads = int(field("llama.attention.head_count")), int(field("llama.attention.head_count_kv"))

    tensors = {}
    for t in reader.tensors:
        w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        w = w.reshape([int(n) for n in reversed(t.shape)])
        if not np.isfinite(w).all():
            fail(f"{src}: tensor {t.name} holds NaN or inf")
        parts = t.name.split(".")
        if t.name == "token_embd.weight":
            key = "model.embed_tokens.weight"
        elif t.name == "output_norm.weight":
            key = "model.norm.weight"
        elif t.name == "output.weight":
            key = "lm_head.weight"
        elif len(parts) == 4 and parts[0] == "blk" and parts[2] in LAYER_NAMES:
            key = f"model.layers.{parts[1]}.{LAYER_NAMES[parts[2]]}.weight"
            if parts[2] == "attn_q":
                w = unpermute(w, heads)
            elif parts[2] == "attn_k":
                w = unpermute(w, kv_heads)
        else:
            fail(f"{src}: unexpected tensor {t.name}")
        tensors[key] = np.ascontiguousarray(w)

    tokens = field("tokenizer.ggml.tokens")
    types = field("tokenizer.ggml.token_type")
    merges = field("tokenizer.ggml.merges")
    if field("tokenizer.ggml.model") != "gpt2":
        fail(f"{src}: only byte-level BPE tokenizers (tokenizer.ggml.model = gpt2) are supported")
    pre = field("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        fail(f"{src}: pre-tokenizer {pre!r} is not supported ({', '.join(PRE_TOKENIZERS)})")
    tokenizer = Tokenizer(
        models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=[tuple(m.split(" ", 1)) for m in merges])
    )
    tokenizer.pre_tokenizer = PRE_TOKENIZERS[pre]()
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == CONTROL_TOKEN]
    )

    token_id = lambda key: int(field(key, -1))  # noqa: E731
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": len(tokens),
        "hidden_size": int(field("llama.embedding_length")),
        "intermediate_size": int(field("llama.feed_forward_length")),
        "num_hidden_layers": int(field("llama.block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "max_position_embeddings": int(field("llama.context_length")),
        "rms_norm_eps": float(field("llama.attention.layer_norm_rms_epsilon")),
        "rope_theta": float(field("llama.rope.freq_base", 10000.0)),
        "tie_word_embeddings": "lm_head.weight" not in tensors,
        "hidden_act": "silu",
        "bos_token_id": token_id("tokenizer.ggml.bos_token_id"),
        "eos_token_id": token_id("tokenizer.ggml.eos_token_id"),
        "pad_token_id": token_id("tokenizer.ggml.padding_token_id"),
        "dtype": "float32",
    }
    name = lambda key: tokens[token_id(key)] if 0 <= token_id(key) < len(tokens) else None  # noqa: E731
    tokenizer_config = {
        "bos_token": name("tokenizer.ggml.bos_token_id"),
        "eos_token": name("tokenizer.ggml.eos_token_id"),
        "pad_token": name("tokenizer.ggml.padding_token_id"),
        "unk_token": name("tokenizer.ggml.unknown_token_id"),
        "add_bos_token": bool(field("tokenizer.ggml.add_bos_token", False)),
        "chat_template": field("tokenizer.chat_template", ""),
    }

    tmp = out.rstrip("/") + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    save_file(tensors, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
    tokenizer.save(os.path.join(tmp, "tokenizer.json"))
    with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    with open(os.path.join(tmp, "tokenizer_config.json"), "w") as f:
        json.dump(tokenizer_config, f, indent=2)
    shutil.rmtree(out, ignore_errors=True)
    os.rename(tmp, out)
    params = sum(w.size for w in tensors.values())
    print(f"{out}: {params / 1e6:.1f} M parameters, {len(tokens)} tokens, pre-tokenizer {pre}", file=sys.stderr)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        fail("usage: import_gguf.py MODEL.gguf OUT_DIR")
    main(sys.argv[1], sys.argv[2])
