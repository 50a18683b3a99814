//! A few seconds of supervised fine-tuning on oracle traces: the masks and the falling loss. The
//! reinforcement-learning section starts from the checkpoint it leaves.

use anyhow::Result;
use toolsmith_agent::Mode;
use toolsmith_train::config::{DataConfig, SftConfig, WorldsData};
use toolsmith_train::sft::{self, Event};

use super::{Env, clear_dir, corpus_tools};

/// Prints ``training (supervised fine-tuning with observation masking; `toolsmith train sft`):``,
/// the data, the loss over the steps and where the checkpoint went.
pub(super) fn section(env: &Env) -> Result<()> {
    println!("\ntraining (supervised fine-tuning with observation masking; `toolsmith train sft`):");
    let out = env.policy_dir().with_file_name("quickstart-sft");
    clear_dir(&out)?;
    let mut trainer = sft::prepare(sft_config(), &out, false, &corpus_tools)?;
    let (mut losses, mut rates) = (Vec::new(), Vec::new());
    let final_dir = trainer.run(&mut |e| match e {
        Event::Data { sequences, tokens, trained_tokens, .. } => println!(
            "  data              -> {sequences} oracle traces of world 5 (gap style): {tokens} tokens, {:.0}% of them the assistant's (the loss); observations masked",
            100.0 * trained_tokens as f64 / tokens.max(1) as f64
        ),
        Event::Step(toolsmith_train::metrics::Record::Train(m)) => {
            losses.push(m.loss);
            rates.push(m.tokens_per_sec);
        }
        _ => {}
    })?;
    rates.sort_by(f64::total_cmp);
    println!(
        "  {:<17} -> loss per assistant token {:.2} -> {:.2} (warm-up + cosine, {:.0} tokens/s)",
        format!("{} AdamW steps", losses.len()),
        losses.first().copied().unwrap_or_default(),
        losses.last().copied().unwrap_or_default(),
        rates.get(rates.len() / 2).copied().unwrap_or_default()
    );
    println!("  checkpoint        -> {} (weights, optimiser moments, data position: resumable)", final_dir.display());
    println!("  try it: toolsmith train sft --preset tiny-world --out runs/sft   (about 12 minutes on 2 cores)");
    Ok(())
}

/// Twelve steps of 4,096 tokens on world 5's gap-style traces, from a fresh tiny policy.
fn sft_config() -> SftConfig {
    SftConfig {
        data: DataConfig {
            files: Vec::new(),
            worlds: WorldsData {
                seeds: vec![5],
                countries: 2,
                tasks_per_family: 2,
                styles: vec![Mode::Gap],
                ..WorldsData::default()
            },
            ..DataConfig::default()
        },
        steps: Some(12),
        lr: 3e-3,
        warmup_ratio: 0.1,
        batch_tokens: 4096,
        micro_batch_tokens: 4096,
        eval: None,
        checkpoint_every: 12,
        run: toolsmith_train::RunSettings { device: toolsmith_train::DeviceChoice::Cpu, ..SftConfig::default().run },
        ..SftConfig::default()
    }
}
