//! What the training benches share: their command-line flags and the SFT settings both build
//! their batches from (oracle traces of world 1, every style).

use std::sync::Arc;

use toolsmith_agent::Mode;
use toolsmith_agent::env::Corpus;
use toolsmith_agent::tools::{Executor, LocalTools};
use toolsmith_train::config::{DataConfig, SftConfig, WorldsData};
use toolsmith_train::{DeviceChoice, Init, PrecisionChoice, RunSettings};

/// The number after `name` on the command line, or `default`.
pub fn arg(name: &str, default: usize) -> usize {
    text(name).map_or(default, |v| v.parse().expect("a number"))
}

/// The word after `name` on the command line.
pub fn text(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.windows(2).find(|w| w[0] == name).map(|w| w[1].clone())
}

pub fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// The tools the traces' worlds answer with.
pub fn tools(corpus: Arc<Corpus>) -> Arc<dyn Executor> {
    Arc::new(LocalTools::new().with_corpus(corpus))
}

/// `--lora-rank R`: adapters of that rank (alpha 2R) on every linear layer, without dropout, so
/// that two implementations' losses can be compared.
pub fn lora() -> Option<toolsmith_policy::LoraConfig> {
    text("--lora-rank").map(|r| {
        let rank: i64 = r.parse().expect("a rank");
        toolsmith_policy::LoraConfig { rank, alpha: 2.0 * rank as f64, dropout: 0.0, ..Default::default() }
    })
}

/// `steps` steps on the oracle traces of world 1 (every style), with the flags' model,
/// precision, trainable layers, LoRA, batch sizes and threads; no evaluation.
pub fn sft_config(steps: u64, threads: usize) -> SftConfig {
    let defaults = SftConfig::default();
    SftConfig {
        data: DataConfig {
            files: Vec::new(),
            worlds: WorldsData {
                seeds: vec![1],
                countries: 6,
                tasks_per_family: 4,
                styles: Mode::ALL.to_vec(),
                ..WorldsData::default()
            },
            ..DataConfig::default()
        },
        batch_tokens: arg("--batch-tokens", defaults.batch_tokens),
        micro_batch_tokens: arg("--micro-batch-tokens", defaults.micro_batch_tokens),
        steps: Some(steps),
        eval: None,
        checkpoint_every: steps,
        run: RunSettings {
            init: text("--init").map_or_else(|| defaults.run.init.clone(), |i| Init::parse(&i)),
            precision: PrecisionChoice::parse(&text("--precision").unwrap_or_else(|| "f32".into()))
                .expect("--precision"),
            trainable_layers: text("--trainable-layers").map(|n| n.parse().expect("a layer count")),
            gradient_checkpointing: std::env::args().any(|a| a == "--gradient-checkpointing"),
            lora: lora(),
            device: DeviceChoice::parse(&text("--device").unwrap_or_else(|| "cpu".into())).expect("--device"),
            threads,
            ..defaults.run.clone()
        },
        ..defaults
    }
}

/// The settings a reference script reads from its plan's "config": the optimiser's, the
/// precision, which layers train, and the adapter both sides start from (in PEFT's layout).
pub fn reference_settings(config: &SftConfig, adapter: &std::path::Path) -> serde_json::Value {
    let o = config.optimizer;
    let lora = config.run.lora.as_ref().map(|l| {
        serde_json::json!({"rank": l.rank, "alpha": l.alpha, "dropout": l.dropout,
               "target_modules": l.normalized().expect("valid").target_modules, "adapter": adapter})
    });
    serde_json::json!({"lr": config.lr, "beta1": o.beta1, "beta2": o.beta2, "eps": o.eps,
        "weight_decay": o.weight_decay, "max_grad_norm": config.run.max_grad_norm,
        "precision": config.run.precision, "trainable_layers": config.run.trainable_layers,
        "gradient_checkpointing": config.run.gradient_checkpointing, "lora": lora})
}

/// Runs a reference script (`python script init plan threads [extra]`) at `threads` threads and
/// returns its JSON: its losses, tokens/s per step and peak RSS in MiB.
pub fn run_reference(
    script: &std::path::Path,
    init: &std::path::Path,
    plan: &std::path::Path,
    threads: usize,
    extra: &[&str],
) -> (Vec<f64>, Vec<f64>, f64) {
    let out = std::process::Command::new(crate::common::reference_python())
        .arg(script)
        .arg(init)
        .arg(plan)
        .arg(threads.to_string())
        .args(extra)
        .env("OMP_NUM_THREADS", threads.to_string())
        .output()
        .expect("run the reference");
    assert!(out.status.success(), "reference failed: {}", String::from_utf8_lossy(&out.stderr));
    let reference: serde_json::Value = serde_json::from_slice(&out.stdout).expect("reference JSON");
    let losses: Vec<f64> = serde_json::from_value(reference["losses"].clone()).expect("losses");
    let rates: Vec<f64> = serde_json::from_value(reference["tokens_per_sec"].clone()).expect("rates");
    (losses, rates, reference["peak_rss_kib"].as_f64().unwrap_or(f64::NAN) / 1024.0)
}
