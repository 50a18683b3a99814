//! Generation and sampling on the tiny model: the cache is exact, batching changes nothing,
//! sampling statistics hold, stop conditions and streaming behave.

mod common;

use std::collections::HashMap;

use tch::{Kind, Tensor};
use toolsmith_policy::decoder::AttentionMask;
use toolsmith_policy::sampling::{Sampler, distribution};
use toolsmith_policy::{FinishReason, Generation, PrefixCache, SamplingParams, TokenEvent};

fn prompts(policy: &toolsmith_policy::Policy) -> Vec<Vec<i64>> {
    ["<|im_start|>user\nWhere was Grace Hopper born?<|im_end|>\n", "<plan>\nTask 1:", "hi"]
        .iter()
        .map(|t| policy.tokenizer().encode(t).expect("encode"))
        .collect()
}

#[test]
fn kv_cache_decoding_matches_a_full_forward() {
    let policy = common::tiny(1);
    let model = policy.model();
    let (input, positions, full) = full_forward(&policy, "<think>the tool graph grows</think><answer>");
    let t = input.size()[1];
    let _guard = tch::no_grad_guard();
    // A cache as long as the sequence is read whole by each decode step (its unwritten columns
    // masked); a much longer one has its filled columns copied out: both must agree, through the
    // layers' own weights and through generation's fused copies of them.
    let fused = model.fuse();
    for (capacity, fused) in [(t, None), (4 * t, None), (t, Some(&fused)), (4 * t, Some(&fused))] {
        let diff = (&full - cached_logits(model, &input, &positions, capacity, fused)).abs().max().double_value(&[]);
        assert!(diff < 1e-4, "cached decoding (capacity {capacity}, fused {}) differs by {diff}", fused.is_some());
    }
}

#[test]
fn a_prefill_after_cached_columns_matches_a_full_forward() {
    // The second half's prefill attends to the first half's cached keys through an explicit mask,
    // as a later turn's new tokens do.
    let policy = common::tiny(4);
    let model = policy.model();
    let (input, positions, full) = full_forward(&policy, "<plan>\nTask 1: search(query=\"Grace Hopper\")\n</plan>");
    let t = input.size()[1];
    let _guard = tch::no_grad_guard();
    let fused = model.fuse();
    let mut cache = model.new_cache(1, t + 8);
    let half = t / 2;
    let first = model.forward_with(
        &input.narrow(1, 0, half),
        &positions.narrow(1, 0, half),
        &AttentionMask::Causal,
        Some(&mut cache),
        Some(&fused),
    );
    let mask = AttentionMask::with_padding(&Tensor::ones([1, t], (Kind::Int64, tch::Device::Cpu)), half, t - half);
    let second = model.forward_with(
        &input.narrow(1, half, t - half),
        &positions.narrow(1, half, t - half),
        &mask,
        Some(&mut cache),
        Some(&fused),
    );
    let cached = Tensor::cat(&[model.logits(&first), model.logits(&second)], 1);
    let diff = (&full - cached).abs().max().double_value(&[]);
    assert!(diff < 1e-4, "prefill after cached columns differs by {diff}");
}

#[test]
fn generation_follows_the_weights_after_they_change() {
    let mut policy = common::tiny(3);
    let prompt = prompts(&policy)[0].clone();
    let params = SamplingParams::greedy(8);
    let (before, _) = policy.generate(std::slice::from_ref(&prompt), &params, None).expect("before");
    // New values for every weight that generation keeps a fused copy of.
    tch::manual_seed(11);
    tch::no_grad(|| {
        for (name, mut weight) in policy.var_store_mut().variables() {
            if ["q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"].iter().any(|m| name.contains(m)) {
                weight.copy_(&(weight.randn_like() * 0.2));
            }
        }
    });
    let (after, _) = policy.generate(std::slice::from_ref(&prompt), &params, None).expect("after");
    // Greedy decoding by full forward passes over the new weights, without a cache.
    let model = policy.model();
    let mut ids = prompt.clone();
    let _guard = tch::no_grad_guard();
    for _ in 0..params.max_new_tokens {
        let t = ids.len() as i64;
        let input = Tensor::from_slice(&ids).view([1, t]);
        let positions = Tensor::arange(t, (Kind::Int64, tch::Device::Cpu)).view([1, t]);
        let logits = model.logits(&model.forward(&input, &positions, &AttentionMask::Causal, None));
        let next = logits.select(1, t - 1).argmax(-1, false).int64_value(&[0]);
        ids.push(next);
        // Generation ends at an end-of-sequence token, which it keeps.
        if policy.tokenizer().eos_ids().contains(&next) {
            break;
        }
    }
    assert_eq!(after[0].output_ids, ids[prompt.len()..], "generation used stale weights");
    assert_ne!(
        after[0].output_ids, before[0].output_ids,
        "the change must alter the draw for this test to mean anything"
    );
}

/// `text`'s ids `[1, t]`, their positions, and its logits from one forward pass without a cache.
fn full_forward(policy: &toolsmith_policy::Policy, text: &str) -> (Tensor, Tensor, Tensor) {
    let ids: Vec<i64> = policy.tokenizer().encode(text).expect("encode");
    let t = ids.len() as i64;
    let input = Tensor::from_slice(&ids).view([1, t]);
    let positions = Tensor::arange(t, (Kind::Int64, tch::Device::Cpu)).view([1, t]);
    let model = policy.model();
    let full = tch::no_grad(|| model.logits(&model.forward(&input, &positions, &AttentionMask::Causal, None)));
    (input, positions, full)
}

/// Logits of `input` with half of it prefilled, then one token at a time through a cache.
fn cached_logits(
    model: &toolsmith_policy::decoder::Transformer,
    input: &Tensor,
    positions: &Tensor,
    capacity: i64,
    fused: Option<&toolsmith_policy::decoder::FusedWeights>,
) -> Tensor {
    let t = input.size()[1];
    let mut cache = model.new_cache(1, capacity);
    let half = t / 2;
    let mut steps = vec![model.logits_with(
        &model.forward_with(
            &input.narrow(1, 0, half),
            &positions.narrow(1, 0, half),
            &AttentionMask::Causal,
            Some(&mut cache),
            fused,
        ),
        fused,
    )];
    for i in half..t {
        steps.push(model.logits_with(
            &model.forward_with(
                &input.narrow(1, i, 1),
                &positions.narrow(1, i, 1),
                &AttentionMask::Causal,
                Some(&mut cache),
                fused,
            ),
            fused,
        ));
    }
    assert_eq!(cache.len(), t);
    Tensor::cat(&steps, 1)
}

#[test]
fn batched_generation_equals_one_prompt_at_a_time() {
    let policy = common::tiny(2);
    let prompts = prompts(&policy);
    for params in [
        SamplingParams::greedy(12),
        SamplingParams { max_new_tokens: 12, temperature: 0.9, top_p: 0.9, seed: 5, ..SamplingParams::default() },
    ] {
        let (batched, _) = policy.generate(&prompts, &params, None).expect("batch");
        for (i, prompt) in prompts.iter().enumerate() {
            // Sequence i of a batch samples with seed + i.
            let single = SamplingParams { seed: params.seed + i as u64, ..params.clone() };
            let (alone, _) = policy.generate(std::slice::from_ref(prompt), &single, None).expect("single");
            assert_eq!(batched[i].output_ids, alone[0].output_ids, "prompt {i}, {params:?}");
            assert_eq!(batched[i].prompt_ids, *prompt);
        }
    }
}

#[test]
fn rows_that_finish_early_leave_the_batch_and_change_no_draw() {
    // Six episodes whose turns end at different steps (stop tokens taken from two of them), so
    // the batch narrows to the running rows several times; their keys and values still reach
    // the prefix cache, where each episode's next turn finds its whole first turn.
    let policy = common::tiny(4);
    let tokenizer = policy.tokenizer().clone();
    let first: Vec<Vec<i64>> =
        ["Where was Grace Hopper born?", "<plan>\nTask 1:", "hi", "What is 2 + 2?", "<think>", "ok"]
            .iter()
            .map(|t| tokenizer.encode(t).expect("encode"))
            .collect();
    let seeds = [3, 4, 5, 6, 7, 8];
    let free = SamplingParams { max_new_tokens: 24, temperature: 1.0, ..SamplingParams::default() };
    let (unstopped, _) = policy.generate_seeded(&first, &free, &seeds).expect("free");
    let params =
        SamplingParams { stop_token_ids: vec![unstopped[0].output_ids[3], unstopped[2].output_ids[9]], ..free.clone() };
    let mut cache = PrefixCache::new(64 << 20);
    let (turn1, _) = policy.generate_with_prefix(&first, &params, Some(&seeds), None, &mut cache).expect("turn 1");
    let lengths: Vec<usize> = turn1.iter().map(|g| g.output_ids.len()).collect();
    assert!(lengths.iter().filter(|&&n| n < 24).count() >= 2 && lengths.contains(&24), "{lengths:?}");
    for (i, (g, prompt)) in turn1.iter().zip(&first).enumerate() {
        let single = SamplingParams { seed: seeds[i], ..params.clone() };
        let (alone, _) = policy.generate(std::slice::from_ref(prompt), &single, None).expect("single");
        assert_eq!(g.output_ids, alone[0].output_ids, "episode {i}");
        for (x, y) in g.logprobs.iter().zip(&alone[0].logprobs) {
            assert!((x - y).abs() < 1e-4, "episode {i}: {x} vs {y}");
        }
    }
    let before = cache.stats();
    next_turn_with_and_without_cache(
        &policy,
        &mut cache,
        &turn1,
        &["<observation>7</observation>"; 6],
        &params,
        &seeds,
    );
    let expected: u64 = turn1.iter().map(|g| (g.prompt_ids.len() + g.output_ids.len() - 1) as u64).sum();
    assert_eq!(cache.stats().reused_tokens - before.reused_tokens, expected);
}

/// Each episode's next turn (its first turn's prompt and output, then its observation) decoded
/// with `cache` and without: the draws must agree. Returns the prompts and the uncached turn.
fn next_turn_with_and_without_cache(
    policy: &toolsmith_policy::Policy,
    cache: &mut PrefixCache,
    turn1: &[Generation],
    observations: &[&str],
    params: &SamplingParams,
    seeds: &[u64],
) -> (Vec<Vec<i64>>, Vec<Generation>) {
    let tokenizer = policy.tokenizer();
    let second: Vec<Vec<i64>> = turn1
        .iter()
        .zip(observations)
        .map(|(g, o)| [g.prompt_ids.clone(), g.output_ids.clone(), tokenizer.encode(o).expect("encode")].concat())
        .collect();
    let (cached, _) = policy.generate_with_prefix(&second, params, Some(seeds), None, cache).expect("turn 2");
    let (plain, _) = policy.generate_seeded(&second, params, seeds).expect("plain turn 2");
    for (i, (a, b)) in cached.iter().zip(&plain).enumerate() {
        assert_eq!(a.output_ids, b.output_ids, "episode {i}");
        assert_eq!(a.prompt_ids, second[i]);
        for (x, y) in a.logprobs.iter().zip(&b.logprobs) {
            assert!((x - y).abs() < 1e-4, "episode {i}: {x} vs {y}");
        }
    }
    (second, plain)
}

#[test]
fn shared_prompts_prefill_once_and_seeded_requests_draw_as_alone() {
    // A group: the same prompt four times (prefilled once, its cache rows copied) and another,
    // each request with a seed of its own.
    let policy = common::tiny(2);
    let mut prompts = prompts(&policy);
    let (a, b) = (prompts.remove(0), prompts.remove(0));
    let batch = vec![a.clone(), a.clone(), b.clone(), a.clone(), a.clone()];
    let seeds = [40, 41, 42, 43, 40];
    let params = SamplingParams { max_new_tokens: 12, temperature: 1.0, ..SamplingParams::default() };
    let (together, _) = policy.generate_seeded(&batch, &params, &seeds).expect("batch");
    for (i, prompt) in batch.iter().enumerate() {
        let single = SamplingParams { seed: seeds[i], ..params.clone() };
        let (alone, _) = policy.generate(std::slice::from_ref(prompt), &single, None).expect("single");
        assert_eq!(together[i].output_ids, alone[0].output_ids, "request {i}");
        for (x, y) in together[i].logprobs.iter().zip(&alone[0].logprobs) {
            assert!((x - y).abs() < 1e-4, "request {i}: {x} vs {y}");
        }
    }
    // Same prompt and seed, same draw; other seeds, other draws.
    assert_eq!(together[0].output_ids, together[4].output_ids);
    assert_ne!(together[0].output_ids, together[1].output_ids);
    assert!(policy.generate_seeded(&batch, &params, &seeds[..2]).is_err());
}

#[test]
fn a_prefix_cache_prefills_only_new_tokens_and_changes_no_draw() {
    // Three episodes' turns: turn 1, then each turn 2 extends its own prompt and output with an
    // observation (one by the same length, so that rows are padded differently), decoded as one
    // batch with and without the cache.
    let mut policy = common::tiny(4);
    let first = prompts(&policy);
    let params = SamplingParams { max_new_tokens: 10, temperature: 1.0, ..SamplingParams::default() };
    let seeds = [7, 8, 9];
    let mut cache = PrefixCache::new(64 << 20);
    let (turn1, _) = policy.generate_with_prefix(&first, &params, Some(&seeds), None, &mut cache).expect("turn 1");
    let (plain1, _) = policy.generate_seeded(&first, &params, &seeds).expect("plain turn 1");
    for (a, b) in turn1.iter().zip(&plain1) {
        assert_eq!(a.output_ids, b.output_ids);
    }
    assert_eq!(cache.len(), 3);
    assert_eq!(cache.stats().reused_tokens, 0);

    let observations = ["<observation>42</observation>", "<observation>Arlington, Virginia</observation>", "ok"];
    let before = cache.stats();
    let (second, plain) = next_turn_with_and_without_cache(&policy, &mut cache, &turn1, &observations, &params, &seeds);
    // Every turn-2 prompt reused its whole turn 1 but the last sampled token.
    let expected: u64 = turn1.iter().map(|g| (g.prompt_ids.len() + g.output_ids.len() - 1) as u64).sum();
    let stats = cache.stats();
    assert_eq!(stats.hits - before.hits, 3);
    assert_eq!(stats.reused_tokens - before.reused_tokens, expected);
    // Turn 2 superseded turn 1: still one entry per episode.
    assert_eq!(cache.len(), 3);

    // Other weights: the cache empties itself instead of serving stale rows.
    let _ = policy.var_store_mut();
    let before = cache.stats();
    let (again, _) = policy.generate_with_prefix(&second, &params, Some(&seeds), None, &mut cache).expect("after");
    assert_eq!(cache.stats().reused_tokens, before.reused_tokens);
    assert_eq!(again[0].output_ids, plain[0].output_ids);

    // A budget too small for any sequence keeps nothing.
    let mut tiny = PrefixCache::new(1024);
    policy.generate_with_prefix(&first, &params, Some(&seeds), None, &mut tiny).expect("small");
    assert!(tiny.is_empty() && tiny.bytes() == 0);
}

#[test]
fn rows_with_very_different_new_tokens_prefill_one_by_one_and_change_no_draw() {
    // Turn 2 of five episodes: one brings a long observation, the others a few tokens, and two
    // are the same prompt. Padding every row to the long one would be most of the prefill, so
    // each row prefills its own new tokens, neighbours with as many new tokens in one pass (rows
    // 2 and 3), and the repeated one copies its twin's keys and values; the tokens and log-probs
    // are those of decoding without any cache.
    let policy = common::tiny(4);
    let tokenizer = policy.tokenizer().clone();
    let mut first = prompts(&policy);
    first.push(tokenizer.encode("<|im_start|>user\nWho founded it?<|im_end|>\n").expect("encode"));
    first.push(first[2].clone());
    let params = SamplingParams { max_new_tokens: 8, ..SamplingParams::default() };
    let mut cache = PrefixCache::new(64 << 20);
    let (turn1, _) = policy.generate_with_prefix(&first, &params, None, None, &mut cache).expect("turn 1");
    let long = format!("<observation>{}</observation>", "Arlington, Virginia. ".repeat(150));
    let observations = [long.as_str(), "<observation>42</observation>", "ok", "ok", "ok"];
    let second: Vec<Vec<i64>> = turn1
        .iter()
        .zip(observations)
        .map(|(g, o)| [g.prompt_ids.clone(), g.output_ids.clone(), tokenizer.encode(o).expect("encode")].concat())
        .collect();
    assert_eq!(second[2], second[4]);
    assert_ne!(second[2], second[3]);
    let new = second[0].len() - turn1[0].prompt_ids.len() - turn1[0].output_ids.len();
    assert!(new > 1100, "the long observation is {new} tokens");
    let before = cache.stats();
    let (cached, _) = policy.generate_with_prefix(&second, &params, None, None, &mut cache).expect("turn 2");
    let (plain, _) = policy.generate(&second, &params, None).expect("plain turn 2");
    for (i, (a, b)) in cached.iter().zip(&plain).enumerate() {
        assert_eq!(a.output_ids, b.output_ids, "episode {i}");
        for (x, y) in a.logprobs.iter().zip(&b.logprobs) {
            assert!((x - y).abs() < 1e-4, "episode {i}: {x} vs {y}");
        }
    }
    assert_eq!(cache.stats().hits - before.hits, 5);
    // The twins decode alike.
    assert_eq!(cached[2].output_ids, cached[4].output_ids);
}

/// One environment's system prompt, long enough for a batch's rows to share.
const SYSTEM: &str = "<|im_start|>system\nYou answer questions with tools. Tools: search(query) finds articles; \
                      calculator(expression) evaluates arithmetic; units(value, from, to) converts.<|im_end|>\n";

#[test]
fn a_shared_beginning_is_prefilled_once_for_the_whole_batch() {
    // Four first turns of one environment: a long system prompt, then each its own question.
    let policy = common::tiny(5);
    let shared = policy.tokenizer().encode(SYSTEM).expect("encode").len();
    assert!(shared >= 32, "the system prompt is long enough to share: {shared}");
    let mut cache = PrefixCache::new(64 << 20);
    first_turns_agree(&policy, &mut cache);
    // The beginning was computed once (one lookup for it, then every row reused it).
    let stats = cache.stats();
    assert_eq!(stats.hits, 4, "{stats:?}");
    assert!(stats.reused_tokens >= 4 * (shared as u64 - 1), "{stats:?} shared {shared}");
    // One entry per row: the shared one is superseded by the rows that extend it.
    assert_eq!(cache.len(), 4);
}

/// Four first turns sharing one long system prompt, decoded with `cache` and without it: the
/// draws must agree. Returns the uncached turns.
fn first_turns_agree(policy: &toolsmith_policy::Policy, cache: &mut PrefixCache) -> Vec<Generation> {
    let questions = ["Where was Ada born?", "What is 17 * 23?", "How far is 3 miles in km?", "Who wrote it?"];
    let prompts: Vec<Vec<i64>> = questions
        .iter()
        .map(|q| policy.tokenizer().encode(&format!("{SYSTEM}<|im_start|>user\n{q}<|im_end|>\n")).expect("encode"))
        .collect();
    let params = SamplingParams { max_new_tokens: 8, temperature: 1.0, ..SamplingParams::default() };
    let seeds = [1, 2, 3, 4];
    let (cached, _) = policy.generate_with_prefix(&prompts, &params, Some(&seeds), None, cache).expect("cached");
    let (plain, _) = policy.generate_seeded(&prompts, &params, &seeds).expect("plain");
    for (i, (a, b)) in cached.iter().zip(&plain).enumerate() {
        assert_eq!(a.output_ids, b.output_ids, "row {i}");
        for (x, y) in a.logprobs.iter().zip(&b.logprobs) {
            assert!((x - y).abs() < 1e-4, "row {i}: {x} vs {y}");
        }
    }
    plain
}

/// Adds noise to `weights` in place, as an optimiser's step would.
fn nudge(weights: impl IntoIterator<Item = Tensor>) {
    tch::no_grad(|| {
        for mut w in weights {
            let noise = w.randn_like() * 0.05;
            let _ = w.f_add_(&noise).expect("add");
        }
    });
}

#[test]
fn frozen_layers_keep_a_shared_beginning_across_updates_of_the_layers_above() {
    // Only the top layer trains. After a step of the optimiser the shared system prompt's rows
    // of the frozen layers are reused (only the top layer runs over it) and the draws are those
    // of decoding without any cache; after a change of a frozen layer nothing stale is reused.
    let mut policy = common::tiny(6);
    let layers = policy.layer_count();
    assert!(layers >= 2, "the tiny model has {layers} layers");
    policy.set_trainable_layers(Some(1)).expect("top layer");
    let key = policy.frozen_id().expect("frozen layers");
    assert_eq!(key.1, layers - 1);
    let mut cache = PrefixCache::new(64 << 20);
    let before = first_turns_agree(&policy, &mut cache);
    assert_eq!(cache.stats().frozen_reused_tokens, 0);
    let kept = cache.bytes();

    nudge(policy.trained_variables().into_values());
    policy.state_mut().step += 1;
    assert_eq!(policy.frozen_id(), Some(key), "a step of the trained layers keeps the frozen ones");
    let after = first_turns_agree(&policy, &mut cache);
    let reused = cache.stats().frozen_reused_tokens;
    assert!(reused >= 32, "the shared beginning's frozen rows were reused: {:?}", cache.stats());
    // The step moved the draws' probabilities: the reused rows met weights they were not
    // computed with, and only the trained layer's were recomputed.
    let moved = before
        .iter()
        .zip(&after)
        .flat_map(|(a, b)| a.logprobs.iter().zip(&b.logprobs))
        .any(|(x, y)| (x - y).abs() > 1e-3);
    assert!(moved, "the update changed what the policy draws");
    // The weights' other rows went; the frozen ones stay through a clear, and go with clear_all.
    cache.clear();
    assert!(cache.bytes() > 0 && cache.bytes() < kept, "{} of {kept}", cache.bytes());
    cache.clear_all();
    assert_eq!(cache.bytes(), 0);
    let _ = first_turns_agree(&policy, &mut cache);

    // A frozen layer changes: its rows are recomputed, never served stale.
    let lowest: Vec<Tensor> = policy
        .var_store_mut()
        .variables()
        .into_iter()
        .filter(|(name, _)| name.starts_with("model.layers.0."))
        .map(|(_, w)| w)
        .collect();
    assert!(!lowest.is_empty());
    nudge(lowest);
    assert_ne!(policy.frozen_id(), Some(key));
    let reused = cache.stats().frozen_reused_tokens;
    let _ = first_turns_agree(&policy, &mut cache);
    assert_eq!(cache.stats().frozen_reused_tokens, reused);
}

#[test]
fn seeded_sampling_is_reproducible_and_seeds_differ() {
    let policy = common::tiny(3);
    let prompt = prompts(&policy).remove(0);
    let params = |seed| SamplingParams { max_new_tokens: 24, temperature: 1.0, seed, ..SamplingParams::default() };
    let run = |seed| policy.generate(std::slice::from_ref(&prompt), &params(seed), None).expect("generate").0;
    let (a, b, c) = (run(11), run(11), run(12));
    assert_eq!(a, b, "same seed, same continuation");
    assert_ne!(a[0].output_ids, c[0].output_ids, "another seed samples another continuation");
    // Behaviour log-probs are real log-probabilities.
    assert!(a[0].logprobs.iter().all(|&lp| lp <= 0.0 && lp.is_finite()));
    assert_eq!(a[0].logprobs.len(), a[0].output_ids.len());
}

#[test]
fn top_p_keeps_the_smallest_nucleus_and_samples_only_from_it() {
    // A known distribution: softmax of these logits.
    let logits: Vec<f32> = vec![2.0, 1.5, 1.0, 0.5, 0.0, -1.0, -2.0, -4.0];
    let params = SamplingParams { temperature: 1.0, top_p: 0.8, ..SamplingParams::default() };
    let full = distribution(&logits, &SamplingParams { top_p: 1.0, ..params.clone() });
    let nucleus = distribution(&logits, &params);
    let kept: f64 = full.iter().take(nucleus.len()).map(|p| p.1).sum();
    let one_less: f64 = full.iter().take(nucleus.len() - 1).map(|p| p.1).sum();
    assert!(kept >= 0.8 && one_less < 0.8, "nucleus of {} tokens holds {kept}", nucleus.len());
    assert!((nucleus.iter().map(|p| p.1).sum::<f64>() - 1.0).abs() < 1e-9);

    // Empirical frequencies match the renormalised nucleus; nothing outside it is drawn.
    let mut sampler = Sampler::new(&params, 0);
    let draws = 20_000;
    let mut counts: HashMap<i64, usize> = HashMap::new();
    for _ in 0..draws {
        *counts.entry(sampler.next(&logits, &[])).or_default() += 1;
    }
    for (token, p) in &nucleus {
        let freq = counts.get(&(*token as i64)).copied().unwrap_or(0) as f64 / draws as f64;
        assert!((freq - p).abs() < 0.015, "token {token}: frequency {freq:.4}, probability {p:.4}");
    }
    let outside: usize =
        counts.iter().filter(|(t, _)| !nucleus.iter().any(|(k, _)| *k as i64 == **t)).map(|(_, c)| c).sum();
    assert_eq!(outside, 0, "tokens outside the nucleus were sampled");
}

#[test]
fn temperature_sharpens_and_top_k_truncates() {
    let logits: Vec<f32> = vec![1.0, 0.5, 0.0, -0.5];
    let p = |temperature: f64, top_k: usize| {
        distribution(&logits, &SamplingParams { temperature, top_k, ..SamplingParams::default() })
    };
    assert!(p(0.5, 0)[0].1 > p(1.0, 0)[0].1 && p(1.0, 0)[0].1 > p(2.0, 0)[0].1);
    let top2 = p(1.0, 2);
    assert_eq!(top2.iter().map(|x| x.0).collect::<Vec<_>>(), vec![0, 1]);
}

#[test]
fn repetition_penalty_lowers_the_chance_of_seen_tokens() {
    let logits: Vec<f32> = vec![2.0, 1.0, -1.0, 0.5];
    let seen = [0_i64, 2];
    let params = SamplingParams { temperature: 1.0, repetition_penalty: 1.5, ..SamplingParams::default() };
    let mut penalised = logits.clone();
    toolsmith_policy::sampling::apply_repetition_penalty(&mut penalised, &seen, 1.5);
    assert_eq!(penalised, vec![2.0 / 1.5, 1.0, -1.5, 0.5]);
    let before = distribution(&logits, &params);
    let after = distribution(&penalised, &params);
    let prob = |d: &[(usize, f64)], t: usize| d.iter().find(|x| x.0 == t).map_or(0.0, |x| x.1);
    assert!(prob(&after, 0) < prob(&before, 0) && prob(&after, 2) < prob(&before, 2));
    assert!(prob(&after, 1) > prob(&before, 1));

    // On the model: greedy decoding of a random model loops; the penalty breaks the loops.
    let policy = common::tiny(4);
    let prompt = policy.tokenizer().encode("hello").expect("encode");
    let distinct = |penalty: f64| {
        let params = SamplingParams { max_new_tokens: 48, repetition_penalty: penalty, ..SamplingParams::default() };
        let (out, _) = policy.generate(std::slice::from_ref(&prompt), &params, None).expect("generate");
        let mut ids = out[0].output_ids.clone();
        ids.sort_unstable();
        ids.dedup();
        ids.len()
    };
    let (plain, penalised) = (distinct(1.0), distinct(2.0));
    assert!(penalised > plain, "distinct tokens: {plain} without the penalty, {penalised} with it");
}

#[test]
fn stop_strings_stop_tokens_and_streaming() {
    let policy = common::tiny(5);
    let prompt = policy.tokenizer().encode("<answer>").expect("encode");
    let base = SamplingParams { max_new_tokens: 30, temperature: 1.0, seed: 9, ..SamplingParams::default() };
    let (free, _) = policy.generate(std::slice::from_ref(&prompt), &base, None).expect("generate");
    let free = &free[0];
    assert_eq!(free.finish_reason, FinishReason::Length);
    assert_eq!(free.output_ids.len(), 30);

    // A stop string taken from the middle of the free-running text ends the generation there.
    let chars: Vec<char> = free.text.chars().collect();
    let stop: String = chars[chars.len() / 2..chars.len() / 2 + 2].iter().collect();
    let params = SamplingParams { stop_strings: vec![stop.clone()], ..base.clone() };
    let mut streamed = String::new();
    let mut events = 0;
    let mut on_token = |e: TokenEvent<'_>| {
        events += 1;
        streamed.push_str(e.text);
    };
    let (out, _) = policy.generate(std::slice::from_ref(&prompt), &params, Some(&mut on_token)).expect("generate");
    let g = &out[0];
    assert_eq!(g.finish_reason, FinishReason::StopString);
    assert!(!g.text.contains(&stop), "the text ends before the stop string");
    assert!(free.text.starts_with(&g.text));
    assert_eq!(streamed, g.text, "the stream adds up to the final text");
    assert_eq!(events, g.output_ids.len(), "one event per token");

    // A stop token ends it too, and is kept in the ids.
    let stop_id = free.output_ids[10];
    let first = free.output_ids.iter().position(|&t| t == stop_id).expect("present");
    let params = SamplingParams { stop_token_ids: vec![stop_id], ..base };
    let (out, _) = policy.generate(std::slice::from_ref(&prompt), &params, None).expect("generate");
    assert_eq!(out[0].finish_reason, FinishReason::StopToken);
    assert_eq!(out[0].output_ids, free.output_ids[..=first]);
}

#[test]
fn a_loop_is_one_block_repeated_over_the_last_tokens() {
    use toolsmith_policy::sampling::{LOOP_PERIOD, LOOP_SPAN, loops};
    let distinct: Vec<i64> = (0..300).collect();
    assert!(!loops(&[]) && !loops(&distinct));
    // One token repeated: a loop once it spans LOOP_SPAN tokens, not one token before.
    let same = vec![7i64; LOOP_SPAN];
    assert!(loops(&same) && !loops(&same[1..]));
    // A five-token block after other text: a loop from the LOOP_SPAN-th repeated token on.
    let mut five: Vec<i64> = (100..110).collect();
    five.extend([1, 2, 3, 4, 5].repeat(10));
    assert!(loops(&five[..10 + LOOP_SPAN]) && !loops(&five[..10 + LOOP_SPAN - 1]));
    // A long block needs three copies; a block longer than LOOP_PERIOD is never one.
    let block: Vec<i64> = (0..40).collect();
    let three = block.repeat(3);
    assert!(loops(&three) && !loops(&three[1..]));
    let long: Vec<i64> = (0..LOOP_PERIOD as i64 + 1).collect();
    assert!(!loops(&long.repeat(3)));
    // Three copies of a block, the last token changed, are not a loop.
    let mut almost = block.repeat(3);
    let last = almost.len() - 1;
    almost[last] = 99;
    assert!(!loops(&almost));
}

#[test]
fn greedy_rows_stop_where_they_start_to_loop_and_others_are_untouched() {
    let policy = common::tiny(3);
    // A random model repeats itself quickly on prompts made of one repeated phrase.
    let prompts: Vec<Vec<i64>> = ["<think>the the the the the", "<tool_call>{\"name\": \"search\"", "hi"]
        .iter()
        .map(|t| policy.tokenizer().encode(t).expect("encode"))
        .collect();
    let free = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(160) };
    let stopping = SamplingParams { stop_loops: true, ..free.clone() };
    let (long, _) = policy.generate(&prompts, &free, None).expect("generate");
    let (short, _) = policy.generate(&prompts, &stopping, None).expect("generate");
    let mut stopped = 0;
    for (l, s) in long.iter().zip(&short) {
        // The same greedy tokens, ending at the first token at which the output is a loop.
        assert_eq!(s.output_ids, l.output_ids[..s.output_ids.len()]);
        assert_eq!(s.finish_reason, FinishReason::Length);
        let first = (1..=l.output_ids.len()).find(|&n| toolsmith_policy::sampling::loops(&l.output_ids[..n]));
        assert_eq!(s.output_ids.len(), first.unwrap_or(l.output_ids.len()));
        stopped += usize::from(s.output_ids.len() < l.output_ids.len());
    }
    assert!(stopped > 0, "no row looped: the test needs prompts that loop");
    // Sampling never stops for a loop.
    let sampled = SamplingParams { temperature: 1.0, seed: 4, ..stopping.clone() };
    let (drawn, _) = policy.generate(&prompts, &sampled, None).expect("generate");
    assert!(drawn.iter().all(|g| g.output_ids.len() == 160));
}

#[test]
fn bad_requests_are_errors() {
    let policy = common::tiny(6);
    let bad = |params: SamplingParams, prompts: Vec<Vec<i64>>| policy.generate(&prompts, &params, None).is_err();
    assert!(bad(SamplingParams::greedy(4), vec![vec![]]), "empty prompt");
    assert!(bad(SamplingParams::greedy(4), vec![vec![1_000_000]]), "id outside the vocabulary");
    assert!(bad(SamplingParams::greedy(4), vec![vec![-1]]), "negative id");
    assert!(bad(SamplingParams { top_p: 0.0, ..SamplingParams::default() }, vec![vec![5]]));
    assert!(bad(SamplingParams { temperature: -1.0, ..SamplingParams::default() }, vec![vec![5]]));
    assert!(bad(SamplingParams { repetition_penalty: 0.0, ..SamplingParams::default() }, vec![vec![5]]));
    assert!(bad(SamplingParams { stop_strings: vec![String::new()], ..SamplingParams::default() }, vec![vec![5]]));
    // Nothing to do is not an error.
    let (out, stats) = policy.generate(&[vec![5]], &SamplingParams::greedy(0), None).expect("zero tokens");
    assert!(out[0].output_ids.is_empty());
    assert_eq!(stats.generated_tokens, 0);
}

#[test]
fn scored_draws_equal_a_draw_then_its_log_prob_bit_for_bit() {
    // Rows like a model's: a 5,000-token vocabulary, some masked to -inf, and odd rows (all -inf
    // but one, a NaN, a +inf) that take the careful path.
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(3);
    let mut rows: Vec<Vec<f32>> = (0..20)
        .map(|r| {
            (0..5_000)
                .map(|i| {
                    if r % 4 == 0 && i % 7 == 0 {
                        f32::NEG_INFINITY
                    } else {
                        rand::Rng::random_range(&mut rng, -8.0_f32..8.0)
                    }
                })
                .collect()
        })
        .collect();
    let mut one = vec![f32::NEG_INFINITY; 5_000];
    one[17] = 0.5;
    rows.push(one);
    rows.push(rows[1].iter().enumerate().map(|(i, &l)| if i == 9 { f32::NAN } else { l }).collect());
    rows.push(rows[2].iter().enumerate().map(|(i, &l)| if i == 9 { f32::INFINITY } else { l }).collect());
    let seen = [3_i64, 17, 40];
    for params in [
        SamplingParams { temperature: 1.0, ..SamplingParams::default() },
        SamplingParams { temperature: 0.7, seed: 9, ..SamplingParams::default() },
        SamplingParams { temperature: 0.0, ..SamplingParams::default() },
        SamplingParams { temperature: 1.0, top_p: 0.9, ..SamplingParams::default() },
        SamplingParams { temperature: 0.8, top_k: 40, ..SamplingParams::default() },
        SamplingParams { temperature: 1.0, repetition_penalty: 1.3, ..SamplingParams::default() },
    ] {
        let (mut fused, mut apart) = (Sampler::new(&params, 5), Sampler::new(&params, 5));
        for row in &rows {
            for _ in 0..3 {
                let (token, logprob) = fused.next_scored(row, &seen);
                let expected = apart.next(row, &seen);
                let expected_logprob = toolsmith_policy::sampling::log_prob(row, expected as usize, params.temperature);
                assert_eq!(token, expected, "{params:?}");
                assert_eq!(logprob.to_bits(), expected_logprob.to_bits(), "{params:?}: token {token}");
            }
        }
    }
}
