//! What the training benches share: their command-line flags and the SFT settings both build
//! their batches from (oracle traces of world 1, every style).

use std::sync::Arc;

use toolsmith_agent::Mode;
use toolsmith_agent::env::Corpus;
use toolsmith_agent::tools::{Executor, LocalTools};
use toolsmith_train::config::{DataConfig, SftConfig, WorldsData};

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
        init: text("--init").unwrap_or(defaults.init.clone()),
        precision: text("--precision").unwrap_or_else(|| "f32".into()),
        trainable_layers: text("--trainable-layers").map(|n| n.parse().expect("a layer count")),
        gradient_checkpointing: std::env::args().any(|a| a == "--gradient-checkpointing"),
        lora: lora(),
        batch_tokens: arg("--batch-tokens", defaults.batch_tokens),
        micro_batch_tokens: arg("--micro-batch-tokens", defaults.micro_batch_tokens),
        steps: Some(steps),
        device: text("--device").unwrap_or_else(|| "cpu".into()),
        threads,
        eval: None,
        checkpoint_every: steps,
        ..defaults
    }
}
