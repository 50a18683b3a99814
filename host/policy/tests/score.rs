//! Scoring for training: log-probs and entropy agree with a direct computation, micro-batches give
//! the same gradients as one batch, and the reference copy is frozen.

mod common;

use tch::nn::OptimizerConfig;
use tch::{Kind, Tensor};
use toolsmith_policy::decoder::AttentionMask;
use toolsmith_policy::score::micro_batches;
use toolsmith_policy::{FrozenActivations, ScoreOptions, TokenSequence};

fn sequences(policy: &toolsmith_policy::Policy) -> Vec<TokenSequence> {
    let enc = |t: &str| policy.tokenizer().encode(t).expect("encode");
    vec![
        TokenSequence::completion(&enc("<|im_start|>user\nWhat is 6*7?<|im_end|>\n"), &enc("<answer>42</answer>")),
        TokenSequence::completion(&enc("hi"), &enc("<think>short</think>")),
        TokenSequence::completion(
            &enc("<plan>\nTask 1: look up - Dependencies: none\n</plan>"),
            &enc("<tool_call>{}</tool_call>"),
        ),
    ]
}

#[test]
fn logprobs_and_entropy_match_a_direct_computation() {
    for temperature in [1.0, 0.7] {
        logprobs_and_entropy_at(temperature);
    }
}

/// Scores at `temperature` against `log_softmax(logits / temperature)` computed directly; only
/// the trained positions are scored (the others are 0, with mask 0).
fn logprobs_and_entropy_at(temperature: f64) {
    let policy = common::tiny(20);
    let seqs = sequences(&policy);
    let options = toolsmith_policy::ScoreOptions::at(temperature).with_entropy(true);
    let scores = tch::no_grad(|| policy.score_with(&seqs, &options)).expect("score");
    let entropy = scores.entropy.as_ref().expect("entropy");
    for (i, seq) in seqs.iter().enumerate() {
        let t = seq.ids.len() as i64;
        let input = Tensor::from_slice(&seq.ids).view([1, t]);
        let positions = Tensor::arange(t, (Kind::Int64, tch::Device::Cpu)).view([1, t]);
        let model = policy.model();
        let logits = tch::no_grad(|| model.logits(&model.forward(&input, &positions, &AttentionMask::Causal, None)));
        let log_probs = (logits / temperature).log_softmax(-1, Kind::Float).get(0);
        for j in 1..t {
            let got = scores.logprobs.get(i as i64).get(j).double_value(&[]);
            if !seq.loss_mask[j as usize] {
                assert_eq!(got, 0.0, "sequence {i} token {j} is not trained, so not scored");
                assert_eq!(scores.mask.get(i as i64).get(j).double_value(&[]), 0.0);
                continue;
            }
            let expected = log_probs.get(j - 1).get(seq.ids[j as usize]).double_value(&[]);
            assert!((expected - got).abs() < 1e-5, "sequence {i} token {j}: {got} vs {expected}");
            let p = log_probs.get(j - 1).exp();
            let h = -(&p * log_probs.get(j - 1)).sum(Kind::Float).double_value(&[]);
            assert!((h - entropy.get(i as i64).get(j).double_value(&[])).abs() < 1e-4);
            let masked = scores.mask.get(i as i64).get(j).double_value(&[]);
            assert_eq!(masked == 1.0, seq.loss_mask[j as usize], "mask follows the loss mask");
        }
        // Padding is never scored.
        for j in t..scores.mask.size()[1] {
            assert_eq!(scores.mask.get(i as i64).get(j).double_value(&[]), 0.0);
        }
    }
}

/// Scored with gradients, the log-probs carry them and the entropy (a statistic) does not, so its
/// `[positions, vocabulary]` intermediates are not kept for the backward pass; its values are
/// those scored without gradients.
#[test]
fn entropy_is_scored_without_gradients() {
    let policy = common::tiny(22);
    let seqs = sequences(&policy);
    let options = toolsmith_policy::ScoreOptions::default().with_entropy(true);
    let with_grad = policy.score_with(&seqs, &options).expect("score");
    assert!(with_grad.logprobs.requires_grad());
    let entropy = with_grad.entropy.as_ref().expect("entropy");
    assert!(!entropy.requires_grad());
    let plain = tch::no_grad(|| policy.score_with(&seqs, &options)).expect("score");
    let diff = (entropy - plain.entropy.as_ref().expect("entropy")).abs().max().double_value(&[]);
    assert!(diff < 1e-6, "entropy differs by {diff}");
}

fn gradients(policy: &toolsmith_policy::Policy) -> Vec<Tensor> {
    let mut named: Vec<(String, Tensor)> = policy.var_store().variables().into_iter().collect();
    named.sort_by(|a, b| a.0.cmp(&b.0));
    named.iter().map(|(_, v)| v.grad().copy()).collect()
}

#[test]
fn micro_batches_accumulate_the_same_gradients() {
    let policy = common::tiny(21);
    let seqs = sequences(&policy);
    let total_tokens: f64 = seqs.iter().map(|s| s.loss_mask.iter().skip(1).filter(|&&m| m).count() as f64).sum();
    let loss = |scores: &toolsmith_policy::TokenScores, _range: std::ops::Range<usize>| {
        -(&scores.logprobs * &scores.mask).sum(Kind::Float) / total_tokens
    };
    let whole = policy.accumulate_gradients(&seqs, usize::MAX, &Default::default(), loss).expect("one batch");
    let full = gradients(&policy);
    policy.var_store().trainable_variables().iter_mut().for_each(|v| v.zero_grad());
    let groups = micro_batches(&seqs, 30);
    assert!(groups.len() > 1, "the test needs several micro-batches, got {groups:?}");
    let split = policy.accumulate_gradients(&seqs, 30, &Default::default(), loss).expect("micro-batches");
    assert!((whole - split).abs() < 1e-5, "loss {whole} vs {split}");
    for (a, b) in full.iter().zip(gradients(&policy)) {
        let diff = (a - b).abs().max().double_value(&[]);
        assert!(diff < 1e-5, "gradient differs by {diff}");
    }
}

#[test]
fn passes_over_the_same_sequences_reuse_the_frozen_layers_exactly() {
    let mut policy = common::tiny(23);
    let layers = usize::try_from(policy.model().spec().layers).expect("layers");
    assert_eq!(policy.model().frozen_layers(), 0);
    policy.set_trainable_layers(Some(1)).expect("top layer");
    assert_eq!(policy.model().frozen_layers(), layers - 1);
    let seqs = sequences(&policy);
    let loss = |scores: &toolsmith_policy::TokenScores, _range: std::ops::Range<usize>| {
        -(&scores.logprobs * &scores.mask).sum(Kind::Float)
    };
    let pass = |policy: &toolsmith_policy::Policy, frozen: Option<&mut FrozenActivations>| {
        policy.var_store().trainable_variables().iter_mut().for_each(|v| v.zero_grad());
        let value = match frozen {
            Some(f) => policy.accumulate_gradients_reusing(&seqs, 30, &Default::default(), f, loss),
            None => policy.accumulate_gradients(&seqs, 30, &Default::default(), loss),
        }
        .expect("pass");
        let grads: Vec<Tensor> = policy
            .var_store()
            .trainable_variables()
            .iter()
            .filter(|v| v.requires_grad())
            .map(|v| v.grad().copy())
            .collect();
        assert!(!grads.is_empty());
        (value, grads)
    };
    let same = |(a, ga): &(f64, Vec<Tensor>), (b, gb): &(f64, Vec<Tensor>)| {
        assert!((a - b).abs() < 1e-6, "loss {a} vs {b}");
        for (x, y) in ga.iter().zip(gb) {
            let diff = (x - y).abs().max().double_value(&[]);
            assert!(diff < 1e-6, "gradient differs by {diff}");
        }
    };
    let mut frozen = FrozenActivations::default();
    let first = pass(&policy, Some(&mut frozen));
    assert_eq!(frozen.len(), micro_batches(&seqs, 30).len());
    same(&first, &pass(&policy, None));
    // The trained layer moves (an epoch's step); the kept lower layers' output still holds.
    tch::no_grad(|| {
        for mut v in policy.var_store().trainable_variables().into_iter().filter(Tensor::requires_grad) {
            let _ = v.g_add_(&(v.randn_like() * 0.05));
        }
    });
    let second = pass(&policy, Some(&mut frozen));
    assert!((second.0 - first.0).abs() > 1e-4, "the step changed nothing");
    same(&second, &pass(&policy, None));
}

#[test]
fn gradient_checkpointing_gives_the_same_loss_and_gradients() {
    let loss = |scores: &toolsmith_policy::TokenScores, _range: std::ops::Range<usize>| {
        -(&scores.logprobs * &scores.mask).sum(Kind::Float)
    };
    let pass = |policy: &toolsmith_policy::Policy, recompute: bool, frozen: Option<&mut FrozenActivations>| {
        policy.var_store().trainable_variables().iter_mut().for_each(|v| v.zero_grad());
        let seqs = sequences(policy);
        let options = ScoreOptions::default().recomputing(recompute);
        let value = match frozen {
            Some(f) => policy.accumulate_gradients_reusing(&seqs, 30, &options, f, loss),
            None => policy.accumulate_gradients(&seqs, 30, &options, loss),
        }
        .expect("pass");
        let mut grads: Vec<(String, Tensor)> = policy
            .var_store()
            .variables()
            .into_iter()
            .filter(|(_, v)| v.requires_grad())
            .map(|(name, v)| (name, v.grad().copy()))
            .collect();
        grads.sort_by(|a, b| a.0.cmp(&b.0));
        (value, grads)
    };
    let same = |what: &str, (a, ga): &(f64, Vec<(String, Tensor)>), (b, gb): &(f64, Vec<(String, Tensor)>)| {
        assert!((a - b).abs() < 1e-6, "{what}: loss {a} vs {b}");
        assert_eq!(ga.len(), gb.len());
        for ((name, x), (other, y)) in ga.iter().zip(gb) {
            assert_eq!(name, other);
            assert!(x.defined() && y.defined(), "{what}: {name} got no gradient");
            assert!(x.abs().max().double_value(&[]) > 0.0 || name.contains("norm"), "{what}: {name}'s gradient is 0");
            let diff = (x - y).abs().max().double_value(&[]);
            assert!(diff < 1e-6, "{what}: {name}'s gradient differs by {diff}");
        }
    };
    // Every weight trains, the embeddings (and the tied head) included.
    let mut policy = common::tiny(24);
    same("full", &pass(&policy, true, None), &pass(&policy, false, None));
    // The top layer trains: the frozen ones are neither kept nor recomputed, and a second pass
    // starts from their kept output.
    policy.set_trainable_layers(Some(1)).expect("top layer");
    let mut frozen = FrozenActivations::default();
    let plain = pass(&policy, false, None);
    same("top layer", &pass(&policy, true, Some(&mut frozen)), &plain);
    same("top layer, second pass", &pass(&policy, true, Some(&mut frozen)), &plain);
}

#[test]
fn micro_batches_cover_every_sequence_once_within_the_budget() {
    let seq = |n: usize| TokenSequence { ids: vec![1; n], loss_mask: vec![true; n] };
    let seqs = vec![seq(10), seq(4), seq(12), seq(40), seq(3), seq(3)];
    let groups = micro_batches(&seqs, 32);
    let mut covered = Vec::new();
    for g in &groups {
        let longest = seqs[g.clone()].iter().map(|s| s.ids.len()).max().unwrap_or(0);
        assert!(longest * g.len() <= 32 || g.len() == 1, "{g:?} is over budget");
        covered.extend(g.clone());
    }
    assert_eq!(covered, (0..seqs.len()).collect::<Vec<_>>());
}

#[test]
fn the_reference_copy_is_frozen_while_the_policy_trains() {
    let policy = common::tiny(22);
    let reference = policy.reference().expect("reference");
    assert!(reference.var_store().trainable_variables().iter().all(|v| !v.requires_grad()));
    let seqs = sequences(&policy);
    let before = tch::no_grad(|| reference.score(&seqs, false)).expect("score").sequence_logprobs();
    let mut opt = tch::nn::Adam::default().build(policy.var_store(), 1e-2).expect("optimizer");
    for _ in 0..3 {
        opt.zero_grad();
        let scores = policy.score(&seqs, false).expect("score");
        let loss = -scores.sequence_logprobs().mean(Kind::Float);
        opt.backward_step(&loss);
    }
    let after_ref = tch::no_grad(|| reference.score(&seqs, false)).expect("score").sequence_logprobs();
    let after_policy = tch::no_grad(|| policy.score(&seqs, false)).expect("score").sequence_logprobs();
    assert_eq!((&before - &after_ref).abs().max().double_value(&[]), 0.0, "the reference moved");
    // Maximising the completions' likelihood raised it.
    assert!((after_policy - before).min().double_value(&[]) > 0.0);
}

#[test]
fn bad_batches_are_errors() {
    let policy = common::tiny(23);
    assert!(policy.score(&[], false).is_err());
    assert!(policy.score(&[TokenSequence { ids: vec![1], loss_mask: vec![true] }], false).is_err());
    assert!(policy.score(&[TokenSequence { ids: vec![1, 2], loss_mask: vec![true] }], false).is_err());
    assert!(policy.score(&[TokenSequence { ids: vec![1, 99_999], loss_mask: vec![true, true] }], false).is_err());
}
