//! LoRA adapters: they start as the base, train alone, turn off to give the base back, save as
//! PEFT saves them and load again, merge into plain weights, and are refused with a clear error
//! when they do not fit.

mod common;

use tch::{Device, Kind, Tensor};
use toolsmith_policy::decoder::AttentionMask;
use toolsmith_policy::{LoadOptions, LoraConfig, Policy, Precision};

fn f32_tiny(seed: u64) -> Policy {
    common::one_thread();
    Policy::tiny(seed, LoadOptions { precision: Some(Precision::F32), ..Default::default() }).expect("tiny")
}

fn logits(policy: &Policy) -> Tensor {
    let ids = policy.tokenizer().encode("<plan>\nTask 1: find the capital of Freedonia\n</plan>").expect("encode");
    let t = ids.len() as i64;
    let input = Tensor::from_slice(&ids).view([1, t]);
    let positions = Tensor::arange(t, (Kind::Int64, Device::Cpu)).unsqueeze(0);
    tch::no_grad(|| {
        let model = policy.model();
        model.logits(&model.forward(&input, &positions, &AttentionMask::Causal, None)).to_kind(Kind::Float)
    })
}

fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
    (a - b).abs().max().double_value(&[])
}

fn config(rank: i64, modules: &[&str]) -> LoraConfig {
    LoraConfig {
        rank,
        alpha: 2.0 * rank as f64,
        dropout: 0.0,
        target_modules: modules.iter().map(|m| m.to_string()).collect(),
        layers_to_transform: None,
    }
}

/// Gives every `lora_B` (zero at the start) nonzero values, as training would. Deterministic
/// without libtorch's global generator, which tests running at once would share.
fn perturb(policy: &Policy, seed: i64) {
    for (name, mut var) in policy.trained_variables() {
        if name.contains("lora_B") {
            let values = Tensor::arange(var.numel() as i64, (Kind::Float, Device::Cpu)) * (0.37 * (seed as f64 + 1.0));
            tch::no_grad(|| var.copy_(&(values.sin().view(var.size().as_slice()) * 0.05)));
        }
    }
}

#[test]
fn adapters_start_as_the_base_train_alone_turn_off_save_as_peft_and_merge() {
    let mut policy = f32_tiny(0);
    let base = logits(&policy);
    let lora = config(4, &["all-linear"]);
    policy.add_lora(&lora, 1).expect("lora");
    assert_eq!(max_diff(&logits(&policy), &base), 0.0, "B starts at zero: the adapted model is the base");

    // Only the adapters train: 4 layers x 7 modules x (A, B), r * (in + out) values each.
    let trained = policy.trained_variables();
    assert_eq!(trained.len(), 4 * 7 * 2);
    assert!(trained.keys().all(|k| k.contains(".lora_A.") || k.contains(".lora_B.")), "{:?}", trained.keys());
    let spec = policy.model().spec().clone();
    let (h, q, kv, i) =
        (spec.hidden_size, spec.heads * spec.head_dim, spec.kv_heads * spec.head_dim, spec.intermediate_size);
    let per_layer = 4 * ((h + q) + (h + kv) + (h + kv) + (q + h) + (h + i) + (h + i) + (i + h));
    let count: i64 = trained.values().map(|t| t.numel() as i64).sum();
    assert_eq!(count, spec.layers * per_layer);

    perturb(&policy, 2);
    let adapted = logits(&policy);
    assert!(max_diff(&adapted, &base) > 1e-3, "the adapters change the output");
    policy.set_adapters_enabled(false);
    assert_eq!(max_diff(&logits(&policy), &base), 0.0, "adapters off: exactly the base");
    policy.set_adapters_enabled(true);

    // Saved beside the base as PEFT saves an adapter; loading attaches it again.
    let dir = tempfile::tempdir().expect("tempdir");
    let saved = dir.path().join("checkpoint");
    policy.save(&saved).expect("save");
    let peft: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(saved.join("adapter_config.json")).expect("adapter_config"))
            .expect("json");
    assert_eq!(
        (peft["peft_type"].as_str(), peft["r"].as_i64(), peft["lora_alpha"].as_f64()),
        (Some("LORA"), Some(4), Some(8.0))
    );
    let adapter = Tensor::read_safetensors(saved.join("adapter_model.safetensors")).expect("adapter weights");
    assert_eq!(adapter.len(), 56);
    assert!(adapter.iter().all(|(n, _)| n.starts_with("base_model.model.model.layers.")), "PEFT's names");
    let weights = Tensor::read_safetensors(saved.join("model.safetensors")).expect("base weights");
    assert!(weights.iter().all(|(n, _)| !n.contains("lora")), "the base file holds the base alone");
    let loaded =
        Policy::load(&saved, LoadOptions { precision: Some(Precision::F32), ..Default::default() }).expect("load");
    assert_eq!(loaded.lora().map(|l| l.normalized().expect("valid")), Some(lora.normalized().expect("valid")));
    assert!(max_diff(&logits(&loaded), &adapted) < 1e-6);

    // Merged: plain weights that give the adapted model, no adapter files.
    let merged = dir.path().join("merged");
    policy.save_merged(&merged).expect("merge");
    assert!(!merged.join("adapter_config.json").exists());
    let plain =
        Policy::load(&merged, LoadOptions { precision: Some(Precision::F32), ..Default::default() }).expect("load");
    assert_eq!(plain.lora(), None);
    assert!(max_diff(&logits(&plain), &adapted) < 1e-4);
    // Saving a plain model over a directory that held an adapter removes it.
    plain.save(&saved).expect("save over");
    assert!(!saved.join("adapter_config.json").exists());
    // The frozen reference copy folds the adapters in too.
    assert!(max_diff(&logits(&policy.reference().expect("reference")), &adapted) < 1e-4);
}

#[test]
fn adapters_that_do_not_fit_are_refused_and_change_nothing() {
    let mut policy = f32_tiny(0);
    let base = logits(&policy);
    let err = policy.add_lora(&config(4, &["qkv_proj"]), 1).expect_err("no such module").to_string();
    assert!(err.contains("no module \"qkv_proj\"") && err.contains("q_proj"), "{err}");
    let err = policy.add_lora(&config(0, &["q_proj"]), 1).expect_err("rank 0").to_string();
    assert!(err.contains("rank"), "{err}");
    assert_eq!(policy.lora(), None);
    assert!(policy.trained_variables().keys().all(|k| !k.contains("lora")));

    // An adapter trained on another base (another seed's tiny model) is refused by fingerprint.
    let dir = tempfile::tempdir().expect("tempdir");
    let mut other = f32_tiny(1);
    other.add_lora(&config(4, &["q_proj", "v_proj"]), 1).expect("lora");
    perturb(&other, 3);
    let adapter = dir.path().join("adapter");
    other.save_adapter(&adapter).expect("save adapter");
    let err = policy.load_adapter(&adapter).expect_err("another base").to_string();
    assert!(err.contains("another base"), "{err}");
    assert_eq!(policy.lora(), None);
    assert_eq!(max_diff(&logits(&policy), &base), 0.0);

    // Without Toolsmith's fingerprint (an adapter made elsewhere), shapes are checked.
    std::fs::remove_file(adapter.join("toolsmith-adapter.json")).expect("rm");
    let config_path = adapter.join("adapter_config.json");
    let mut peft: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&config_path).expect("read")).expect("json");
    peft["r"] = 8.into();
    std::fs::write(&config_path, peft.to_string()).expect("write");
    let err = policy.load_adapter(&adapter).expect_err("rank 8 config, rank 4 tensors").to_string();
    assert!(err.contains("shape"), "{err}");
    // A module list that does not match the tensors.
    peft["r"] = 4.into();
    peft["target_modules"] = serde_json::json!(["q_proj"]);
    std::fs::write(&config_path, peft.to_string()).expect("write");
    let err = policy.load_adapter(&adapter).expect_err("v_proj tensors, q_proj only").to_string();
    assert!(err.contains("does not fit"), "{err}");
    // Corrupt weights.
    std::fs::write(adapter.join("adapter_model.safetensors"), b"not safetensors").expect("write");
    let err = policy.load_adapter(&adapter).expect_err("corrupt").to_string();
    assert!(err.contains("safetensors"), "{err}");
    assert_eq!(policy.lora(), None);
    assert_eq!(max_diff(&logits(&policy), &base), 0.0);

    // The same base's adapter applies; frozen layers and adapters exclude each other.
    // (A copy of this very base: two `tiny(0)` built while other tests draw from libtorch's
    // generator have been seen to differ in their last-drawn weight.)
    policy.save(&dir.path().join("base")).expect("save base");
    let mut same =
        Policy::load(&dir.path().join("base"), LoadOptions { precision: Some(Precision::F32), ..Default::default() })
            .expect("load base");
    same.add_lora(&config(4, &["q_proj", "v_proj"]), 1).expect("lora");
    perturb(&same, 4);
    let good = dir.path().join("good");
    same.save_adapter(&good).expect("save");
    policy.load_adapter(&good).expect("the same base");
    assert!(max_diff(&logits(&policy), &logits(&same)) < 1e-6);
    let err = policy.set_trainable_layers(Some(1)).expect_err("both").to_string();
    assert!(err.contains("exclude"), "{err}");
}

#[test]
fn adapters_on_chosen_layers_only_save_load_and_are_checked() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut policy = f32_tiny(0);
    let base = logits(&policy);
    let layers = policy.layer_count();
    assert!(layers >= 3, "{layers}");
    // A layer the model lacks is refused before anything changes.
    let mut past = config(4, &["all-linear"]);
    past.layers_to_transform = Some(vec![layers]);
    let err = policy.add_lora(&past, 1).expect_err("no such layer").to_string();
    assert!(err.contains(&format!("names layer {layers}")), "{err}");
    let mut empty = config(4, &["all-linear"]);
    empty.layers_to_transform = Some(Vec::new());
    assert!(policy.add_lora(&empty, 1).expect_err("empty").to_string().contains("empty"));
    assert_eq!(policy.lora(), None);

    // A copy of this base to load the adapter onto (two `tiny(0)` built while other tests draw
    // from libtorch's generator can differ).
    let base_dir = dir.path().join("base");
    policy.save(&base_dir).expect("save base");
    let same_base = || {
        Policy::load(&base_dir, LoadOptions { precision: Some(Precision::F32), ..Default::default() }).expect("base")
    };

    // The top two layers only: every adapter variable is theirs, and only they train.
    let mut top = config(4, &["q_proj", "down_proj"]);
    top.layers_to_transform = Some(vec![layers - 1, layers - 2]);
    policy.add_lora(&top, 1).expect("lora");
    let trained: Vec<String> = policy.trained_variables().into_keys().collect();
    assert_eq!(trained.len(), 2 * 2 * 2, "{trained:?}");
    for name in &trained {
        let layer: usize = name.split('.').nth(2).and_then(|l| l.parse().ok()).expect("a layer");
        assert!(layer >= layers - 2, "{name}");
    }
    perturb(&policy, 2);
    let adapted = logits(&policy);
    assert!(max_diff(&adapted, &base) > 1e-4);

    // Saved as PEFT writes it, with the layers; loaded onto the same base, the same logits.
    let adapter = dir.path().join("adapter");
    policy.save_adapter(&adapter).expect("save");
    let peft: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(adapter.join("adapter_config.json")).expect("read"))
            .expect("json");
    assert_eq!(peft["layers_to_transform"], serde_json::json!([layers - 1, layers - 2]));
    let mut again = same_base();
    // Loading draws nothing from libtorch's global generator (the daemon swaps adapters while a
    // training unit's dropout draws from it): the draw after it is the seed's first.
    let after_load = {
        let _seeded = toolsmith_policy::seeded(11);
        again.load_adapter(&adapter).expect("load");
        Tensor::rand([8], (Kind::Float, Device::Cpu))
    };
    let first = {
        let _seeded = toolsmith_policy::seeded(11);
        Tensor::rand([8], (Kind::Float, Device::Cpu))
    };
    assert_eq!(max_diff(&after_load, &first), 0.0, "the adapter's load drew from the generator");
    assert_eq!(max_diff(&logits(&again), &adapted), 0.0);
    assert_eq!(again.lora().map(|l| l.normalized().expect("valid")), Some(top.normalized().expect("valid")));

    // PEFT's single index is read as a list of one; an index past the model is refused.
    let config_path = adapter.join("adapter_config.json");
    let mut edited = peft.clone();
    edited["layers_to_transform"] = serde_json::json!(layers + 5);
    std::fs::write(&config_path, edited.to_string()).expect("write");
    let err = same_base().load_adapter(&adapter).expect_err("past the model").to_string();
    assert!(err.contains(&format!("names layer {}", layers + 5)), "{err}");
    // Tensors of layers the config does not list do not fit.
    edited["layers_to_transform"] = serde_json::json!(layers - 1);
    std::fs::write(&config_path, edited.to_string()).expect("write");
    let err = same_base().load_adapter(&adapter).expect_err("two layers' tensors, one listed").to_string();
    assert!(err.contains("does not fit"), "{err}");
}
