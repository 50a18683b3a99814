//! Equivalence with the reference implementation: random Qwen2 and Llama models made and run by
//! Hugging Face transformers (PyTorch eager), loaded here from their safetensors and tokenizer.
//! Logits of a padded batch must agree within 1e-4 (fp32) and greedy generation token for token.

mod common;

use std::path::Path;
use std::process::Command;

use serde_json::{Value, json};
use tch::{Device, Kind, Tensor};
use toolsmith_policy::decoder::AttentionMask;
use toolsmith_policy::{LoadOptions, LoraConfig, Policy, Precision, SamplingParams, TINY_TOKENIZER};

const MAX_NEW_TOKENS: usize = 16;

fn texts() -> Vec<&'static str> {
    vec![
        "<|im_start|>user\nWhere was Ada Lovelace born, and when?<|im_end|>\n<|im_start|>assistant\n",
        "<plan>\nTask 1: find the city - Dependencies: none\nTask 2: its population - Dependencies: Task 1\n</plan>",
        "hello",
        "<tool_call>{\"name\": \"calculator\", \"arguments\": {\"expression\": \"2 + 3 * 4\"}}</tool_call>",
    ]
}

/// Makes the reference model with Python and returns its directory and reference outputs.
fn make_reference(arch: &str, work: &Path) -> Value {
    let tokenizer_dir = work.join("tokenizer");
    std::fs::create_dir_all(&tokenizer_dir).expect("mkdir");
    std::fs::write(tokenizer_dir.join("tokenizer.json"), TINY_TOKENIZER).expect("write tokenizer");
    let inputs = work.join("inputs.json");
    std::fs::write(&inputs, json!({"texts": texts(), "max_new_tokens": MAX_NEW_TOKENS}).to_string())
        .expect("write inputs");
    let out = work.join(arch);
    let script = common::repo_root().join("host/policy/tests/reference/reference.py");
    let status = Command::new(common::reference_python())
        .arg(&script)
        .args(["make", "--arch", arch, "--tokenizer"])
        .arg(&tokenizer_dir)
        .arg("--out")
        .arg(&out)
        .arg("--inputs")
        .arg(&inputs)
        .env("OMP_NUM_THREADS", "1")
        .status()
        .expect("run reference.py");
    assert!(status.success(), "reference.py make failed for {arch}");
    serde_json::from_str(&std::fs::read_to_string(out.join("reference.json")).expect("reference.json"))
        .expect("reference JSON")
}

fn ids_of(value: &Value) -> Vec<Vec<i64>> {
    serde_json::from_value(value.clone()).expect("token id lists")
}

fn check(arch: &str, device: Device) {
    common::one_thread();
    let work = tempfile::tempdir().expect("tempdir");
    let reference = make_reference(arch, work.path());
    let dir = work.path().join(arch);
    let policy = Policy::load(&dir, LoadOptions { device, precision: Some(Precision::F32) })
        .expect("load the transformers checkpoint");
    assert_eq!(policy.state().architecture, arch);

    // The same tokenizer.json through both libraries gives the same ids.
    let ids: Vec<Vec<i64>> = texts().iter().map(|t| policy.tokenizer().encode(t).expect("encode")).collect();
    assert_eq!(ids, ids_of(&reference["input_ids"]), "{arch}: token ids differ from transformers");

    // Logits of the right-padded batch at every real position.
    let expected = Tensor::read_safetensors(dir.join("reference.safetensors")).expect("reference logits");
    let expected = &expected.iter().find(|(n, _)| n == "logits").expect("logits tensor").1;
    let longest = ids.iter().map(Vec::len).max().unwrap_or(0);
    let mut flat = Vec::new();
    for x in &ids {
        flat.extend_from_slice(x);
        flat.extend(std::iter::repeat_n(policy.tokenizer().pad_id(), longest - x.len()));
    }
    let (b, t) = (ids.len() as i64, longest as i64);
    let input = Tensor::from_slice(&flat).view([b, t]).to_device(device);
    let positions = Tensor::arange(t, (Kind::Int64, device)).unsqueeze(0).expand([b, t], true);
    let ours = tch::no_grad(|| {
        let model = policy.model();
        model.logits(&model.forward(&input, &positions, &AttentionMask::Causal, None))
    })
    .to_kind(Kind::Float)
    .to_device(Device::Cpu);
    let mut worst = 0.0_f64;
    for (i, x) in ids.iter().enumerate() {
        let n = x.len() as i64;
        let diff = (ours.get(i as i64).narrow(0, 0, n) - expected.get(i as i64).narrow(0, 0, n)).abs().max();
        worst = worst.max(diff.double_value(&[]));
    }
    let scale = expected.abs().max().double_value(&[]);
    eprintln!("{arch} on {device:?}: max |logit difference| {worst:.2e} (logits up to {scale:.2})");
    assert!(worst < 1e-4, "{arch}: logits differ from transformers by {worst}");

    // Greedy generation, one prompt at a time and as one left-padded batch.
    let params = SamplingParams::greedy(MAX_NEW_TOKENS);
    for (i, prompt) in ids.iter().enumerate() {
        let (out, _) = policy.generate(std::slice::from_ref(prompt), &params, None).expect("generate");
        assert_eq!(out[0].output_ids, ids_of(&reference["greedy_single"])[i], "{arch}: greedy output {i}");
    }
    let (out, _) = policy.generate(&ids, &params, None).expect("generate batch");
    let batched: Vec<Vec<i64>> = out.into_iter().map(|g| g.output_ids).collect();
    assert_eq!(batched, ids_of(&reference["greedy_batched"]), "{arch}: batched greedy outputs");
}

#[test]
fn qwen2_matches_transformers() {
    check("qwen2", Device::Cpu);
}

#[test]
fn llama_matches_transformers() {
    check("llama", Device::Cpu);
}

/// Runs only where libtorch sees a GPU.
#[test]
fn qwen2_and_llama_match_transformers_on_cuda() {
    if !tch::Cuda::is_available() {
        eprintln!("no CUDA device: skipped");
        return;
    }
    check("qwen2", Device::Cuda(0));
    check("llama", Device::Cuda(0));
}

#[test]
fn tiny_checkpoint_loads_in_transformers_too() {
    // The other direction: our own checkpoint format is Hugging Face's.
    let work = tempfile::tempdir().expect("tempdir");
    let policy = common::tiny(3);
    policy.save(work.path()).expect("save");
    let prompt = policy.tokenizer().encode("<plan>\nTask 1: hello").expect("encode");
    let (ours, _) = policy.generate(std::slice::from_ref(&prompt), &SamplingParams::greedy(8), None).expect("generate");
    let script = "import json,sys,torch\nfrom transformers import AutoModelForCausalLM\n\
         m=AutoModelForCausalLM.from_pretrained(sys.argv[1]).eval()\n\
         x=torch.tensor([json.loads(sys.argv[2])])\n\
         o=m.generate(input_ids=x,attention_mask=torch.ones_like(x),do_sample=False,max_new_tokens=8,eos_token_id=[2,0],pad_token_id=0)\n\
         print(json.dumps(o[0,x.shape[1]:].tolist()))";
    let output = Command::new(common::reference_python())
        .args(["-c", script])
        .arg(work.path())
        .arg(serde_json::to_string(&prompt).expect("json"))
        .env("OMP_NUM_THREADS", "1")
        .output()
        .expect("run python");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let theirs: Vec<i64> =
        serde_json::from_str(String::from_utf8_lossy(&output.stdout).lines().last().unwrap_or("[]")).expect("ids");
    assert_eq!(ours[0].output_ids, theirs);
}

/// Our LoRA adapter, saved as PEFT saves one, loads in PEFT and gives our logits, with the adapter
/// and merged.
/// Our LoRA adapter, saved as PEFT saves one, loads in PEFT and gives our logits, with the adapter
/// and merged.
#[test]
fn peft_loads_our_lora_adapter() {
    peft_loads_our_adapter(false);
}

/// The same with adapters on the top layer only (PEFT's `layers_to_transform`).
#[test]
fn peft_loads_our_lora_adapter_of_the_top_layer() {
    peft_loads_our_adapter(true);
}

fn peft_loads_our_adapter(top_layer_only: bool) {
    common::one_thread();
    let work = tempfile::tempdir().expect("tempdir");
    make_reference("llama", work.path());
    let dir = work.path().join("llama");
    let mut policy = Policy::load(&dir, LoadOptions { precision: Some(Precision::F32), ..Default::default() })
        .expect("load the transformers checkpoint");
    let top = policy.layer_count() - 1;
    let config = LoraConfig {
        rank: 4,
        alpha: 8.0,
        dropout: 0.0,
        target_modules: vec!["all-linear".into()],
        layers_to_transform: top_layer_only.then(|| vec![top]),
    };
    policy.add_lora(&config, 3).expect("lora");
    // B starts at zero; give it values so the adapter changes something.
    // Deterministic without libtorch's global generator, which tests running at once share.
    for (name, mut var) in policy.trained_variables() {
        if name.contains("lora_B") {
            let values = Tensor::arange(var.numel() as i64, (Kind::Float, Device::Cpu)) * 2.22;
            tch::no_grad(|| var.copy_(&(values.sin().view(var.size().as_slice()) * 0.05)));
        }
    }
    let adapter = work.path().join("adapter");
    policy.save_adapter(&adapter).expect("save adapter");
    let ids: Vec<Vec<i64>> = vec![policy.tokenizer().encode(texts()[0]).expect("encode")];
    let ids_file = work.path().join("ids.json");
    std::fs::write(&ids_file, serde_json::to_string(&ids).expect("json")).expect("write ids");
    let out = work.path().join("peft.safetensors");
    let status = Command::new(common::reference_python())
        .arg(common::repo_root().join("host/policy/tests/reference/reference.py"))
        .arg("lora")
        .arg("--model")
        .arg(&dir)
        .arg("--adapter")
        .arg(&adapter)
        .arg("--ids")
        .arg(&ids_file)
        .arg("--out")
        .arg(&out)
        .env("OMP_NUM_THREADS", "1")
        .status()
        .expect("run reference.py lora");
    assert!(status.success(), "reference.py lora failed");
    let theirs = Tensor::read_safetensors(&out).expect("peft logits");
    let t = ids[0].len() as i64;
    let input = Tensor::from_slice(&ids[0]).view([1, t]);
    let positions = Tensor::arange(t, (Kind::Int64, Device::Cpu)).unsqueeze(0);
    let ours = tch::no_grad(|| {
        let model = policy.model();
        model.logits(&model.forward(&input, &positions, &AttentionMask::Causal, None))
    });
    let base = {
        let mut off =
            Policy::load(&dir, LoadOptions { precision: Some(Precision::F32), ..Default::default() }).expect("base");
        off.set_adapters_enabled(false);
        tch::no_grad(|| off.model().logits(&off.model().forward(&input, &positions, &AttentionMask::Causal, None)))
    };
    assert!((&ours - &base).abs().max().double_value(&[]) > 1e-3, "the adapter changes nothing");
    for (name, expected) in &theirs {
        let worst = (&ours - expected).abs().max().double_value(&[]);
        eprintln!("peft {name}: max |logit difference| {worst:.2e}");
        assert!(worst < 1e-4, "{name}: our LoRA logits differ from PEFT's by {worst}");
    }
}
