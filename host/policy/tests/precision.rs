//! bf16 against f32: the same checkpoint's logits agree within bf16's resolution, on the tiny
//! model and on SmolLM2-135M (when setup fetched it); `auto` picks bf16 only where the CPU
//! computes it natively, and for training only where it trains faster in it.

mod common;

use tch::{Device, Kind, Tensor};
use toolsmith_policy::decoder::{AttentionMask, FusedWeights};
use toolsmith_policy::{CpuFeatures, LoadOptions, Policy, Precision};

const PROMPT: &str = "<|im_start|>user\nWhat is the population of the capital of Freedonia?<|im_end|>\n<|im_start|>assistant\n<plan>\nTask 1: find the capital";

/// Log-probabilities over the vocabulary at every position of the prompt, in f32.
fn log_probs(policy: &Policy) -> Tensor {
    let ids = policy.tokenizer().encode(PROMPT).expect("encode");
    let t = ids.len() as i64;
    let input = Tensor::from_slice(&ids).view([1, t]);
    let positions = Tensor::arange(t, (Kind::Int64, Device::Cpu)).unsqueeze(0);
    tch::no_grad(|| {
        let model = policy.model();
        model
            .logits(&model.forward(&input, &positions, &AttentionMask::Causal, None))
            .to_kind(Kind::Float)
            .log_softmax(-1, Kind::Float)
    })
}

/// The largest log-prob difference over each position's 20 most likely tokens (f32's), and the
/// share of positions whose top token agrees.
fn compare(f32: &Policy, bf16: &Policy) -> (f64, f64) {
    let (a, b) = (log_probs(f32), log_probs(bf16));
    let (_, top) = a.topk(20, -1, true, true);
    let diff = (a.gather(-1, &top, false) - b.gather(-1, &top, false)).abs().max().double_value(&[]);
    let agree =
        a.argmax(-1, false).eq_tensor(&b.argmax(-1, false)).to_kind(Kind::Float).mean(Kind::Float).double_value(&[]);
    (diff, agree)
}

fn options(precision: Precision) -> LoadOptions {
    LoadOptions { precision: Some(precision), ..Default::default() }
}

#[test]
fn bf16_logits_stay_close_to_f32_on_the_tiny_model() {
    common::one_thread();
    let dir = tempfile::tempdir().expect("tempdir");
    Policy::tiny(0, options(Precision::F32)).expect("tiny").save(dir.path()).expect("save");
    let f32 = Policy::load(dir.path(), options(Precision::F32)).expect("f32");
    let Ok(bf16) = Policy::load(dir.path(), options(Precision::Bf16)) else {
        assert!(!toolsmith_policy::cpu_has_bf16(), "bf16 refused on a CPU that has it");
        return;
    };
    assert_eq!(bf16.model().kind(), Kind::BFloat16);
    let (diff, agree) = compare(&f32, &bf16);
    eprintln!("tiny: max |log-prob difference| over the top 20: {diff:.3}, top-1 agreement {agree:.2}");
    assert!(diff < 0.05 && agree >= 0.9, "bf16 drifts from f32: {diff}, {agree}");
}

/// Logits of `ids` decoded one token at a time after a prefill of the first half, through
/// `fused` (generation's copies of the weights) or the layers' own weights.
fn decoded_logits(policy: &Policy, ids: &[i64], fused: Option<&FusedWeights>) -> Tensor {
    let model = policy.model();
    let t = ids.len() as i64;
    let input = Tensor::from_slice(ids).view([1, t]);
    let positions = Tensor::arange(t, (Kind::Int64, Device::Cpu)).unsqueeze(0);
    let mut cache = model.new_cache(1, t);
    let half = t / 2;
    let mut step = |from: i64, n: i64| {
        let hidden = model.forward_with(
            &input.narrow(1, from, n),
            &positions.narrow(1, from, n),
            &AttentionMask::Causal,
            Some(&mut cache),
            fused,
        );
        model.logits_with(&hidden.select(1, -1), fused).to_kind(Kind::Float)
    };
    let mut steps = vec![step(0, half)];
    steps.extend((half..t).map(|i| step(i, 1)));
    Tensor::stack(&steps, 0)
}

#[test]
fn bf16_decoding_on_packed_weights_matches_the_layers_own_weights() {
    common::one_thread();
    let dir = tempfile::tempdir().expect("tempdir");
    Policy::tiny(5, options(Precision::F32)).expect("tiny").save(dir.path()).expect("save");
    let Ok(bf16) = Policy::load(dir.path(), options(Precision::Bf16)) else {
        assert!(!toolsmith_policy::cpu_has_bf16(), "bf16 refused on a CPU that has it");
        return;
    };
    let _guard = tch::no_grad_guard();
    let fused = bf16.model().fuse();
    assert!(fused.packed(), "bf16 generation on this CPU runs on oneDNN's packed weights");
    let ids = bf16.tokenizer().encode(PROMPT).expect("encode");
    let packed = decoded_logits(&bf16, &ids, Some(&fused));
    let plain = decoded_logits(&bf16, &ids, None);
    let diff = (&packed - &plain).abs().max().double_value(&[]);
    let scale = plain.abs().max().double_value(&[]);
    assert!(diff <= scale * 0.02, "packed decoding differs by {diff} (logits up to {scale})");
    let agree = packed.argmax(-1, false).eq_tensor(&plain.argmax(-1, false)).to_kind(Kind::Float).mean(Kind::Float);
    assert!(agree.double_value(&[]) >= 0.95, "top tokens agree on {agree}");
}

#[test]
fn bf16_logits_stay_close_to_f32_on_smollm2() {
    common::one_thread();
    let Ok(dir) = toolsmith_policy::locate("smollm2-135m") else {
        eprintln!("SmolLM2 is not fetched here (./scripts/fetch-smollm2.sh); nothing to compare");
        return;
    };
    let f32 = Policy::load(&dir, options(Precision::F32)).expect("f32");
    let Ok(bf16) = Policy::load(&dir, options(Precision::Bf16)) else {
        assert!(!toolsmith_policy::cpu_has_bf16(), "bf16 refused on a CPU that has it");
        return;
    };
    let (diff, agree) = compare(&f32, &bf16);
    eprintln!("SmolLM2: max |log-prob difference| over the top 20: {diff:.3}, top-1 agreement {agree:.2}");
    assert!(diff < 0.75 && agree >= 0.85, "bf16 drifts from f32: {diff}, {agree}");
}

#[test]
fn auto_picks_bf16_where_the_cpu_has_it_and_bf16_is_refused_where_it_does_not() {
    let has = toolsmith_policy::cpu_has_bf16();
    assert_eq!(Precision::auto(Device::Cpu), if has { Precision::Bf16 } else { Precision::F32 });
    assert_eq!(LoadOptions::default().precision(), Precision::auto(Device::Cpu));
    assert!(Precision::F32.check(Device::Cpu).is_ok());
    match Precision::Bf16.check(Device::Cpu) {
        Ok(()) => assert!(has),
        Err(e) => {
            assert!(!has);
            assert!(e.to_string().contains("AVX512_BF16"), "{e}");
        }
    }
}

#[test]
fn training_picks_bf16_only_where_the_cpu_trains_faster_in_it() {
    let cpu = |vendor: &str, flags: &str| {
        CpuFeatures::from_cpuinfo(&format!(
            "processor\t: 0\nvendor_id\t: {vendor}\nmodel name\t: some CPU\nflags\t\t: fpu sse2 {flags}\n\n\
             processor\t: 1\nvendor_id\t: {vendor}\nflags\t\t: fpu sse2 {flags}\n"
        ))
    };
    // A Zen 5: bf16 for both.
    let zen5 = cpu("AuthenticAMD", "avx512f avx512_bf16 avx512_vnni");
    assert_eq!(zen5, CpuFeatures { avx512_bf16: true, amx_bf16: false, amd: true });
    assert!(zen5.has_bf16() && zen5.trains_in_bf16());
    // An Intel CPU with AVX512_BF16 and no AMX (or AMX hidden by a hypervisor): it decodes in
    // bf16 but trains in f32.
    let xeon = cpu("GenuineIntel", "avx512f avx512_bf16 avx512_fp16");
    assert!(xeon.has_bf16() && !xeon.trains_in_bf16());
    // With AMX it trains in bf16 too.
    let amx = cpu("GenuineIntel", "avx512f avx512_bf16 amx_bf16 amx_tile amx_int8");
    assert!(amx.has_bf16() && amx.trains_in_bf16());
    // Neither: f32 throughout; a flag's name must match whole.
    let old = cpu("GenuineIntel", "avx512f avx512_bf16x amx_bf16_not");
    assert!(!old.has_bf16() && !old.trains_in_bf16());
    assert_eq!(CpuFeatures::from_cpuinfo(""), CpuFeatures::default());
    // This machine's choices follow its features (unless the environment overrides them).
    if std::env::var_os("TOOLSMITH_CPU_BF16").is_none() {
        let here = CpuFeatures::detect();
        assert_eq!(toolsmith_policy::cpu_trains_in_bf16(), here.trains_in_bf16());
        assert_eq!(
            Precision::auto_for_training(Device::Cpu),
            if here.trains_in_bf16() { Precision::Bf16 } else { Precision::F32 }
        );
    }
    assert_eq!(Precision::auto_for_training(Device::Cuda(0)), Precision::Bf16);
}
