//! Helpers shared by the trainer's tests.

use toolsmith_policy::tch::{self, Kind};
use toolsmith_policy::{Policy, ScoreOptions};
use toolsmith_train::rl::episode::EpisodeSequence;

/// Rescores a sampled sequence with `policy` at the sampling `temperature`: (tokens trained on,
/// the largest difference between the trainer's log-prob and the behaviour log-prob recorded
/// when sampling).
pub fn rescore(policy: &Policy, seq: &EpisodeSequence, temperature: f64) -> (usize, f64) {
    let options = ScoreOptions::at(temperature);
    let scores = tch::no_grad(|| policy.score_with(std::slice::from_ref(&seq.tokens), &options)).expect("scores");
    let logprobs = Vec::<f64>::try_from(scores.logprobs.get(0).to_kind(Kind::Double)).expect("logprobs");
    let (mut scored, mut max_diff) = (0, 0.0_f64);
    for (i, &m) in seq.tokens.loss_mask.iter().enumerate() {
        if m {
            scored += 1;
            max_diff = max_diff.max((logprobs[i] - seq.behaviour[i]).abs());
        }
    }
    (scored, max_diff)
}
