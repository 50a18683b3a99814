//! One `RunSettings` flattened into both trainers' configs: files written before it existed
//! (and the configs saved in their checkpoints) read unchanged and write back the same keys, so a
//! resume sees no changed setting; unknown keys are still refused; `init`, `device` and
//! `precision` are parsed when the file is read.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use toolsmith_train::rl::RlConfig;
use toolsmith_train::run::changed_fields;
use toolsmith_train::{DeviceChoice, Init, PrecisionChoice, SftConfig};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

fn read(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).expect("read")).expect("JSON")
}

/// The fixtures are the defaults the previous config types wrote (the committed schemas' defaults
/// before `RunSettings`), field for field.
#[test]
fn configs_written_before_run_settings_load_and_write_back_the_same_keys() {
    let sft_file = fixture("sft-config-before-run-settings.json");
    let sft = SftConfig::from_file(&sft_file).expect("old SFT config");
    assert_eq!(sft, SftConfig::default());
    let written = serde_json::to_value(&sft).expect("serialise");
    assert_eq!(written, read(&sft_file));
    assert!(changed_fields(&read(&sft_file), &written, &[]).is_empty(), "a resume would see no change");

    let rl_file = fixture("rl-config-before-run-settings.json");
    let rl = RlConfig::from_file(&rl_file).expect("old RL config");
    assert_eq!(rl, RlConfig::default());
    assert_eq!(serde_json::to_value(&rl).expect("serialise"), read(&rl_file));
}

#[test]
fn shared_keys_stay_at_the_top_level_of_a_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("run.toml");
    std::fs::write(
        &file,
        "init = \"smollm2-135m\"\ndevice = \"cuda:1\"\nprecision = \"bfloat16\"\nseed = 7\nthreads = 2\n\
         max_grad_norm = 0.5\ntrainable_layers = 4\nlr = 2e-4\n[lora]\nrank = 8\nalpha = 16.0\n",
    )
    .expect("write");
    let config = SftConfig::from_file(&file).expect("TOML config");
    assert_eq!(config.run.init, Init::Named("smollm2-135m".into()));
    assert_eq!(config.run.device, DeviceChoice::Cuda(Some(1)));
    assert_eq!(config.run.precision.to_string(), "bf16");
    assert_eq!((config.run.seed, config.run.threads, config.run.trainable_layers), (7, 2, Some(4)));
    assert_eq!(config.run.max_grad_norm, 0.5);
    assert_eq!(config.run.lora.as_ref().map(|l| l.rank), Some(8));
    assert_eq!(config.lr, 2e-4);
    let written = serde_json::to_value(&config).expect("serialise");
    assert_eq!(written["device"], "cuda:1");
    assert_eq!(written["precision"], "bf16");
    assert!(written.get("run").is_none(), "flattened: no `run` table");
}

#[test]
fn unknown_keys_and_bad_values_are_refused_by_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cases = [
        (json!({"sed": 3}), "unknown field `sed`"),
        (json!({"data": {"worldz": {}}}), "unknown field `worldz`"),
        (json!({"device": "tpu"}), "unknown device \"tpu\""),
        (json!({"precision": "int4"}), "unknown precision \"int4\""),
        (json!({"keep_checkpoints": 0}), "keep_checkpoints must be positive"),
    ];
    for (i, (body, expected)) in cases.into_iter().enumerate() {
        let file = dir.path().join(format!("c{i}.json"));
        std::fs::write(&file, body.to_string()).expect("write");
        let sft = SftConfig::from_file(&file).expect_err("refused").to_string();
        assert!(sft.contains(expected), "SFT {body}: {sft}");
        if i != 1 {
            let rl = RlConfig::from_file(&file).expect_err("refused").to_string();
            assert!(rl.contains(expected), "RL {body}: {rl}");
        }
    }
}

#[test]
fn init_device_and_precision_parse_once_into_types() {
    assert_eq!(Init::parse("tiny"), Init::Tiny);
    assert_eq!(Init::parse(""), Init::Unset);
    assert_eq!(Init::parse("smollm2-135m"), Init::Named("smollm2-135m".into()));
    assert_eq!(Init::parse("runs/sft/final"), Init::Dir("runs/sft/final".into()));
    for spec in ["tiny", "", "smollm2-135m", "runs/sft/final"] {
        assert_eq!(Init::parse(spec).to_string(), spec, "written back as given");
    }
    assert_eq!(DeviceChoice::parse("cuda").expect("cuda").to_string(), "cuda");
    assert_eq!(DeviceChoice::parse("cuda:3").expect("cuda:3"), DeviceChoice::Cuda(Some(3)));
    assert!(DeviceChoice::parse("cuda:x").is_err());
    assert_eq!(PrecisionChoice::parse("auto").expect("auto"), PrecisionChoice::Auto);
    assert_eq!(PrecisionChoice::parse("float32").expect("float32").to_string(), "f32");
}

#[test]
fn the_schema_lists_the_shared_keys_at_the_top_level_and_refuses_others() {
    for schema in [toolsmith_train::config::schema(), toolsmith_train::rl::config::schema()] {
        for key in ["init", "device", "precision", "seed", "lora", "gradient_checkpointing"] {
            assert!(schema["properties"].get(key).is_some(), "{key} in the schema");
        }
        assert_eq!(schema["additionalProperties"], false);
        assert!(schema["properties"].get("run").is_none());
    }
}
