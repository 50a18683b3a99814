//! `toolsmith train sft` against the same step loop in PyTorch, in one run: same checkpoint,
//! same batches (sequence ids, masks, micro-batches), same learning rates, same thread count.
//! Prints tokens/s of each side (median over steps, after the first), their ratio, and the
//! largest difference between the two loss curves (the two implementations agree or the speed
//! comparison means nothing).
//!
//!   cargo bench -p toolsmith-train --bench sft [-- --threads N --steps S --rounds R]
//!
//! Needs the reference venv (scripts/torch-reference-env.sh; created on first use).

#[path = "../../policy/tests/common/mod.rs"]
mod common;

use std::process::Command;
use std::sync::Arc;

use serde_json::{Value, json};
use toolsmith_agent::Mode;
use toolsmith_agent::env::Corpus;
use toolsmith_agent::tools::{Executor, LocalTools};
use toolsmith_policy::score::micro_batches;
use toolsmith_train::config::{DataConfig, SftConfig, WorldsData};
use toolsmith_train::metrics::{Record, read};
use toolsmith_train::sft;

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.windows(2).find(|w| w[0] == name).map_or(default, |w| w[1].parse().expect("a number"))
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn main() {
    let (threads, steps, rounds) = (arg("--threads", 1), arg("--steps", 12) as u64, arg("--rounds", 3));
    let python = common::reference_python();
    let script = common::repo_root().join("host/train/benches/sft_reference.py");
    let tools = |corpus: Arc<Corpus>| -> Arc<dyn Executor> { Arc::new(LocalTools::new().with_corpus(corpus)) };
    let config = SftConfig {
        data: DataConfig {
            files: Vec::new(),
            worlds: WorldsData { seeds: vec![1], countries: 6, tasks_per_family: 4, styles: Mode::ALL.to_vec() },
        },
        steps: Some(steps),
        device: "cpu".into(),
        threads,
        eval: None,
        checkpoint_every: steps,
        ..SftConfig::default()
    };
    println!(
        "SFT step loop, tiny policy, {threads} thread(s), {steps} steps of {} tokens, {rounds} rounds",
        config.batch_tokens
    );
    let (mut ours, mut theirs, mut max_diff) = (Vec::new(), Vec::new(), 0.0_f64);
    for round in 0..rounds {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut trainer = sft::prepare(config.clone(), &dir.path().join("run"), false, &tools).expect("prepare");
        let init = dir.path().join("init");
        trainer.policy().lock().expect("policy").save(&init).expect("save");
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
        let o = config.optimizer;
        let plan = json!({
            "pad_id": pad,
            "config": {"lr": config.lr, "beta1": o.beta1, "beta2": o.beta2, "eps": o.eps,
                       "weight_decay": o.weight_decay, "max_grad_norm": config.max_grad_norm},
            "steps": plan,
        });
        let plan_path = dir.path().join("plan.json");
        std::fs::write(&plan_path, plan.to_string()).expect("plan");
        trainer.run(&mut |_| {}).expect("trains");
        let records = read(&dir.path().join("run/metrics.jsonl")).expect("metrics");
        let steps_ours: Vec<(f64, f64)> = records
            .iter()
            .filter_map(|r| if let Record::Train(s) = r { Some((s.loss, s.tokens_per_sec)) } else { None })
            .collect();
        let out = Command::new(&python)
            .arg(&script)
            .arg(&init)
            .arg(&plan_path)
            .arg(threads.to_string())
            .env("OMP_NUM_THREADS", threads.to_string())
            .output()
            .expect("run the reference");
        assert!(out.status.success(), "reference failed: {}", String::from_utf8_lossy(&out.stderr));
        let reference: Value = serde_json::from_slice(&out.stdout).expect("reference JSON");
        let ref_losses: Vec<f64> = serde_json::from_value(reference["losses"].clone()).expect("losses");
        let ref_rates: Vec<f64> = serde_json::from_value(reference["tokens_per_sec"].clone()).expect("rates");
        for ((a, _), b) in steps_ours.iter().zip(&ref_losses) {
            max_diff = max_diff.max((a - b).abs());
        }
        let (a, b) = (median(steps_ours[1..].iter().map(|s| s.1).collect()), median(ref_rates[1..].to_vec()));
        println!("round {}: ours {a:.0} tokens/s, PyTorch {b:.0} tokens/s, ratio {:.2}", round + 1, a / b);
        ours.push(a);
        theirs.push(b);
    }
    let (a, b) = (median(ours), median(theirs));
    println!();
    println!("| threads | toolsmith train sft | PyTorch AdamW loop | ratio | max abs loss difference |");
    println!("|---:|---:|---:|---:|---:|");
    println!("| {threads} | {a:.0} tokens/s | {b:.0} tokens/s | {:.2}x | {max_diff:.1e} |", a / b);
}
