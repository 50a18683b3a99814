//! The policy against PyTorch eager on the same configuration and thread count, in one run:
//! training throughput (forward + backward, tokens/s) against a plain PyTorch training step, and
//! KV-cache generation (tokens/s, batch 1, greedy) against `transformers` `generate`, with the
//! peak resident memory of each process.
//!
//!   cargo bench -p toolsmith-policy --bench policy [-- --threads N --batch B --seq T --rounds R]
//!
//! Each round measures both sides back to back (ours, then the reference process); the table shows
//! medians over the rounds, so drift on a shared machine hits both sides alike.
//!
//! Needs the reference venv (scripts/torch-reference-env.sh; created on first use).

#[path = "../tests/common/mod.rs"]
mod common;

use std::process::Command;
use std::time::Instant;

use tch::Kind;
use toolsmith_policy::{LoadOptions, Policy, SamplingParams, TokenSequence};

struct Options {
    threads: usize,
    batch: usize,
    seq: usize,
    steps: usize,
    prompt: usize,
    new_tokens: usize,
    generations: usize,
    rounds: usize,
}

fn options() -> Options {
    let mut o =
        Options { threads: 1, batch: 8, seq: 128, steps: 10, prompt: 16, new_tokens: 128, generations: 5, rounds: 3 };
    let args: Vec<String> = std::env::args().collect();
    for pair in args.windows(2) {
        let value = || pair[1].parse::<usize>().unwrap_or_else(|_| panic!("{} wants a number", pair[0]));
        match pair[0].as_str() {
            "--threads" => o.threads = value(),
            "--batch" => o.batch = value(),
            "--seq" => o.seq = value(),
            "--steps" => o.steps = value(),
            "--new-tokens" => o.new_tokens = value(),
            "--rounds" => o.rounds = value().max(1),
            _ => {}
        }
    }
    o
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn main() {
    let o = options();
    toolsmith_policy::set_threads(o.threads);
    let root = common::repo_root();
    let dir = tempfile::tempdir().expect("tempdir");
    let policy = Policy::tiny(0, LoadOptions::default()).expect("tiny policy");
    policy.save(dir.path()).expect("save");
    let spec = policy.config().spec().expect("spec");
    let vocab = spec.vocab_size;

    // Training step: forward, masked token log-likelihood, backward (what the trainer runs).
    tch::manual_seed(0);
    let batch: Vec<TokenSequence> = (0..o.batch)
        .map(|_| {
            let ids =
                Vec::<i64>::try_from(tch::Tensor::randint(vocab, [o.seq as i64], (Kind::Int64, tch::Device::Cpu)))
                    .expect("ids");
            TokenSequence { loss_mask: vec![true; ids.len()], ids }
        })
        .collect();
    let step = || {
        let scores = policy.score(&batch, false).expect("score");
        let loss = -(&scores.logprobs * &scores.mask).sum(Kind::Float) / scores.mask.sum(Kind::Float);
        loss.backward();
        policy.var_store().trainable_variables().iter_mut().for_each(|v| v.zero_grad());
    };
    let generate_params =
        SamplingParams { max_new_tokens: o.new_tokens, ignore_eos: true, ..SamplingParams::default() };
    let prompt: Vec<i64> = (0..o.prompt as i64).map(|i| 3 + (i * 37) % (vocab - 3)).collect();
    let generate = || policy.generate(std::slice::from_ref(&prompt), &generate_params, None).expect("generate");
    step();
    generate();
    let python = common::reference_python();
    let (mut ours_train, mut ours_generate, mut py_train, mut py_generate, mut py_peak) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), f64::NAN);
    for _ in 0..o.rounds {
        let times: Vec<f64> = (0..o.steps)
            .map(|_| {
                let t = Instant::now();
                step();
                t.elapsed().as_secs_f64()
            })
            .collect();
        ours_train.push((o.batch * o.seq) as f64 / median(times));
        let rates: Vec<f64> = (0..o.generations)
            .map(|_| {
                let t = Instant::now();
                let (out, _) = generate();
                out[0].output_ids.len() as f64 / t.elapsed().as_secs_f64()
            })
            .collect();
        ours_generate.push(median(rates));

        let out = Command::new(&python)
            .arg(root.join("host/policy/tests/reference/reference.py"))
            .arg("bench")
            .arg("--model")
            .arg(dir.path())
            .args(["--threads", &o.threads.to_string(), "--batch", &o.batch.to_string(), "--seq", &o.seq.to_string()])
            .args(["--steps", &o.steps.to_string(), "--prompt", &o.prompt.to_string()])
            .args(["--new-tokens", &o.new_tokens.to_string(), "--generations", &o.generations.to_string()])
            .env("OMP_NUM_THREADS", o.threads.to_string())
            .output()
            .expect("reference.py bench");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let reference: serde_json::Value =
            serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().last().unwrap_or("{}")).expect("json");
        let number = |k: &str| reference[k].as_f64().unwrap_or(f64::NAN);
        py_train.push(number("train_tokens_per_sec"));
        py_generate.push(number("generate_tokens_per_sec"));
        py_peak = number("peak_rss_mib");
    }
    let ours_peak = common::peak_rss_mib();
    let ratios =
        |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| format!("{:.2}", x / y)).collect::<Vec<_>>().join(", ");
    let train_ratios = ratios(&ours_train, &py_train);
    let generate_ratios = ratios(&ours_generate, &py_generate);
    let (ours_train, py_train) = (median(ours_train), median(py_train));
    let (ours_generate, py_generate) = (median(ours_generate), median(py_generate));

    println!(
        "policy: tiny {} ({:.2} M parameters), fp32, CPU, {} thread(s), medians of {} rounds",
        policy.state().architecture,
        policy.state().parameters as f64 / 1e6,
        o.threads,
        o.rounds
    );
    println!("| workload | toolsmith (tch) | PyTorch eager | ratio | target |");
    println!("|---|---|---|---|---|");
    println!(
        "| forward+backward, batch {} x {} tokens | {:.0} tokens/s | {:.0} tokens/s | {:.2}x | >= 1.0x |",
        o.batch,
        o.seq,
        ours_train,
        py_train,
        ours_train / py_train
    );
    println!(
        "| generate, {} + {} tokens, greedy, KV cache | {:.0} tokens/s | {:.0} tokens/s (transformers generate) | {:.2}x | >= 1.5x |",
        o.prompt,
        o.new_tokens,
        ours_generate,
        py_generate,
        ours_generate / py_generate
    );
    println!("| peak resident memory | {ours_peak:.0} MiB | {py_peak:.0} MiB | {:.2}x | |", ours_peak / py_peak);
    println!("ratios per round: forward+backward {train_ratios}; generate {generate_ratios}");
}
