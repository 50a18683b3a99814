#!/usr/bin/env python3
"""Multi-turn GRPO with TRL against `toolsmith env serve` (an OpenEnv server), on CPU.

Each GRPO rollout is one whole tool-use episode, played through TRL's (experimental) `rollout_func`
over openenv-core's GenericEnvClient (WebSocket /ws session):

    reset(task_id, world)                              the dataset row's task
    repeat until done or --max-turns:
        context = observation["messages"]              rendered with the tokenizer's chat template
                                                       (plain "role: content" lines without one)
        the trainer's model samples up to --max-completion-length tokens
        step({"text": <decoded turn>})
    completion_ids = turn 1's sampled ids, the observation ids, turn 2's sampled ids, ...
    env_mask       = 1 on sampled ids, 0 on observation ids (they are not trained)
    logprobs       = the sampled ids' logprobs (0 on observation ids)

Later turns continue from the exact token ids of the episode so far (no re-tokenisation of earlier
turns); the ids between turns are what the chat template adds for the environment's new messages.
The environment's final reward reaches GRPO through the extra key `env_reward`, returned as is by
the reward function. The dataset is one row per task of GET /tasks (prompt = the question).

Run it with the interpreter printed by `scripts/trl-env.sh`, against a running server:

    PY=$(scripts/trl-env.sh | tail -n 1)
    toolsmith env serve --init tiny --method gap --out "$(mktemp -d)" --http 127.0.0.1:0 \\
        --max-turns 3 --max-tokens 64            # prints the URL on stderr
    $PY examples/trl/grpo_toolsmith.py --env-url http://127.0.0.1:PORT --make-tiny "$(mktemp -d)"
    $PY examples/trl/grpo_toolsmith.py --env-url http://127.0.0.1:PORT --model DIR   # e.g. SmolLM2

Options: --max-steps 2  --num-generations 2  --batch-size 2  --max-turns 2
         --max-completion-length 16 (per turn)  --report FILE  --output-dir DIR  --seed 0
--make-tiny DIR builds a tiny random Qwen2 with a WordLevel tokenizer whose vocabulary covers the
trace grammar (<tool_call>, <answer>, \\boxed, JSON punctuation) and the words of the server's
system prompt and questions; any other word maps to <unk>.
--report FILE writes {"global_step", "env_rewards" (every episode's final reward as the server
returned it), "logged_rewards" (TRL's logged reward mean per step), "resets", "steps", "seconds",
"episodes", ...}. No Hugging Face Hub access is needed (HF_HUB_OFFLINE=1).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
import urllib.request

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("WANDB_DISABLED", "true")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

TRACE_TAGS = ("think", "plan", "graph", "subtask", "tool_call", "observation", "mem", "reflection", "answer")
BASE_WORDS = ("the a an of in on to for is was are who what which when where how many year founded "
              "search query name arguments answer result found no yes not none true false error tool "
              "call observation turn question user assistant system").split()


def log(*args) -> None:
    print("grpo_toolsmith:", *args, file=sys.stderr, flush=True)


def http_json(base: str, path: str):
    with urllib.request.urlopen(base.rstrip("/") + path, timeout=30) as r:
        return json.loads(r.read().decode())


# ------------------------------------------------------------------------------------------------
# Tiny model
# Tags, \boxed, words, single digits (so every number is covered), single whitespace and single
# punctuation characters; decoding concatenates the pieces, so a turn in the grammar decodes
# exactly as written.
WORD_RE = r"</?[A-Za-z_]+>|\\boxed|[A-Za-z_]+|\d|\s|[^\w\s]"


def make_tiny_model(out_dir: str, texts: list[str], max_words: int = 4000) -> str:
    """A tiny random Qwen2 causal LM + WordLevel PreTrainedTokenizerFast, saved to out_dir. The
    vocabulary: specials, the trace grammar's tags, \\boxed, single characters (whitespace too), BASE_WORDS and the
    words of `texts` (the server's system prompt and questions), most frequent first."""
    import collections

    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    vocab = {"<pad>": 0, "<unk>": 1, "<eos>": 2}

    def add(w: str) -> None:
        vocab.setdefault(w, len(vocab))

    for tag in TRACE_TAGS:
        add(f"<{tag}>")
        add(f"</{tag}>")
    add("\\boxed")
    for ch in " \n\t{}[]()\":,.;!?'=-+*/\\_<>|#@&%$`~^0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ":
        add(ch)
    for w in BASE_WORDS:
        add(w)
    counts = collections.Counter(t for text in texts for t in re.findall(WORD_RE, text))
    for w, _ in counts.most_common():
        if len(vocab) >= max_words:
            break
        add(w)

    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(WORD_RE), behavior="isolated")
    tok.decoder = decoders.Fuse()
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>", eos_token="<eos>",
                                     clean_up_tokenization_spaces=False)
    hf_tok.padding_side = "left"
    cfg = Qwen2Config(vocab_size=len(vocab), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16384,
                      tie_word_embeddings=True, pad_token_id=0, eos_token_id=2, bos_token_id=None)
    model = Qwen2ForCausalLM(cfg)
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = 2
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir)
    hf_tok.save_pretrained(out_dir)
    return out_dir


def load_tokenizer(model_dir: str):
    """The model's tokenizer. A bare `tokenizers` tokenizer (what --make-tiny saves) is loaded as
    itself: AutoTokenizer would pick the model type's class (Qwen2Tokenizer) and replace its
    pre-tokenizer with a byte-level one."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    try:
        with open(os.path.join(model_dir, "tokenizer_config.json"), encoding="utf-8") as f:
            cls = json.load(f).get("tokenizer_class")
    except (OSError, ValueError):
        cls = None
    if cls in ("TokenizersBackend", "PreTrainedTokenizerFast"):
        return PreTrainedTokenizerFast.from_pretrained(model_dir)
    return AutoTokenizer.from_pretrained(model_dir)


# ------------------------------------------------------------------------------------------------
# Rendering: the chat template when the tokenizer has one, else "role: content" lines.
class Renderer:
    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.templated = bool(getattr(tokenizer, "chat_template", None))
        self.eos = tokenizer.eos_token_id

    def _ids(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False)["input_ids"]

    @staticmethod
    def _msgs(messages) -> list[dict]:
        return [{"role": str(m.get("role", "user")), "content": str(m.get("content", ""))} for m in messages]

    @staticmethod
    def _lines(messages) -> str:
        return "".join(f"{m['role']}: {m['content']}\n" for m in messages)

    def prompt_ids(self, messages) -> list[int]:
        msgs = self._msgs(messages)
        if self.templated:
            return list(self.tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True,
                                                     return_dict=False))
        return self._ids(self._lines(msgs) + "assistant:")

    def env_ids(self, messages, sampled: list[int]) -> list[int]:
        """The ids the next context adds after the model's last turn: the end of that turn when the
        model did not close it, the environment's new messages and the next generation prompt."""
        msgs = self._msgs(messages)
        last = max((i for i, m in enumerate(msgs) if m["role"] == "assistant"), default=None)
        new = msgs[last + 1:] if last is not None else msgs[-1:]
        closed = bool(sampled) and sampled[-1] == self.eos
        if not self.templated:
            return ([] if closed or self.eos is None else [self.eos]) + self._ids("\n" + self._lines(new) + "assistant:")
        head = msgs[: last + 1] if last is not None else msgs[:-1]
        prefix = list(self.tok.apply_chat_template(head, tokenize=True, return_dict=False))
        full = list(self.tok.apply_chat_template(head + new, add_generation_prompt=True, tokenize=True,
                                                 return_dict=False))
        eos_at = [i for i, t in enumerate(prefix) if t == self.eos]
        if eos_at:
            prefix = prefix[: eos_at[-1] + 1]  # "...<|im_end|>" (without the template's trailing "\n")
        if full[: len(prefix)] == prefix:
            suffix = full[len(prefix):]
        else:  # not append-only: tokenise the text difference
            ptxt = self.tok.decode(prefix)
            ftxt = self.tok.decode(full)
            suffix = self._ids(ftxt[len(ptxt):] if ftxt.startswith(ptxt) else ftxt)
        return ([] if closed or self.eos is None else [self.eos]) + suffix


# ------------------------------------------------------------------------------------------------
class EpisodeRunner:
    """Plays whole episodes over one GenericEnvClient session; a TRL rollout_func."""

    def __init__(self, env_url: str, tasks: list[dict], tokenizer, max_turns: int, max_new: int):
        from openenv.core import GenericEnvClient

        self.client = GenericEnvClient(base_url=env_url, message_timeout_s=120.0).sync()
        self.client.connect()
        self.by_question: dict[str, list[dict]] = {}
        for t in tasks:
            self.by_question.setdefault(t["question"], []).append(t)
        self._cursor: dict[str, int] = {}
        self.tok = tokenizer
        self.render = Renderer(tokenizer)
        self.max_turns = max_turns
        self.max_new = max_new
        self.resets = 0
        self.steps = 0
        self.episodes: list[dict] = []
        self.seconds = 0.0  # time spent in rollouts (generation and the environment)

    def close(self) -> None:
        self.client.close()

    def task_for(self, prompt) -> dict:
        question = prompt if isinstance(prompt, str) else prompt[-1]["content"]
        options = self.by_question[question]
        i = self._cursor.get(question, 0)
        self._cursor[question] = i + 1
        return options[i % len(options)]

    def _sample(self, model, ids: list[int], temperature: float):
        import torch

        inp = torch.tensor([ids], device=model.device)
        out = model.generate(inp, attention_mask=torch.ones_like(inp), max_new_tokens=self.max_new,
                             do_sample=True, temperature=temperature, top_k=0, top_p=1.0,
                             pad_token_id=self.tok.pad_token_id, eos_token_id=self.tok.eos_token_id,
                             return_dict_in_generate=True, output_logits=True)
        new = out.sequences[0, inp.shape[1]:].tolist()
        lps = []
        for step, tok_id in enumerate(new):
            logp = torch.log_softmax(out.logits[step][0].float() / temperature, dim=-1)
            lps.append(float(logp[tok_id]))
        # A sequence that stopped at EOS carries nothing after it; drop any padding to be safe.
        if self.tok.eos_token_id in new:
            cut = new.index(self.tok.eos_token_id) + 1
            new, lps = new[:cut], lps[:cut]
        return new, lps

    def play(self, model, prompt, temperature: float) -> dict:
        task = self.task_for(prompt)
        kw = {"task_id": task["task_id"]}
        if isinstance(task.get("world"), int):
            kw["world"] = task["world"]
        r = self.client.reset(**kw)
        self.resets += 1
        obs = r.observation
        prompt_ids = self.render.prompt_ids(obs["messages"])
        seq = list(prompt_ids)
        completion, mask, logprobs = [], [], []
        reward, done, turns = r.reward, r.done, 0
        while not done and turns < self.max_turns:
            sampled, lps = self._sample(model, seq, temperature)
            text = self.tok.decode(sampled, skip_special_tokens=True)
            r = self.client.step({"text": text})
            self.steps += 1
            turns += 1
            completion += sampled
            mask += [1] * len(sampled)
            logprobs += lps
            seq += sampled
            reward, done, obs = r.reward, r.done, r.observation
            if not done and turns < self.max_turns:
                env = self.render.env_ids(obs["messages"], sampled)
                completion += env
                mask += [0] * len(env)
                logprobs += [0.0] * len(env)
                seq += env
        result = obs.get("result") or {}
        self.episodes.append({"task_id": task["task_id"], "world": task.get("world"), "turns": turns,
                              "done": bool(done), "reward": reward, "outcome": result.get("outcome"),
                              "answer": result.get("answer"), "completion_tokens": len(completion),
                              "env_tokens": mask.count(0)})
        return {"prompt_ids": prompt_ids, "completion_ids": completion, "env_mask": mask,
                "logprobs": logprobs, "env_reward": float(reward) if reward is not None else 0.0}

    def __call__(self, prompts: list, trainer) -> dict:
        """TRL rollout_func: one episode per entry of `prompts` (TRL 1.16 hands over the prompt
        slice already repeated num_generations times, one entry per completion it scores)."""
        import torch

        model = trainer.accelerator.unwrap_model(trainer.model)
        was_training = model.training
        model.eval()
        temperature = float(getattr(trainer.args, "temperature", 1.0) or 1.0)
        out = {"prompt_ids": [], "completion_ids": [], "env_mask": [], "logprobs": [], "env_reward": []}
        t0 = time.time()
        try:
            with torch.no_grad():
                for p in prompts:
                    ep = self.play(model, p, temperature)
                    for k in out:
                        out[k].append(ep[k])
        finally:
            model.train(was_training)
            self.seconds += time.time() - t0
        log(f"rollouts: {len(prompts)} episodes, rewards {out['env_reward']}, "
            f"completion tokens {[len(c) for c in out['completion_ids']]}")
        return out


def env_reward(prompts, completions, env_reward, **kwargs) -> list[float]:
    """The environment's final episode reward, passed through from rollout_func."""
    return [float(r) for r in env_reward]


# ------------------------------------------------------------------------------------------------
def main() -> int:
    ap = argparse.ArgumentParser(description="multi-turn TRL GRPO against `toolsmith env serve`")
    ap.add_argument("--env-url", required=True, help="the server's base URL, e.g. http://127.0.0.1:PORT")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", metavar="DIR", help="a Hugging Face model directory (e.g. SmolLM2-135M-Instruct)")
    src.add_argument("--make-tiny", metavar="DIR", help="build a tiny random Qwen2 + WordLevel tokenizer in DIR")
    ap.add_argument("--max-steps", type=int, default=2, help="optimiser steps")
    ap.add_argument("--num-generations", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=2, help="per-device train batch (completions)")
    ap.add_argument("--max-turns", type=int, default=2)
    ap.add_argument("--max-completion-length", type=int, default=16, help="tokens per turn")
    ap.add_argument("--learning-rate", type=float, default=1e-5)
    ap.add_argument("--report", metavar="FILE")
    ap.add_argument("--output-dir", help="TRL output dir (default: a temporary directory)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()

    t0 = time.time()
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    torch.manual_seed(a.seed)
    listing = http_json(a.env_url, "/tasks")
    tasks = listing["tasks"]
    if not tasks:
        log("GET /tasks lists no tasks")
        return 1
    log(f"{len(tasks)} tasks from {a.env_url}")

    if a.make_tiny:
        # Vocabulary from what the model will read: one episode's context and every question.
        from openenv.core import GenericEnvClient

        with GenericEnvClient(base_url=a.env_url).sync() as probe:
            first = probe.reset(task_id=tasks[0]["task_id"]).observation
        texts = [m.get("content", "") for m in first.get("messages", [])] + [t["question"] for t in tasks]
        model_dir = make_tiny_model(a.make_tiny, texts)
    else:
        model_dir = a.model
    tokenizer = load_tokenizer(model_dir)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)

    ds = Dataset.from_dict({"prompt": [t["question"] for t in tasks],
                            "task_id": [t["task_id"] for t in tasks]})
    runner = EpisodeRunner(a.env_url, tasks, tokenizer, a.max_turns, a.max_completion_length)
    out_dir = a.output_dir or tempfile.mkdtemp(prefix="grpo-toolsmith-")
    cfg = GRPOConfig(
        output_dir=out_dir,
        max_steps=a.max_steps,
        per_device_train_batch_size=a.batch_size,
        num_generations=a.num_generations,
        max_completion_length=a.max_completion_length,
        use_vllm=False,
        use_cpu=True,
        bf16=False,
        learning_rate=a.learning_rate,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        dataloader_num_workers=0,
        seed=a.seed,
    )
    trainer = GRPOTrainer(model=model, reward_funcs=env_reward, args=cfg, train_dataset=ds,
                          processing_class=tokenizer, rollout_func=runner)
    t1 = time.time()
    try:
        result = trainer.train()
    finally:
        runner.close()
    t2 = time.time()

    logged = [rec for rec in trainer.state.log_history if "reward" in rec]
    report = {
        "global_step": result.global_step,
        "env_rewards": [ep["reward"] for ep in runner.episodes],
        "logged_rewards": [rec["reward"] for rec in logged],
        "resets": runner.resets,
        "steps": runner.steps,
        "seconds": round(t2 - t0, 2),
        "setup_seconds": round(t1 - t0, 2),
        "train_seconds": round(t2 - t1, 2),
        "rollout_seconds": round(runner.seconds, 2),
        "train_loss": result.training_loss,
        "model": "tiny" if a.make_tiny else os.path.basename(os.path.normpath(model_dir)),
        "chat_template": runner.render.templated,
        "episodes": runner.episodes,
        "log": [{k: v for k, v in rec.items() if k in ("step", "loss", "reward", "reward_std",
                                                     "rewards/env_reward/mean", "completions/mean_length")}
                for rec in trainer.state.log_history],
    }
    if a.report:
        with open(a.report, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)
    log(f"TRAIN_OK global_step={result.global_step} resets={runner.resets} steps={runner.steps} "
        f"env_rewards={report['env_rewards']} logged_rewards={report['logged_rewards']} "
        f"setup_s={t1 - t0:.1f} train_s={t2 - t1:.1f}")
    ok = result.global_step == a.max_steps and len(report["logged_rewards"]) >= 1
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
