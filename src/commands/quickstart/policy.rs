//! The tiny policy from scratch: init, tokenizer, checkpoint round trip, seeded sampling and one
//! supervised step.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Result;
use toolsmith_policy::tch;
use toolsmith_policy::tokenizer::TRACE_TAGS;
use toolsmith_policy::{LoadOptions, Policy, SamplingParams, TokenSequence};

use super::{Env, ms};

/// The chat prompt every phase of this section decodes or trains on.
const PROMPT: &str = "<|im_start|>user\nWhere was Ada Lovelace born?<|im_end|>\n<|im_start|>assistant\n";

/// Prints `the policy (a Qwen2-style decoder on libtorch; the tiny default, untrained, on the CPU):`
/// and one line per thing the policy does.
pub(super) fn section(env: &Env) -> Result<()> {
    println!("\nthe policy (a Qwen2-style decoder on libtorch; the tiny default, untrained, on the CPU):");
    let (policy, dir) = init_and_reload(env)?;
    sample(&policy)?;
    sft_step(&policy)?;
    println!("  try it: toolsmith policy generate {} --prompt 'hello' --temperature 0.8", dir.display());
    Ok(())
}

/// A fresh tiny policy, its tokenizer on a trace, then saved to the quickstart's policy directory
/// and loaded back from it.
fn init_and_reload(env: &Env) -> Result<(Policy, PathBuf)> {
    let started = Instant::now();
    let policy = Policy::tiny(0, LoadOptions::default())?;
    let spec = policy.config().spec()?;
    println!(
        "  init              -> {:.2} M parameters: {} layers, hidden {}, {} heads / {} key-value heads, vocab {} ({})",
        policy.state().parameters as f64 / 1e6,
        spec.layers,
        spec.hidden_size,
        spec.heads,
        spec.kv_heads,
        spec.vocab_size,
        ms(started.elapsed())
    );
    let trace = "<plan>\nTask 1: find the city - Dependencies: none\n</plan><tool_call>";
    let ids = policy.tokenizer().encode(trace)?;
    println!(
        "  tokenizer         -> byte-level BPE, {} trace tags as single tokens: {:?} is {} tokens",
        TRACE_TAGS.len(),
        trace.replace('\n', " "),
        ids.len()
    );
    let dir = env.policy_dir();
    policy.save(&dir)?;
    let policy = Policy::load(&dir, LoadOptions::default())?;
    println!("  checkpoint        -> {} (safetensors + config + tokenizer + state), reloaded", dir.display());
    Ok((policy, dir))
}

/// Greedy decoding, then a seeded batch of three sampled twice to show the seed reproduces it.
fn sample(policy: &Policy) -> Result<()> {
    let greedy = SamplingParams::greedy(24);
    let (out, stats) = policy.generate_text(&[PROMPT], &greedy, None)?;
    println!(
        "  generate, greedy  -> {} tokens, {:.0} tokens/s, finish {:?} (an untrained model babbles)",
        out[0].output_ids.len(),
        stats.tokens_per_sec(),
        out[0].finish_reason
    );
    let sampled =
        SamplingParams { max_new_tokens: 24, temperature: 0.8, top_p: 0.95, seed: 1, ..SamplingParams::default() };
    let prompts = [PROMPT, "<plan>\nTask 1:", "<mem>"];
    let (out, stats) = policy.generate_text(&prompts, &sampled, None)?;
    println!(
        "  generate, batch 3 -> temperature 0.8, top-p 0.95, seed 1, KV cache: {} tokens at {:.0} tokens/s",
        stats.generated_tokens,
        stats.tokens_per_sec()
    );
    let (again, _) = policy.generate_text(&prompts, &sampled, None)?;
    println!("  same seed again   -> identical: {}", out == again);
    Ok(())
}

/// One supervised step on a completion: its log-likelihood rises.
fn sft_step(policy: &Policy) -> Result<()> {
    let tokenizer = policy.tokenizer();
    let sequence =
        TokenSequence::completion(&tokenizer.encode(PROMPT)?, &tokenizer.encode("<answer>London</answer><|im_end|>")?);
    let batch = [sequence];
    let before = tch::no_grad(|| policy.score(&batch, false))?.sequence_logprobs().double_value(&[]);
    let mut optimizer = tch::nn::OptimizerConfig::build(tch::nn::Adam::default(), policy.var_store(), 1e-3)?;
    let scores = policy.score(&batch, false)?;
    optimizer.backward_step(&(-scores.sequence_logprobs().sum(tch::Kind::Float)));
    let after = tch::no_grad(|| policy.score(&batch, false))?.sequence_logprobs().double_value(&[]);
    println!("  one SFT step      -> log p(completion | prompt) {before:.2} -> {after:.2}");
    Ok(())
}
