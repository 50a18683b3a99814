//! One environment's first turns: 16 prompts with a long shared beginning (a system prompt with a
//! tool listing) and a question each, decoded as one batch for 4 tokens. With a prefix cache the
//! shared beginning is prefilled once; without, once per row. Then the same with the top 8 layers
//! training, after an optimiser's step: the frozen layers' rows of the shared beginning are kept
//! across it, so only the 8 trained layers run over it. Medians of 3, same run.
//!
//!   cargo bench -p toolsmith-policy --bench prefix [-- smollm2-135m|tiny]

use std::time::Instant;

use toolsmith_policy::{LoadOptions, Policy, PrefixCache, SamplingParams};

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--list") {
        println!("prefix: bench");
        return;
    }
    let name = args.iter().skip(1).find(|a| !a.starts_with('-')).cloned().unwrap_or_else(|| "smollm2-135m".into());
    toolsmith_policy::set_threads(2);
    let mut policy = if name == "tiny" {
        Policy::tiny(0, LoadOptions::default()).expect("tiny")
    } else {
        Policy::load(&toolsmith_policy::locate(&name).expect("policy"), LoadOptions::default()).expect("load")
    };
    let tools: String = (0..24)
        .map(|i| format!("tool_{i}(query: string, limit: integer) -> object: finds things of kind {i} in the world.\n"))
        .collect();
    let system = format!("<|im_start|>system\nYou answer questions with tools. Tools:\n{tools}<|im_end|>\n");
    let prompts: Vec<Vec<i64>> = (0..16)
        .map(|i| {
            let text = format!("{system}<|im_start|>user\nQuestion {i}: where was person {i} born?<|im_end|>\n");
            policy.tokenizer().encode(&text).expect("encode")
        })
        .collect();
    let shared = policy.tokenizer().encode(&system).expect("encode").len();
    let params = SamplingParams { max_new_tokens: 4, temperature: 0.0, ..SamplingParams::default() };
    let (mut plain, mut cached) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        let started = Instant::now();
        let (a, _) = policy.generate(&prompts, &params, None).expect("plain");
        plain.push(started.elapsed().as_secs_f64());
        let mut cache = PrefixCache::new(1 << 30);
        let started = Instant::now();
        let (b, _) = policy.generate_with_prefix(&prompts, &params, None, None, &mut cache).expect("cached");
        cached.push(started.elapsed().as_secs_f64());
        assert!(a.iter().zip(&b).all(|(x, y)| x.output_ids == y.output_ids), "the same tokens");
    }
    let trained = 8.min(policy.layer_count() - 1);
    policy.set_trainable_layers(Some(trained)).expect("top layers");
    let mut cache = PrefixCache::new(1 << 30);
    policy.generate_with_prefix(&prompts, &params, None, None, &mut cache).expect("before the step");
    let mut frozen = Vec::new();
    for _ in 0..3 {
        // A step of the optimiser: the trained layers move, the frozen ones stay.
        tch::no_grad(|| {
            for (_, mut w) in policy.trained_variables() {
                let noise = w.randn_like() * 1e-3;
                let _ = w.f_add_(&noise).expect("step");
            }
        });
        policy.state_mut().step += 1;
        let (a, _) = policy.generate(&prompts, &params, None).expect("plain");
        let started = Instant::now();
        let (b, _) = policy.generate_with_prefix(&prompts, &params, None, None, &mut cache).expect("frozen rows");
        frozen.push(started.elapsed().as_secs_f64());
        assert!(a.iter().zip(&b).all(|(x, y)| x.output_ids == y.output_ids), "the same tokens");
    }
    let (p, c, f) = (median(plain), median(cached), median(frozen));
    println!("policy {name}: 16 prompts of {} tokens, {shared} of them shared; 4 new tokens", prompts[0].len());
    println!("| | seconds | vs every row prefilling it |");
    println!("|---|---:|---:|");
    println!("| shared beginning prefilled per row | {p:.2} | 1.00x |");
    println!("| shared beginning prefilled once (prefix cache) | {c:.2} | {:.2}x |", p / c);
    println!(
        "| after a step of the top {trained} of {} layers, their rows only | {f:.2} | {:.2}x |",
        policy.layer_count(),
        p / f
    );
    println!("(frozen rows reused for {} tokens)", cache.stats().frozen_reused_tokens);
}
