//! `toolsmith policy ...`: create, inspect and sample from policy checkpoints.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use serde_json::{Value, json};
use toolsmith_policy::tokenizer::{self, tiny_tokenizer_config};
use toolsmith_policy::{LoadOptions, Policy, Precision, SamplingParams, TINY_CONFIG, TINY_TOKENIZER};

use super::print_json;

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Describe a checkpoint: architecture, sizes, parameters, precision, tokenizer, training state.
    Info {
        dir: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Sample a continuation of a prompt and report tokens/s.
    Generate(GenerateArgs),
    /// Write a freshly initialised model (the tiny default unless --config names another).
    Init {
        /// A Qwen2 or Llama `config.json` [default: the tiny ~4 M-parameter configuration].
        #[arg(long)]
        config: Option<PathBuf>,
        /// A `tokenizer.json` [default: the tiny byte-level BPE with trace tags].
        #[arg(long)]
        tokenizer: Option<PathBuf>,
        #[arg(long)]
        out: PathBuf,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Replace an existing checkpoint in OUT.
        #[arg(long)]
        force: bool,
    },
    /// Train the tiny byte-level BPE tokenizer on a text corpus (trace tags become single tokens).
    TrainTokenizer {
        /// Text files; paragraphs (blank-line separated) are the training sequences.
        #[arg(required = true)]
        corpus: Vec<PathBuf>,
        #[arg(long, default_value_t = 4096)]
        vocab_size: usize,
        #[arg(long)]
        out: PathBuf,
    },
}

#[derive(Debug, Args)]
pub struct GenerateArgs {
    dir: PathBuf,
    #[arg(long)]
    prompt: String,
    #[arg(long, default_value_t = 64)]
    max_new_tokens: usize,
    /// 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f64,
    #[arg(long, default_value_t = 1.0)]
    top_p: f64,
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    #[arg(long, default_value_t = 1.0)]
    repetition_penalty: f64,
    /// Stop when the text contains this (repeatable).
    #[arg(long = "stop")]
    stop: Vec<String>,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// auto (CUDA when available), cpu, cuda or cuda:N.
    #[arg(long, default_value = "auto")]
    device: String,
    /// f32, bf16 or f16 [default: f32 on CPU, the checkpoint's on CUDA].
    #[arg(long)]
    dtype: Option<String>,
    /// CPU threads for libtorch [default: libtorch's choice].
    #[arg(long)]
    threads: Option<usize>,
    /// Print {prompt_ids, output_ids, text, finish_reason, tokens_per_sec} instead of streaming.
    #[arg(long)]
    json: bool,
}

pub fn run(cmd: PolicyCommand) -> Result<ExitCode> {
    match cmd {
        PolicyCommand::Info { dir, json } => info(&dir, json),
        PolicyCommand::Generate(args) => generate(args),
        PolicyCommand::Init { config, tokenizer, out, seed, force } => {
            init(config.as_deref(), tokenizer.as_deref(), &out, seed, force)
        }
        PolicyCommand::TrainTokenizer { corpus, vocab_size, out } => train_tokenizer(&corpus, vocab_size, &out),
    }
}

fn load(dir: &Path, device: &str, dtype: Option<&str>) -> Result<Policy> {
    // A named policy (`smollm2-135m`) is found where setup put it.
    let located = toolsmith_policy::locate(&dir.to_string_lossy())?;
    let dir = located.as_path();
    let device = toolsmith_policy::parse_device(device)?;
    let precision = dtype.map(Precision::parse).transpose()?;
    let bar = super::tools::spinner(&format!("loading {}", dir.display()));
    let policy = Policy::load(dir, LoadOptions { device, precision });
    bar.finish_and_clear();
    policy.with_context(|| format!("cannot load the policy in {}", dir.display()))
}

fn info(dir: &Path, json: bool) -> Result<ExitCode> {
    let policy = load(dir, "cpu", None)?;
    let spec = policy.config().spec()?;
    let state = policy.state();
    let tokenizer = policy.tokenizer();
    let report = json!({
        "architecture": state.architecture,
        "parameters": state.parameters,
        "precision": state.precision,
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "layers": spec.layers,
        "heads": spec.heads,
        "kv_heads": spec.kv_heads,
        "head_dim": spec.head_dim,
        "rope_theta": spec.rope_theta,
        "tie_word_embeddings": spec.tie_word_embeddings,
        "max_position_embeddings": spec.max_position_embeddings,
        "tokenizer": {
            "tokens": tokenizer.vocab_size(),
            "eos_ids": tokenizer.eos_ids(),
            "pad_id": tokenizer.pad_id(),
            "hash": tokenizer.hash(),
            "chat_template": tokenizer.chat_template().is_some(),
        },
        "step": state.step,
        "optimizer_state": state.optimizer_state,
        "cuda_available": toolsmith_policy::tch::Cuda::is_available(),
    });
    if json {
        print_json(&report)?;
        return Ok(ExitCode::SUCCESS);
    }
    println!("{}", dir.display());
    println!(
        "  {} decoder, {:.2} M parameters ({} weights)",
        state.architecture,
        state.parameters as f64 / 1e6,
        state.precision.hf_name()
    );
    println!(
        "  {} layers, hidden {}, MLP {}, {} heads ({} key/value, head dim {}), rope theta {}",
        spec.layers,
        spec.hidden_size,
        spec.intermediate_size,
        spec.heads,
        spec.kv_heads,
        spec.head_dim,
        spec.rope_theta
    );
    println!(
        "  vocabulary {} ({} in the tokenizer), embeddings {}, context {}",
        spec.vocab_size,
        tokenizer.vocab_size(),
        if spec.tie_word_embeddings { "tied" } else { "untied" },
        spec.max_position_embeddings
    );
    println!("  end of sequence {:?}, padding {}", tokenizer.eos_ids(), tokenizer.pad_id());
    println!(
        "  training step {}{}",
        state.step,
        state.optimizer_state.as_deref().map(|p| format!(", optimizer state {p}")).unwrap_or_default()
    );
    println!("  CUDA available: {}", toolsmith_policy::tch::Cuda::is_available());
    Ok(ExitCode::SUCCESS)
}

fn generate(args: GenerateArgs) -> Result<ExitCode> {
    if let Some(threads) = args.threads {
        toolsmith_policy::set_threads(threads);
    }
    let policy = load(&args.dir, &args.device, args.dtype.as_deref())?;
    let params = SamplingParams {
        max_new_tokens: args.max_new_tokens,
        temperature: args.temperature,
        top_p: args.top_p,
        top_k: args.top_k,
        repetition_penalty: args.repetition_penalty,
        stop_strings: args.stop.clone(),
        stop_token_ids: Vec::new(),
        seed: args.seed,
        ignore_eos: false,
        stop_loops: false,
    };
    params.validate()?;
    if args.json {
        let (mut out, stats) = policy.generate_text(&[&args.prompt], &params, None)?;
        let g = out.pop().context("no generation")?;
        print_json(&json!({
            "prompt_ids": g.prompt_ids,
            "output_ids": g.output_ids,
            "text": g.text,
            "finish_reason": g.finish_reason,
            "tokens_per_sec": stats.tokens_per_sec(),
        }))?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut stdout = std::io::stdout();
    let mut stream = |event: toolsmith_policy::TokenEvent<'_>| {
        // A closed stdout (e.g. `| head`) just ends the printing; generation finishes anyway.
        let _ = stdout.write_all(event.text.as_bytes()).and_then(|()| stdout.flush());
    };
    let (out, stats) = policy.generate_text(&[&args.prompt], &params, Some(&mut stream))?;
    println!();
    let finish = out.first().map(|g| g.finish_reason);
    eprintln!(
        "{} tokens in {:.2} s ({:.1} tokens/s; prompt {} tokens, prefill {:.1} ms) on {:?}, finish {:?}",
        stats.generated_tokens,
        stats.prefill_secs + stats.decode_secs,
        stats.tokens_per_sec(),
        stats.prompt_tokens,
        stats.prefill_secs * 1e3,
        policy.device(),
        finish.context("no generation")?
    );
    Ok(ExitCode::SUCCESS)
}

fn init(config: Option<&Path>, tokenizer: Option<&Path>, out: &Path, seed: u64, force: bool) -> Result<ExitCode> {
    if out.join("model.safetensors").exists() && !force {
        bail!("{} already holds a checkpoint (use --force to replace it)", out.display());
    }
    let config: Value = match config {
        Some(path) => {
            let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
            serde_json::from_str(&text).with_context(|| format!("{} is not valid JSON", path.display()))?
        }
        None => serde_json::from_str(TINY_CONFIG).context("the embedded tiny config")?,
    };
    let (tokenizer_json, tokenizer_config) = match tokenizer {
        Some(path) => tokenizer::read_files(path)?,
        None => (TINY_TOKENIZER.as_bytes().to_vec(), Some(tiny_tokenizer_config())),
    };
    let policy = Policy::init(config, tokenizer_json, tokenizer_config, seed, LoadOptions::default())?;
    policy.save(out).with_context(|| format!("cannot write the checkpoint to {}", out.display()))?;
    println!(
        "wrote a {} model with {:.2} M parameters to {}",
        policy.state().architecture,
        policy.state().parameters as f64 / 1e6,
        out.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// Paragraphs of the corpus files: the sequences the tokenizer is trained on.
pub fn corpus_paragraphs(files: &[PathBuf]) -> Result<Vec<String>> {
    let mut texts = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
        texts.extend(text.split("\n\n").filter(|p| !p.trim().is_empty()).map(str::to_owned));
    }
    Ok(texts)
}

fn train_tokenizer(corpus: &[PathBuf], vocab_size: usize, out: &Path) -> Result<ExitCode> {
    let texts = corpus_paragraphs(corpus)?;
    let trained = tokenizer::train_tiny(&texts, vocab_size)?;
    let json = trained.to_string(true).map_err(|e| anyhow::anyhow!("cannot serialise the tokenizer: {e}"))?;
    std::fs::write(out, json + "\n").with_context(|| format!("cannot write {}", out.display()))?;
    println!(
        "trained a {}-token byte-level BPE on {} paragraphs; wrote {}",
        trained.get_vocab_size(true),
        texts.len(),
        out.display()
    );
    Ok(ExitCode::SUCCESS)
}
