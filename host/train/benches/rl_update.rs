//! An RL update (`toolsmith train rl`'s, with its frozen-activation reuse between epochs)
//! against the same update written plainly in PyTorch, in one run: same checkpoint, same
//! sequences (the SFT bench's oracle traces standing in for rollouts), micro-batches,
//! advantages, learning rates and thread count. Each step scores the batch's old log-probs
//! (untimed: a sampler gives them in training), then takes `epochs` clipped policy-gradient
//! updates (DAPO's clip 0.2/0.28, token-mean loss, AdamW, global-norm clipping); the update is
//! timed. Prints update tokens/s of each side (batch tokens over the update's seconds, median
//! over steps after the first), their ratio, and the largest difference between the two sides'
//! losses of the last epoch (the first epoch's loss is the same on both sides by construction).
//!
//!   cargo bench -p toolsmith-train --bench rl_update [-- --threads N --steps S --rounds R
//!       --epochs E] [--init tiny|smollm2-135m|DIR] [--precision f32|bf16]
//!       [--trainable-layers N] [--lora-rank R] [--batch-tokens T] [--micro-batch-tokens T]
//!
//! Needs the reference venv (scripts/torch-reference-env.sh; created on first use).

#[path = "../../policy/tests/common/mod.rs"]
mod common;
mod support;

use std::time::Instant;

use serde_json::{Value, json};
use toolsmith_policy::score::micro_batches;
use toolsmith_policy::tch::{self, Kind, Tensor};
use toolsmith_policy::{FrozenActivations, ScoreOptions, TokenSequence};
use toolsmith_train::optim::AdamW;
use toolsmith_train::rl::loss::{Aggregation, LossConfig, LossInputs, policy_loss, token_weights};
use toolsmith_train::sft;

/// Rows of per-token values, right-padded with 0 to `t`.
fn rows(values: &[&[f64]], t: i64) -> Tensor {
    let width = t as usize;
    let mut flat = vec![0_f32; values.len() * width];
    for (slot, row) in flat.chunks_mut(width).zip(values) {
        for (s, &v) in slot.iter_mut().zip(row.iter()) {
            *s = v as f32;
        }
    }
    Tensor::from_slice(&flat).view([values.len() as i64, t])
}

/// A fixed advantage per sequence in [-1, 1], so that both sides push the same way.
fn advantage(i: usize) -> f64 {
    ((i * 7919) % 11) as f64 / 5.0 - 1.0
}

fn main() {
    let (threads, steps, rounds, epochs) = (
        support::arg("--threads", 1),
        support::arg("--steps", 4) as u64,
        support::arg("--rounds", 2),
        support::arg("--epochs", 2),
    );
    let script = common::repo_root().join("host/train/benches/rl_update_reference.py");
    let lora = support::lora();
    let config = support::sft_config(steps, threads);
    assert_eq!(config.run.device, toolsmith_train::DeviceChoice::Cpu, "the RL update bench runs on the CPU");
    let loss = LossConfig::default();
    println!(
        "RL update, {} ({}, trainable_layers {:?}, lora rank {:?}), {threads} thread(s), {steps} steps of {} tokens, {epochs} epochs, {rounds} rounds",
        config.run.init,
        config.run.precision,
        config.run.trainable_layers,
        lora.as_ref().map(|l| l.rank),
        config.batch_tokens
    );
    let (mut ours, mut theirs, mut max_diff) = (Vec::new(), Vec::new(), 0.0_f64);
    for round in 0..rounds {
        let dir = tempfile::tempdir().expect("tempdir");
        let trainer = sft::prepare(config.clone(), &dir.path().join("run"), false, &support::tools).expect("prepare");
        let (init, adapter) = (dir.path().join("init"), dir.path().join("adapter"));
        let (shared, schedule) = (trainer.policy(), trainer.schedule());
        let batches: Vec<Vec<TokenSequence>> = trainer
            .batch_plan(steps)
            .iter()
            .map(|batch| batch.iter().map(|&i| trainer.sequences()[i].tokens.clone()).collect())
            .collect();
        // The trainer's own optimiser state would count in this process's peak memory.
        drop(trainer);
        let policy = shared.lock().expect("policy");
        policy.save_merged(&init).expect("save");
        policy.save_adapter(&adapter).expect("save adapter");
        let mut optimizer = AdamW::new(policy.trained_variables(), config.optimizer);
        let (mut plan, mut rates, mut last_losses) = (Vec::new(), Vec::new(), Vec::new());
        for (step, mut seqs) in batches.into_iter().enumerate() {
            // Longest first, as the RL trainer orders its examples.
            seqs.sort_by_key(|s| std::cmp::Reverse(s.ids.len()));
            let micro = micro_batches(&seqs, config.micro_batch_tokens);
            let trained: Vec<usize> = seqs.iter().map(|s| s.loss_mask.iter().skip(1).filter(|&&m| m).count()).collect();
            let episodes: Vec<usize> = (0..seqs.len()).collect();
            let weights = token_weights(&trained, &episodes, Aggregation::TokenMean, 0);
            let advantages: Vec<Vec<f64>> =
                seqs.iter().enumerate().map(|(i, s)| vec![advantage(i); s.ids.len()]).collect();
            let options = ScoreOptions::default();
            let mut old: Vec<Vec<f64>> = Vec::with_capacity(seqs.len());
            for range in &micro {
                let scores = tch::no_grad(|| policy.score_with(&seqs[range.clone()], &options)).expect("score");
                for (row, i) in range.clone().enumerate() {
                    let n = seqs[i].ids.len() as i64;
                    let values = scores.logprobs.get(row as i64).narrow(0, 0, n).to_kind(Kind::Double);
                    old.push(Vec::<f64>::try_from(values).expect("log-probs"));
                }
            }
            let lr = schedule.lr(step as u64);
            let started = Instant::now();
            let mut frozen = FrozenActivations::default();
            let mut epoch_loss = 0.0;
            for _ in 0..epochs {
                optimizer.zero_grad();
                epoch_loss = policy
                    .accumulate_gradients_reusing(
                        &seqs,
                        config.micro_batch_tokens,
                        &options,
                        &mut frozen,
                        |scores, range| {
                            let t = scores.logprobs.size()[1];
                            let pick = |v: &[Vec<f64>]| {
                                rows(&v[range.clone()].iter().map(Vec::as_slice).collect::<Vec<_>>(), t)
                            };
                            let (old, adv) = (pick(&old), pick(&advantages));
                            let w = Tensor::from_slice(&weights[range.clone()]).to_kind(Kind::Float).view([-1, 1]);
                            let inputs = LossInputs {
                                mask: &scores.mask,
                                old_logprobs: &old,
                                ref_logprobs: None,
                                advantages: &adv,
                                weights: &w,
                                importance: None,
                            };
                            policy_loss(&scores.logprobs, &inputs, &loss).0
                        },
                    )
                    .expect("update");
                optimizer.clip_grad_norm(config.run.max_grad_norm);
                optimizer.step(lr);
            }
            let seconds = started.elapsed().as_secs_f64();
            let tokens: usize = seqs.iter().map(|s| s.ids.len()).sum();
            rates.push(tokens as f64 / seconds);
            last_losses.push(epoch_loss);
            let sequences: Vec<Value> = seqs
                .iter()
                .map(|s| json!({"ids": s.ids, "mask": s.loss_mask.iter().map(|&m| u8::from(m)).collect::<Vec<_>>()}))
                .collect();
            let micro: Vec<[usize; 2]> = micro.iter().map(|r| [r.start, r.end]).collect();
            let advantages: Vec<f64> = (0..seqs.len()).map(advantage).collect();
            plan.push(json!({"lr": lr, "sequences": sequences, "micro_batches": micro, "advantages": advantages, "weights": weights}));
        }
        drop(policy);
        let our_rss = common::peak_rss_mib();
        let pad = shared.lock().expect("policy").tokenizer().pad_id();
        let mut settings = support::reference_settings(&config, &adapter);
        settings["epochs"] = json!(epochs);
        settings["clip_low"] = json!(loss.clip_low);
        settings["clip_high"] = json!(loss.clip_high);
        let plan = json!({"pad_id": pad, "config": settings, "steps": plan});
        let plan_path = dir.path().join("plan.json");
        std::fs::write(&plan_path, plan.to_string()).expect("plan");
        let (ref_losses, ref_rates, their_rss) = support::run_reference(&script, &init, &plan_path, threads, &[]);
        for (a, b) in last_losses.iter().zip(&ref_losses) {
            max_diff = max_diff.max((a - b).abs());
        }
        let (a, b) = (support::median(rates[1..].to_vec()), support::median(ref_rates[1..].to_vec()));
        println!(
            "round {}: ours {a:.0} tokens/s, PyTorch {b:.0} tokens/s, ratio {:.2}; peak RSS ours {our_rss:.0} MiB (this process), PyTorch {their_rss:.0} MiB; last-epoch losses ours {:?}, PyTorch {:?}",
            round + 1,
            a / b,
            last_losses.iter().map(|l| (l * 1e5).round() / 1e5).collect::<Vec<_>>(),
            ref_losses.iter().map(|l| (l * 1e5).round() / 1e5).collect::<Vec<_>>()
        );
        ours.push(a);
        theirs.push(b);
    }
    let (a, b) = (support::median(ours), support::median(theirs));
    println!();
    println!("| threads | toolsmith RL update | PyTorch update loop | ratio | max abs loss difference |");
    println!("|---:|---:|---:|---:|---:|");
    println!("| {threads} | {a:.0} tokens/s | {b:.0} tokens/s | {:.2}x | {max_diff:.1e} |", a / b);
}
