//! `toolsmith train sft` against the same step loop in PyTorch, in one run: same checkpoint,
//! same batches (sequence ids, masks, micro-batches), same learning rates, same thread count.
//! Prints tokens/s of each side (median over steps, after the first), their ratio, and the
//! largest difference between the two loss curves (the two implementations agree or the speed
//! comparison means nothing).
//!
//!   cargo bench -p toolsmith-train --bench sft [-- --threads N --steps S --rounds R]
//!       [--init tiny|smollm2-135m|DIR] [--precision f32|bf16] [--trainable-layers N]
//!       [--lora-rank R] [--batch-tokens T] [--micro-batch-tokens T] [--device cpu|cuda]
//!       [--gradient-checkpointing]
//!
//! With LoRA both sides start from the same adapter (ours, saved as PEFT saves it), without
//! dropout, so their losses can be compared.
//!
//! Needs the reference venv (scripts/torch-reference-env.sh; created on first use).

#[path = "../../policy/tests/common/mod.rs"]
mod common;
mod support;

use serde_json::{Value, json};
use toolsmith_policy::score::micro_batches;
use toolsmith_train::metrics::{Record, read};
use toolsmith_train::sft;

fn main() {
    let (threads, steps, rounds) =
        (support::arg("--threads", 1), support::arg("--steps", 12) as u64, support::arg("--rounds", 3));
    let script = common::repo_root().join("host/train/benches/sft_reference.py");
    let lora = support::lora();
    let config = support::sft_config(steps, threads);
    println!(
        "SFT step loop, {} on {} ({}, trainable_layers {:?}, gradient checkpointing {}, lora rank {:?}), {threads} thread(s), {steps} steps of {} tokens, {rounds} rounds",
        config.run.init,
        config.run.device,
        config.run.precision,
        config.run.trainable_layers,
        config.run.gradient_checkpointing,
        lora.as_ref().map(|l| l.rank),
        config.batch_tokens
    );
    let (mut ours, mut theirs, mut max_diff) = (Vec::new(), Vec::new(), 0.0_f64);
    for round in 0..rounds {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut trainer =
            sft::prepare(config.clone(), &dir.path().join("run"), false, &support::tools).expect("prepare");
        let init = dir.path().join("init");
        let adapter = dir.path().join("adapter");
        {
            let policy = trainer.policy();
            let policy = policy.lock().expect("policy");
            // The reference loads the base in fp32 and casts for itself (autocast).
            policy.save_merged(&init).expect("save");
            policy.save_adapter(&adapter).expect("save adapter");
        }
        let schedule = trainer.schedule();
        let plan: Vec<Value> = trainer
            .batch_plan(steps)
            .iter()
            .enumerate()
            .map(|(step, batch)| {
                let seqs: Vec<_> = batch.iter().map(|&i| trainer.sequences()[i].tokens.clone()).collect();
                let micro: Vec<[usize; 2]> =
                    micro_batches(&seqs, config.micro_batch_tokens).into_iter().map(|r| [r.start, r.end]).collect();
                let sequences: Vec<Value> = seqs
                    .iter()
                    .map(
                        |s| json!({"ids": s.ids, "mask": s.loss_mask.iter().map(|&m| u8::from(m)).collect::<Vec<_>>()}),
                    )
                    .collect();
                json!({"lr": schedule.lr(step as u64), "sequences": sequences, "micro_batches": micro})
            })
            .collect();
        let pad = trainer.policy().lock().expect("policy").tokenizer().pad_id();
        let plan = json!({"pad_id": pad, "config": support::reference_settings(&config, &adapter), "steps": plan});
        let plan_path = dir.path().join("plan.json");
        std::fs::write(&plan_path, plan.to_string()).expect("plan");
        trainer.run(&mut |_| {}).expect("trains");
        let our_rss = common::peak_rss_mib();
        let records = read(&dir.path().join("run/metrics.jsonl")).expect("metrics");
        let steps_ours: Vec<(f64, f64)> = records
            .iter()
            .filter_map(|r| if let Record::Train(s) = r { Some((s.loss, s.tokens_per_sec)) } else { None })
            .collect();
        let (ref_losses, ref_rates, their_rss) =
            support::run_reference(&script, &init, &plan_path, threads, &[config.run.device.to_string().as_str()]);
        for ((a, _), b) in steps_ours.iter().zip(&ref_losses) {
            max_diff = max_diff.max((a - b).abs());
        }
        let (a, b) =
            (support::median(steps_ours[1..].iter().map(|s| s.1).collect()), support::median(ref_rates[1..].to_vec()));
        println!(
            "round {}: ours {a:.0} tokens/s, PyTorch {b:.0} tokens/s, ratio {:.2}; peak RSS ours {our_rss:.0} MiB (this process), PyTorch {their_rss:.0} MiB; losses ours {:?}, PyTorch {:?}",
            round + 1,
            a / b,
            steps_ours.iter().map(|s| (s.0 * 1e4).round() / 1e4).collect::<Vec<_>>(),
            ref_losses.iter().map(|l| (l * 1e4).round() / 1e4).collect::<Vec<_>>()
        );
        ours.push(a);
        theirs.push(b);
    }
    let (a, b) = (support::median(ours), support::median(theirs));
    println!();
    println!("| threads | toolsmith train sft | PyTorch AdamW loop | ratio | max abs loss difference |");
    println!("|---:|---:|---:|---:|---:|");
    println!("| {threads} | {a:.0} tokens/s | {b:.0} tokens/s | {:.2}x | {max_diff:.1e} |", a / b);
}
