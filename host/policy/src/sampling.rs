//! Choosing the next token from a row of logits: greedy, temperature, top-k, top-p (nucleus) and
//! repetition penalty, with a seeded generator so a run can be repeated exactly.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::PolicyError;

/// How to sample a continuation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SamplingParams {
    /// Most tokens generated per sequence.
    pub max_new_tokens: usize,
    /// 0 means greedy (argmax).
    pub temperature: f64,
    /// Nucleus mass in (0, 1]; 1 disables it.
    pub top_p: f64,
    /// Keep only the k most likely tokens; 0 disables it.
    pub top_k: usize,
    /// Hugging Face's (CTRL) penalty over prompt and generated tokens: positive logits divided by
    /// it, negative ones multiplied. 1 disables it.
    pub repetition_penalty: f64,
    /// Generation stops once the text contains one of these; the text ends before it.
    pub stop_strings: Vec<String>,
    /// Extra ids that end a sequence, besides the tokenizer's end-of-sequence ids.
    pub stop_token_ids: Vec<i64>,
    /// Seed of the sampler (sequence i of a batch uses `seed + i`).
    pub seed: u64,
    /// Keep going past end-of-sequence tokens (benchmarks; stop tokens still stop).
    pub ignore_eos: bool,
    /// Greedy decoding only: end a sequence whose last tokens repeat one block exactly (see
    /// [`loops`]) as if it had reached `max_new_tokens`: a trained model rarely leaves such a
    /// loop (a random one can). Evaluation turns this on: such a turn is almost always lost, and
    /// decoding it to the end of its budget made the other rows of its batch wait.
    pub stop_loops: bool,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            max_new_tokens: 64,
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
            repetition_penalty: 1.0,
            stop_strings: Vec::new(),
            stop_token_ids: Vec::new(),
            seed: 0,
            ignore_eos: false,
            stop_loops: false,
        }
    }
}

/// Tokens a repeated block must span before it counts as a loop (and at least three copies).
pub const LOOP_SPAN: usize = 48;
/// The longest block [`loops`] looks for.
pub const LOOP_PERIOD: usize = 64;

/// Whether `output` ends in an exact loop: one block of at most [`LOOP_PERIOD`] tokens repeated
/// back to back over the last `max(LOOP_SPAN, 3 * block)` tokens.
pub fn loops(output: &[i64]) -> bool {
    let n = output.len();
    (1..=LOOP_PERIOD.min(n / 3)).any(|p| {
        let span = LOOP_SPAN.max(3 * p);
        span <= n && output[n - span..n - p] == output[n - span + p..]
    })
}

impl SamplingParams {
    /// Greedy decoding of up to `max_new_tokens` tokens, everything else by default.
    pub fn greedy(max_new_tokens: usize) -> Self {
        Self { max_new_tokens, ..Self::default() }
    }

    /// Whether these settings end `output` for looping ([`SamplingParams::stop_loops`]).
    pub fn ends_in_loop(&self, output: &[i64]) -> bool {
        self.stop_loops && self.temperature == 0.0 && loops(output)
    }

    /// Refuses settings out of range (a negative temperature, `top_p` outside (0, 1], ...).
    pub fn validate(&self) -> Result<(), PolicyError> {
        let bad = |message: String| Err(PolicyError::Sampling(message));
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return bad(format!("temperature must be >= 0, got {}", self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad(format!("top_p must be in (0, 1], got {}", self.top_p));
        }
        if !(self.repetition_penalty > 0.0 && self.repetition_penalty.is_finite()) {
            return bad(format!("repetition_penalty must be > 0, got {}", self.repetition_penalty));
        }
        if self.stop_strings.iter().any(String::is_empty) {
            return bad("stop strings must not be empty".into());
        }
        Ok(())
    }
}

/// Applies the repetition penalty in place to the logits of tokens in `seen`.
pub fn apply_repetition_penalty(logits: &mut [f32], seen: &[i64], penalty: f64) {
    if penalty == 1.0 {
        return;
    }
    let penalty = penalty as f32;
    let mut done = vec![false; logits.len()];
    for &id in seen {
        let Ok(i) = usize::try_from(id) else { continue };
        if i < logits.len() && !done[i] {
            done[i] = true;
            let l = &mut logits[i];
            *l = if *l > 0.0 { *l / penalty } else { *l * penalty };
        }
    }
}

/// The sampling distribution after temperature, top-k and top-p: `(token, probability)` pairs,
/// most likely first, probabilities renormalised to sum to 1.
pub fn distribution(logits: &[f32], params: &SamplingParams) -> Vec<(usize, f64)> {
    let temperature = params.temperature.max(f64::MIN_POSITIVE);
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let mut probs: Vec<(usize, f64)> = logits
        .iter()
        .enumerate()
        .filter(|(_, l)| l.is_finite())
        .map(|(i, &l)| (i, ((l as f64 - max) / temperature).exp()))
        .collect();
    probs.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    if params.top_k > 0 {
        probs.truncate(params.top_k);
    }
    let total: f64 = probs.iter().map(|p| p.1).sum();
    if params.top_p < 1.0 {
        // The smallest prefix whose mass reaches top_p (always at least one token).
        let mut mass = 0.0;
        let mut keep = 0;
        for (_, p) in &probs {
            keep += 1;
            mass += p / total;
            if mass >= params.top_p {
                break;
            }
        }
        probs.truncate(keep.max(1));
    }
    let total: f64 = probs.iter().map(|p| p.1).sum();
    probs.iter_mut().for_each(|p| p.1 /= total);
    probs
}

/// Picks tokens for one sequence, with its own seeded generator.
#[derive(Debug)]
pub struct Sampler {
    params: SamplingParams,
    rng: StdRng,
    /// The last row's unnormalised probabilities, kept so a row's weights are computed once.
    weights: Vec<f64>,
}

impl Sampler {
    /// A sampler under `params` whose generator is seeded with `params.seed + stream`.
    pub fn new(params: &SamplingParams, stream: u64) -> Self {
        Self {
            params: params.clone(),
            rng: StdRng::seed_from_u64(params.seed.wrapping_add(stream)),
            weights: Vec::new(),
        }
    }

    /// Moves past `draws` draws, as if that many tokens had been sampled (each sampled token
    /// takes one uniform draw): a generation resumed after a pause draws what it would have.
    pub fn skip(&mut self, draws: usize) {
        if self.params.temperature > 0.0 {
            for _ in 0..draws {
                let _: f64 = self.rng.random();
            }
        }
    }

    /// [`Sampler::next`] and the drawn token's [`log_prob`] under the raw row, bit for bit, in one
    /// pass over the vocabulary where plain temperature sampling allows it (the exponentials of
    /// a 49 k vocabulary, three passes before, were most of a batched GPU decode step).
    pub fn next_scored(&mut self, logits: &[f32], seen: &[i64]) -> (i64, f64) {
        let p = &self.params;
        let (temperature, plain) =
            (p.temperature, p.temperature > 0.0 && p.repetition_penalty == 1.0 && p.top_k == 0 && p.top_p >= 1.0);
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        if !plain || max == f32::NEG_INFINITY || max == f32::INFINITY || logits.iter().any(|l| l.is_nan()) {
            let token = self.next(logits, seen);
            return (token, log_prob(logits, token as usize, temperature));
        }
        let u: f64 = self.rng.random();
        // With a finite maximum and no NaN, the weights' total is `log_prob`'s sum over every
        // logit, in the same order.
        let (token, max, total) = sample_unsorted(logits, temperature, u, &mut self.weights);
        (token as i64, (logits[token] as f64 - max) / temperature - total.ln())
    }

    /// Chooses the next token given this step's logits and every token seen so far. The row is
    /// left as it is (its raw values give the behaviour log-prob); a copy is made only when the
    /// repetition penalty has to change it.
    pub fn next(&mut self, logits: &[f32], seen: &[i64]) -> i64 {
        let penalised;
        let logits = if self.params.repetition_penalty == 1.0 {
            logits
        } else {
            let mut copy = logits.to_vec();
            apply_repetition_penalty(&mut copy, seen, self.params.repetition_penalty);
            penalised = copy;
            &penalised
        };
        if self.params.temperature == 0.0 {
            return argmax(logits) as i64;
        }
        let u: f64 = self.rng.random();
        if self.params.top_k == 0 && self.params.top_p >= 1.0 {
            // Plain temperature sampling needs no ordering: skip sorting the whole vocabulary.
            return sample_unsorted(logits, self.params.temperature, u, &mut self.weights).0 as i64;
        }
        let dist = distribution(logits, &self.params);
        let mut u = u;
        for &(token, p) in &dist {
            if u < p {
                return token as i64;
            }
            u -= p;
        }
        // Rounding left a sliver of mass: it belongs to the last kept token.
        dist.last().map_or_else(|| argmax(logits) as i64, |&(token, _)| token as i64)
    }
}

/// Inverse-CDF sampling from `softmax(logits / temperature)` in vocabulary order: the token, the
/// row's maximum and the total of its unnormalised weights, which are computed once into
/// `weights` (non-finite logits weigh 0).
fn sample_unsorted(logits: &[f32], temperature: f64, u: f64, weights: &mut Vec<f64>) -> (usize, f64, f64) {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    weights.clear();
    weights.extend(logits.iter().map(|&l| if l.is_finite() { ((l as f64 - max) / temperature).exp() } else { 0.0 }));
    let total: f64 = weights.iter().sum();
    let mut target = u * total;
    let mut token = None;
    for (i, &w) in weights.iter().enumerate() {
        if w > 0.0 {
            token = Some(i);
            if target < w {
                break;
            }
            target -= w;
        }
    }
    (token.unwrap_or_else(|| argmax(logits)), max, total)
}

/// Index of the largest logit (the first one on ties, like `torch.argmax`).
pub fn argmax(logits: &[f32]) -> usize {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best
}

/// `log softmax(logits / temperature)[token]` in f64: the log-prob of `token` under the
/// distribution it was drawn from, before top-p, top-k and the repetition penalty reshape it
/// (a temperature of 0, greedy decoding, scores the untempered distribution). The trainer
/// rescores with the same temperature ([`crate::ScoreOptions`]), so the importance ratio of an
/// unchanged policy is exactly 1.
pub fn log_prob(logits: &[f32], token: usize, temperature: f64) -> f64 {
    let t = if temperature > 0.0 { temperature } else { 1.0 };
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&l| ((l as f64 - max) / t).exp()).sum();
    logits.get(token).map_or(f64::NEG_INFINITY, |&l| (l as f64 - max) / t - sum.ln())
}
