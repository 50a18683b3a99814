//! Decoding a pretrained policy against `transformers` `generate`, in one run: greedy, KV cache,
//! 16-token random prompts (distinct per row), 128 new tokens per row with end-of-sequence
//! ignored, at batch 1 and batch 8; ours in f32 and bf16, transformers in float32 and bfloat16.
//! The ratio is ours (bf16 where the CPU has it) over transformers at its fastest dtype.
//!
//!   cargo bench --profile dev -p toolsmith-policy --bench decode [-- --model smollm2-135m
//!       --threads N --rounds R --new-tokens K --generations G --ours-only
//!       --batches 1,8,32 --prompt-tokens P --temperature T --precision f32|bf16 --device cpu|cuda]
//!
//! `--temperature` above 0 samples (ours only: transformers' sampler differs), as rollouts do.
//!
//! Each round measures every configuration of both sides back to back; medians over rounds.
//! Needs the reference venv (scripts/torch-reference-env.sh; created on first use).

#[path = "../tests/common/mod.rs"]
mod common;

use std::process::Command;
use std::time::Instant;

use tch::Kind;
use toolsmith_policy::{LoadOptions, Policy, Precision, SamplingParams};

fn text(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.windows(2).find(|w| w[0] == name).map(|w| w[1].clone())
}

fn number(name: &str, default: usize) -> usize {
    text(name).map_or(default, |v| v.parse().expect("a number"))
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn main() {
    let model = text("--model").unwrap_or_else(|| "smollm2-135m".into());
    let (threads, rounds) = (number("--threads", 2), number("--rounds", 3));
    let (new_tokens, generations) = (number("--new-tokens", 128), number("--generations", 3));
    let prompt_tokens = number("--prompt-tokens", 16);
    let batches: Vec<usize> = text("--batches")
        .unwrap_or_else(|| "1,8".into())
        .split(',')
        .map(|b| b.trim().parse().expect("batch sizes, comma-separated"))
        .collect();
    let temperature: f64 = text("--temperature").map_or(0.0, |t| t.parse().expect("a temperature"));
    let ours_only = temperature > 0.0 || std::env::args().any(|a| a == "--ours-only");
    toolsmith_policy::set_threads(threads);
    let device_name = text("--device").unwrap_or_else(|| "cpu".into());
    let device = toolsmith_policy::parse_device(&device_name).expect("a device");
    let dir = toolsmith_policy::locate(&model).expect("the policy (run ./scripts/setup.sh)");
    let precisions: Vec<Precision> = match text("--precision").as_deref() {
        Some("f32") => vec![Precision::F32],
        Some("bf16") => vec![Precision::Bf16],
        _ if device.is_cuda() || toolsmith_policy::cpu_has_bf16() => vec![Precision::F32, Precision::Bf16],
        _ => vec![Precision::F32],
    };
    let policies: Vec<(Precision, Policy)> = precisions
        .iter()
        .map(|&p| (p, Policy::load(&dir, LoadOptions { device, precision: Some(p) }).expect("load")))
        .collect();
    let vocab = policies[0].1.model().spec().vocab_size;
    tch::manual_seed(0);
    let prompts: Vec<Vec<i64>> = (0..batches.iter().copied().max().unwrap_or(1))
        .map(|_| {
            Vec::<i64>::try_from(tch::Tensor::randint_low(
                10,
                vocab,
                [prompt_tokens as i64],
                (Kind::Int64, tch::Device::Cpu),
            ))
            .expect("ids")
        })
        .collect();
    let params = SamplingParams { ignore_eos: true, temperature, ..SamplingParams::greedy(new_tokens) };
    let python = common::reference_python();
    let script = common::repo_root().join("host/policy/tests/reference/reference.py");
    // (ours or theirs, dtype, batch) -> tokens/s per round
    let mut results: std::collections::BTreeMap<(String, String, usize), Vec<f64>> = Default::default();
    for round in 0..rounds {
        for &batch in &batches {
            for (precision, policy) in &policies {
                let rows = &prompts[..batch];
                policy.generate(rows, &params, None).expect("warm-up");
                let rates: Vec<f64> = (0..generations)
                    .map(|_| {
                        let t = Instant::now();
                        let (out, stats) = policy.generate(rows, &params, None).expect("generate");
                        // Prefill and decode apart: long prompts make the two very different.
                        eprintln!(
                            "batch {batch} {}: prefill {:.2} s, decode {:.1} ms a step",
                            precision.hf_name(),
                            stats.prefill_secs,
                            1e3 * stats.decode_secs / (new_tokens.max(2) - 1) as f64
                        );
                        out.iter().map(|g| g.output_ids.len()).sum::<usize>() as f64 / t.elapsed().as_secs_f64()
                    })
                    .collect();
                results.entry(("ours".into(), precision.hf_name().into(), batch)).or_default().push(median(rates));
            }
            let reference = if ours_only { &[][..] } else { &["float32", "bfloat16"][..] };
            for &dtype in reference {
                let out = Command::new(&python)
                    .arg(&script)
                    .arg("bench")
                    .arg("--model")
                    .arg(&dir)
                    .args(["--threads", &threads.to_string(), "--batch", "1", "--seq", "8", "--steps", "1"])
                    .args(["--prompt", &prompt_tokens.to_string(), "--new-tokens", &new_tokens.to_string()])
                    .args(["--generations", &generations.to_string(), "--dtype", dtype])
                    .args(["--generate-batch", &batch.to_string(), "--prompts", "random"])
                    .args(["--device", &device_name])
                    .env("OMP_NUM_THREADS", threads.to_string())
                    .output()
                    .expect("reference.py bench");
                assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
                let reply: serde_json::Value =
                    serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().last().unwrap_or("{}"))
                        .expect("json");
                let rate = reply["generate_tokens_per_sec"].as_f64().unwrap_or(f64::NAN);
                results.entry(("transformers".into(), dtype.into(), batch)).or_default().push(rate);
            }
        }
        eprintln!("round {} of {rounds}: {results:?}", round + 1);
    }
    println!(
        "decode, {model} on {device_name}, temperature {temperature}, {prompt_tokens}-token prompts, {new_tokens} new tokens per row, {threads} thread(s), medians of {rounds} rounds"
    );
    println!(
        "| batch | ours f32 | ours bf16 | transformers float32 | transformers bfloat16 | ratio (best of each; per round) |"
    );
    println!("|---:|---:|---:|---:|---:|---:|");
    for &batch in &batches {
        let get = |who: &str, dtype: &str| results.get(&(who.to_string(), dtype.to_string(), batch));
        let cell = |who: &str, dtype: &str| {
            get(who, dtype).map_or("-".into(), |r| format!("{:.1} tokens/s", median(r.clone())))
        };
        // Per round: our best configuration over theirs.
        let best = |who: &str, dtypes: [&str; 2]| -> Vec<f64> {
            (0..rounds)
                .map(|i| dtypes.iter().filter_map(|d| get(who, d).map(|r| r[i])).fold(f64::NAN, f64::max))
                .collect()
        };
        let (ours, theirs) = (best("ours", ["float32", "bfloat16"]), best("transformers", ["float32", "bfloat16"]));
        let per_round: Vec<String> = ours.iter().zip(&theirs).map(|(a, b)| format!("{:.2}", a / b)).collect();
        // With `--ours-only` there is nothing to divide by.
        let ratio = if ours_only {
            "-".to_string()
        } else {
            format!("**{:.2}x** ({})", median(ours.clone()) / median(theirs.clone()), per_round.join(", "))
        };
        println!(
            "| {batch} | {} | {} | {} | {} | {ratio} |",
            cell("ours", "float32"),
            cell("ours", "bfloat16"),
            cell("transformers", "float32"),
            cell("transformers", "bfloat16"),
        );
    }
}
