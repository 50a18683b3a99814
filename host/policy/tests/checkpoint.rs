//! Checkpoints round-trip exactly, load sharded, keep their training state, and refuse corrupt or
//! mismatched files with a clear error (never a panic, never a half-loaded model).

mod common;

use std::path::Path;

use serde_json::Value;
use tch::{Kind, Tensor};
use toolsmith_policy::decoder::AttentionMask;
use toolsmith_policy::{LoadOptions, Policy, PolicyError, Precision};

fn logits(policy: &Policy, ids: &[i64]) -> Tensor {
    let model = policy.model();
    let t = ids.len() as i64;
    let input = Tensor::from_slice(ids).view([1, t]);
    let positions = Tensor::arange(t, (Kind::Int64, tch::Device::Cpu)).view([1, t]);
    tch::no_grad(|| model.logits(&model.forward(&input, &positions, &AttentionMask::Causal, None))).to_kind(Kind::Float)
}

/// In f32, the precision the tests save in, so a round trip is exact.
fn load(dir: &Path) -> Result<Policy, PolicyError> {
    Policy::load(dir, LoadOptions { precision: Some(toolsmith_policy::Precision::F32), ..Default::default() })
}

fn error_text(dir: &Path) -> String {
    load(dir).expect_err("must not load").to_string()
}

#[test]
fn save_and_load_round_trip_with_state() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut policy = common::tiny(7);
    policy.state_mut().step = 42;
    policy.state_mut().optimizer_state = Some("optimizer.safetensors".into());
    policy.save(dir.path()).expect("save");
    let loaded = load(dir.path()).expect("load");
    let ids = policy.tokenizer().encode("<mem>two facts</mem>").expect("encode");
    let diff = (logits(&policy, &ids) - logits(&loaded, &ids)).abs().max().double_value(&[]);
    assert_eq!(diff, 0.0, "weights changed in the round trip");
    assert_eq!(loaded.state().step, 42);
    assert_eq!(loaded.state().optimizer_state.as_deref(), Some("optimizer.safetensors"));
    assert_eq!(loaded.state().tokenizer_hash, policy.tokenizer().hash());
    assert_eq!(loaded.state().parameters, policy.state().parameters);
    assert!((1_000_000..=5_000_000).contains(&loaded.state().parameters), "tiny is 1-5 M parameters");
    // Tied embeddings: no separate head in the file.
    let names: Vec<String> = Tensor::read_safetensors(dir.path().join("model.safetensors"))
        .expect("read")
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert!(names.contains(&"model.embed_tokens.weight".to_string()));
    assert!(!names.iter().any(|n| n == "lm_head.weight"));
    assert!(names.iter().any(|n| n == "model.layers.3.self_attn.q_proj.bias"), "Qwen2 q/k/v biases");
}

#[test]
fn sharded_checkpoints_load() {
    let dir = tempfile::tempdir().expect("tempdir");
    let policy = common::tiny(8);
    policy.save(dir.path()).expect("save");
    // Split the weights into two shards with an index, as large Hugging Face models are stored.
    let mut tensors = Tensor::read_safetensors(dir.path().join("model.safetensors")).expect("read");
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    let (first, second) = tensors.split_at(tensors.len() / 2);
    let mut map = serde_json::Map::new();
    for (file, part) in [("model-00001-of-00002.safetensors", first), ("model-00002-of-00002.safetensors", second)] {
        Tensor::write_safetensors(part, dir.path().join(file)).expect("write shard");
        for (name, _) in part {
            map.insert(name.clone(), Value::from(file));
        }
    }
    std::fs::remove_file(dir.path().join("model.safetensors")).expect("rm");
    let index = serde_json::json!({"metadata": {}, "weight_map": map});
    std::fs::write(dir.path().join("model.safetensors.index.json"), index.to_string()).expect("index");
    let loaded = load(dir.path()).expect("load shards");
    let ids = [5_i64, 6, 7, 8];
    assert_eq!((logits(&policy, &ids) - logits(&loaded, &ids)).abs().max().double_value(&[]), 0.0);

    // A shard that the index names but that is gone.
    std::fs::remove_file(dir.path().join("model-00002-of-00002.safetensors")).expect("rm");
    assert!(error_text(dir.path()).contains("missing weights file"));
}

#[test]
fn half_precision_loads_and_generates() {
    let dir = tempfile::tempdir().expect("tempdir");
    common::tiny(9).save(dir.path()).expect("save");
    for precision in [Precision::Bf16, Precision::F16] {
        common::one_thread();
        let loaded = Policy::load(dir.path(), LoadOptions { device: tch::Device::Cpu, precision: Some(precision) });
        // bf16 is refused, clearly, on a CPU that does not compute it.
        let policy = match loaded {
            Err(e) if precision == Precision::Bf16 && !toolsmith_policy::cpu_has_bf16() => {
                assert!(e.to_string().contains("AVX512_BF16"), "{e}");
                continue;
            }
            other => other.expect("load"),
        };
        assert_eq!(policy.model().kind(), precision.kind());
        let (out, _) =
            policy.generate(&[vec![5, 6, 7]], &toolsmith_policy::SamplingParams::greedy(4), None).expect("generate");
        assert_eq!(out[0].output_ids.len(), 4);
    }
}

#[test]
fn corrupt_and_mismatched_checkpoints_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let policy = common::tiny(10);
    let fresh = |name: &str| {
        let d = dir.path().join(name);
        policy.save(&d).expect("save");
        d
    };

    let d = fresh("truncated");
    let weights = d.join("model.safetensors");
    let bytes = std::fs::read(&weights).expect("read");
    std::fs::write(&weights, &bytes[..bytes.len() / 2]).expect("truncate");
    assert!(error_text(&d).contains("unreadable safetensors"), "{}", error_text(&d));

    let d = fresh("garbage-config");
    std::fs::write(d.join("config.json"), "{not json").expect("write");
    assert!(error_text(&d).contains("config.json"));

    let d = fresh("unknown-architecture");
    std::fs::write(d.join("config.json"), r#"{"model_type": "gpt2", "vocab_size": 10}"#).expect("write");
    assert!(error_text(&d).contains("gpt2"));

    let d = fresh("bad-heads");
    let mut config: Value =
        serde_json::from_str(&std::fs::read_to_string(d.join("config.json")).expect("read")).expect("json");
    config["num_key_value_heads"] = Value::from(3);
    std::fs::write(d.join("config.json"), config.to_string()).expect("write");
    assert!(error_text(&d).contains("multiple of num_key_value_heads"));

    let d = fresh("wrong-size");
    config = serde_json::from_str(&std::fs::read_to_string(d.join("config.json")).expect("read")).expect("json");
    config["intermediate_size"] = Value::from(512);
    std::fs::write(d.join("config.json"), config.to_string()).expect("write");
    let text = error_text(&d);
    assert!(text.contains("shape") && text.contains("mlp"), "{text}");

    let d = fresh("missing-tensor");
    let kept: Vec<(String, Tensor)> = Tensor::read_safetensors(d.join("model.safetensors"))
        .expect("read")
        .into_iter()
        .filter(|(n, _)| n != "model.norm.weight")
        .collect();
    Tensor::write_safetensors(&kept, d.join("model.safetensors")).expect("write");
    assert!(error_text(&d).contains("model.norm.weight"));

    let d = fresh("other-tokenizer");
    let tokenizer = std::fs::read_to_string(d.join("tokenizer.json")).expect("read");
    std::fs::write(d.join("tokenizer.json"), tokenizer.replacen("\"<think>\"", "\"<thonk>\"", 1)).expect("write");
    assert!(error_text(&d).contains("tokenizer"));

    let d = fresh("bad-state");
    std::fs::write(d.join("toolsmith-state.json"), "[]").expect("write");
    assert!(error_text(&d).contains("invalid state"));

    assert!(load(&dir.path().join("nowhere")).is_err());
    // The original is untouched by all of this.
    load(&fresh("intact")).expect("a good checkpoint still loads");
}

#[test]
fn unsupported_configs_are_explained() {
    let base: Value = serde_json::from_str(toolsmith_policy::TINY_CONFIG).expect("tiny config");
    let with = |key: &str, value: Value| {
        let mut c = base.clone();
        c[key] = value;
        toolsmith_policy::ModelConfig::from_json(&c).and_then(|c| c.spec()).expect_err("refused").to_string()
    };
    assert!(with("use_sliding_window", Value::Bool(true)).contains("sliding"));
    assert!(with("hidden_act", Value::from("gelu")).contains("gelu"));
    assert!(with("rope_scaling", serde_json::json!({"rope_type": "yarn", "factor": 4.0})).contains("yarn"));
    assert!(with("hidden_size", Value::from(-1)).contains("positive"));
    let mut no_size = base.clone();
    no_size.as_object_mut().expect("object").remove("hidden_size");
    assert!(toolsmith_policy::ModelConfig::from_json(&no_size).is_err());
}
